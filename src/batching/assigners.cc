#include "batching/assigners.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <string_view>

namespace sluice {
namespace {

// Tokens of the micro-batch a sample's cost share is taken from (padded estimates).
constexpr int64_t kShareTokens = 4096;

class ContiguousAssigner final : public Assigner {
 public:
  std::string_view name() const override { return "contiguous"; }
  std::vector<std::vector<Sample>> Assign(std::span<const Sample> batch,
                                          const StageCostEvaluator& eval,
                                          const BatchingOptions& options) const override {
    const int64_t dp = std::max<int64_t>(1, eval.parallel().dp);
    const int64_t n = static_cast<int64_t>(batch.size());
    std::vector<std::vector<Sample>> out(static_cast<size_t>(dp));
    int64_t start = 0;
    for (int64_t r = 0; r < dp; ++r) {
      const int64_t size = n / dp + (r < n % dp ? 1 : 0);
      out[r].assign(batch.begin() + start, batch.begin() + start + size);
      start += size;
    }
    return out;
  }
};

class BalancedAssigner final : public Assigner {
 public:
  std::string_view name() const override { return "balanced"; }
  std::vector<std::vector<Sample>> Assign(std::span<const Sample> batch,
                                          const StageCostEvaluator& eval,
                                          const BatchingOptions& options) const override {
    const int64_t dp = std::max<int64_t>(1, eval.parallel().dp);
    const std::vector<int64_t> cost = EstimateSampleCosts(batch, eval, options);
    std::vector<int64_t> order(batch.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t x, int64_t y) { return cost[x] > cost[y]; });
    std::vector<int64_t> load(static_cast<size_t>(dp), 0);
    std::vector<int64_t> replica_of(batch.size(), 0);
    for (int64_t i : order) {
      const int64_t r = std::min_element(load.begin(), load.end()) - load.begin();
      replica_of[i] = r;
      load[r] += cost[i];
    }
    return GatherReplicas(batch, replica_of, dp);
  }
};

}  // namespace

std::unique_ptr<Assigner> MakeContiguousAssigner() {
  return std::make_unique<ContiguousAssigner>();
}
std::unique_ptr<Assigner> MakeBalancedAssigner() { return std::make_unique<BalancedAssigner>(); }

std::vector<int64_t> EstimateSampleCosts(std::span<const Sample> samples,
                                         const StageCostEvaluator& eval,
                                         const BatchingOptions& options) {
  const Recompute rc = options.recompute.value_or(Recompute::kNone);
  std::vector<int64_t> cost(samples.size(), 0);
  const StageCostEvaluator::Quadratic q = eval.BottleneckQuadratic(rc);  // zero without a fit
  if (!eval.model().is_encoder_decoder() && eval.varlen_supported() && (q.a > 0 || q.b > 0)) {
    for (size_t i = 0; i < samples.size(); ++i) {
      const double s = static_cast<double>(eval.SeqLen(samples[i]));
      const double ms = q.a * s * s + q.b * s;
      cost[i] = std::max<int64_t>(1, Duration::Millis(ms).nanos());
    }
    return cost;
  }
  // Price each sample's share of a micro-batch of about kShareTokens tokens of copies of it
  // (amortising the per-micro-batch floor); memoised by padded lengths. Remember the priced
  // sample with the most tokens for those the cost model cannot price.
  std::vector<bool> priced(samples.size(), false);
  std::map<std::pair<int64_t, int64_t>, int64_t> memo;  // (Pad(len), Pad(dec)) -> ns, 0 = none
  int64_t ref_tokens = 0, ref_cost = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    const int64_t len = eval.Pad(std::max<int64_t>(1, eval.SeqLen(samples[i])));
    const int64_t dec = eval.model().is_encoder_decoder()
                            ? eval.Pad(std::max<int64_t>(1, eval.DecLen(samples[i])))
                            : 0;
    auto [it, fresh] = memo.try_emplace({len, dec}, 0);
    if (fresh) {
      for (int64_t copies = std::max<int64_t>(1, kShareTokens / (len + dec)); copies >= 1;
           copies /= 2) {
        const CostSummary summary = eval.Summarize(LayerShape{copies, len, dec}, rc, 1);
        // An answer that breaks the memory rule still estimates time; only unanswered lookups
        // (bottleneck zero) try fewer copies.
        if (summary.bottleneck > Duration::Zero() && !summary.bottleneck.is_infinite()) {
          it->second = std::max<int64_t>(1, summary.bottleneck.nanos() / copies);
          break;
        }
      }
    }
    if (it->second == 0) continue;
    priced[i] = true;
    cost[i] = it->second;
    const int64_t tokens = samples[i].tokens();
    if (tokens > ref_tokens) {
      ref_tokens = tokens;
      ref_cost = cost[i];
    }
  }
  for (size_t i = 0; i < samples.size(); ++i) {
    if (priced[i]) continue;
    const int64_t tokens = std::max<int64_t>(1, samples[i].tokens());
    cost[i] = ref_tokens > 0
                  ? std::max<int64_t>(
                        1, static_cast<int64_t>(std::llround(static_cast<double>(ref_cost) *
                                                             static_cast<double>(tokens) /
                                                             static_cast<double>(ref_tokens))))
                  : tokens;
  }
  return cost;
}

std::vector<std::vector<Sample>> GatherReplicas(std::span<const Sample> batch,
                                                std::span<const int64_t> replica_of,
                                                int64_t replicas) {
  std::vector<std::vector<Sample>> out(static_cast<size_t>(replicas));
  for (size_t i = 0; i < batch.size(); ++i) out[replica_of[i]].push_back(batch[i]);
  return out;
}

}  // namespace sluice
