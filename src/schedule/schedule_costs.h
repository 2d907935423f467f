// ScheduleCosts from a replica's micro-batches, and reordering of micro-batches.
//
// BuildScheduleCosts prices every micro-batch of one data-parallel replica on every virtual stage
// (chunk) of its pipeline, for the schedule generators and the estimator:
//  - chunks: the micro-batch's per-device records (MicroBatch::stages) split over the virtual
//    stages by StageCostEvaluator::SplitOverChunks (vpp = 1: the device stage's own record).
//  - stored_until_w = w_stored_fraction x stored (zero-bubble's M_W / M_B).
//  - p2p: ChunkBoundaryBytes of the shape over the AlphaBetaCommModel of the cluster's links.
//    Replica k's pipeline ranks are consecutive devices from k * pp * tp on, rank r on devices
//    [first + r * tp, first + (r + 1) * tp); a boundary crosses nodes when a tp peer pair does.
//    The interleaved wrap (rank pp - 1 to rank 0) is priced the same way. Same-rank chunks
//    (pp = 1) hand over for free.
//  - held: StageCostEvaluator::ChunkHeldBuffers of the shape (the buffers a micro-batch holds on
//    a virtual stage between its F and its B or I).
//  - budget: the evaluator's ActivationBudget per rank less the room for transient buffers of
//    the replica's largest micro-batch there (StageCostEvaluator::TransientBuffers), at least 0.
//  Held and transient buffers are the schedule layer's share of the plan's memory rule
//  (plan/memory_rule.h), as in the batching rule of batching/stage_cost.h.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <span>

#include "base/status.h"
#include "batching/micro_batch.h"
#include "batching/stage_cost.h"
#include "model/cluster_spec.h"
#include "schedule/action.h"

namespace sluice {

struct ScheduleCostOptions {
  // Share of a chunk's stored activations its W still needs after I: the inputs of the linear
  // layers (14 sbh) and the gradients of their outputs (18 sbh) of a layer's 34 sbh (Korthikanti
  // et al.; zero-bubble's M_W = 32 sbh). In [0, 1].
  double w_stored_fraction = 32.0 / 34.0;
  // Data-parallel replica whose pipeline this is (decides which links its boundaries cross).
  int64_t replica = 0;
};

// Errors: no micro-batches, a micro-batch without pp per-stage figures, the replica's devices
// outside the cluster, w_stored_fraction outside [0, 1].
StatusOr<ScheduleCosts> BuildScheduleCosts(std::span<const MicroBatch> micro_batches,
                                           const StageCostEvaluator& eval,
                                           const ClusterSpec& cluster,
                                           const ScheduleCostOptions& options = {});

// out = costs with micro-batch i of out being micro-batch order[i] of `costs` (chunks and p2p;
// pp, vpp and budget copied). Reuses out's storage. REQUIRES: `order` is a permutation of
// 0 .. m-1 and out != &costs.
void PermuteMicroBatches(const ScheduleCosts& costs, std::span<const int64_t> order,
                         ScheduleCosts* out);

}  // namespace sluice
