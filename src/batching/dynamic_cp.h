// Per-micro-batch context parallelism (Megatron-Core's dynamic CP, FlexSP, WLB-LLM; issue 16):
// within one replica of cp C, a micro-batch of short sequences need not be split over all C
// devices: its samples can be spread over k sub-groups of C / k devices each, every sub-group
// running its own samples at cp C / k at the same time (k = 1: the whole micro-batch at cp C, as
// before). Short sequences then skip most of the K/V ring and the 1/C slicing that runs their
// kernels below their best rate, while a micro-batch holding a long sequence keeps the full cp:
// in effect each micro-batch runs at its own cp.
//
// ApplyDynamicCp, after batching: for each micro-batch holding two or more units (samples of a
// varlen micro-batch, rows of a padded one), for k = 2, 4, ... up to min(C, units), the units are
// spread over k sub-groups by longest-processing-time (cost L^2 + 6 h L per sample of L tokens,
// h the hidden size: attention plus the linear layers), each sub-group priced as a micro-batch
// of its own on the evaluator of cp C / k (one varlen row of its samples, or its padded rows).
// The micro-batch's per-stage costs become the per-field maximum over its sub-groups (they run
// side by side, on disjoint devices); the split with the smallest bottleneck (forward + backward
// at the slowest stage) is kept when it is smaller than the unsplit one and no stage's stored or
// peak memory grows (so a plan that fit still fits). Shapes, tokens and rows stay those of the
// whole micro-batch (the plan's boundary tensors are already the whole micro-batch's, see
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

// `narrower[j]` prices cp = eval.parallel().cp >> (j + 1) with dp << (j + 1) (the same devices,
// model states sharded as before), for every such cp >= 1. Returns the number of micro-batches split. REQUIRES: plan is kOk for
// `batch` on `eval`.
int64_t ApplyDynamicCp(BatchPlan* plan, std::span<const Sample> batch,
                       const StageCostEvaluator& eval,
                       std::span<const std::shared_ptr<const StageCostEvaluator>> narrower);

}  // namespace sluice
