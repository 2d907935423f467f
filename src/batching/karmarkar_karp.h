// Karmarkar-Karp (multiway largest differencing method) and the split of a globally built
// micro-batch list over data-parallel replicas (DynaPipe's third stage).
//
// KarmarkarKarpPartition splits item weights into `bins` bins: every item starts as a partial
// partition (its weight in one bin, the others empty); the two partial partitions with the
// largest spread (max bin - min bin) are merged, largest bin of one with the smallest of the
// other, until one remains; a local search then moves or swaps items out of the heaviest bin
// while that lowers it. Each bin lists its items in ascending index order, so a bin keeps the
// original order of the micro-batches; bins are ordered by their first item (empty bins last).
// Ties break on creation order, so the result is deterministic.
//
// DistributeMicroBatches gives each replica one bin (BalancedPartition) of the global
// micro-batches, weighted by their bottleneck-stage time. When there are fewer micro-batches than
// replicas (a small batch fits in one micro-batch), the micro-batches with the most rows are
// first cut in two (rows in order, each half re-priced) until every replica can get one or no
// micro-batch has two rows left; a replica left empty by the partition then takes the
// lightest micro-batch of a replica that has several. So no replica is empty when the batch has
// at least dp rows. It then checks the memory of every replica's
// order exactly (CheckSequenceMemory), raising recompute levels where a window is overfull unless
// the level is fixed (RaiseRecomputeToFit in dynapipe_batcher.h).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "batching/method.h"
#include "batching/micro_batch.h"
#include "batching/stage_cost.h"
#include "data/sample.h"

namespace sluice {

// Per bin, the indices of its items (ascending). REQUIRES: bins >= 1, weights >= 0.
std::vector<std::vector<int64_t>> KarmarkarKarpPartition(std::span<const int64_t> weights,
                                                         int64_t bins);
// The better (smaller largest bin) of KarmarkarKarpPartition and GreedyLptPartition, ties to
// Karmarkar-Karp. The differencing method is not a dominating algorithm: on about 0.5% of random
// micro-batch time lists LPT ends slightly (< 1%) lower, so the split keeps whichever is lower.
std::vector<std::vector<int64_t>> BalancedPartition(std::span<const int64_t> weights, int64_t bins);
// Greedy LPT for comparison: items by weight descending (ties: smaller index) into the lightest
// bin (ties: lower bin). Same output form as KarmarkarKarpPartition.
std::vector<std::vector<int64_t>> GreedyLptPartition(std::span<const int64_t> weights,
                                                     int64_t bins);
// The largest bin sum of a partition.
int64_t MaxBinSum(std::span<const int64_t> weights,
                  const std::vector<std::vector<int64_t>>& partition);

// Splits `global` (built for the whole batch with replicas = dp) over eval.parallel().dp
// replicas by BalancedPartition on Bottleneck() times. An infeasible `global` gives a plan with
// its outcome and reason. The plan's `method` and `dropped` are left for the caller.
// Errors: a micro-batch naming a sample that is not in `batch`.
StatusOr<BatchPlan> DistributeMicroBatches(ReplicaBatches global, std::span<const Sample> batch,
                                           const StageCostEvaluator& eval,
                                           const BatchingOptions& options);

}  // namespace sluice
