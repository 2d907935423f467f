#include "compare/compare_dynamic.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <utility>

#include "cost/comm_model.h"
#include "cost/layer_work.h"

namespace sluice {
namespace {

bool SameLayout(const HeteroConfig& a, const HeteroConfig& b) {
  if (a.groups.size() != b.groups.size()) return false;
  for (size_t g = 0; g < a.groups.size(); ++g) {
    const ParallelConfig& x = a.groups[g];
    const ParallelConfig& y = b.groups[g];
    if (x.dp != y.dp || x.tp != y.tp || x.pp != y.pp || x.vpp != y.vpp || x.cp != y.cp ||
        x.zero != y.zero) {
      return false;
    }
  }
  return true;
}

// Simulated over estimated time on the score batches (1 when unknown).
double Calibration(double estimated_tokens_per_s, double simulated_tokens_per_s) {
  if (estimated_tokens_per_s <= 0 || simulated_tokens_per_s <= 0) return 1;
  return estimated_tokens_per_s / simulated_tokens_per_s;
}

}  // namespace

HeteroConfig Strategy::Layout() const {
  if (hetero.has_value()) return *hetero;
  return HeteroConfig{.groups = {candidate->parallel}};
}

std::string Strategy::Describe() const {
  if (hetero.has_value()) return fmt::format("heterogeneous {}", DescribeHetero(*hetero));
  return candidate->Describe();
}

std::vector<Strategy> PickStrategies(const MethodSearch& search,
                                     const std::optional<HeteroChoice>& hetero,
                                     StrategyLimits limits) {
  std::vector<Strategy> out;
  // Homogeneous: the simulated complete ones (best simulated first), then by estimate.
  std::vector<const CandidateScore*> homo;
  for (const CandidateScore& c : search.ranked) {
    if (c.complete() && c.simulated) homo.push_back(&c);
  }
  std::stable_sort(homo.begin(), homo.end(), [](const auto* a, const auto* b) {
    return a->simulated_tokens_per_s > b->simulated_tokens_per_s;
  });
  for (const CandidateScore& c : search.ranked) {
    if (c.complete() && !c.simulated) homo.push_back(&c);
  }
  for (const CandidateScore* c : homo) {
    if (static_cast<int64_t>(out.size()) >= limits.homogeneous) break;
    out.push_back({.candidate = c->candidate,
                   .calibration =
                       Calibration(c->estimated_tokens_per_s, c->simulated_tokens_per_s)});
  }
  if (!hetero.has_value()) return out;
  std::vector<const HeteroCandidate*> mixes;
  for (const HeteroCandidate& c : hetero->search.ranked) {
    if (c.feasible && c.simulated) mixes.push_back(&c);
  }
  std::stable_sort(mixes.begin(), mixes.end(), [](const auto* a, const auto* b) {
    return a->simulated_tokens_per_s > b->simulated_tokens_per_s;
  });
  for (const HeteroCandidate& c : hetero->search.ranked) {
    if (c.feasible && !c.simulated) mixes.push_back(&c);
  }
  for (int64_t k = 0; k < limits.hetero && k < static_cast<int64_t>(mixes.size()); ++k) {
    const HeteroCandidate& c = *mixes[k];
    out.push_back({.hetero = c.config,
                   .calibration = Calibration(c.estimated_tokens_per_s, c.simulated_tokens_per_s),
                   .screen_scale = c.scale});
  }
  return out;
}

Duration SwitchCost(const std::optional<HeteroConfig>& from, const HeteroConfig& to,
                    const ModelSpec& model, const ClusterSpec& cluster) {
  if (!from.has_value() || SameLayout(*from, to)) return Duration::Zero();
  const int64_t params = model.layers * AnalyticLayerParams(model, LayerKind::kEncoder, 1) +
                         AnalyticLayerParams(model, LayerKind::kEmbedding, 1) +
                         AnalyticLayerParams(model, LayerKind::kOutputHead, 1);
  Bytes largest;
  for (const ParallelConfig& g : to.groups) {
    const int64_t held = (params + g.tp * g.pp - 1) / (g.tp * g.pp);
    const ModelStateMemory m = ModelStatesFromParams(held, g.dp * g.cp, g.zero);
    largest = std::max(largest, m.weights + m.optimizer);
  }
  const AlphaBetaCommModel comm(cluster);
  return comm.Collective(CollectiveKind::kAllToAll, largest,
                         CollectiveRing{.members = cluster.num_devices(),
                                        .spans_nodes = cluster.nodes > 1});
}

StatusOr<DynamicRunner> DynamicRunner::Create(CandidateScorer& scorer, const CostModel& cost,
                                              const ClusterSpec& cluster, const MethodSpec& method,
                                              const CompareScenario& cs,
                                              std::vector<Strategy> strategies,
                                              DynamicOptions options) {
  DynamicRunner r;
  r.options_ = options;
  r.cluster_ = &cluster;
  r.cost_ = &cost;
  r.strategies_ = std::move(strategies);
  for (const Strategy& s : r.strategies_) {
    if (s.hetero.has_value()) {
      SLUICE_ASSIGN_OR_RETURN(HeteroPlanner h,
                              HeteroPlanner::Create(cost, *s.hetero, cluster,
                                                    HeteroOptionsFor(method, cs), method.name));
      r.planners_.emplace_back();
      r.hetero_planners_.push_back(std::move(h));
      r.sync_.push_back(Duration::Zero());
    } else {
      SLUICE_ASSIGN_OR_RETURN(Planner p, scorer.PlannerFor(*s.candidate));
      r.sync_.push_back(EstimateGradientSync(p.evaluator(), cluster));
      r.planners_.push_back(std::move(p));
      r.hetero_planners_.emplace_back();
    }
  }
  // The screen starts from the search's scales; the mixes' refresh counters start staggered
  // over the refresh period (see the header).
  int64_t mixes = 0;
  for (const Strategy& s : r.strategies_) mixes += s.hetero.has_value() ? 1 : 0;
  r.screened_since_.assign(r.strategies_.size(), 0);
  for (size_t s = 0, k = 0; s < r.strategies_.size(); ++s) {
    r.scale_.push_back(r.strategies_[s].screen_scale);
    if (r.strategies_[s].hetero.has_value()) {
      r.screened_since_[s] = static_cast<int64_t>(k++) * kScreenRefresh / mixes;
    }
  }
  // Homogeneous strategies that batch alike (one configuration under several schedules) share
  // one batching per batch.
  for (size_t s = 0; s < r.strategies_.size(); ++s) {
    r.batching_of_.push_back(s);
    if (!r.planners_[s].has_value()) continue;
    for (size_t t = 0; t < s; ++t) {
      if (r.planners_[t].has_value() && r.planners_[t]->SameBatching(*r.planners_[s])) {
        r.batching_of_[s] = t;
        break;
      }
    }
  }
  return r;
}

StatusOr<BatchRun> DynamicRunner::Run(const GlobalBatch& batch, const SimOptions& sim,
                                      const FlopCounter& flops, int64_t devices) {
  const auto start = std::chrono::steady_clock::now();
  const size_t n = strategies_.size();
  std::vector<std::optional<PlanResult>> homo(n);
  std::vector<std::optional<HeteroPlanResult>> het(n);
  std::vector<std::optional<BatchPlan>> batched(n);  // [strategy] its batching, when shared
  std::optional<size_t> best;
  Duration best_cost, best_switch;
  std::optional<HeteroConfig> from;
  if (previous_.has_value()) from = strategies_[*previous_].Layout();
  std::vector<int64_t> screened;
  // The strategy's estimated makespan as the choice weighs it.
  auto weigh = [&](size_t s, Duration estimate, Duration sw) {
    return Duration::Nanos(static_cast<int64_t>(static_cast<double>(estimate.nanos()) *
                                                strategies_[s].calibration)) +
           sw;
  };
  for (size_t s = 0; s < n; ++s) {
    Duration estimate;
    bool ok = false;
    const Duration sw = SwitchCost(from, strategies_[s].Layout(), cost_->model(), *cluster_);
    // A mix the screen would skip: skipped, or when its refresh is due, planned quickly (with
    // full refreshes a due mix is planned in full without screening it).
    bool quick = false;
    const bool due = screened_since_[s] + 1 >= kScreenRefresh;
    if (hetero_planners_[s].has_value() && options_.screen_margin.has_value() && best.has_value() &&
        !scale_[s].empty() && (!due || options_.quick_refresh)) {
      const std::optional<Duration> guess = hetero_planners_[s]->Screen(batch.samples, scale_[s]);
      if (guess.has_value() &&
          weigh(s,
                Duration::Nanos(static_cast<int64_t>(static_cast<double>(guess->nanos()) *
                                                     (1 - *options_.screen_margin))),
                sw) >= best_cost) {
        if (!due) {
          screened.push_back(static_cast<int64_t>(s));
          ++screened_since_[s];
          continue;
        }
        quick = true;
      }
    }
    if (planners_[s].has_value()) {
      std::optional<BatchPlan>& shared = batched[batching_of_[s]];
      if (!shared.has_value()) {
        SLUICE_ASSIGN_OR_RETURN(shared, planners_[s]->Batch(batch.samples));
      }
      SLUICE_ASSIGN_OR_RETURN(PlanResult p, planners_[s]->PlanBatched(batch.samples, *shared));
      ok = p.outcome == PlanOutcome::kOk;
      estimate = p.makespan + sync_[s];
      homo[s] = std::move(p);
    } else {
      SLUICE_ASSIGN_OR_RETURN(HeteroPlanResult p,
                              quick ? hetero_planners_[s]->PlanFrom(batch.samples, scale_[s])
                                    : hetero_planners_[s]->Plan(batch.samples));
      ok = p.outcome == PlanOutcome::kOk;
      estimate = p.makespan;
      screened_since_[s] = 0;
      if (ok) scale_[s] = p.scale;
      het[s] = std::move(p);
    }
    if (!ok) continue;
    const Duration cost = weigh(s, estimate, sw);
    if (!best.has_value() || cost < best_cost) {
      best = s;
      best_cost = cost;
      best_switch = sw;
    }
  }
  // Planning: every strategy's, and the choice.
  const double planning_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (!best.has_value()) {
    // No strategy planned the batch: the first one's outcome is the batch's.
    BatchRun out;
    if (homo[0].has_value()) {
      out.rec = StartRecord(batch, *homo[0]);
    } else {
      out.rec.batch = batch.index;
      out.rec.tokens = batch.tokens;
      out.rec.outcome = BatchOutcome::kOutOfMemory;
      out.rec.reason = het[0]->infeasible_reason;
    }
    out.rec.planning_ms = planning_ms;
    out.rec.reason = fmt::format("no strategy planned it; {}: {}", strategies_[0].Describe(),
                                 out.rec.reason);
    return out;
  }
  const size_t s = *best;
  BatchRun out;
  if (homo[s].has_value()) {
    SLUICE_ASSIGN_OR_RETURN(out, SimulateHomogeneous(std::move(*homo[s]), *planners_[s], batch,
                                                     sim, flops, devices, nullptr, false));
  } else {
    SLUICE_ASSIGN_OR_RETURN(
        out, SimulateHeteroBatch(*hetero_planners_[s], *het[s], batch, sim, flops, devices));
  }
  out.rec.planning_ms = planning_ms;
  out.rec.strategy = static_cast<int64_t>(s);
  out.rec.screened = std::move(screened);
  const bool changed = previous_.has_value() && *previous_ != static_cast<int64_t>(s);
  previous_ = static_cast<int64_t>(s);
  if (changed) ++switches_;
  if (out.rec.outcome != BatchOutcome::kOk) return out;
  // The switch: the devices move states instead of computing (exposed communication).
  out.rec.switch_ms = best_switch.millis();
  const double before = out.rec.iteration_ms;
  out.rec.iteration_ms += out.rec.switch_ms;
  if (out.rec.iteration_ms > 0) {
    out.rec.comm = (out.rec.comm * before + out.rec.switch_ms) / out.rec.iteration_ms;
    out.rec.bubble = out.rec.bubble * before / out.rec.iteration_ms;
  }
  out.account.comm += static_cast<double>(devices) * best_switch.seconds();
  out.account.device_seconds += static_cast<double>(devices) * best_switch.seconds();
  return out;
}

}  // namespace sluice
