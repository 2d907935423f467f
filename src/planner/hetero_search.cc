// The search over heterogeneous mixes (hetero.h: EnumerateHeteroMixes, SearchHetero): which
// two-group layouts fit the cluster, each planned on the score batches and ranked by its
// estimate, the best few simulated.
#include <algorithm>
#include <chrono>
#include <numeric>
#include <optional>
#include <utility>

#include "planner/hetero.h"

namespace sluice {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

std::vector<HeteroConfig> EnumerateHeteroMixes(const ModelSpec& model, const ClusterSpec& cluster,
                                               int64_t zero, std::optional<Bytes> memory_limit,
                                               std::optional<Bytes> memory_reserve) {
  struct Shape {
    int64_t tp, pp, cp;
    int64_t width() const { return tp * pp * cp; }
  };
  std::vector<Shape> narrow, wide;
  for (int64_t tp : {1, 2}) {
    for (int64_t cp : {1, 2}) {
      for (int64_t pp : {1, 2, 4}) narrow.push_back({tp, pp, cp});
    }
  }
  for (int64_t pp : {1, 2}) {
    for (int64_t tp : {1, 2, 4, 8}) {
      for (int64_t cp : {1, 2, 4, 8}) {
        if (tp * cp >= 4 && tp * cp <= 16) wide.push_back({tp, pp, cp});
      }
    }
  }
  const int64_t devices = cluster.num_devices();
  std::vector<HeteroConfig> out;
  for (const Shape& w : wide) {
    for (const Shape& a : narrow) {
      if (w.tp * w.cp <= a.tp * a.cp) continue;
      for (int64_t nw = 1; nw * w.width() < devices; ++nw) {
        const int64_t rest = devices - nw * w.width();
        if (rest % a.width() != 0) continue;
        auto group = [&](const Shape& s, int64_t dp) {
          ParallelConfig p;
          p.dp = dp;
          p.tp = s.tp;
          p.pp = s.pp;
          p.cp = s.cp;
          p.zero = zero;
          p.memory_limit = memory_limit;
          p.memory_reserve = memory_limit.has_value() ? std::nullopt : memory_reserve;
          return p;
        };
        HeteroConfig h{.groups = {group(w, nw), group(a, rest / a.width())}};
        if (CheckHeteroFits(h, model, cluster, "mix").ok()) out.push_back(std::move(h));
      }
    }
  }
  return out;
}

StatusOr<HeteroSearch> SearchHetero(const CostModel& cost, const ClusterSpec& cluster,
                                    std::span<const HeteroConfig> mixes,
                                    std::span<const GlobalBatch> score,
                                    const HeteroPlannerOptions& options, const SimOptions& sim,
                                    int64_t simulate_top) {
  const auto start = Clock::now();
  HeteroSearch out;
  std::vector<std::optional<HeteroPlanner>> planners;
  for (const HeteroConfig& mix : mixes) {
    HeteroCandidate c;
    c.config = mix;
    StatusOr<HeteroPlanner> planner = HeteroPlanner::Create(cost, mix, cluster, options, "mix");
    if (!planner.ok()) {
      c.reason = planner.status().message();
      out.ranked.push_back(std::move(c));
      planners.emplace_back();
      continue;
    }
    int64_t tokens = 0;
    Duration time;
    c.feasible = true;
    for (const GlobalBatch& b : score) {
      SLUICE_ASSIGN_OR_RETURN(HeteroPlanResult r, planner->Plan(b.samples));
      if (r.outcome != PlanOutcome::kOk) {
        c.feasible = false;
        c.reason = r.infeasible_reason;
        c.scale.clear();
        break;
      }
      tokens += b.tokens;
      time += r.makespan;
      c.scale = std::move(r.scale);
    }
    if (c.feasible && time > Duration::Zero()) {
      c.estimated_tokens_per_s = static_cast<double>(tokens) / time.seconds();
    }
    out.ranked.push_back(std::move(c));
    planners.push_back(std::move(*planner));
  }
  std::vector<size_t> order(out.ranked.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    const HeteroCandidate& a = out.ranked[x];
    const HeteroCandidate& b = out.ranked[y];
    if (a.feasible != b.feasible) return a.feasible;
    return a.estimated_tokens_per_s > b.estimated_tokens_per_s;
  });
  std::vector<HeteroCandidate> ranked;
  int64_t simulated = 0;
  for (size_t idx : order) {
    HeteroCandidate c = out.ranked[idx];
    if (c.feasible && simulated < simulate_top) {
      ++simulated;
      c.simulated = true;
      int64_t tokens = 0;
      Duration time;
      for (const GlobalBatch& b : score) {
        SLUICE_ASSIGN_OR_RETURN(HeteroPlanResult r, planners[idx]->Plan(b.samples));
        SLUICE_ASSIGN_OR_RETURN(HeteroSimResult s, SimulateHetero(r, sim));
        if (s.outcome != SimOutcome::kOk || s.memory_exceeded) {
          c.feasible = false;
          c.reason = s.problem;
          break;
        }
        tokens += s.real_tokens;
        time += s.iteration_time;
      }
      if (c.feasible && time > Duration::Zero()) {
        c.simulated_tokens_per_s = static_cast<double>(tokens) / time.seconds();
        if (!out.best.has_value() || c.simulated_tokens_per_s > out.best->simulated_tokens_per_s) {
          out.best = c;
        }
      }
    }
    ranked.push_back(std::move(c));
  }
  out.ranked = std::move(ranked);
  out.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return out;
}

}  // namespace sluice
