#include "data/data_loss.h"

#include <fmt/core.h>

#include <unordered_map>

#include "base/numbers.h"

namespace sluice {
namespace {

std::string Share(int64_t part, int64_t whole) {
  return whole > 0 ? fmt::format("{:.1f}%",
                                 100.0 * static_cast<double>(part) / static_cast<double>(whole))
                   : "-";
}

}  // namespace

DataLoss DataLossOf(const GlobalBatcher& batcher) {
  const BatcherReport& r = batcher.report();
  const BatcherOptions& o = batcher.options();
  DataLoss d;
  d.samples = r.dataset_samples;
  d.tokens = r.dataset_tokens;
  d.max_seqlen = o.max_seqlen;
  d.tokens_per_batch = o.tokens_per_batch;
  d.long_samples = o.long_samples;
  d.clipped_samples = static_cast<int64_t>(r.clipped.size());
  d.clipped_tokens = r.clipped_tokens;
  // A clipped sample that is still larger than the budget is dropped with its clipped tokens.
  for (const DroppedSample& s : r.dropped) {
    if (s.reason == DropReason::kLongerThanMaxSeqlen) {
      ++d.dropped_long_samples;
      d.dropped_long_tokens += s.input_len + s.target_len;
    } else if (s.reason == DropReason::kLargerThanBudget) {
      ++d.dropped_budget_samples;
      d.dropped_budget_tokens += s.input_len + s.target_len;
    }
  }
  if (d.dropped_budget_samples > 0 && !r.clipped.empty()) {
    // Their tokens after clipping: take off what clipping removed (counted in clipped_tokens).
    std::unordered_map<int64_t, int64_t> removed;
    for (const ClippedSample& c : r.clipped) {
      removed[c.id] = (c.input_len + c.target_len) - (c.clipped_input_len + c.clipped_target_len);
    }
    for (const DroppedSample& s : r.dropped) {
      if (s.reason != DropReason::kLargerThanBudget) continue;
      if (auto it = removed.find(s.id); it != removed.end()) d.dropped_budget_tokens -= it->second;
    }
  }
  d.kept_samples = r.eligible_samples;
  d.kept_tokens = r.eligible_tokens;
  return d;
}

std::string DataLoss::Describe() const {
  if (clipped_samples == 0 && dropped_samples() == 0) {
    return max_seqlen > 0
               ? fmt::format("no sample was clipped or dropped (none longer than max seqlen {})",
                             max_seqlen)
               : "no sample was clipped or dropped";
  }
  std::string out;
  auto add = [&](const std::string& part) { out += (out.empty() ? "" : "; ") + part; };
  if (clipped_samples > 0) {
    add(fmt::format(
        "{} of {} samples ({}) longer than max seqlen {} were clipped, removing {} "
        "of {} tokens ({})",
        FormatCount(clipped_samples), FormatCount(samples), Share(clipped_samples, samples), max_seqlen,
        FormatCount(clipped_tokens), FormatCount(tokens), Share(clipped_tokens, tokens)));
  }
  if (dropped_long_samples > 0) {
    add(
        fmt::format("{} of {} samples ({}) longer than max seqlen {} were dropped with their {} "
                    "of {} tokens ({})",
                    FormatCount(dropped_long_samples), FormatCount(samples),
                    Share(dropped_long_samples, samples), max_seqlen, FormatCount(dropped_long_tokens),
                    FormatCount(tokens), Share(dropped_long_tokens, tokens)));
  }
  if (dropped_budget_samples > 0) {
    add(
        fmt::format("{} samples larger than the batch budget of {} tokens were dropped with {} "
                    "tokens ({})",
                    FormatCount(dropped_budget_samples), FormatCount(tokens_per_batch),
                    FormatCount(dropped_budget_tokens), Share(dropped_budget_tokens, tokens)));
  }
  const int kinds =
      (clipped_samples > 0) + (dropped_long_samples > 0) + (dropped_budget_samples > 0);
  if (kinds > 1) {
    add(fmt::format("{} of {} tokens ({}) lost in all", FormatCount(lost_tokens()), FormatCount(tokens),
                    Share(lost_tokens(), tokens)));
  }
  return out;
}

std::string DataLoss::WhyNoBatch() const {
  if (kept_samples > 0) return "";
  if (samples == 0) return "the dataset has no samples";
  std::string why;
  if (dropped_long_samples > 0) {
    why += fmt::format("{} longer than max seqlen {} (long samples are dropped)",
                       FormatCount(dropped_long_samples), max_seqlen);
  }
  if (dropped_budget_samples > 0) {
    why += fmt::format("{}{} larger than the batch budget of {} tokens", why.empty() ? "" : ", ",
                       FormatCount(dropped_budget_samples), FormatCount(tokens_per_batch));
  }
  return fmt::format("all {} samples were dropped: {}", FormatCount(samples), why);
}

}  // namespace sluice
