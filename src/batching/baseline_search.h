// The per-batch grid search shared by the practitioners' baselines (baselines.h), and the pieces
// they price with.
//
// A baseline is a family of micro-batch sequences indexed by one integer parameter (rows per
// micro-batch, or a token cap) and a recompute level applied to every micro-batch. The search
// finds the largest parameter whose micro-batches fit memory (bisection, assuming that larger
// parameters need more memory), tries a few parameters up to it under every allowed level, and
// keeps the fastest PredictReplicaTime; ties keep the smaller parameter and the lighter level.
// This is the "best micro-batch size and recompute level" DynaPipe grid-searched for its
// baseline, taken per batch, so it is if anything favourable to the baseline.
//
// Thread safety: free functions without state; the builder callback must be safe to call
// from the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "batching/method.h"
#include "batching/micro_batch.h"
#include "batching/stage_cost.h"

namespace sluice {

// Fills `out` with the priced micro-batches for (param, rc), in execution order; false when the
// cost model cannot price one of them.
using MicroBatchBuilder =
    std::function<bool(int64_t param, Recompute rc, std::vector<MicroBatch>* out)>;

struct BaselineSearchSpace {
  std::vector<Recompute> levels;  // allowed levels, lightest (fastest) first
  int64_t fixed_param = 0;        // > 0: the user's choice, the only parameter tried
  int64_t lo = 1;                 // smallest parameter (the smallest micro-batches)
  int64_t hi = 1;                 // largest meaningful parameter (everything in one micro-batch)
  // Parameters tried up to the largest that fits, ascending.
  std::function<std::vector<int64_t>(int64_t lo, int64_t largest)> candidates;
  std::string param_name;  // "micro-batch size" or "token cap", for messages
};

// Runs the search. kOutOfMemory (not a Status) when not even the smallest micro-batches fit
// under the most memory-saving allowed level; the reason names their need and the budget.
ReplicaBatches SearchFastestBaseline(const StageCostEvaluator& eval,
                                     const BaselineSearchSpace& space,
                                     const MicroBatchBuilder& build, std::string_view method);

// options.recompute alone, or none, selective, full.
std::vector<Recompute> RecomputeLevels(const BatchingOptions& options);

// Prices a micro-batch whose padded shape is fixed by the method rather than by its rows
// (padding to max_seqlen, packed rows of max_seqlen): shape.mbs = rows, per-stage times and
// memory from EvaluateStages at mb->recompute, real tokens from the samples. False when the
// cost model cannot answer. REQUIRES: every row id is in `index`; the shape covers the rows.
bool PriceFixedShape(const StageCostEvaluator& eval, const BatchIndex& index, LayerShape shape,
                     MicroBatch* mb);

// Why `micro_batches` (priced, in order) do not fit: the micro-batch and stage with the largest
// need k_s x stored + peak against the stage's activation budget (memory limit minus model
// states), or CheckSequenceMemory's message when only a window of unequal ones overflows.
std::string MemoryNeedReason(const StageCostEvaluator& eval,
                             std::span<const MicroBatch> micro_batches);

}  // namespace sluice
