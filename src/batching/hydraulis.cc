// Hydraulis stage 1 (hydraulis.h): sequences spread over the data-parallel replicas, and the
// assigner and micro-batcher objects of method.h. Stage 2 is hydraulis_pack.cc, the min-max
// partition hydraulis_partition.cc.
#include "batching/hydraulis.h"

#include <algorithm>
#include <memory>
#include <numeric>
#include <utility>

#include "base/rng.h"
#include "batching/assigners.h"

namespace sluice {
namespace {

class HydraulisAssigner final : public Assigner {
 public:
  std::string_view name() const override { return "hydraulis"; }
  std::vector<std::vector<Sample>> Assign(std::span<const Sample> batch,
                                          const StageCostEvaluator& eval,
                                          const BatchingOptions& options) const override {
    const int64_t dp = std::max<int64_t>(1, eval.parallel().dp);
    const std::vector<int64_t> cost = EstimateSampleCosts(batch, eval, options);
    const Dispatch d =
        HydraulisDispatch(cost, dp, eval.pp(), options.hydraulis_shuffles, options.seed);
    return GatherReplicas(batch, d.replica_of, dp);
  }
};

class HydraulisBatcher final : public MicroBatcher {
 public:
  std::string_view name() const override { return "hydraulis"; }
  StatusOr<ReplicaBatches> Build(std::span<const Sample> samples, const StageCostEvaluator& eval,
                                 const BatchingOptions& options, int64_t replicas) const override {
    return HydraulisPackReplica(samples, eval, options, nullptr);
  }
};

}  // namespace

std::unique_ptr<Assigner> MakeHydraulisAssigner() { return std::make_unique<HydraulisAssigner>(); }
std::unique_ptr<MicroBatcher> MakeHydraulisBatcher() {
  return std::make_unique<HydraulisBatcher>();
}

int64_t DispatchMaxTime(std::span<const int64_t> cost, std::span<const int64_t> replica_of,
                        int64_t replicas, int64_t pp) {
  std::vector<int64_t> sum(replicas, 0), mx(replicas, 0);
  for (size_t i = 0; i < cost.size(); ++i) {
    sum[replica_of[i]] += cost[i];
    mx[replica_of[i]] = std::max(mx[replica_of[i]], cost[i]);
  }
  int64_t worst = 0;
  for (int64_t r = 0; r < replicas; ++r) worst = std::max(worst, sum[r] + (pp - 1) * mx[r]);
  return worst;
}

Dispatch HydraulisDispatch(std::span<const int64_t> cost, int64_t replicas, int64_t pp,
                           int64_t shuffles, uint64_t seed) {
  SLUICE_CHECK(replicas >= 1 && pp >= 1);
  const size_t n = cost.size();
  const Rng base(seed);
  Dispatch best;
  bool have = false;
  std::vector<int64_t> order(n), replica_of(n);
  std::vector<int64_t> sum(replicas), mx(replicas), count(replicas), t(replicas);
  for (int64_t k = 0; k < std::max<int64_t>(1, shuffles); ++k) {
    Rng rng = base.Fork(static_cast<uint64_t>(k));
    std::iota(order.begin(), order.end(), 0);
    rng.Shuffle(order);
    std::fill(sum.begin(), sum.end(), 0);
    std::fill(mx.begin(), mx.end(), 0);
    std::fill(count.begin(), count.end(), 0);
    std::fill(t.begin(), t.end(), 0);
    for (int64_t i : order) {
      // The two largest T_r: the resulting global max when r grows is max(T_r', max of others).
      int64_t first = 0, second = -1;
      for (int64_t r = 1; r < replicas; ++r) {
        if (t[r] > t[first]) {
          second = first;
          first = r;
        } else if (second < 0 || t[r] > t[second]) {
          second = r;
        }
      }
      int64_t pick = -1, pick_max = 0, pick_t = 0;
      bool pick_empty = false;
      for (int64_t r = 0; r < replicas; ++r) {
        const int64_t t_new = sum[r] + cost[i] + (pp - 1) * std::max(mx[r], cost[i]);
        const int64_t others = r == first ? (second < 0 ? 0 : t[second]) : t[first];
        const int64_t global = std::max(t_new, others);
        const bool empty = count[r] == 0;
        const bool better = pick < 0 || global < pick_max ||
                            (global == pick_max && empty && !pick_empty) ||
                            (global == pick_max && empty == pick_empty && t_new < pick_t);
        if (better) {
          pick = r, pick_max = global, pick_t = t_new, pick_empty = empty;
        }
      }
      replica_of[i] = pick;
      sum[pick] += cost[i];
      mx[pick] = std::max(mx[pick], cost[i]);
      ++count[pick];
      t[pick] = pick_t;
    }
    const int64_t max_time = *std::max_element(t.begin(), t.end());
    const bool all_nonempty =
        std::all_of(count.begin(), count.end(), [](int64_t c) { return c > 0; });
    const bool better = !have || (all_nonempty && !best.all_nonempty) ||
                        (all_nonempty == best.all_nonempty && max_time < best.max_time);
    if (better) {
      best = Dispatch{replica_of, max_time, all_nonempty};
      have = true;
    }
  }
  return best;
}

}  // namespace sluice
