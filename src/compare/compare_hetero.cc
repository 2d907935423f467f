#include "compare/compare_hetero.h"

#include <fmt/core.h>

#include <algorithm>

namespace sluice {
namespace {

bool Allowed(std::span<const int64_t> list, int64_t v) {
  return list.empty() || std::find(list.begin(), list.end(), v) != list.end();
}

}  // namespace

std::vector<HeteroConfig> HeteroMixesOf(const Scenario& sc, const SearchSpace& space) {
  std::vector<HeteroConfig> out;
  for (int64_t zero : {1, 2}) {
    if (!Allowed(space.zero, zero)) continue;
    for (HeteroConfig& h :
         EnumerateHeteroMixes(sc.model, sc.cluster, zero, sc.memory_limit, sc.memory_reserve)) {
      const bool in_space = std::all_of(h.groups.begin(), h.groups.end(), [&](const auto& g) {
        return Allowed(space.tp, g.tp) && Allowed(space.pp, g.pp) && Allowed(space.cp, g.cp);
      });
      if (in_space) out.push_back(std::move(h));
    }
  }
  return out;
}

HeteroPlannerOptions HeteroOptionsFor(const MethodSpec& method, const CompareScenario& cs) {
  HeteroPlannerOptions o;
  const bool own = method.kind == MethodKind::kHetero;
  o.planner.method = own && !method.batching.empty() ? method.batching.front() : "hydraulis";
  o.planner.schedule =
      own && !method.schedules.empty() ? method.schedules.front() : ScheduleKind::k1F1B;
  o.planner.batching.seed = cs.seed;
  o.planner.batching.max_seqlen = cs.max_seqlen;
  return o;
}

StatusOr<HeteroChoice> SearchHeteroMixes(const Scenario& sc, const CompareScenario& cs,
                                         const MethodSpec& method,
                                         std::span<const GlobalBatch> score,
                                         const SimOptions& sim) {
  HeteroChoice out;
  const std::vector<HeteroConfig> mixes = HeteroMixesOf(sc, cs.search);
  SimOptions quiet = sim;
  quiet.record_timeline = false;
  quiet.record_memory = false;
  SLUICE_ASSIGN_OR_RETURN(out.search,
                          SearchHetero(*sc.cost, sc.cluster, mixes, score,
                                       HeteroOptionsFor(method, cs), quiet,
                                       std::max<int64_t>(1, cs.search.simulate_top)));
  for (const HeteroCandidate& c : out.search.ranked) {
    out.feasible += c.estimated_tokens_per_s > 0 ? 1 : 0;
    out.simulated += c.simulated ? 1 : 0;
  }
  if (out.search.best.has_value()) {
    out.best = out.search.best->config;
  } else if (mixes.empty()) {
    out.reason = fmt::format(
        "no 2-shape mix of the {} devices lies in the search space (tp, pp, cp lists; ZeRO 1 or "
        "2) and fits the model",
        sc.cluster.num_devices());
  } else {
    const HeteroCandidate* first = nullptr;
    for (const HeteroCandidate& c : out.search.ranked) {
      if (!c.reason.empty()) {
        first = &c;
        break;
      }
    }
    out.reason = fmt::format("none of the {} 2-shape mixes ran the score batches within memory{}",
                             mixes.size(),
                             first != nullptr ? fmt::format(" (e.g. {}: {})",
                                                            DescribeHetero(first->config),
                                                            first->reason)
                                              : "");
  }
  return out;
}

}  // namespace sluice
