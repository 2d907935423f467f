#include "batching/dynamic_cp.h"

#include <algorithm>
#include <numeric>
#include <vector>

namespace sluice {
namespace {

using Units = std::vector<std::vector<int64_t>>;  // sample ids per unit

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

// Longest-processing-time spread of the units (visited in `order`) over k sub-groups.
std::vector<Units> Spread(const Units& units, const std::vector<double>& cost,
                          const std::vector<size_t>& order, int64_t k) {
  std::vector<Units> groups(static_cast<size_t>(k));
  std::vector<double> load(static_cast<size_t>(k), 0);
  for (size_t u : order) {
    const size_t g = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[g] += cost[u];
    groups[g].push_back(units[u]);
  }
  return groups;
}

// The per-stage costs of `groups` side by side on `narrow` (empty when one does not price).
std::vector<ChunkCost> PriceSplit(const std::vector<Units>& groups, const MicroBatch& mb,
                                  const StageCostEvaluator& narrow, const BatchIndex& index) {
  std::vector<ChunkCost> combined;
  for (const Units& g : groups) {
    MicroBatch sub;
    sub.varlen = mb.varlen;
    sub.recompute = mb.recompute;
    if (mb.varlen) {
      sub.rows.emplace_back();
      for (const auto& unit : g) sub.rows[0].push_back(unit[0]);
    } else {
      sub.rows = g;
    }
    if (!PriceMicroBatch(narrow, index, &sub)) return {};
    if (combined.empty()) {
      combined = sub.stages;
    } else {
      if (sub.stages.size() != combined.size()) return {};
      for (size_t s = 0; s < combined.size(); ++s) combined[s] = Max(combined[s], sub.stages[s]);
    }
  }
  if (combined.size() != mb.stages.size()) return {};
  for (size_t s = 0; s < combined.size(); ++s) {
    combined[s].stored_until_w = mb.stages[s].stored_until_w;
  }
  return combined;
}

bool NoGrowth(const std::vector<ChunkCost>& split, const std::vector<ChunkCost>& whole) {
  for (size_t s = 0; s < split.size(); ++s) {
    if (split[s].stored > whole[s].stored || split[s].peak > whole[s].peak) return false;
  }
  return true;
}

int64_t NextPowerOfTwo(int64_t x) {
  int64_t p = 1;
  while (p < x) p *= 2;
  return p;
}

}  // namespace

bool FitsInAnyOrder(const StageCostEvaluator& eval, std::span<const MicroBatch> micro_batches) {
  const int64_t m = static_cast<int64_t>(micro_batches.size());
  if (m == 0) return true;
  std::vector<Bytes> kept(static_cast<size_t>(m));
  for (int64_t s = 0; s < eval.pp(); ++s) {
    const int64_t k = eval.InFlight(s, m);
    Bytes running, transient;
    for (int64_t i = 0; i < m; ++i) {
      const MicroBatch& mb = micro_batches[i];
      if (static_cast<int64_t>(mb.stages.size()) != eval.pp()) return false;
      const Bytes held = eval.HeldBuffers(mb.shape, s);
      kept[i] = mb.stages[s].stored + held;
      running = std::max(running, mb.stages[s].peak + held);
      transient = std::max(transient, eval.TransientBuffers(mb.shape, s));
    }
    const int64_t others = std::clamp<int64_t>(k - 1, 0, m);
    std::partial_sort(kept.begin(), kept.begin() + others, kept.end(), std::greater<Bytes>());
    Bytes need = running + transient;
    for (int64_t i = 0; i < others; ++i) need += kept[i];
    if (need > eval.ActivationBudget(s)) return false;
  }
  return true;
}

int64_t ApplyDynamicCp(BatchPlan* plan, std::span<const Sample> batch,
                       const StageCostEvaluator& eval,
                       std::span<const std::shared_ptr<const StageCostEvaluator>> narrower,
                       DynamicCpRule rule) {
  const int64_t cp = eval.parallel().cp;
  if (cp <= 1 || narrower.empty()) return 0;
  const BatchIndex index(batch);
  const double h = static_cast<double>(eval.model().hidden);
  const bool megatron = rule == DynamicCpRule::kMegatronLength;
  auto sample_cost = [&](int64_t id) {
    const double len = static_cast<double>(eval.SeqLen(index(id)));
    return megatron ? len * len : len * len + 6 * h * len;
  };
  // Megatron's max_seqlen_per_rank: the largest micro-batch's tokens over the cp ranks.
  int64_t per_rank = 1;
  if (megatron) {
    int64_t largest = 1;
    for (const auto& replica : plan->replicas) {
      for (const MicroBatch& mb : replica) {
        int64_t tokens = 0;
        for (const auto& row : mb.rows) {
          for (int64_t id : row) tokens += eval.SeqLen(index(id));
        }
        largest = std::max(largest, tokens);
      }
    }
    per_rank = std::max<int64_t>(1, (largest + cp - 1) / cp);
  }
  int64_t split = 0;
  for (std::vector<MicroBatch>& replica : plan->replicas) {
    for (MicroBatch& mb : replica) {
      // Units: samples of a varlen micro-batch, rows of a padded one.
      Units units;
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
      std::vector<int64_t> ks;  // candidate splits
      if (megatron) {
        int64_t need = mb.cp_class;  // gbpc packs know their class
        for (const Units::value_type& unit : units) {
          for (int64_t id : unit) {
            if (mb.cp_class > 0) break;
            need =
                std::max(need, NextPowerOfTwo((eval.SeqLen(index(id)) + per_rank - 1) / per_rank));
          }
        }
        need = std::max<int64_t>(need, 1);
        int64_t k = cp / std::min(cp, need);
        while (k > n) k /= 2;
        if (k >= 2) ks.push_back(k);
      } else {
        for (int64_t k = 2; k <= std::min(cp, n); k *= 2) ks.push_back(k);
      }
      // Candidates that price, fastest first (Megatron's rule: its one k).
      struct Option {
        Duration time;
        int64_t k;
        std::vector<ChunkCost> stages;
      };
      std::vector<Option> options;
      const Duration whole = Bottleneck(mb.stages);
      for (int64_t k : ks) {
        size_t j = 0;
        while ((int64_t{2} << j) < k) ++j;
        if (j >= narrower.size()) break;
        std::vector<ChunkCost> stages =
            PriceSplit(Spread(units, cost, order, k), mb, *narrower[j], index);
        if (stages.empty()) continue;
        const Duration t = Bottleneck(stages);
        if (!megatron && t >= whole) continue;
        options.push_back({t, k, std::move(stages)});
      }
      std::stable_sort(options.begin(), options.end(),
                       [](const Option& a, const Option& b) { return a.time < b.time; });
      for (Option& o : options) {
        std::vector<ChunkCost> before = mb.stages;
        const bool grows = !NoGrowth(o.stages, before);
        mb.stages = std::move(o.stages);
        if (grows && !FitsInAnyOrder(eval, replica)) {
          mb.stages = std::move(before);
          continue;
        }
        mb.cp_split = o.k;
        ++split;
        break;
      }
    }
  }
  return split;
}

}  // namespace sluice
