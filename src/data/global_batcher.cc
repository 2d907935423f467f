#include "data/global_batcher.h"

#include <fmt/core.h>

#include <array>

#include "base/json_util.h"
#include "base/rng.h"

namespace sluice {
namespace {

constexpr std::array<std::string_view, 2> kPolicyNames = {"clip", "drop"};

bool IsLong(const Sample& s, const BatcherOptions& o) {
  if (o.max_seqlen == 0) return false;
  if (o.limit == SeqlenLimit::kTotal) return s.tokens() > o.max_seqlen;
  return s.input_len > o.max_seqlen || s.target_len > o.max_seqlen;
}

Sample Clip(Sample s, const BatcherOptions& o) {
  const int64_t max = o.max_seqlen;
  if (o.limit == SeqlenLimit::kEachSide) {
    s.input_len = std::min(s.input_len, max);
    s.target_len = std::min(s.target_len, max);
  } else {
    const int64_t excess = s.tokens() - max;
    const int64_t from_target = std::min(excess, s.target_len);
    s.target_len -= from_target;
    s.input_len -= excess - from_target;
  }
  return s;
}

}  // namespace

Sample ClipSample(Sample sample, int64_t max_seqlen, SeqlenLimit limit) {
  BatcherOptions o;
  o.max_seqlen = max_seqlen;
  o.limit = limit;
  return IsLong(sample, o) ? Clip(std::move(sample), o) : sample;
}

std::string_view LongSamplePolicyName(LongSamplePolicy policy) {
  return kPolicyNames[static_cast<size_t>(policy)];
}

StatusOr<LongSamplePolicy> ParseLongSamplePolicy(std::string_view name) {
  if (name == "clip") return LongSamplePolicy::kClip;
  if (name == "drop") return LongSamplePolicy::kDrop;
  return InvalidArgumentError(fmt::format("long-sample policy '{}': allowed values are {}", name,
                                          JoinAllowed(kPolicyNames)));
}

std::string_view DropReasonText(DropReason reason) {
  switch (reason) {
    case DropReason::kLongerThanMaxSeqlen:
      return "longer than max_seqlen";
    case DropReason::kLargerThanBudget:
      return "larger than the batch token budget";
    case DropReason::kPartialLastBatch:
      return "in the dropped last batch";
  }
  return "unknown";
}

int64_t BatcherReport::DroppedCount(DropReason reason) const {
  int64_t n = 0;
  for (const DroppedSample& d : dropped) n += d.reason == reason;
  return n;
}

std::string BatcherReport::Summary(size_t max_ids) const {
  const auto ids = [&](auto&& list, auto&& keep) {
    std::string out;
    size_t shown = 0, total = 0;
    for (const auto& x : list) {
      if (!keep(x)) continue;
      ++total;
      if (shown < max_ids) out += (shown++ == 0 ? "" : ", ") + std::to_string(x.id);
    }
    if (total > shown) out += fmt::format(", ... ({} more)", total - shown);
    return out;
  };
  std::string out = fmt::format(
      "{} samples ({} tokens); {} batches hold {} samples and {} tokens over {} epoch(s)\n",
      dataset_samples, dataset_tokens, batches, batched_samples, batched_tokens, epochs_started);
  if (!clipped.empty()) {
    out += fmt::format("clipped to max_seqlen: {} samples, {} tokens removed per epoch (ids {})\n",
                       clipped.size(), clipped_tokens, ids(clipped, [](auto&) { return true; }));
  }
  for (DropReason r : {DropReason::kLongerThanMaxSeqlen, DropReason::kLargerThanBudget,
                       DropReason::kPartialLastBatch}) {
    const int64_t n = DroppedCount(r);
    if (n == 0) continue;
    out += fmt::format("dropped, {}: {} samples (ids {})\n", DropReasonText(r), n,
                       ids(dropped, [r](const DroppedSample& d) { return d.reason == r; }));
  }
  return out;
}

StatusOr<GlobalBatcher> GlobalBatcher::Create(const Dataset& dataset,
                                              const BatcherOptions& options) {
  if (options.tokens_per_batch < 1) {
    return InvalidArgumentError(
        fmt::format("tokens_per_batch: must be >= 1 token, got {}", options.tokens_per_batch));
  }
  if (options.max_seqlen < 0) {
    return InvalidArgumentError(
        fmt::format("max_seqlen: must be >= 0 tokens (0 = no limit), got {}", options.max_seqlen));
  }
  if (options.epochs < 0) {
    return InvalidArgumentError(
        fmt::format("epochs: must be >= 0 (0 = unbounded), got {}", options.epochs));
  }
  GlobalBatcher b(options);
  BatcherReport& r = b.report_;
  r.dataset_samples = static_cast<int64_t>(dataset.size());
  if (dataset.size() > UINT32_MAX) {
    return InvalidArgumentError(
        fmt::format("{}: more than {} samples", dataset.source(), UINT32_MAX));
  }
  b.eligible_.reserve(dataset.size());
  for (const Sample& s : dataset.samples()) {
    r.dataset_tokens += s.tokens();
    Sample kept = s;
    if (IsLong(s, options)) {
      if (options.long_samples == LongSamplePolicy::kDrop) {
        r.dropped.push_back(
            {s.id, DropReason::kLongerThanMaxSeqlen, kEveryEpoch, s.input_len, s.target_len});
        continue;
      }
      kept = Clip(s, options);
      r.clipped.push_back({s.id, s.input_len, s.target_len, kept.input_len, kept.target_len});
      r.clipped_tokens += s.tokens() - kept.tokens();
    }
    if (kept.tokens() > options.tokens_per_batch) {
      r.dropped.push_back(
          {s.id, DropReason::kLargerThanBudget, kEveryEpoch, s.input_len, s.target_len});
      continue;
    }
    r.eligible_tokens += kept.tokens();
    b.eligible_.push_back(kept);
    b.original_.emplace_back(s.input_len, s.target_len);
  }
  r.eligible_samples = static_cast<int64_t>(b.eligible_.size());
  return b;
}

void GlobalBatcher::StartEpoch() {
  ++epoch_;
  ++report_.epochs_started;
  batches_this_epoch_ = 0;
  order_.resize(eligible_.size());
  for (size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<uint32_t>(i);
  if (options_.shuffle) Rng(options_.seed).Fork(static_cast<uint64_t>(epoch_)).Shuffle(order_);
  cursor_ = 0;
}

bool GlobalBatcher::Next(GlobalBatch* batch) {
  while (true) {
    if (epoch_ < 0 || cursor_ >= order_.size()) {
      if (finished_ || eligible_.empty()) return false;
      // An epoch that yielded no batch (everything fell in a dropped last batch) means every
      // later epoch would yield none either.
      const bool epoch_was_empty = epoch_ >= 0 && batches_this_epoch_ == 0;
      if (epoch_was_empty || (options_.epochs > 0 && epoch_ + 1 >= options_.epochs)) {
        finished_ = true;
        return false;
      }
      StartEpoch();
    }
    GlobalBatch out;
    out.epoch = epoch_;
    size_t end = cursor_;
    while (end < order_.size() &&
           out.tokens + eligible_[order_[end]].tokens() <= options_.tokens_per_batch) {
      out.tokens += eligible_[order_[end]].tokens();
      ++end;
    }
    // Every eligible sample fits the budget alone, so a batch is never empty.
    SLUICE_CHECK(end > cursor_);
    const size_t begin = cursor_;
    cursor_ = end;
    if (cursor_ == order_.size() && options_.drop_last && out.tokens < options_.tokens_per_batch) {
      for (size_t k = begin; k < end; ++k) {
        const Sample& s = eligible_[order_[k]];
        const auto& [input_len, target_len] = original_[order_[k]];
        report_.dropped.push_back(
            {s.id, DropReason::kPartialLastBatch, epoch_, input_len, target_len});
      }
      continue;
    }
    out.samples.reserve(end - begin);
    for (size_t k = begin; k < end; ++k) out.samples.push_back(eligible_[order_[k]]);
    out.index = next_index_++;
    ++batches_this_epoch_;
    ++report_.batches;
    report_.batched_samples += static_cast<int64_t>(out.samples.size());
    report_.batched_tokens += out.tokens;
    *batch = std::move(out);
    return true;
  }
}

}  // namespace sluice
