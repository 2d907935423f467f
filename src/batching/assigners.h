// Assigners that split one global batch over the data-parallel replicas.
//
//   contiguous  Megatron-LM's data-parallel sampler: replica r gets the r-th consecutive slice of
//               the batch; slice sizes differ by at most one (the first n mod dp replicas get
//               one more sample).
//   balanced    LPT (longest processing time first) on each sample's estimated cost: samples in
//               descending cost go to the replica with the least summed cost so far.
// The Hydraulis assigner (randomised greedy min-max) is in hydraulis.h.
//
// Invariants: every sample lands on exactly one replica; each replica keeps its samples in
// the batch's order (so dataset-order batchers such as padding and packing still see dataset
// order); results depend only on the inputs (ties break by replica index and sample position).
//
// Thread safety: stateless; Assign may be called concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "batching/method.h"
#include "batching/stage_cost.h"
#include "data/sample.h"

namespace sluice {

std::unique_ptr<Assigner> MakeContiguousAssigner();  // "contiguous"
std::unique_ptr<Assigner> MakeBalancedAssigner();    // "balanced"

// Estimated forward + backward time of each sample on the bottleneck pipeline stage, in
// nanoseconds, at options.recompute (none when absent), without the per-micro-batch constant:
//  - decoder-only models with varlen fits: Hydraulis' f(s) = a s^2 + b s from
//    StageCostEvaluator::BottleneckQuadratic;
//  - otherwise (encoder-decoder): the sample's share of a padded micro-batch of
//    max(1, 4096 / (padded input + padded target)) copies of it, i.e. that micro-batch's
//    bottleneck time divided by the copies (amortising the per-micro-batch floor, which
//    dominates a lone short sample); a sample the cost model cannot price even alone is scaled
//    from the largest priced one by its token count.
// Costs are at least 1 so that every sample weighs something.
std::vector<int64_t> EstimateSampleCosts(std::span<const Sample> samples,
                                         const StageCostEvaluator& eval,
                                         const BatchingOptions& options);

// Positions 0..n-1 of `batch` grouped by replica (each group ascending) -> samples per replica.
std::vector<std::vector<Sample>> GatherReplicas(std::span<const Sample> batch,
                                                std::span<const int64_t> replica_of,
                                                int64_t replicas);

}  // namespace sluice
