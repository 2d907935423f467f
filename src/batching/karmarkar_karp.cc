#include "batching/karmarkar_karp.h"

#include <fmt/core.h>

#include <algorithm>
#include <numeric>
#include <queue>

#include "batching/dynapipe_batcher.h"

namespace sluice {
namespace {

// A bin of a partial partition: its sum and a linked list of items (head/tail into `next`).
struct Bin {
  int64_t sum = 0;
  int64_t head = -1;
  int64_t tail = -1;
};

// Bins sorted by sum descending; ties keep the earlier position.
void SortBins(std::vector<Bin>* bins) {
  std::stable_sort(bins->begin(), bins->end(),
                   [](const Bin& a, const Bin& b) { return a.sum > b.sum; });
}

// Puts each bin's items in ascending order and orders bins by their first item, empty bins last.
std::vector<std::vector<int64_t>> Canonical(std::vector<std::vector<int64_t>> bins) {
  for (std::vector<int64_t>& b : bins) std::sort(b.begin(), b.end());
  std::stable_sort(bins.begin(), bins.end(), [](const auto& a, const auto& b) {
    if (a.empty() != b.empty()) return b.empty();
    return !a.empty() && a.front() < b.front();
  });
  return bins;
}

// Local refinement: moves one item out of the heaviest bin, or swaps one of its items with a
// lighter one of another bin, while that lowers the heaviest bin's sum (the best such change
// first; ties to the lowest bin and item positions). Each step lowers the sorted vector of bin
// sums lexicographically, so it terminates.
void Refine(std::span<const int64_t> w, std::vector<std::vector<int64_t>>* bins) {
  const size_t k = bins->size();
  std::vector<int64_t> sums(k, 0);
  for (size_t b = 0; b < k; ++b) {
    for (int64_t i : (*bins)[b]) sums[b] += w[i];
  }
  for (;;) {
    const size_t h = static_cast<size_t>(std::max_element(sums.begin(), sums.end()) - sums.begin());
    int64_t best = sums[h];  // the larger of the two touched sums after the change
    size_t best_bin = k, best_x = 0, best_y = 0;
    bool swap = false;
    const std::vector<int64_t>& hb = (*bins)[h];
    for (size_t b = 0; b < k; ++b) {
      if (b == h) continue;
      const std::vector<int64_t>& lb = (*bins)[b];
      for (size_t x = 0; x < hb.size(); ++x) {
        const int64_t move = std::max(sums[h] - w[hb[x]], sums[b] + w[hb[x]]);
        if (move < best) {
          best = move;
          best_bin = b;
          best_x = x;
          swap = false;
        }
        for (size_t y = 0; y < lb.size(); ++y) {
          const int64_t delta = w[hb[x]] - w[lb[y]];
          if (delta <= 0) continue;
          const int64_t v = std::max(sums[h] - delta, sums[b] + delta);
          if (v < best) {
            best = v;
            best_bin = b;
            best_x = x;
            best_y = y;
            swap = true;
          }
        }
      }
    }
    if (best_bin == k) return;
    std::vector<int64_t>& from = (*bins)[h];
    std::vector<int64_t>& to = (*bins)[best_bin];
    const int64_t item = from[best_x];
    if (swap) {
      const int64_t other = to[best_y];
      sums[h] += w[other] - w[item];
      sums[best_bin] += w[item] - w[other];
      from[best_x] = other;
      to[best_y] = item;
    } else {
      sums[h] -= w[item];
      sums[best_bin] += w[item];
      from.erase(from.begin() + static_cast<std::ptrdiff_t>(best_x));
      to.push_back(item);
    }
  }
}

}  // namespace

std::vector<std::vector<int64_t>> KarmarkarKarpPartition(std::span<const int64_t> weights,
                                                         int64_t bins) {
  SLUICE_CHECK(bins >= 1);
  const int64_t n = static_cast<int64_t>(weights.size());
  std::vector<int64_t> next(static_cast<size_t>(n), -1);
  // Partial partitions, each `bins` bins sorted by sum descending.
  std::vector<std::vector<Bin>> parts;
  parts.reserve(static_cast<size_t>(2 * n));
  using Key = std::pair<int64_t, int64_t>;  // (spread, -id): largest spread, then oldest
  std::priority_queue<Key> queue;
  for (int64_t i = 0; i < n; ++i) {
    SLUICE_CHECK(weights[i] >= 0);
    std::vector<Bin> p(static_cast<size_t>(bins));
    p[0] = Bin{weights[i], i, i};
    queue.push({weights[i], -static_cast<int64_t>(parts.size())});
    parts.push_back(std::move(p));
  }
  while (queue.size() > 1) {
    const int64_t a = -queue.top().second;
    queue.pop();
    const int64_t b = -queue.top().second;
    queue.pop();
    std::vector<Bin> merged(static_cast<size_t>(bins));
    for (int64_t k = 0; k < bins; ++k) {
      const Bin& x = parts[a][k];
      const Bin& y = parts[b][bins - 1 - k];
      Bin m{x.sum + y.sum, x.head, x.tail};
      if (y.head >= 0) {
        if (m.head < 0) {
          m.head = y.head;
        } else {
          next[m.tail] = y.head;
        }
        m.tail = y.tail;
      }
      merged[k] = m;
    }
    SortBins(&merged);
    const int64_t spread = merged.front().sum - merged.back().sum;
    queue.push({spread, -static_cast<int64_t>(parts.size())});
    parts.push_back(std::move(merged));
    parts[a].clear();
    parts[b].clear();
  }
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(bins));
  if (!queue.empty()) {
    const std::vector<Bin>& last = parts[-queue.top().second];
    for (int64_t k = 0; k < bins; ++k) {
      for (int64_t i = last[k].head; i >= 0; i = i == last[k].tail ? -1 : next[i]) {
        out[k].push_back(i);
      }
    }
  }
  Refine(weights, &out);
  return Canonical(std::move(out));
}

std::vector<std::vector<int64_t>> GreedyLptPartition(std::span<const int64_t> weights,
                                                     int64_t bins) {
  SLUICE_CHECK(bins >= 1);
  std::vector<int64_t> idx(weights.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int64_t a, int64_t b) { return weights[a] > weights[b]; });
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(bins));
  std::vector<int64_t> sums(static_cast<size_t>(bins), 0);
  for (int64_t i : idx) {
    const size_t k = static_cast<size_t>(std::min_element(sums.begin(), sums.end()) - sums.begin());
    sums[k] += weights[i];
    out[k].push_back(i);
  }
  return Canonical(std::move(out));
}

std::vector<std::vector<int64_t>> BalancedPartition(std::span<const int64_t> weights,
                                                    int64_t bins) {
  std::vector<std::vector<int64_t>> kk = KarmarkarKarpPartition(weights, bins);
  std::vector<std::vector<int64_t>> lpt = GreedyLptPartition(weights, bins);
  return MaxBinSum(weights, lpt) < MaxBinSum(weights, kk) ? lpt : kk;
}

int64_t MaxBinSum(std::span<const int64_t> weights,
                  const std::vector<std::vector<int64_t>>& partition) {
  int64_t best = 0;
  for (const std::vector<int64_t>& bin : partition) {
    int64_t sum = 0;
    for (int64_t i : bin) sum += weights[i];
    best = std::max(best, sum);
  }
  return best;
}

StatusOr<BatchPlan> DistributeMicroBatches(ReplicaBatches global, std::span<const Sample> batch,
                                           const StageCostEvaluator& eval,
                                           const BatchingOptions& options) {
  BatchPlan plan;
  const int64_t dp = eval.parallel().dp;
  if (global.outcome != PlanOutcome::kOk) {
    plan.outcome = global.outcome;
    plan.infeasible_reason = global.infeasible_reason;
    return plan;
  }
  const BatchIndex index(batch);
  std::vector<int64_t> weights;
  weights.reserve(global.micro_batches.size());
  for (const MicroBatch& mb : global.micro_batches) {
    for (const std::vector<int64_t>& row : mb.rows) {
      for (int64_t id : row) {
        if (!index.Contains(id)) {
          return InvalidArgumentError(
              fmt::format("distributing micro-batches: sample id {} is not in the batch", id));
        }
      }
    }
    weights.push_back(mb.Bottleneck().nanos());
  }
  // Fewer micro-batches than replicas: cut the widest (most rows) in two, in row order, until
  // every replica can have one. Halves hold fewer rows, so they fit wherever the whole did.
  while (static_cast<int64_t>(global.micro_batches.size()) < dp) {
    size_t widest = 0;
    for (size_t i = 1; i < global.micro_batches.size(); ++i) {
      if (global.micro_batches[i].rows.size() > global.micro_batches[widest].rows.size()) {
        widest = i;
      }
    }
    if (global.micro_batches.empty() || global.micro_batches[widest].rows.size() < 2) break;
    MicroBatch& whole = global.micro_batches[widest];
    MicroBatch second;
    second.varlen = whole.varlen;
    second.recompute = whole.recompute;
    const size_t half = (whole.rows.size() + 1) / 2;
    second.rows.assign(whole.rows.begin() + static_cast<std::ptrdiff_t>(half), whole.rows.end());
    whole.rows.resize(half);
    if (!PriceMicroBatch(eval, index, &whole) || !PriceMicroBatch(eval, index, &second)) {
      return InternalError("distributing micro-batches: a half of a micro-batch has no cost");
    }
    weights[widest] = whole.Bottleneck().nanos();
    global.micro_batches.insert(
        global.micro_batches.begin() + static_cast<std::ptrdiff_t>(widest) + 1, std::move(second));
    weights.insert(weights.begin() + static_cast<std::ptrdiff_t>(widest) + 1,
                   global.micro_batches[widest + 1].Bottleneck().nanos());
  }
  std::vector<std::vector<int64_t>> bins = BalancedPartition(weights, dp);
  // A replica left empty takes the lightest micro-batch of the replica with the most.
  for (std::vector<int64_t>& bin : bins) {
    if (!bin.empty()) continue;
    auto donor = std::max_element(bins.begin(), bins.end(),
                                  [](const auto& a, const auto& b) { return a.size() < b.size(); });
    if (donor->size() < 2) break;
    auto lightest = std::min_element(donor->begin(), donor->end(),
                                     [&](int64_t a, int64_t b) { return weights[a] < weights[b]; });
    bin.push_back(*lightest);
    donor->erase(lightest);
  }
  plan.replicas.resize(static_cast<size_t>(dp));
  for (int64_t r = 0; r < dp; ++r) {
    for (int64_t i : bins[r]) plan.replicas[r].push_back(std::move(global.micro_batches[i]));
    std::string reason;
    if (!RaiseRecomputeToFit(eval, index, options.recompute, &plan.replicas[r], &reason)) {
      BatchPlan oom;
      oom.outcome = PlanOutcome::kOutOfMemory;
      oom.infeasible_reason = fmt::format("replica {}: {}", r, reason);
      return oom;
    }
  }
  return plan;
}

}  // namespace sluice
