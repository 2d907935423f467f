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

// The 64 micro-batches of `mbs` with the shortest bottlenecks, in index order.
std::vector<size_t> Shortest(const std::vector<MicroBatch>& mbs) {
  constexpr size_t kCandidates = 64;
  std::vector<size_t> order(mbs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return mbs[a].Bottleneck() < mbs[b].Bottleneck(); });
  if (order.size() > kCandidates) order.resize(kCandidates);
  std::sort(order.begin(), order.end());
  return order;
}

// `mbs` without its micro-batch `x` fits the memory rule.
bool FitsWithout(const StageCostEvaluator& eval, const std::vector<MicroBatch>& mbs, size_t x) {
  std::vector<MicroBatch> trial = mbs;
  trial.erase(trial.begin() + static_cast<std::ptrdiff_t>(x));
  return SequenceFitsMemory(eval, trial);
}

// Merges a micro-batch of `from` into one of `into` (the same vector: two of one replica;
// another: a micro-batch moves to another replica of the group and merges there): of the 64
// micro-batches of each with the shortest bottlenecks, the pair (of the same varlen and cp class)
// whose merge adds the least bottleneck time and keeps both replicas within the memory rule
// (SequenceFitsMemory), at the higher recompute level of the two. False when no pair fits.
bool MergeCheapestPair(const StageCostEvaluator& eval, const BatchIndex& index,
                       std::vector<MicroBatch>* from, std::vector<MicroBatch>* into) {
  const bool same = from == into;
  const std::vector<size_t> xs = Shortest(*from);
  const std::vector<size_t> ys = same ? xs : Shortest(*into);
  struct Candidate {
    Duration extra;
    size_t x, y;
    MicroBatch merged;
  };
  std::vector<Candidate> candidates;
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
      candidates.push_back({extra, x, y, std::move(merged)});
    }
  }
  // The cheapest first (ties: the first pair in index order); the first that fits is taken.
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& a, const Candidate& b) { return a.extra < b.extra; });
  for (Candidate& c : candidates) {
    std::vector<MicroBatch> trial = *into;
    trial[c.y] = c.merged;
    if (same) trial.erase(trial.begin() + static_cast<std::ptrdiff_t>(c.x));
    if (!SequenceFitsMemory(eval, trial)) continue;
    if (!same && !FitsWithout(eval, *from, c.x)) continue;
    (*into)[c.y] = std::move(c.merged);
    from->erase(from->begin() + static_cast<std::ptrdiff_t>(c.x));
    return true;
  }
  return false;
}

// Moves a micro-batch from `from` to the end of `into`: the one with the shortest bottleneck that
// keeps both replicas within the memory rule. False when none does.
bool MoveShortest(const StageCostEvaluator& eval, std::vector<MicroBatch>* from,
                  std::vector<MicroBatch>* into) {
  std::vector<size_t> order(from->size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return (*from)[a].Bottleneck() < (*from)[b].Bottleneck();
  });
  for (size_t x : order) {
    std::vector<MicroBatch> trial = *into;
    trial.push_back((*from)[x]);
    if (!SequenceFitsMemory(eval, trial) || !FitsWithout(eval, *from, x)) continue;
    into->push_back(std::move((*from)[x]));
    from->erase(from->begin() + static_cast<std::ptrdiff_t>(x));
    return true;
  }
  return false;
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
    std::vector<std::vector<MicroBatch>*> group;
    for (int64_t d = first; d < first + ep; ++d) group.push_back(&plan->replicas[d]);
    auto count = [&](size_t m) { return group[m]->size(); };
    // Each pass splits, moves or merges; a move narrows the spread of the counts and a merge
    // lowers the largest, so the passes end.
    while (true) {
      size_t target = 0;
      for (size_t m = 0; m < group.size(); ++m) target = std::max(target, count(m));
      // 1. Below the largest count: split while a micro-batch holds two samples or more.
      for (size_t m = 0; m < group.size(); ++m) {
        std::vector<MicroBatch>& mbs = *group[m];
        while (mbs.size() < target) {
          // The micro-batch with the most rows, then samples, then the longest bottleneck.
          auto key = [](const MicroBatch& x) {
            return std::make_tuple(x.rows.size(), x.num_samples(), x.Bottleneck());
          };
          size_t pick = mbs.size();
          for (size_t i = 0; i < mbs.size(); ++i) {
            if (mbs[i].num_samples() < 2) continue;
            if (pick == mbs.size() || key(mbs[pick]) < key(mbs[i])) pick = i;
          }
          MicroBatch a, b;
          if (pick == mbs.size() || !Halve(mbs[pick], &a, &b)) break;  // one sample each
          for (MicroBatch* half : {&a, &b}) {
            if (!PriceMicroBatch(eval, index, half)) {
              return FailedPreconditionError(fmt::format(
                  "expert parallelism: the cost model cannot price half of micro-batch {} of "
                  "replica {} (split to give its expert-parallel group equal micro-batch counts)",
                  pick, first + static_cast<int64_t>(m)));
            }
          }
          mbs[pick] = std::move(a);
          mbs.insert(mbs.begin() + static_cast<std::ptrdiff_t>(pick) + 1, std::move(b));
          ++changes;
        }
      }
      size_t low = 0, high = 0;
      for (size_t m = 0; m < group.size(); ++m) {
        if (count(m) < count(low)) low = m;
        if (count(m) > count(high)) high = m;
      }
      if (count(low) == count(high)) break;
      // 2. A member of one-sample micro-batches stays below: two or more below the largest count,
      //    it takes one of the fullest member's micro-batches.
      if (count(high) - count(low) >= 2 && MoveShortest(eval, group[high], group[low])) {
        ++changes;
        continue;
      }
      // 3. Else every member at the largest count loses one: two of its own micro-batches merge,
      //    or one of them merges into another member's.
      for (size_t m = 0; m < group.size(); ++m) {
        if (count(m) != target) continue;
        bool merged = MergeCheapestPair(eval, index, group[m], group[m]);
        for (size_t e = 0; e < group.size() && !merged; ++e) {
          if (e != m) merged = MergeCheapestPair(eval, index, group[m], group[e]);
        }
        if (!merged) {
          return FailedPreconditionError(fmt::format(
              "expert parallelism: replicas {}-{} form an expert-parallel group (ep = {}) whose "
              "all-to-alls pair up one by one, so they need equal micro-batch counts; replica {} "
              "has {} micro-batches and replica {} only {} of one sample each, and no micro-batch "
              "of replica {} merges with another of the group (within the memory limit, priced "
              "by the cost model) or moves; give the replicas more samples (more tokens per "
              "batch) or more memory",
              first, first + ep - 1, ep, first + static_cast<int64_t>(m), target,
              first + static_cast<int64_t>(low), count(low), first + static_cast<int64_t>(m)));
        }
        ++changes;
      }
    }
  }
  return changes;
}

}  // namespace sluice
