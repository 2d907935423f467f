// Practitioners' batching baselines: one replica's samples -> fixed-shape micro-batches.
//
// Five MicroBatchers model how variable-length data is batched by today's tools
// (docs/batching-baselines-hydraulis.md gives each one's exact rule and the tool it models):
//   padding       every row padded to max_seqlen, dataset order, fixed rows per micro-batch
//   sorted        length-sorted (descending), fixed rows per micro-batch, each padded to its max
//   token-budget  fairseq max_tokens / DynaPipe "TB": length-sorted, cut greedily before
//                 rows x padded max would exceed the cap
//   packing       Megatron/DeepSpeed pack-dataset: next-fit in dataset order into max_seqlen
//                 rows that attend across the whole row, fixed rows per micro-batch
//   multipack     axolotl multipack: first-fit-decreasing into max_seqlen rows, fixed rows per
//                 micro-batch; per-sample (varlen) attention for decoder-only models
// What the options leave open is searched per batch and the fastest predicted replica time
// (PredictReplicaTime) that fits memory wins, as DynaPipe grid-searched its baseline: the
// micro-batch size (rows) and one recompute level for the whole batch; token-budget searches
// its cap instead of a size.
//
// Encoder-decoder samples use both lengths: inputs fill encoder rows, targets decoder rows.
// Padding pads decoder rows to the longest target of the replica; packing concatenates
// (input, target) pairs into rows with an encoder capacity max_seqlen and a decoder capacity in
// proportion to the batch's target/input token ratio (see PackCapacity).
//
// Invariants of a kOk result: every sample is in exactly one row; CheckSequenceMemory holds.
// A sample longer than max_seqlen is an InvalidArgument naming it (the data layer clips or
// drops such samples before batching). When nothing fits memory the result is kOutOfMemory
// with the smallest micro-batches' need against the budget.
//
// Thread safety: the batchers are stateless; Build may be called concurrently.
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

std::unique_ptr<MicroBatcher> MakePaddingBatcher();      // "padding"
std::unique_ptr<MicroBatcher> MakeSortedBatcher();       // "sorted"
std::unique_ptr<MicroBatcher> MakeTokenBudgetBatcher();  // "token-budget"
std::unique_ptr<MicroBatcher> MakePackingBatcher();      // "packing"
std::unique_ptr<MicroBatcher> MakeMultipackBatcher();    // "multipack"

// ---- Building blocks, exposed for tests and for other batchers. ----

// The row length every sample must fit: options.max_seqlen, or the model's max position when 0.
// InvalidArgument when max_seqlen exceeds the model's max position, or when a sample's length
// (StageCostEvaluator::SeqLen, or DecLen for encoder-decoder targets) exceeds it.
StatusOr<int64_t> CheckSampleLengths(std::span<const Sample> samples,
                                     const StageCostEvaluator& eval,
                                     const BatchingOptions& options);

// Capacity of one packed row in tokens: `enc` for SeqLen, `dec` for DecLen (0: decoder-only).
struct PackCapacity {
  int64_t enc = 0;
  int64_t dec = 0;
};
// Packing capacity for `samples`: enc = max_seqlen; for encoder-decoder models
// dec = Pad(max(longest target, ceil(max_seqlen * sum(targets) / sum(inputs)))), at most
// Pad(max_seqlen): the decoder length a practitioner would configure so that decoder rows fill
// about as well as encoder rows.
PackCapacity PackingCapacity(std::span<const Sample> samples, const StageCostEvaluator& eval,
                             int64_t max_seqlen);

// Next-fit in the given order: a sample goes into the open row when both lengths fit, else it
// opens a new row. Rows hold sample ids. REQUIRES: every sample fits `cap` alone.
std::vector<std::vector<int64_t>> NextFitRows(std::span<const Sample> samples,
                                              const StageCostEvaluator& eval, PackCapacity cap);
// First-fit-decreasing: samples sorted by (SeqLen, DecLen) descending, ties by id; each goes into
// the first row where both lengths fit. REQUIRES: every sample fits `cap` alone.
std::vector<std::vector<int64_t>> FirstFitDecreasingRows(std::span<const Sample> samples,
                                                         const StageCostEvaluator& eval,
                                                         PackCapacity cap);

// Token-budget cut: `samples`, in the given order (callers sort them), are cut greedily; a group
// of sample ids closes before a sample whose addition would make
// rows x (Pad(max SeqLen) + Pad(max DecLen)) exceed `cap` (rounded lengths on both sides of the
// comparison, unlike the reference's running total). A sample whose padded length alone
// exceeds `cap` forms a group by itself.
std::vector<std::vector<int64_t>> TokenBudgetGroups(std::span<const Sample> samples,
                                                    const StageCostEvaluator& eval, int64_t cap);

// The micro-batch sizes a search tries: 1, 2, 3, 4, 6, 8, 12, ... (powers of two and three
// times powers of two) up to `largest`, plus `largest` itself. REQUIRES: largest >= 1.
std::vector<int64_t> MicroBatchSizeCandidates(int64_t largest);

}  // namespace sluice
