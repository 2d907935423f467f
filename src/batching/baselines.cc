#include "batching/baselines.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>

#include "batching/baseline_search.h"
#include "batching/micro_batch.h"

namespace sluice {
namespace {

// (SeqLen, DecLen) descending, ties by id: the "sorted" order of every length-sorted baseline
// (lexicographic for encoder-decoder pairs, DynaPipe's TB (S)).
std::vector<Sample> SortedByLengthDescending(std::span<const Sample> samples,
                                             const StageCostEvaluator& eval) {
  std::vector<Sample> sorted(samples.begin(), samples.end());
  std::stable_sort(sorted.begin(), sorted.end(), [&](const Sample& x, const Sample& y) {
    const int64_t lx = eval.SeqLen(x), ly = eval.SeqLen(y);
    if (lx != ly) return lx > ly;
    const int64_t dx = eval.DecLen(x), dy = eval.DecLen(y);
    if (dx != dy) return dx > dy;
    return x.id < y.id;
  });
  return sorted;
}

// Rows of single samples, in the given order.
std::vector<std::vector<int64_t>> OneSamplePerRow(std::span<const Sample> samples) {
  std::vector<std::vector<int64_t>> rows;
  rows.reserve(samples.size());
  for (const Sample& s : samples) rows.push_back({s.id});
  return rows;
}

// Padded decoder length for fixed-shape rows: the longest target (at least one token).
int64_t LongestTargetPadded(std::span<const Sample> samples, const StageCostEvaluator& eval) {
  if (!eval.model().is_encoder_decoder()) return 0;
  int64_t longest = 1;
  for (const Sample& s : samples) longest = std::max(longest, eval.DecLen(s));
  return eval.Pad(longest);
}

// Cuts `rows` into micro-batches of `mbs` rows (the last may hold fewer) at `rc` and prices them:
// at `fixed_shape` when its seqlen > 0, else from their rows (PriceMicroBatch).
bool BuildFixedRows(const StageCostEvaluator& eval, const BatchIndex& index,
                    const std::vector<std::vector<int64_t>>& rows, int64_t mbs, Recompute rc,
                    bool varlen, LayerShape fixed_shape, std::vector<MicroBatch>* out) {
  out->clear();
  for (size_t start = 0; start < rows.size(); start += static_cast<size_t>(mbs)) {
    const size_t end = std::min(rows.size(), start + static_cast<size_t>(mbs));
    MicroBatch mb;
    mb.rows.assign(rows.begin() + static_cast<std::ptrdiff_t>(start),
                   rows.begin() + static_cast<std::ptrdiff_t>(end));
    mb.recompute = rc;
    mb.varlen = varlen;
    const bool ok = fixed_shape.seqlen > 0 ? PriceFixedShape(eval, index, fixed_shape, &mb)
                                           : PriceMicroBatch(eval, index, &mb);
    if (!ok) return false;
    out->push_back(std::move(mb));
  }
  return true;
}

// The searchable form of a fixed-rows baseline: `rows` in execution order, cut into
// options.micro_batch_size rows per micro-batch (searched when 0).
StatusOr<ReplicaBatches> FixedRowsBaseline(std::span<const Sample> samples,
                                           const StageCostEvaluator& eval,
                                           const BatchingOptions& options,
                                           std::vector<std::vector<int64_t>> rows, bool varlen,
                                           LayerShape fixed_shape, std::string_view method) {
  if (options.micro_batch_size < 0) {
    return InvalidArgumentError(
        fmt::format("{}: micro_batch_size must be >= 0 (0 = search), got {}", method,
                    options.micro_batch_size));
  }
  if (rows.empty()) return ReplicaBatches{};
  const BatchIndex index(samples);
  const int64_t n_rows = static_cast<int64_t>(rows.size());
  BaselineSearchSpace space;
  space.levels = RecomputeLevels(options);
  space.fixed_param = options.micro_batch_size > 0 ? std::min(options.micro_batch_size, n_rows) : 0;
  space.lo = 1;
  space.hi = n_rows;
  space.candidates = [](int64_t, int64_t largest) { return MicroBatchSizeCandidates(largest); };
  space.param_name = "micro-batch size";
  const MicroBatchBuilder build = [&](int64_t mbs, Recompute rc, std::vector<MicroBatch>* out) {
    return BuildFixedRows(eval, index, rows, mbs, rc, varlen, fixed_shape, out);
  };
  return SearchFastestBaseline(eval, space, build, method);
}

class PaddingBatcher final : public MicroBatcher {
 public:
  std::string_view name() const override { return "padding"; }
  StatusOr<ReplicaBatches> Build(std::span<const Sample> samples, const StageCostEvaluator& eval,
                                 const BatchingOptions& options, int64_t replicas) const override {
    SLUICE_ASSIGN_OR_RETURN(const int64_t max_seqlen, CheckSampleLengths(samples, eval, options));
    const LayerShape shape{1, eval.Pad(max_seqlen), LongestTargetPadded(samples, eval)};
    return FixedRowsBaseline(samples, eval, options, OneSamplePerRow(samples), false, shape,
                             name());
  }
};

class SortedBatcher final : public MicroBatcher {
 public:
  std::string_view name() const override { return "sorted"; }
  StatusOr<ReplicaBatches> Build(std::span<const Sample> samples, const StageCostEvaluator& eval,
                                 const BatchingOptions& options, int64_t replicas) const override {
    SLUICE_RETURN_IF_ERROR(CheckSampleLengths(samples, eval, options).status());
    return FixedRowsBaseline(samples, eval, options,
                             OneSamplePerRow(SortedByLengthDescending(samples, eval)), false,
                             LayerShape{1, 0, 0}, name());
  }
};

// Padded tokens of one sample alone: Pad(input) [+ Pad(target)].
int64_t PaddedTokens(const StageCostEvaluator& eval, const Sample& s) {
  const int64_t dec = eval.DecLen(s);
  return eval.Pad(eval.SeqLen(s)) + (dec > 0 ? eval.Pad(dec) : 0);
}

// lo, the round caps (2^j and 3 x 2^(j-1)) strictly between, and largest.
std::vector<int64_t> CapCandidates(int64_t lo, int64_t largest) {
  std::vector<int64_t> caps{lo};
  for (int64_t p = 1; p < largest && p <= (int64_t{1} << 52); p *= 2) {
    for (int64_t c : {p, p + p / 2}) {
      if (c > lo && c < largest) caps.push_back(c);
    }
  }
  if (largest > lo) caps.push_back(largest);
  std::sort(caps.begin(), caps.end());
  caps.erase(std::unique(caps.begin(), caps.end()), caps.end());
  return caps;
}

class TokenBudgetBatcher final : public MicroBatcher {
 public:
  std::string_view name() const override { return "token-budget"; }
  StatusOr<ReplicaBatches> Build(std::span<const Sample> samples, const StageCostEvaluator& eval,
                                 const BatchingOptions& options, int64_t replicas) const override {
    SLUICE_RETURN_IF_ERROR(CheckSampleLengths(samples, eval, options).status());
    if (options.tokens_per_micro_batch < 0) {
      return InvalidArgumentError(
          fmt::format("token-budget: tokens_per_micro_batch must be >= 0 (0 = search), got {}",
                      options.tokens_per_micro_batch));
    }
    if (samples.empty()) return ReplicaBatches{};
    const std::vector<Sample> sorted = SortedByLengthDescending(samples, eval);
    const BatchIndex index(samples);
    // The smallest useful cap holds the longest padded sample alone; the largest holds them all.
    int64_t lo = 1;
    int64_t max_len = 0, max_dec = 0;
    for (const Sample& s : sorted) {
      lo = std::max(lo, PaddedTokens(eval, s));
      max_len = std::max(max_len, eval.SeqLen(s));
      max_dec = std::max(max_dec, eval.DecLen(s));
    }
    const int64_t hi =
        std::max(lo, static_cast<int64_t>(sorted.size()) *
                         (eval.Pad(max_len) + (max_dec > 0 ? eval.Pad(max_dec) : 0)));
    BaselineSearchSpace space;
    space.levels = RecomputeLevels(options);
    space.fixed_param = options.tokens_per_micro_batch;
    space.lo = lo;
    space.hi = hi;
    space.candidates = CapCandidates;
    space.param_name = "token cap";
    const MicroBatchBuilder build = [&](int64_t cap, Recompute rc, std::vector<MicroBatch>* out) {
      out->clear();
      for (auto& group : TokenBudgetGroups(sorted, eval, cap)) {
        MicroBatch mb;
        for (int64_t id : group) mb.rows.push_back({id});
        mb.recompute = rc;
        if (!PriceMicroBatch(eval, index, &mb)) return false;
        out->push_back(std::move(mb));
      }
      return true;
    };
    return SearchFastestBaseline(eval, space, build, name());
  }
};

class PackingBatcher final : public MicroBatcher {
 public:
  // first_fit_decreasing: multipack (FFD, varlen attention: per sample, and for encoder-decoder
  // models encoder and decoder rows packed separately, cross attention within the sample);
  // otherwise Megatron/DeepSpeed packing (next-fit in dataset order, full attention per row).
  explicit PackingBatcher(bool first_fit_decreasing) : ffd_(first_fit_decreasing) {}
  std::string_view name() const override { return ffd_ ? "multipack" : "packing"; }
  StatusOr<ReplicaBatches> Build(std::span<const Sample> samples, const StageCostEvaluator& eval,
                                 const BatchingOptions& options, int64_t replicas) const override {
    SLUICE_ASSIGN_OR_RETURN(const int64_t max_seqlen, CheckSampleLengths(samples, eval, options));
    const PackCapacity cap = PackingCapacity(samples, eval, max_seqlen);
    std::vector<std::vector<int64_t>> rows =
        ffd_ ? FirstFitDecreasingRows(samples, eval, cap) : NextFitRows(samples, eval, cap);
    const bool varlen = ffd_ && eval.varlen_supported();
    const LayerShape shape =
        varlen ? LayerShape{1, 0, 0} : LayerShape{1, eval.Pad(cap.enc), cap.dec};
    return FixedRowsBaseline(samples, eval, options, std::move(rows), varlen, shape, name());
  }

 private:
  bool ffd_;
};

bool Fits(int64_t used_enc, int64_t used_dec, int64_t len, int64_t dec, PackCapacity cap) {
  return used_enc + len <= cap.enc && used_dec + dec <= cap.dec;
}

}  // namespace

std::unique_ptr<MicroBatcher> MakePaddingBatcher() { return std::make_unique<PaddingBatcher>(); }
std::unique_ptr<MicroBatcher> MakeSortedBatcher() { return std::make_unique<SortedBatcher>(); }
std::unique_ptr<MicroBatcher> MakeTokenBudgetBatcher() {
  return std::make_unique<TokenBudgetBatcher>();
}
std::unique_ptr<MicroBatcher> MakePackingBatcher() {
  return std::make_unique<PackingBatcher>(false);
}
std::unique_ptr<MicroBatcher> MakeMultipackBatcher() {
  return std::make_unique<PackingBatcher>(true);
}

StatusOr<int64_t> CheckSampleLengths(std::span<const Sample> samples,
                                     const StageCostEvaluator& eval,
                                     const BatchingOptions& options) {
  const int64_t model_max = eval.model().max_position;
  if (options.max_seqlen < 0 || options.max_seqlen > model_max) {
    return InvalidArgumentError(
        fmt::format("max_seqlen must be in [0, {}] (model '{}' max position; 0 = that), got {}",
                    model_max, eval.model().name, options.max_seqlen));
  }
  const int64_t max_seqlen = options.max_seqlen > 0 ? options.max_seqlen : model_max;
  for (const Sample& s : samples) {
    const int64_t len = eval.SeqLen(s);
    const int64_t dec = eval.DecLen(s);
    if (len > max_seqlen || dec > max_seqlen) {
      return InvalidArgumentError(fmt::format(
          "sample id {}: {} {} tokens > max seqlen {}; the data layer must clip or drop it "
          "before batching (--long=clip|drop)",
          s.id, len > max_seqlen ? "length" : "target", len > max_seqlen ? len : dec, max_seqlen));
    }
  }
  return max_seqlen;
}

PackCapacity PackingCapacity(std::span<const Sample> samples, const StageCostEvaluator& eval,
                             int64_t max_seqlen) {
  PackCapacity cap{max_seqlen, 0};
  if (!eval.model().is_encoder_decoder()) return cap;
  int64_t sum_in = 0, sum_dec = 0, longest_dec = 1;
  for (const Sample& s : samples) {
    sum_in += eval.SeqLen(s);
    sum_dec += eval.DecLen(s);
    longest_dec = std::max(longest_dec, eval.DecLen(s));
  }
  int64_t proportional = 0;
  if (sum_in > 0) {
    // ceil(max_seqlen * sum_dec / sum_in) without overflow for realistic sums.
    const __int128 num = static_cast<__int128>(max_seqlen) * sum_dec;
    proportional = static_cast<int64_t>((num + sum_in - 1) / sum_in);
  } else {
    proportional = max_seqlen;
  }
  cap.dec = std::min(eval.Pad(std::max(longest_dec, proportional)), eval.Pad(max_seqlen));
  return cap;
}

std::vector<std::vector<int64_t>> NextFitRows(std::span<const Sample> samples,
                                              const StageCostEvaluator& eval, PackCapacity cap) {
  std::vector<std::vector<int64_t>> rows;
  int64_t used = 0, used_dec = 0;
  for (const Sample& s : samples) {
    const int64_t len = eval.SeqLen(s), dec = eval.DecLen(s);
    SLUICE_CHECK(len <= cap.enc && dec <= cap.dec);
    if (rows.empty() || !Fits(used, used_dec, len, dec, cap)) {
      rows.emplace_back();
      used = used_dec = 0;
    }
    rows.back().push_back(s.id);
    used += len;
    used_dec += dec;
  }
  return rows;
}

std::vector<std::vector<int64_t>> FirstFitDecreasingRows(std::span<const Sample> samples,
                                                         const StageCostEvaluator& eval,
                                                         PackCapacity cap) {
  std::vector<std::vector<int64_t>> rows;
  std::vector<std::pair<int64_t, int64_t>> used;  // (enc, dec) tokens per row
  for (const Sample& s : SortedByLengthDescending(samples, eval)) {
    const int64_t len = eval.SeqLen(s), dec = eval.DecLen(s);
    SLUICE_CHECK(len <= cap.enc && dec <= cap.dec);
    size_t r = 0;
    while (r < rows.size() && !Fits(used[r].first, used[r].second, len, dec, cap)) ++r;
    if (r == rows.size()) {
      rows.emplace_back();
      used.emplace_back(0, 0);
    }
    rows[r].push_back(s.id);
    used[r].first += len;
    used[r].second += dec;
  }
  return rows;
}

std::vector<std::vector<int64_t>> TokenBudgetGroups(std::span<const Sample> samples,
                                                    const StageCostEvaluator& eval, int64_t cap) {
  std::vector<std::vector<int64_t>> groups;
  int64_t max_len = 0, max_dec = 0;
  for (const Sample& s : samples) {
    const int64_t len = eval.Pad(eval.SeqLen(s));
    const int64_t dec = eval.DecLen(s) > 0 ? eval.Pad(eval.DecLen(s)) : 0;
    if (!groups.empty()) {
      const int64_t rows = static_cast<int64_t>(groups.back().size()) + 1;
      const int64_t padded = rows * (std::max(max_len, len) + std::max(max_dec, dec));
      if (padded > cap) groups.emplace_back();
    } else {
      groups.emplace_back();
    }
    if (groups.back().empty()) max_len = max_dec = 0;
    groups.back().push_back(s.id);
    max_len = std::max(max_len, len);
    max_dec = std::max(max_dec, dec);
  }
  return groups;
}

std::vector<int64_t> MicroBatchSizeCandidates(int64_t largest) {
  SLUICE_CHECK(largest >= 1);
  std::vector<int64_t> sizes;
  for (int64_t p = 1; p <= largest && p <= (int64_t{1} << 52); p *= 2) {
    sizes.push_back(p);
    if (p >= 2 && p + p / 2 <= largest) sizes.push_back(p + p / 2);
  }
  if (sizes.back() != largest) sizes.push_back(largest);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

}  // namespace sluice
