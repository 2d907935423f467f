// One global batch of a compared run, simulated and recorded (compare.h's BatchRecord with its
// accounting): the step every kind of method shares once it has a plan — a homogeneous plan
// (planner/planner.h) or heterogeneous replicas (planner/hetero.h).
//
// Internal to compare/ (compare.cc, compare_dynamic.cc).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "base/status.h"
#include "compare/compare.h"
#include "compare/ideal_bound.h"
#include "data/global_batcher.h"
#include "planner/hetero.h"
#include "planner/planner.h"
#include "sim/simulator.h"

namespace sluice {

// A batch's record, its accounting (before R is known) and the samples its plan placed.
struct BatchRun {
  BatchRecord rec;
  BatchAccount account;            // zero unless rec.outcome == kOk
  std::vector<Sample> placed;      // the samples the plan's micro-batches hold (ok only)
  std::optional<ExampleRun> example;  // when asked for and the batch ran
};

// The samples of `batch` that `plan`'s micro-batches hold.
std::vector<Sample> PlacedSamples(const PlanResult& plan, std::span<const Sample> batch);

// The batch's record before simulation: index, tokens, planning time, and (when the plan is
// infeasible) the out-of-memory outcome.
BatchRecord StartRecord(const GlobalBatch& batch, const PlanResult& plan);

// Simulates `plan` (planned by `planner` for `batch`; `adjust` applied first when set) and fills
// the record: outcome, tokens, micro-batches, iteration, bubble, comm, peak memory, accounting.
// `sim.samples` is set here; `keep_example` keeps the plan and simulation.
StatusOr<BatchRun> SimulateHomogeneous(PlanResult plan, const Planner& planner,
                                       const GlobalBatch& batch, SimOptions sim,
                                       const FlopCounter& flops, int64_t devices,
                                       const std::function<void(ExecutionPlan*)>& adjust,
                                       bool keep_example);

// The same for heterogeneous replicas (SimulateHetero): the groups' micro-batches and tokens
// summed, bubble and comm over every group's ranks and the whole iteration, the accounting of
// each group (AccountBatch on its devices) summed, plus the devices' time outside the groups'
// own iterations: the exposed cross-group reduction as communication, the faster groups'
// waiting for the slowest as imbalance.
StatusOr<BatchRun> SimulateHeteroBatch(const HeteroPlanner& planner, const HeteroPlanResult& plan,
                                       const GlobalBatch& batch, SimOptions sim,
                                       const FlopCounter& flops, int64_t devices);

}  // namespace sluice
