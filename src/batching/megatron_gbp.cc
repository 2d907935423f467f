#include "batching/megatron_gbp.h"

#include <fmt/core.h>

#include <algorithm>
#include <numeric>

#include "batching/baseline_search.h"
#include "batching/baselines.h"
#include "batching/micro_batch.h"

namespace sluice {
namespace {

// lo, the round caps (2^j and 3 x 2^(j-1)) strictly between, and largest.
std::vector<int64_t> PackCaps(int64_t lo, int64_t largest) {
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

class GlobalBatchPackingBatcher final : public MicroBatcher {
 public:
  explicit GlobalBatchPackingBatcher(bool by_cp_class) : by_cp_class_(by_cp_class) {}
  std::string_view name() const override { return by_cp_class_ ? "gbpc" : "gbp"; }
  StatusOr<ReplicaBatches> Build(std::span<const Sample> samples, const StageCostEvaluator& eval,
                                 const BatchingOptions& options, int64_t replicas) const override {
    if (eval.model().is_encoder_decoder() || !eval.varlen_supported()) {
      return InvalidArgumentError(fmt::format(
          "megatron-gbp packs decoder-only sequences into THD rows with per-sample attention; "
          "model '{}' {}",
          eval.model().name,
          eval.model().is_encoder_decoder() ? "is encoder-decoder"
                                            : "has no varlen pricing in this cost model"));
    }
    SLUICE_ASSIGN_OR_RETURN(const int64_t max_seqlen, CheckSampleLengths(samples, eval, options));
    if (samples.empty()) return ReplicaBatches{};
    const BatchIndex index(samples);
    int64_t lo = 1;
    for (const Sample& s : samples) lo = std::max(lo, eval.Pad(eval.SeqLen(s)));
    BaselineSearchSpace space;
    space.levels = RecomputeLevels(options);
    space.lo = lo;
    space.hi = std::max(lo, max_seqlen);
    space.candidates = PackCaps;
    space.param_name = "pack cap";
    const int64_t bins = std::max<int64_t>(1, replicas);
    const int64_t cp = by_cp_class_ ? eval.parallel().cp : 1;
    const MicroBatchBuilder build = [&](int64_t cap, Recompute rc, std::vector<MicroBatch>* out) {
      out->clear();
      for (std::vector<int64_t>& pack : BalancedGlobalPacks(samples, eval, cap, bins, cp)) {
        MicroBatch mb;
        if (cp > 1) mb.cp_class = CpClass(eval.SeqLen(index(pack[0])), cap, cp);
        mb.rows.push_back(std::move(pack));
        mb.varlen = true;
        mb.recompute = rc;
        if (!PriceMicroBatch(eval, index, &mb)) return false;
        out->push_back(std::move(mb));
      }
      return true;
    };
    return SearchFastestBaseline(eval, space, build, by_cp_class_ ? "gbpc" : "megatron-gbp");
  }

 private:
  bool by_cp_class_;
};



}  // namespace

std::unique_ptr<MicroBatcher> MakeGlobalBatchPackingBatcher() {
  return std::make_unique<GlobalBatchPackingBatcher>(false);
}

std::unique_ptr<MicroBatcher> MakeCpClassPackingBatcher() {
  return std::make_unique<GlobalBatchPackingBatcher>(true);
}

int64_t CpClass(int64_t len, int64_t cap, int64_t cp) {
  if (cp <= 1) return 1;
  const int64_t per_rank = std::max<int64_t>(1, cap / cp);
  const int64_t ranks = (len + per_rank - 1) / per_rank;
  int64_t c = 1;
  while (c < ranks && c < cp) c *= 2;
  return std::min(c, cp);
}

std::vector<std::vector<int64_t>> BalancedGlobalPacks(std::span<const Sample> samples,
                                                      const StageCostEvaluator& eval, int64_t cap,
                                                      int64_t replicas, int64_t cp) {
  auto cp_class = [&](int64_t len) { return CpClass(len, cap, cp); };
  int64_t tokens = 0;
  std::vector<int64_t> order(samples.size());
  std::iota(order.begin(), order.end(), 0);
  for (const Sample& s : samples) tokens += eval.SeqLen(s);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    const int64_t la = eval.SeqLen(samples[a]), lb = eval.SeqLen(samples[b]);
    return la != lb ? la > lb : samples[a].id < samples[b].id;
  });
  int64_t packs = std::max<int64_t>(1, (tokens + cap - 1) / cap);
  packs = (packs + replicas - 1) / replicas * replicas;
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(packs));
  std::vector<int64_t> used(out.size(), 0);
  std::vector<double> work(out.size(), 0);
  std::vector<int64_t> klass(out.size(), 0);  // 0: empty, any class
  for (int64_t i : order) {
    const int64_t len = eval.SeqLen(samples[i]);
    const int64_t c = cp_class(len);
    int64_t best = -1;
    for (size_t p = 0; p < out.size(); ++p) {
      if (used[p] + len > cap || (klass[p] != 0 && klass[p] != c)) continue;
      if (best < 0 || work[p] < work[best]) best = static_cast<int64_t>(p);
    }
    if (best < 0) {
      best = static_cast<int64_t>(out.size());
      out.resize(out.size() + static_cast<size_t>(replicas));
      used.resize(out.size(), 0);
      work.resize(out.size(), 0);
      klass.resize(out.size(), 0);
    }
    klass[best] = c;
    out[best].push_back(samples[i].id);
    used[best] += len;
    work[best] += static_cast<double>(len) * static_cast<double>(len);
  }
  out.erase(std::remove_if(out.begin(), out.end(), [](const auto& p) { return p.empty(); }),
            out.end());
  return out;
}

}  // namespace sluice
