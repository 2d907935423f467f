// Min-max partition with a size cap: Hydraulis stage 2's per-v problem (hydraulis.h). The
// reference solves it as a MILP with CBC under a 0.5 s limit; here LPT, a local search and, for
// few items, an exact branch-and-bound.
#include <algorithm>
#include <limits>
#include <numeric>

#include "batching/hydraulis.h"

namespace sluice {
namespace {

constexpr int64_t kNoBound = std::numeric_limits<int64_t>::max();
// Swap partners examined per bin on each side of the ideal cost.
constexpr int64_t kSwapNeighbours = 3;

// Bin loads and token sums of a partition.
struct Bins {
  std::vector<int64_t> load;
  std::vector<int64_t> used;
  std::vector<std::vector<int64_t>> items;
};

Bins Tally(std::span<const PartitionItem> items, int64_t bins, std::span<const int64_t> bin_of) {
  Bins b{std::vector<int64_t>(bins, 0), std::vector<int64_t>(bins, 0),
         std::vector<std::vector<int64_t>>(bins)};
  std::vector<int64_t> count(bins, 0);
  for (const int64_t bin : bin_of) ++count[bin];
  for (int64_t k = 0; k < bins; ++k) b.items[k].reserve(static_cast<size_t>(count[k]));
  for (size_t i = 0; i < items.size(); ++i) {
    b.load[bin_of[i]] += items[i].cost;
    b.used[bin_of[i]] += items[i].size;
    b.items[bin_of[i]].push_back(static_cast<int64_t>(i));
  }
  return b;
}

int64_t MaxLoad(const Bins& b) {
  return b.load.empty() ? 0 : *std::max_element(b.load.begin(), b.load.end());
}

// Greedy in `order`: each item to the least-loaded bin with room (lowest index on ties).
Partition Greedy(std::span<const PartitionItem> items, int64_t bins, int64_t cap,
                 std::span<const int64_t> order) {
  Partition p;
  p.bin.assign(items.size(), 0);
  std::vector<int64_t> load(bins, 0), used(bins, 0);
  for (int64_t i : order) {
    int64_t best = -1;
    for (int64_t b = 0; b < bins; ++b) {
      if (used[b] + items[i].size > cap) continue;
      if (best < 0 || load[b] < load[best]) best = b;
    }
    if (best < 0) return Partition{};
    p.bin[i] = best;
    load[best] += items[i].cost;
    used[best] += items[i].size;
  }
  p.feasible = true;
  p.max_load = load.empty() ? 0 : *std::max_element(load.begin(), load.end());
  return p;
}

std::vector<int64_t> OrderBy(std::span<const PartitionItem> items, bool by_size) {
  std::vector<int64_t> order(items.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
    const PartitionItem& a = items[x];
    const PartitionItem& b = items[y];
    if (by_size && a.size != b.size) return a.size > b.size;
    if (a.cost != b.cost) return a.cost > b.cost;
    return a.size > b.size;
  });
  return order;
}

// Moves the cheapest item of the most-populated bin into each empty bin while there are more
// items than occupied bins; never raises the max load (the moved item's cost is at most its old
// bin's load) and keeps the cap (an item alone fits).
void FillEmptyBins(std::span<const PartitionItem> items, int64_t bins, Partition* p) {
  Bins b = Tally(items, bins, p->bin);
  for (int64_t e = 0; e < bins; ++e) {
    if (!b.items[e].empty()) continue;
    int64_t from = 0;
    for (int64_t j = 1; j < bins; ++j) {
      if (b.items[j].size() > b.items[from].size()) from = j;
    }
    if (b.items[from].size() < 2) return;
    auto it =
        std::min_element(b.items[from].begin(), b.items[from].end(), [&](int64_t x, int64_t y) {
          return items[x].cost != items[y].cost ? items[x].cost < items[y].cost : x < y;
        });
    const int64_t i = *it;
    b.items[from].erase(it);
    b.items[e].push_back(i);
    b.load[from] -= items[i].cost;
    b.load[e] += items[i].cost;
    p->bin[i] = e;
  }
  p->max_load = MaxLoad(b);
}

struct Search {
  std::span<const PartitionItem> items;
  std::vector<int64_t> order;
  int64_t cap = 0;
  int64_t lower_bound = 0;
  std::vector<int64_t> load, used, count, assign;
  int64_t best = kNoBound;
  std::vector<int64_t> best_assign;

  void Dfs(size_t k, int64_t cur_max) {
    if (best <= lower_bound) return;  // the incumbent is provably optimal
    if (k == order.size()) {
      if (cur_max < best) {
        best = cur_max;
        best_assign = assign;
      }
      return;
    }
    const int64_t i = order[k];
    bool tried_empty = false;
    for (size_t b = 0; b < load.size(); ++b) {
      if (count[b] == 0) {
        if (tried_empty) continue;  // empty bins are interchangeable
        tried_empty = true;
      }
      if (used[b] + items[i].size > cap) continue;
      const int64_t next_max = std::max(cur_max, load[b] + items[i].cost);
      if (next_max >= best) continue;
      load[b] += items[i].cost;
      used[b] += items[i].size;
      ++count[b];
      assign[i] = static_cast<int64_t>(b);
      Dfs(k + 1, next_max);
      load[b] -= items[i].cost;
      used[b] -= items[i].size;
      --count[b];
    }
  }
};

}  // namespace

PartitionOrders OrdersOf(std::span<const PartitionItem> items) {
  return PartitionOrders{OrderBy(items, false), OrderBy(items, true)};
}

Partition LptPartition(std::span<const PartitionItem> items, int64_t bins, int64_t cap) {
  return LptPartition(items, bins, cap, OrdersOf(items));
}

Partition LptPartition(std::span<const PartitionItem> items, int64_t bins, int64_t cap,
                       const PartitionOrders& orders) {
  SLUICE_CHECK(bins >= 1);
  SLUICE_CHECK(orders.by_cost.size() == items.size() && orders.by_size.size() == items.size());
  Partition p = Greedy(items, bins, cap, orders.by_cost);
  if (!p.feasible) p = Greedy(items, bins, cap, orders.by_size);
  return p;
}

Partition LocalSearch(std::span<const PartitionItem> items, int64_t bins, int64_t cap,
                      Partition start) {
  if (!start.feasible) return start;
  Partition p = std::move(start);
  Bins b = Tally(items, bins, p.bin);
  // Each bin's items sorted by (cost, position), so that swap partners are found by bisection.
  auto by_cost = [&](int64_t x, int64_t y) {
    return items[x].cost != items[y].cost ? items[x].cost < items[y].cost : x < y;
  };
  for (auto& bin : b.items) std::sort(bin.begin(), bin.end(), by_cost);
  const int64_t max_steps = 16 * static_cast<int64_t>(items.size()) + 16;
  for (int64_t step = 0; step < max_steps; ++step) {
    const int64_t top = std::max_element(b.load.begin(), b.load.end()) - b.load.begin();
    const int64_t top_load = b.load[top];
    int64_t best_val = top_load;
    int64_t best_x = -1, best_j = -1, best_y = -1;  // best_y < 0: a move
    auto consider = [&](int64_t val, int64_t x, int64_t j, int64_t y) {
      if (val < best_val) {
        best_val = val;
        best_x = x, best_j = j, best_y = y;
      }
    };
    for (int64_t x : b.items[top]) {
      const int64_t cx = items[x].cost;
      for (int64_t j = 0; j < bins; ++j) {
        // A move to j or a swap with a cheaper item of j leaves j at or above its load: no
        // better than best_val when that load already is.
        if (j == top || b.load[j] >= best_val) continue;
        if (b.used[j] + items[x].size <= cap) {
          consider(std::max(top_load - cx, b.load[j] + cx), x, j, -1);
        }
        // The ideal partner costs cx - (top_load - load_j) / 2 (it evens the two bins); try the
        // few items of bin j nearest to that cost.
        const std::vector<int64_t>& partners = b.items[j];
        const int64_t ideal = cx - (top_load - b.load[j]) / 2;
        const auto pos = std::lower_bound(partners.begin(), partners.end(), ideal,
                                          [&](int64_t y, int64_t c) { return items[y].cost < c; });
        const int64_t at = pos - partners.begin();
        const int64_t size = static_cast<int64_t>(partners.size());
        for (int64_t k = std::max<int64_t>(0, at - kSwapNeighbours);
             k < std::min(size, at + kSwapNeighbours); ++k) {
          const int64_t y = partners[k];
          const int64_t cy = items[y].cost;
          if (cy >= cx) continue;
          if (b.used[top] - items[x].size + items[y].size > cap) continue;
          if (b.used[j] - items[y].size + items[x].size > cap) continue;
          consider(std::max(top_load - cx + cy, b.load[j] - cy + cx), x, j, y);
        }
      }
    }
    if (best_x < 0) break;
    auto move = [&](int64_t i, int64_t from, int64_t to) {
      b.load[from] -= items[i].cost;
      b.used[from] -= items[i].size;
      b.load[to] += items[i].cost;
      b.used[to] += items[i].size;
      auto& src = b.items[from];
      src.erase(std::lower_bound(src.begin(), src.end(), i, by_cost));
      auto& dst = b.items[to];
      dst.insert(std::lower_bound(dst.begin(), dst.end(), i, by_cost), i);
      p.bin[i] = to;
    };
    move(best_x, top, best_j);
    if (best_y >= 0) move(best_y, best_j, top);
  }
  p.max_load = MaxLoad(b);
  return p;
}

Partition ExactPartition(std::span<const PartitionItem> items, int64_t bins, int64_t cap,
                         const Partition& start) {
  return ExactPartition(items, bins, cap, start, OrderBy(items, false));
}

Partition ExactPartition(std::span<const PartitionItem> items, int64_t bins, int64_t cap,
                         const Partition& start, std::span<const int64_t> by_cost) {
  SLUICE_CHECK(static_cast<int64_t>(items.size()) <= kExactPartitionLimit && bins >= 1);
  Search s;
  s.items = items;
  s.order.assign(by_cost.begin(), by_cost.end());
  s.cap = cap;
  int64_t total = 0, largest = 0;
  for (const PartitionItem& it : items) {
    total += it.cost;
    largest = std::max(largest, it.cost);
  }
  s.lower_bound = std::max(largest, (total + bins - 1) / bins);
  s.load.assign(bins, 0);
  s.used.assign(bins, 0);
  s.count.assign(bins, 0);
  s.assign.assign(items.size(), 0);
  if (start.feasible) {
    s.best = start.max_load;
    s.best_assign = start.bin;
  }
  s.Dfs(0, 0);
  Partition p;
  if (s.best == kNoBound) return p;
  p.feasible = true;
  p.max_load = s.best;
  p.bin = s.best_assign;
  return p;
}

Partition MinMaxPartition(std::span<const PartitionItem> items, int64_t bins, int64_t cap) {
  return MinMaxPartition(items, bins, cap, OrdersOf(items));
}

Partition MinMaxPartition(std::span<const PartitionItem> items, int64_t bins, int64_t cap,
                          const PartitionOrders& orders) {
  Partition p = LocalSearch(items, bins, cap, LptPartition(items, bins, cap, orders));
  if (static_cast<int64_t>(items.size()) <= kExactPartitionLimit) {
    p = ExactPartition(items, bins, cap, p, orders.by_cost);
  }
  if (p.feasible) FillEmptyBins(items, bins, &p);
  return p;
}

}  // namespace sluice
