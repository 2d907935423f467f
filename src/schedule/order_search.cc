#include "schedule/order_search.h"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <numeric>
#include <utility>

#include "base/rng.h"
#include "schedule/schedule_costs.h"

namespace sluice {
namespace {

using Features = std::array<double, 4>;

double Dist2(const Features& a, const Features& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += (a[i] - b[i]) * (a[i] - b[i]);
  return d;
}

double Sum(const Features& a) { return a[0] + a[1] + a[2] + a[3]; }

// DynaPipe's clustering features, in milliseconds.
std::vector<Features> MicroBatchFeatures(const ScheduleCosts& costs) {
  const size_t last = static_cast<size_t>(costs.pp * costs.vpp - 1);
  std::vector<Features> x;
  x.reserve(costs.chunks.size());
  for (const std::vector<ChunkCost>& mb : costs.chunks) {
    const ChunkCost& a = mb[0];
    const ChunkCost& z = mb[last];
    x.push_back({a.forward.millis(), z.forward.millis(),
                 (a.backward_input + a.backward_weight).millis(),
                 (z.backward_input + z.backward_weight).millis()});
  }
  return x;
}

// Orders tried, without repeats, in the order they were proposed.
class Candidates {
 public:
  void Add(const std::vector<int64_t>& order) {
    for (const std::vector<int64_t>& o : orders_) {
      if (o == order) return;
    }
    orders_.push_back(order);
  }
  const std::vector<std::vector<int64_t>>& orders() const { return orders_; }

 private:
  std::vector<std::vector<int64_t>> orders_;
};

Candidates ProposeOrders(const ScheduleCosts& costs, const OrderSearchOptions& options) {
  const int64_t m = costs.num_microbatches();
  Candidates c;
  std::vector<int64_t> identity(static_cast<size_t>(m));
  std::iota(identity.begin(), identity.end(), 0);
  c.Add(identity);
  std::vector<Duration> total(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) {
    for (const ChunkCost& cc : costs.chunks[i]) {
      total[i] += cc.forward + cc.backward_input + cc.backward_weight;
    }
  }
  std::vector<int64_t> longest = identity;
  std::stable_sort(longest.begin(), longest.end(),
                   [&](int64_t a, int64_t b) { return total[a] > total[b]; });
  c.Add(longest);
  if (m <= options.exhaustive_up_to) {
    std::vector<int64_t> perm = identity;
    while (std::next_permutation(perm.begin(), perm.end())) c.Add(perm);
    return c;
  }
  const int64_t k = options.clusters > 0 ? options.clusters : (m > 20 ? 3 : 4);
  const std::vector<int64_t> cluster = ClusterMicroBatches(costs, k);
  const int64_t used = *std::max_element(cluster.begin(), cluster.end()) + 1;
  std::vector<std::vector<int64_t>> members(static_cast<size_t>(used));
  for (int64_t i = 0; i < m; ++i) members[cluster[i]].push_back(i);
  std::vector<int64_t> perm(static_cast<size_t>(used));
  std::iota(perm.begin(), perm.end(), 0);
  Rng rng(options.seed);
  std::vector<int64_t> order;
  std::vector<std::vector<int64_t>> shuffled;
  do {
    order.clear();
    for (int64_t p : perm) order.insert(order.end(), members[p].begin(), members[p].end());
    c.Add(order);
    for (int64_t s = 0; s < options.shuffles; ++s) {
      shuffled = members;
      for (std::vector<int64_t>& g : shuffled) rng.Shuffle(g);
      order.clear();
      for (int64_t p : perm) order.insert(order.end(), shuffled[p].begin(), shuffled[p].end());
      c.Add(order);
    }
  } while (std::next_permutation(perm.begin(), perm.end()));
  return c;
}

}  // namespace

std::vector<int64_t> ClusterMicroBatches(const ScheduleCosts& costs, int64_t k) {
  const std::vector<Features> x = MicroBatchFeatures(costs);
  const size_t m = x.size();
  // Farthest-point initialisation from the largest micro-batch; stops early on duplicates.
  std::vector<Features> centers;
  size_t first = 0;
  for (size_t i = 1; i < m; ++i) {
    if (Sum(x[i]) > Sum(x[first])) first = i;
  }
  centers.push_back(x[first]);
  while (static_cast<int64_t>(centers.size()) < k) {
    size_t best = 0;
    double best_d = -1;
    for (size_t i = 0; i < m; ++i) {
      double d = Dist2(x[i], centers[0]);
      for (const Features& c : centers) d = std::min(d, Dist2(x[i], c));
      if (d > best_d) {
        best_d = d;
        best = i;
      }
    }
    if (best_d <= 0) break;
    centers.push_back(x[best]);
  }
  // Lloyd's iterations.
  std::vector<int64_t> assign(m, -1);
  for (int iter = 0; iter < 50; ++iter) {
    bool changed = false;
    for (size_t i = 0; i < m; ++i) {
      int64_t best = 0;
      for (size_t c = 1; c < centers.size(); ++c) {
        if (Dist2(x[i], centers[c]) < Dist2(x[i], centers[best])) best = static_cast<int64_t>(c);
      }
      changed = changed || assign[i] != best;
      assign[i] = best;
    }
    if (!changed) break;
    std::vector<Features> sum(centers.size(), Features{0, 0, 0, 0});
    std::vector<int64_t> count(centers.size(), 0);
    for (size_t i = 0; i < m; ++i) {
      for (size_t f = 0; f < 4; ++f) sum[assign[i]][f] += x[i][f];
      ++count[assign[i]];
    }
    for (size_t c = 0; c < centers.size(); ++c) {
      if (count[c] == 0) continue;
      for (size_t f = 0; f < 4; ++f) centers[c][f] = sum[c][f] / static_cast<double>(count[c]);
    }
  }
  // Renumber the non-empty clusters by decreasing centroid total.
  std::vector<int64_t> count(centers.size(), 0);
  for (int64_t a : assign) ++count[a];
  std::vector<int64_t> ids;
  for (size_t c = 0; c < centers.size(); ++c) {
    if (count[c] > 0) ids.push_back(static_cast<int64_t>(c));
  }
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int64_t a, int64_t b) { return Sum(centers[a]) > Sum(centers[b]); });
  std::vector<int64_t> rename(centers.size(), -1);
  for (size_t i = 0; i < ids.size(); ++i) rename[ids[i]] = static_cast<int64_t>(i);
  for (int64_t& a : assign) a = rename[a];
  return assign;
}

StatusOr<OrderSearchResult> SearchMicroBatchOrder(ScheduleKind kind, const ScheduleCosts& costs,
                                                  const OrderSearchOptions& options) {
  SLUICE_RETURN_IF_ERROR(ValidateScheduleCosts(costs));
  if (options.clusters < 0 || options.exhaustive_up_to < 0 || options.exhaustive_up_to > 8 ||
      options.shuffles < 0) {
    return InvalidArgumentError(fmt::format(
        "order search options: clusters ({}) and shuffles ({}) must be >= 0, exhaustive_up_to "
        "({}) in 0..8",
        options.clusters, options.shuffles, options.exhaustive_up_to));
  }
  const Candidates candidates = ProposeOrders(costs, options);
  OrderSearchResult out;
  out.given_makespan = Duration::Infinite();
  ScheduleCosts permuted;
  bool have = false;
  std::string first_reason;
  Duration best = Duration::Infinite();
  // Scored by ScheduleMakespan (for ZB-H1 about a third cheaper than generating); the winner is
  // generated once at the end, and the given order again only when it does not fit (its reason).
  for (const std::vector<int64_t>& order : candidates.orders()) {
    PermuteMicroBatches(costs, order, &permuted);
    SLUICE_ASSIGN_OR_RETURN(Duration t, ScheduleMakespan(kind, permuted, options.schedule));
    const bool given = out.candidates == 0;
    ++out.candidates;
    if (t == Duration::Infinite()) {
      if (given) {
        SLUICE_ASSIGN_OR_RETURN(ScheduleResult r,
                                GenerateSchedule(kind, permuted, options.schedule));
        first_reason = r.infeasible_reason;
      }
      continue;
    }
    ++out.feasible;
    if (given) out.given_makespan = t;
    if (!have || t < best) {
      have = true;
      best = t;
      out.order = order;
    }
  }
  if (have) {
    PermuteMicroBatches(costs, out.order, &permuted);
    SLUICE_ASSIGN_OR_RETURN(out.result, GenerateSchedule(kind, permuted, options.schedule));
  }
  if (!have) {
    out.outcome = PlanOutcome::kOutOfMemory;
    out.infeasible_reason = fmt::format(
        "no order of the {} micro-batches fits memory under {} ({} tried); the given order: {}",
        costs.num_microbatches(), ScheduleKindName(kind), out.candidates, first_reason);
    out.order = candidates.orders().front();
  }
  return out;
}

}  // namespace sluice
