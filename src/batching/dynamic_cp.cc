#include "batching/dynamic_cp.h"

#include <algorithm>
#include <numeric>
#include <vector>

namespace sluice {
namespace {

// Per-field maximum of two stage costs (sub-groups side by side).
ChunkCost Max(const ChunkCost& a, const ChunkCost& b) {
  ChunkCost c;
  c.forward = std::max(a.forward, b.forward);
  c.backward_input = std::max(a.backward_input, b.backward_input);
  c.backward_weight = std::max(a.backward_weight, b.backward_weight);
  c.stored = std::max(a.stored, b.stored);
  c.peak = std::max(a.peak, b.peak);
  c.stored_until_w = std::max(a.stored_until_w, b.stored_until_w);
  return c;
}

Duration Bottleneck(const std::vector<ChunkCost>& stages) {
  Duration worst;
  for (const ChunkCost& c : stages) worst = std::max(worst, c.forward + c.backward());
  return worst;
}

}  // namespace

int64_t ApplyDynamicCp(BatchPlan* plan, std::span<const Sample> batch,
                       const StageCostEvaluator& eval,
                       std::span<const std::shared_ptr<const StageCostEvaluator>> narrower) {
  const int64_t cp = eval.parallel().cp;
  if (cp <= 1 || narrower.empty()) return 0;
  const BatchIndex index(batch);
  const double h = static_cast<double>(eval.model().hidden);
  auto sample_cost = [&](int64_t id) {
    const double len = static_cast<double>(eval.SeqLen(index(id)));
    return len * len + 6 * h * len;
  };
  int64_t split = 0;
  for (std::vector<MicroBatch>& replica : plan->replicas) {
    for (MicroBatch& mb : replica) {
      // Units: samples of a varlen micro-batch, rows of a padded one.
      std::vector<std::vector<int64_t>> units;
      if (mb.varlen) {
        for (const auto& row : mb.rows) {
          for (int64_t id : row) units.push_back({id});
        }
      } else {
        units = mb.rows;
      }
      const int64_t n = static_cast<int64_t>(units.size());
      if (n < 2) continue;
      std::vector<double> cost(units.size(), 0);
      for (size_t u = 0; u < units.size(); ++u) {
        for (int64_t id : units[u]) cost[u] += sample_cost(id);
      }
      std::vector<size_t> order(units.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](size_t a, size_t b) { return cost[a] > cost[b]; });
      Duration best = Bottleneck(mb.stages);
      std::vector<ChunkCost> best_stages;
      int64_t best_k = 1;
      for (size_t j = 0; j < narrower.size(); ++j) {
        const int64_t k = int64_t{2} << j;
        if (k > n || k > cp) break;
        std::vector<std::vector<std::vector<int64_t>>> groups(static_cast<size_t>(k));
        std::vector<double> load(static_cast<size_t>(k), 0);
        for (size_t u : order) {
          const size_t g = static_cast<size_t>(
              std::min_element(load.begin(), load.end()) - load.begin());
          load[g] += cost[u];
          groups[g].push_back(units[u]);
        }
        std::vector<ChunkCost> combined;
        bool ok = true;
        for (const auto& g : groups) {
          MicroBatch sub;
          sub.varlen = mb.varlen;
          sub.recompute = mb.recompute;
          if (mb.varlen) {
            sub.rows.emplace_back();
            for (const auto& unit : g) sub.rows[0].push_back(unit[0]);
          } else {
            sub.rows = g;
          }
          if (!PriceMicroBatch(*narrower[j], index, &sub)) {
            ok = false;
            break;
          }
          if (combined.empty()) {
            combined = sub.stages;
          } else {
            for (size_t s = 0; s < combined.size(); ++s) combined[s] = Max(combined[s], sub.stages[s]);
          }
        }
        if (!ok || combined.size() != mb.stages.size()) continue;
        for (size_t s = 0; s < combined.size() && ok; ++s) {
          ok = combined[s].stored <= mb.stages[s].stored && combined[s].peak <= mb.stages[s].peak;
        }
        const Duration t = Bottleneck(combined);
        if (ok && t < best) {
          best = t;
          best_stages = std::move(combined);
          best_k = k;
        }
      }
      if (best_k > 1) {
        for (size_t s = 0; s < best_stages.size(); ++s) {
          best_stages[s].stored_until_w = mb.stages[s].stored_until_w;
        }
        mb.stages = std::move(best_stages);
        mb.cp_split = best_k;
        ++split;
      }
    }
  }
  return split;
}

}  // namespace sluice
