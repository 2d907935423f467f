// Per-micro-batch context parallelism (Megatron-Core's dynamic CP, FlexSP, WLB-LLM; issue 16):
// within one replica of cp C, a micro-batch of short sequences need not be split over all C
// devices: its samples can be spread over k sub-groups of C / k devices each, every sub-group
// running its own samples at cp C / k at the same time (k = 1: the whole micro-batch at cp C, as
// before). Short sequences then skip most of the K/V ring and the 1/C slicing that runs their
// kernels below their best rate, while a micro-batch holding a long sequence keeps the full cp:
// in effect each micro-batch runs at its own cp.
//
// ApplyDynamicCp, after batching: for each micro-batch holding two or more units (samples of a
// varlen micro-batch, rows of a padded one), candidate splits k = 2, 4, ... up to min(C, units)
// spread the units over k sub-groups by longest-processing-time, each sub-group priced as a
// micro-batch of its own on the evaluator of cp C / k (one varlen row of its samples, or its
// padded rows). The micro-batch's per-stage costs become the per-field maximum over its
// sub-groups (they run side by side, on disjoint devices). Which k, by `rule`:
//  - kFastest (sluice): every k, units balanced by L^2 + 6 h L per sample of L tokens (h the
//    hidden size: attention plus the linear layers); the split with the smallest bottleneck
//    (forward + backward at the slowest stage) is kept when it beats the unsplit one.
//  - kMegatronLength (Megatron-Core's hybrid/dynamic CP, `megatron-gbp`'s megatron-hybrid-cp):
//    each sample's cp is the next power of two of ceil(L / max_seqlen_per_rank), at most C: a
//    gbpc pack's MicroBatch::cp_class (max_seqlen_per_rank = its pack cap / C), else with
//    max_seqlen_per_rank = ceil(largest micro-batch's tokens in the plan / C); the micro-batch
//    splits into k = C / (the largest cp its samples need) sub-groups (at most its units, a power
//    of two), balanced by Megatron's work estimate L^2; kept whatever its time.
// Memory: a split is kept only when the replica still fits: either no stage's stored or peak
// memory of the micro-batch grows, or the replica passes the order-free form of the memory rule
// of stage_cost.h on every stage (the k_s - 1 largest stored + held, plus the largest peak +
// held, plus the largest transient, within the budget), which holds for any order a schedule
// later picks. (Sub-groups rarely hold exactly 1/k of the tokens, so requiring "no growth" alone
// kept every micro-batch whole on real batches.) Shapes, tokens and rows stay those of the whole
// micro-batch (the plan's boundary tensors are already the whole micro-batch's, see
// stage_cost.h); `MicroBatch::cp_split` records k.
//
// Thread safety: pure function.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "batching/micro_batch.h"
#include "batching/stage_cost.h"
#include "data/sample.h"

namespace sluice {

enum class DynamicCpRule { kFastest, kMegatronLength };

// `narrower[j]` prices cp = eval.parallel().cp >> (j + 1) with dp << (j + 1) (the same devices,
// model states sharded as before), for every such cp >= 1. Returns the number of micro-batches
// split. REQUIRES: plan is kOk for `batch` on `eval`.
int64_t ApplyDynamicCp(BatchPlan* plan, std::span<const Sample> batch,
                       const StageCostEvaluator& eval,
                       std::span<const std::shared_ptr<const StageCostEvaluator>> narrower,
                       DynamicCpRule rule = DynamicCpRule::kFastest);

// The order-free memory check above for one replica's micro-batches (true: every order fits).
bool FitsInAnyOrder(const StageCostEvaluator& eval, std::span<const MicroBatch> micro_batches);

}  // namespace sluice
