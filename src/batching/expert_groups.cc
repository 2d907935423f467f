#include "batching/expert_groups.h"

#include <fmt/core.h>

#include <algorithm>
#include <optional>
#include <tuple>
#include <utility>

namespace sluice {
namespace {

// The micro-batch's two halves (rows, or the samples of its single row); false when it holds one
// sample.
bool Halve(const MicroBatch& whole, MicroBatch* first, MicroBatch* second) {
  std::vector<std::vector<int64_t>> a, b;
  if (whole.rows.size() >= 2) {
    const size_t cut = (whole.rows.size() + 1) / 2;
    a.assign(whole.rows.begin(), whole.rows.begin() + static_cast<std::ptrdiff_t>(cut));
    b.assign(whole.rows.begin() + static_cast<std::ptrdiff_t>(cut), whole.rows.end());
  } else if (whole.rows.size() == 1 && whole.rows[0].size() >= 2) {
    const std::vector<int64_t>& row = whole.rows[0];
    const size_t cut = (row.size() + 1) / 2;
    a = {std::vector<int64_t>(row.begin(), row.begin() + static_cast<std::ptrdiff_t>(cut))};
    b = {std::vector<int64_t>(row.begin() + static_cast<std::ptrdiff_t>(cut), row.end())};
  } else {
    return false;
  }
  for (auto [half, rows] : {std::pair{first, &a}, std::pair{second, &b}}) {
    *half = MicroBatch{};
    half->rows = std::move(*rows);
    half->varlen = whole.varlen;
    half->recompute = whole.recompute;
    half->cp_class = whole.cp_class;
  }
  return true;
}

// Merges a micro-batch of `from` into one of `into` (the same vector: two of one replica;
// another: a micro-batch moves to another replica of the group and merges there): of the 64
// micro-batches of each with the shortest bottlenecks, the pair (of the same varlen and cp class)
// whose merge adds the least bottleneck time and keeps `into` within the memory rule
// (SequenceFitsMemory), at the higher recompute level of the two. False when no pair fits.
bool MergeCheapestPair(const StageCostEvaluator& eval, const BatchIndex& index,
                       std::vector<MicroBatch>* from, std::vector<MicroBatch>* into) {
  constexpr size_t kCandidates = 64;
  auto shortest = [&](const std::vector<MicroBatch>& mbs) {
    std::vector<size_t> order(mbs.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return mbs[a].Bottleneck() < mbs[b].Bottleneck(); });
    if (order.size() > kCandidates) order.resize(kCandidates);
    std::sort(order.begin(), order.end());
    return order;
  };
  const bool same = from == into;
  const std::vector<size_t> xs = shortest(*from);
  const std::vector<size_t> ys = same ? xs : shortest(*into);
  std::optional<std::tuple<Duration, size_t, size_t>> best;  // (extra time, x in from, y in into)
  std::optional<MicroBatch> best_merged;
  std::vector<MicroBatch> trial;
  for (size_t x : xs) {
    for (size_t y : ys) {
      if (same && y <= x) continue;
      const MicroBatch& a = (*from)[x];
      const MicroBatch& b = (*into)[y];
      if (a.varlen != b.varlen || a.cp_class != b.cp_class) continue;
      MicroBatch merged;
      // Own pairs keep their order (x before y); a moved micro-batch goes after the host's rows.
      merged.rows = same ? a.rows : b.rows;
      const std::vector<std::vector<int64_t>>& rest = same ? b.rows : a.rows;
      merged.rows.insert(merged.rows.end(), rest.begin(), rest.end());
      merged.varlen = a.varlen;
      merged.recompute = std::max(a.recompute, b.recompute);
      merged.cp_class = a.cp_class;
      if (!PriceMicroBatch(eval, index, &merged)) continue;
      const Duration extra = merged.Bottleneck() - a.Bottleneck() - b.Bottleneck();
      if (best.has_value() && !(extra < std::get<0>(*best))) continue;
      trial = *into;
      trial[y] = merged;
      if (same) trial.erase(trial.begin() + static_cast<std::ptrdiff_t>(x));
      if (!SequenceFitsMemory(eval, trial)) continue;
      best = std::make_tuple(extra, x, y);
      best_merged = std::move(merged);
    }
  }
  if (!best.has_value()) return false;
  (*into)[std::get<2>(*best)] = std::move(*best_merged);
  from->erase(from->begin() + static_cast<std::ptrdiff_t>(std::get<1>(*best)));
  return true;
}

}  // namespace

StatusOr<int64_t> EqualizeExpertGroups(BatchPlan* plan, std::span<const Sample> batch,
                                       const StageCostEvaluator& eval, int64_t ep) {
  const int64_t dp = static_cast<int64_t>(plan->replicas.size());
  if (ep <= 1 || dp <= 1) return int64_t{0};
  SLUICE_CHECK(dp % ep == 0);
  const BatchIndex index(batch);
  int64_t changes = 0;
  for (int64_t first = 0; first < dp; first += ep) {
    // The largest count, unless a member has fewer samples than that: then its sample count.
    size_t target = 0;
    for (int64_t d = first; d < first + ep; ++d) {
      target = std::max(target, plan->replicas[d].size());
    }
    for (int64_t d = first; d < first + ep; ++d) {
      size_t samples = 0;
      for (const MicroBatch& m : plan->replicas[d]) samples += static_cast<size_t>(m.num_samples());
      target = std::min(target, samples);
    }
    // Splits first, so that a replica that must merge across (below) meets members at the count.
    for (int64_t d = first; d < first + ep; ++d) {
      std::vector<MicroBatch>& mbs = plan->replicas[d];
      while (mbs.size() < target) {
        // The micro-batch with the most rows, then samples, then the longest bottleneck.
        auto key = [](const MicroBatch& m) {
          return std::make_tuple(m.rows.size(), m.num_samples(), m.Bottleneck());
        };
        size_t pick = mbs.size();
        for (size_t i = 0; i < mbs.size(); ++i) {
          if (mbs[i].num_samples() < 2) continue;
          if (pick == mbs.size() || key(mbs[pick]) < key(mbs[i])) pick = i;
        }
        MicroBatch a, b;
        SLUICE_CHECK(pick < mbs.size() && Halve(mbs[pick], &a, &b));  // target <= its samples
        for (MicroBatch* half : {&a, &b}) {
          if (!PriceMicroBatch(eval, index, half)) {
            return FailedPreconditionError(fmt::format(
                "expert parallelism: the cost model cannot price half of micro-batch {} of "
                "replica {} (split to give its expert-parallel group equal micro-batch counts)",
                pick, d));
          }
        }
        mbs[pick] = std::move(a);
        mbs.insert(mbs.begin() + static_cast<std::ptrdiff_t>(pick) + 1, std::move(b));
        ++changes;
      }
    }
    for (int64_t d = first; d < first + ep; ++d) {
      std::vector<MicroBatch>& mbs = plan->replicas[d];
      const size_t had = mbs.size();
      while (mbs.size() > target) {
        // Two of its own micro-batches, else one of them into another member's (the sample moves
        // to that replica): whichever fits at the smallest added time, own pairs first.
        bool merged = MergeCheapestPair(eval, index, &mbs, &mbs);
        for (int64_t e = first; e < first + ep && !merged; ++e) {
          if (e != d) merged = MergeCheapestPair(eval, index, &mbs, &plan->replicas[e]);
        }
        if (!merged) {
          return FailedPreconditionError(fmt::format(
              "expert parallelism: replicas {}-{} form an expert-parallel group (ep = {}) whose "
              "all-to-alls pair up one by one, so they need equal micro-batch counts; replica {} "
              "has {} micro-batches, but another member of its group holds only {} sample{} and "
              "no micro-batch of replica {} merges with another of the group within the memory "
              "limit; give the replicas more samples (more tokens per batch) or more memory",
              first, first + ep - 1, ep, d, had, target, target == 1 ? "" : "s", d));
        }
        ++changes;
      }
    }
  }
  return changes;
}

}  // namespace sluice
