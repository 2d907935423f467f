// The plan optimizer's candidates (planner/optimizer.h, step 1): dPRO's critical-path pruning on
// sluice's IR. From the simulated critical path of a plan: for a compute op on it, moving it one
// place earlier or later on its rank, and moving the rank's next W (zero-bubble weight gradient)
// to just before it; for a transfer on it, posting its Start (on both ranks) earlier: one
// instruction, or before the nearest blocking Finish; for a collective on it, halving or
// doubling the gradient buckets; for an F, B or I on it that recomputes (with a pricer), a lower
// recompute level for that (micro-batch, stage) (none, or selective after full).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "passes/pass.h"
#include "passes/recompute.h"
#include "base/rng.h"
#include "plan/execution_plan.h"
#include "planner/optimizer.h"
#include "sim/simulator.h"

namespace sluice {

// The candidates above from `sim`'s critical path of `plan`, without duplicates (by Describe()),
// in the order the path visits them. REQUIRES: `sim` is `plan`'s simulation with its timeline.
std::vector<std::shared_ptr<const passes::PlanPass>> CriticalPathCandidates(
    const ExecutionPlan& plan, const SimResult& sim,
    const std::shared_ptr<const passes::RecomputePricer>& pricer);

// The replica that holds most of the compute time on `sim`'s critical path, or -1.
int64_t CriticalReplica(const ExecutionPlan& plan, const SimResult& sim);

// The index of a step's candidate among the untried ones, whose kinds are `kinds` (one each; see
// CandidateDraw): `result.kinds` holds each kind's gain and counts so far, `current` is the
// current plan's simulated time and `ranks` the plan's rank count (a refused candidate costs the
// validation of one rank: 1/ranks of a simulation). Only counts and simulated times enter, never
// the clock, so the draw is the same on any machine. REQUIRES: !kinds.empty(), ranks > 0.
size_t DrawCandidate(CandidateDraw draw, const std::vector<std::string>& kinds,
                     const OptimizeResult& result, Duration current, int64_t ranks, Rng* rng);

}  // namespace sluice
