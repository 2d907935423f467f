// Lowering: a BatchPlan (which samples form which micro-batches on which replica) and one Schedule
// per replica (the order of F/B/I/W on each pipeline rank) become an ExecutionPlan with exact
// shapes, matched communication, buffer slots, gradient reduction and the optimizer step.
//
// How (DynaPipe's instruction generation plus its instruction optimizer, in one pass):
//  1. Each replica's micro-batches are priced per virtual stage with BuildScheduleCosts (the
//     plan records these costs) and its schedule is simulated with them and the alpha-beta cost
//     of each boundary transfer: every rank runs its actions in list order, each as soon as its
//     inputs are there. A schedule whose order cannot run (an action waits for one that waits
//     for it) is an error.
//  2. Every boundary transfer becomes a Start on both ranks, emitted at the same simulated moment
//     (when the producing action ends) and ordered on both ranks by (time, tag), so every pair
//     of ranks posts its sends and receives in the same order. Transfers stay within a replica.
//  3. Finishes: a receive finishes just before the first instruction that reads it; an
//     activation send finishes just before the backward of that micro-batch on that stage (its
//     buffer is the stage output the backward needs anyway); a gradient send finishes before the
//     rank's next backward, or at the end of the iteration, so at most one is in flight per rank.
//  4. Buffers: LoadInput, receives and compute outputs allocate; a FreeBuffer follows each
//     buffer's last use; logical buffers are packed into the lowest free slot.
//  5. Gradient reduction: each virtual stage's gradients are cut into buckets of at most
//     `bucket_bytes` (fp16), reduced across the data-parallel group once the stage's last
//     backward (B or W) is done, in decreasing stage order on every rank so that all replicas
//     post the same collectives in the same order: all-reduce for ZeRO 0/1, reduce-scatter for
//     ZeRO >= 2 followed, after OptimizerStep, by an all-gather of the updated parameters (the
//     per-layer gathers of ZeRO-3 belong to the compute ops, see docs/formats.md). With context
//     parallelism the group is dp x cp (a position's cp ranks hold the same parameters); the
//     collectives are posted by the dp ranks of the plan. dp * cp = 1 has no
//     collectives. OptimizerStep ends every program.
//
// The lowering does not validate the result; run ValidatePlan (validate.h) on it.
//
// Thread safety: pure functions.
#pragma once

#include <span>
#include <vector>

#include "base/status.h"
#include "base/units.h"
#include "batching/micro_batch.h"
#include "batching/stage_cost.h"
#include "data/sample.h"
#include "model/cluster_spec.h"
#include "plan/execution_plan.h"
#include "schedule/action.h"
#include "schedule/schedule_costs.h"

namespace sluice {

struct LowerOptions {
  // Largest gradient bucket, fp16 bytes (PyTorch DDP's default bucket_cap_mb = 25 MiB).
  Bytes bucket_bytes = Bytes::MiB(25);
  // How the per-virtual-stage costs and transfer times are priced (BuildScheduleCosts; the
  // replica field is set per replica). Use the options the schedules were generated with.
  ScheduleCostOptions costs;
};

// Lowers `batch_plan` for the global batch `batch`, with `schedules[d]` the schedule of replica d;
// a schedule's micro-batch i is micro-batch i of the replica (apply an order search's permutation
// to the replica's micro-batches before lowering).
// REQUIRES: `eval` was created for the plan's parallel configuration and `cluster`.
// Errors: the batch plan is not kOk, the counts of replicas, schedules and micro-batches or the
// pp/vpp of a schedule disagree with the configuration, a schedule is incomplete
// (CheckScheduleComplete) or cannot run, a micro-batch lacks per-stage costs.
StatusOr<ExecutionPlan> LowerPlan(const BatchPlan& batch_plan, std::span<const Sample> batch,
                                  std::span<const Schedule> schedules,
                                  const StageCostEvaluator& eval, const ClusterSpec& cluster,
                                  const LowerOptions& options = {});

}  // namespace sluice
