// GlobalBatcher: cuts a dataset into global batches by a token budget, epoch after epoch.
//
// As in DynaPipe and Hydraulis, a global batch holds as many consecutive samples (in epoch order)
// as fit in `tokens_per_batch` input+target tokens; the sample that does not fit starts the next
// batch (greedy next-fit, order kept). Before batching, samples longer than `max_seqlen` are
// clipped or dropped, and a sample that alone exceeds the budget (after clipping) is dropped;
// both are counted and listed with their reason in the report, never silent.
//
// Invariants: every batch has 1..n samples and tokens <= tokens_per_batch; within an epoch every
// sample of the dataset appears in exactly one batch or in the report's dropped list (reason
// kLongerThanMaxSeqlen or kLargerThanBudget for every epoch, kPartialLastBatch for that epoch);
// clipped samples keep their id and carry the clipped lengths. Output is a pure function of the
// dataset and the options (shuffle order: Rng(seed).Fork(epoch)).
//
// Thread safety: a batcher is used by one thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "data/sample.h"

namespace sluice {

// What happens to a sample longer than max_seqlen.
enum class LongSamplePolicy {
  kClip,  // truncate to max_seqlen (see SeqlenLimit) and keep
  kDrop,  // leave out of every batch
};
// "clip" / "drop", and back; the error lists the allowed names.
std::string_view LongSamplePolicyName(LongSamplePolicy policy);
StatusOr<LongSamplePolicy> ParseLongSamplePolicy(std::string_view name);

// What max_seqlen limits.
enum class SeqlenLimit {
  // Each side separately, as an encoder-decoder model sees it: input_len <= max_seqlen and
  // target_len <= max_seqlen; clipping truncates each side to max_seqlen. For decoder-only
  // samples (target 0) this is the whole sequence.
  kEachSide,
  // input_len + target_len <= max_seqlen, as a decoder-only model sees a concatenated
  // prompt/response pair; clipping removes tokens from the target first, then from the input.
  kTotal,
};

struct BatcherOptions {
  // Global batch budget in input+target tokens. REQUIRES >= 1.
  int64_t tokens_per_batch = 65536;
  // Longest sequence the model accepts, in tokens; 0 = no limit.
  int64_t max_seqlen = 0;
  LongSamplePolicy long_samples = LongSamplePolicy::kClip;
  SeqlenLimit limit = SeqlenLimit::kEachSide;
  // Shuffle the samples at the start of every epoch (seeded); false keeps dataset order.
  bool shuffle = true;
  uint64_t seed = 0;
  // Number of passes over the data; 0 = unbounded (Next() then returns false only when an epoch
  // yields no batch: no sample survives the length drops, or drop_last drops the only batch).
  int64_t epochs = 1;
  // True: the last batch of each epoch is dropped (its samples listed with kPartialLastBatch)
  // unless it is exactly full (tokens == tokens_per_batch). False: it is kept.
  bool drop_last = false;
};

// `sample` as the batcher keeps it under `max_seqlen` and `limit` (long_samples kClip): unchanged
// when it fits or max_seqlen is 0, else truncated (kEachSide: each side to max_seqlen; kTotal:
// the target first, then the input). Commands that read a plan's samples back from the data
// (`sluice optimize --data`) clip them with it, as the plan's batches were clipped.
Sample ClipSample(Sample sample, int64_t max_seqlen, SeqlenLimit limit);

struct GlobalBatch {
  int64_t index = 0;  // 0, 1, 2, ... across epochs
  int64_t epoch = 0;
  std::vector<Sample> samples;  // in epoch order, lengths after clipping
  int64_t tokens = 0;           // sum of samples' input_len + target_len

  friend bool operator==(const GlobalBatch&, const GlobalBatch&) = default;
};

enum class DropReason {
  kLongerThanMaxSeqlen,  // long_samples == kDrop and the sample exceeds max_seqlen
  kLargerThanBudget,     // after clipping, the sample alone exceeds tokens_per_batch
  kPartialLastBatch,     // drop_last and the sample was in an epoch's last, partial batch
};
// "longer than max_seqlen", "larger than the batch token budget", "in the dropped last batch".
std::string_view DropReasonText(DropReason reason);

// A sample that no batch holds. Original (unclipped) lengths.
struct DroppedSample {
  int64_t id = 0;
  DropReason reason = DropReason::kLongerThanMaxSeqlen;
  int64_t epoch = -1;  // -1 (kEveryEpoch) for length reasons; the epoch for kPartialLastBatch
  int64_t input_len = 0;
  int64_t target_len = 0;
  friend bool operator==(const DroppedSample&, const DroppedSample&) = default;
};
inline constexpr int64_t kEveryEpoch = -1;

// A sample that was truncated to max_seqlen (in every epoch).
struct ClippedSample {
  int64_t id = 0;
  int64_t input_len = 0;  // original
  int64_t target_len = 0;
  int64_t clipped_input_len = 0;  // as batched
  int64_t clipped_target_len = 0;
  friend bool operator==(const ClippedSample&, const ClippedSample&) = default;
};

struct BatcherReport {
  int64_t dataset_samples = 0;         // samples in the dataset
  int64_t dataset_tokens = 0;          // their tokens before clipping
  int64_t eligible_samples = 0;        // samples left after length drops (batched every epoch)
  int64_t eligible_tokens = 0;         // their tokens, after clipping
  std::vector<ClippedSample> clipped;  // in dataset order
  int64_t clipped_tokens = 0;          // tokens removed by clipping, per epoch
  std::vector<DroppedSample> dropped;  // length drops (dataset order), then partial batches
  int64_t epochs_started = 0;
  int64_t batches = 0;          // batches returned by Next() so far
  int64_t batched_samples = 0;  // samples in them
  int64_t batched_tokens = 0;   // tokens in them

  // Number of dropped entries with `reason`.
  int64_t DroppedCount(DropReason reason) const;
  // A few lines: counts of clipped and dropped samples by reason, with up to `max_ids` example
  // ids each.
  std::string Summary(size_t max_ids = 8) const;
};

class GlobalBatcher {
 public:
  // InvalidArgument when tokens_per_batch < 1, max_seqlen < 0 or epochs < 0 (names the option),
  // or the dataset has more than 2^32 - 1 samples. A sample too large for the budget is not an
  // error: it is dropped with kLargerThanBudget.
  // Copies what it needs; `dataset` need not outlive the batcher.
  static StatusOr<GlobalBatcher> Create(const Dataset& dataset, const BatcherOptions& options);

  // Fills *batch with the next global batch and returns true, or returns false when all epochs
  // are done (and then keeps returning false).
  bool Next(GlobalBatch* batch);

  const BatcherReport& report() const { return report_; }
  const BatcherOptions& options() const { return options_; }

 private:
  explicit GlobalBatcher(const BatcherOptions& options) : options_(options) {}
  void StartEpoch();

  BatcherOptions options_;
  std::vector<Sample> eligible_;                       // after clipping, in dataset order
  std::vector<std::pair<int64_t, int64_t>> original_;  // eligible_[i]'s unclipped lengths
  std::vector<uint32_t> order_;                        // this epoch's order: indices into eligible_
  size_t cursor_ = 0;                                  // next position in order_
  int64_t epoch_ = -1;                                 // current epoch; -1 before the first
  int64_t batches_this_epoch_ = 0;
  int64_t next_index_ = 0;
  bool finished_ = false;
  BatcherReport report_;
};

}  // namespace sluice
