// DataLoss: what the length limits of a GlobalBatcher cost a dataset — how many samples and
// tokens were clipped to max_seqlen or dropped, and why — in the one form every command shows
// (`sluice plan`, `batch`, `compare`: terminal, results.json, HTML report).
//
// Counts are per epoch (length clipping and dropping apply to every epoch alike); a dropped last
// batch (BatcherOptions::drop_last) is not a length loss and is not counted here. Invariant:
// tokens - lost_tokens() = the tokens of the samples that every epoch batches.
//
// Thread safety: value type and pure functions.
#pragma once

#include <cstdint>
#include <string>

#include "data/global_batcher.h"

namespace sluice {

struct DataLoss {
  int64_t samples = 0;  // in the dataset
  int64_t tokens = 0;   // their input + target tokens, before clipping
  int64_t max_seqlen = 0;
  int64_t tokens_per_batch = 0;
  LongSamplePolicy long_samples = LongSamplePolicy::kClip;
  int64_t clipped_samples = 0;       // truncated to max_seqlen
  int64_t clipped_tokens = 0;        // tokens clipping removed
  int64_t dropped_long_samples = 0;  // longer than max_seqlen, dropped (long_samples kDrop)
  int64_t dropped_long_tokens = 0;
  int64_t dropped_budget_samples = 0;  // alone (after clipping) larger than the batch budget
  int64_t dropped_budget_tokens = 0;   // their tokens after clipping
  int64_t kept_samples = 0;            // batched every epoch
  int64_t kept_tokens = 0;

  int64_t lost_tokens() const { return tokens - kept_tokens; }
  int64_t dropped_samples() const { return dropped_long_samples + dropped_budget_samples; }
  // One line: "4,123 of 30,000 samples (13.7%) longer than max seqlen 2048 were clipped,
  // removing 6,543,210 of 9,210,000 tokens (71.0%)", or "no sample was clipped or dropped ...".
  std::string Describe() const;
  // Why no global batch came out, e.g. "all 12 samples were dropped: 12 longer than max seqlen
  // 2048 (long samples are dropped)"; "" when some sample is kept.
  std::string WhyNoBatch() const;

  friend bool operator==(const DataLoss&, const DataLoss&) = default;
};

// The loss of the batcher's dataset under its options.
DataLoss DataLossOf(const GlobalBatcher& batcher);

}  // namespace sluice
