// Hydraulis' two-stage data assignment (arXiv 2412.07894, PKU-DAIR/Hetu examples/hydraulis):
// stage 1 spreads a global batch's sequences over the data-parallel replicas, stage 2 packs each
// replica's sequences into v balanced varlen micro-batches. Formulas and the choices made where
// the reference leaves room: docs/batching-baselines-hydraulis.md.
//
// Stage 1 (MakeHydraulisAssigner, HydraulisDispatch): per-sequence cost f(s) (EstimateSampleCosts:
// a s^2 + b s for decoder-only models); for each of options.hydraulis_shuffles seeded shuffles,
// visit the sequences in shuffled order and put each on the replica that minimises the resulting
// max_r T_r, T_r = sum_{i in r} f(s_i) + (pp - 1) max_{i in r} f(s_i); ties prefer an empty
// replica, then the smaller resulting T_r, then the lower index. Keep the shuffle with the
// smallest max T_r among those leaving no replica empty (any, when there are fewer sequences than
// replicas). Replicas are homogeneous here (one ParallelConfig), so the reference's step of
// pinning sequences only the largest replica can hold is moot: a sequence fits every replica or
// none, and one that fits none is reported by the micro-batcher as out of memory.
//
// Stage 2 (MakeHydraulisBatcher, HydraulisPackReplica): for v from v_min to v_max (at most 16
// values, MicroBatchCounts), a min-max partition of the replica's sequences into v bins whose token
// sums stay under a cap S_cap(v) (MinMaxPartition), tried with the cap of each allowed recompute
// level; v minimises (C* + c) (pp - 1 + v), where C* + c is the largest priced bottleneck time of
// the v micro-batches at the recompute levels chosen for them. Encoder-decoder models: a
// sequence's size is its input + target tokens (the encoder and decoder rows of a micro-batch
// grow together), f(s) is EstimateSampleCosts' share of a padded micro-batch of copies (there is
// no quadratic fit), the token cap's worst composition is copies of the sample with the most
// tokens, and micro-batches are priced by the encoder-decoder varlen rule of stage_cost.h.
// A partition is only built (priced, its levels raised and lowered) when a lower bound on its
// objective (each micro-batch at its fastest level, memory aside) is below the best objective so
// far: the chosen micro-batches are the same as building every partition, found faster.
//
// Thread safety: stateless functions and objects; concurrent calls are safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "base/status.h"
#include "batching/method.h"
#include "batching/stage_cost.h"
#include "data/sample.h"

namespace sluice {

std::unique_ptr<Assigner> MakeHydraulisAssigner();     // "hydraulis" (stage 1)
std::unique_ptr<MicroBatcher> MakeHydraulisBatcher();  // "hydraulis" (stage 2)

// ---- Stage 1 ----

struct Dispatch {
  std::vector<int64_t> replica_of;  // per sequence position
  int64_t max_time = 0;             // max_r T_r, in the units of `cost`
  bool all_nonempty = false;        // every replica got at least one sequence
};
// The randomised greedy over `shuffles` shuffles (at least one), the k-th drawn from
// Rng(seed).Fork(k), so a run with more shuffles tries a superset of the orders of one with
// fewer. REQUIRES: replicas >= 1, pp >= 1, cost[i] >= 0.
Dispatch HydraulisDispatch(std::span<const int64_t> cost, int64_t replicas, int64_t pp,
                           int64_t shuffles, uint64_t seed);
// max_r T_r of an assignment.
int64_t DispatchMaxTime(std::span<const int64_t> cost, std::span<const int64_t> replica_of,
                        int64_t replicas, int64_t pp);

// ---- Stage 2: min-max partition with a size cap ----

struct PartitionItem {
  int64_t cost = 0;  // f(s) in ns
  int64_t size = 0;  // tokens
};
struct Partition {
  bool feasible = false;     // every item placed within the cap
  int64_t max_load = 0;      // max over bins of summed cost
  std::vector<int64_t> bin;  // per item
};
// Sequences up to this count are partitioned exactly by MinMaxPartition.
inline constexpr int64_t kExactPartitionLimit = 12;

// The two item orders LPT uses: by cost descending (ties: size descending, then position), and
// by size descending (ties: cost descending, then position). They depend on the items only, so
// a caller partitioning the same items into several bin counts or caps computes them once.
struct PartitionOrders {
  std::vector<int64_t> by_cost;
  std::vector<int64_t> by_size;
};
PartitionOrders OrdersOf(std::span<const PartitionItem> items);

// LPT: items by cost descending (ties: size descending, then position) each to the least-loaded
// bin with room; when that fails, by size descending to the least-loaded bin with room.
Partition LptPartition(std::span<const PartitionItem> items, int64_t bins, int64_t cap);
// The same with the orders given. REQUIRES: orders == OrdersOf(items).
Partition LptPartition(std::span<const PartitionItem> items, int64_t bins, int64_t cap,
                       const PartitionOrders& orders);
// Improves a feasible partition: while some move of one item out of a most-loaded bin, or swap
// of an item there with a cheaper item of another bin, lowers the larger of the two bins' loads
// below the most-loaded one's, apply the best such move or swap. Swap partners are the few items
// of each bin nearest in cost to the exchange that would even the two bins (cost-sorted bins,
// bisection), so a step costs O(|top bin| x bins x log n). Never worse than `start`.
Partition LocalSearch(std::span<const PartitionItem> items, int64_t bins, int64_t cap,
                      Partition start);
// Exact branch-and-bound (items by cost descending, symmetric empty bins skipped, pruned by the
// incumbent `start` when feasible). REQUIRES: items.size() <= kExactPartitionLimit.
Partition ExactPartition(std::span<const PartitionItem> items, int64_t bins, int64_t cap,
                         const Partition& start);
// The same with OrdersOf(items).by_cost given.
Partition ExactPartition(std::span<const PartitionItem> items, int64_t bins, int64_t cap,
                         const Partition& start, std::span<const int64_t> by_cost);
// LPT + local search; exact when items.size() <= kExactPartitionLimit.
Partition MinMaxPartition(std::span<const PartitionItem> items, int64_t bins, int64_t cap);
// The same with the orders given. REQUIRES: orders == OrdersOf(items).
Partition MinMaxPartition(std::span<const PartitionItem> items, int64_t bins, int64_t cap,
                          const PartitionOrders& orders);

// ---- Stage 2: one replica ----

// How many values of v stage 2 tries at most, as in the reference.
inline constexpr int64_t kMaxMicroBatchCounts = 16;
// The v values tried: every value of [v_min, v_max] when there are at most 16, else 16 values
// spread geometrically from v_min to v_max (the objective's optimum, near
// sqrt((pp - 1) sum f / c), may lie far above v_min for a large replica). Strictly increasing.
// REQUIRES: 1 <= v_min <= v_max.
std::vector<int64_t> MicroBatchCounts(int64_t v_min, int64_t v_max);

// What stage 2 considered, for tests and reports.
struct HydraulisPackDetail {
  int64_t total_tokens = 0;         // sum of sequence lengths (+ targets, encoder-decoder)
  int64_t utilization_len = 0;      // U = ceil(c / b): where the linear work equals c
  int64_t v_min = 0;                // first v whose cap can hold the replica
  int64_t v_max = 0;                // max(v_min, min(|I|, floor(total / U)))
  std::vector<int64_t> tried_v;     // v values partitioned
  std::vector<int64_t> token_cap;   // the cap that gave the best objective per tried v
  std::vector<Duration> objective;  // (C* + c)(pp - 1 + v) per tried v; Infinite if infeasible
  // Per tried v: its objective is a lower bound, not the objective (its partitions could not
  // beat the best objective found before them, so they were bounded instead of built).
  std::vector<bool> bounded;
  // In: build every option instead of bounding (for tests: the choice must not change).
  bool exhaustive = false;
  int64_t chosen_v = 0;
};
// Stage 2 for one replica's samples. InvalidArgument when the evaluator has no varlen pricing;
// kOutOfMemory when even the longest sequence alone breaks the memory rule. `detail` may be
// null. For encoder-decoder models total_tokens and sizes count input + target tokens.
StatusOr<ReplicaBatches> HydraulisPackReplica(std::span<const Sample> samples,
                                              const StageCostEvaluator& eval,
                                              const BatchingOptions& options,
                                              HydraulisPackDetail* detail);

}  // namespace sluice
