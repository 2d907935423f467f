#include "planner/optimizer.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string_view>
#include <memory>
#include <utility>

#include "base/rng.h"
#include "plan/validate.h"
#include "planner/optimizer_candidates.h"

namespace sluice {
namespace {

using Candidate = std::shared_ptr<const passes::PlanPass>;

// Makes *to equal `from` again after a candidate was tried on it: only what differs is copied
// (a pass rewrites one rank, or a few), so the buffers of the rest are neither freed nor
// allocated. Exact: afterwards *to == from.
void RestoreFrom(const ExecutionPlan& from, ExecutionPlan* to) {
  if (to->ranks.size() != from.ranks.size()) {
    *to = from;
    return;
  }
  for (size_t r = 0; r < from.ranks.size(); ++r) {
    if (to->ranks[r] != from.ranks[r]) to->ranks[r] = from.ranks[r];
  }
  if (to->replicas != from.replicas) to->replicas = from.replicas;
  if (to->model_states != from.model_states) to->model_states = from.model_states;
  if (to->sample_ids != from.sample_ids) to->sample_ids = from.sample_ids;
  if (to->dropped != from.dropped) to->dropped = from.dropped;
  if (!(to->model == from.model) || !(to->cluster == from.cluster) ||
      !(to->parallel == from.parallel) || to->cost_model != from.cost_model ||
      to->method != from.method) {
    *to = from;
  }
}

// The kind of a pass: its Describe() up to the first '('.
std::string KindOf(const std::string& describe) { return describe.substr(0, describe.find('(')); }

CandidateKindStats& StatsOf(OptimizeResult* result, const std::string& kind) {
  for (CandidateKindStats& k : result->kinds) {
    if (k.kind == kind) return k;
  }
  result->kinds.push_back(CandidateKindStats{.kind = kind});
  return result->kinds.back();
}

Status CheckOptions(const OptimizerOptions& o) {
  if (o.max_steps < 0) {
    return InvalidArgumentError(
        fmt::format("optimizer: max_steps = {}; allowed: 0 or more", o.max_steps));
  }
  if (o.budget <= Duration::Zero()) {
    return InvalidArgumentError("optimizer: budget must be positive (milliseconds > 0)");
  }
  if (o.order_exhaustive_up_to < 0 || o.order_exhaustive_up_to > 10) {
    return InvalidArgumentError(fmt::format(
        "optimizer: order_exhaustive_up_to = {}; allowed: 0..10", o.order_exhaustive_up_to));
  }
  if (!(o.order_budget_share > 0 && o.order_budget_share <= 1)) {
    return InvalidArgumentError(fmt::format(
        "optimizer: order_budget_share = {}; allowed: (0, 1]", o.order_budget_share));
  }
  if (!(o.placed_order_share >= 0 && o.placed_order_share <= 1)) {
    return InvalidArgumentError(
        fmt::format("optimizer: placed_order_share = {}; allowed: [0, 1]", o.placed_order_share));
  }
  if (o.order_estimates < 0) {
    return InvalidArgumentError(
        fmt::format("optimizer: order_estimates = {}; allowed: 0 or more", o.order_estimates));
  }
  if (!(o.beta > 0) || !std::isfinite(o.beta)) {
    return InvalidArgumentError(fmt::format("optimizer: beta = {}; allowed: > 0", o.beta));
  }
  return Status::Ok();
}

}  // namespace

std::string_view OptimizerSearchName(OptimizerSearch search) {
  return search == OptimizerSearch::kMcmc ? "mcmc" : "greedy";
}

std::string_view CandidateDrawName(CandidateDraw draw) {
  return draw == CandidateDraw::kUniform ? "uniform" : "by-kind";
}

Duration BudgetLeft(Duration budget, std::chrono::steady_clock::time_point since) {
  const Duration spent = Duration::Nanos(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - since)
          .count());
  return std::max(Duration::Micros(1), budget - spent);
}

namespace {

Duration Since(std::chrono::steady_clock::time_point t) {
  return Duration::Nanos(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t)
          .count());
}

}  // namespace

StatusOr<OptimizeResult> OptimizePlan(const ExecutionPlan& plan, const OptimizerOptions& options) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  SLUICE_RETURN_IF_ERROR(CheckOptions(options));
  SLUICE_RETURN_IF_ERROR(ValidatePlan(plan, ValidateOptions{.grid_context = 2}));
  SimOptions sim = options.sim;
  sim.record_timeline = true;
  sim.record_memory = false;
  OptimizeResult result;
  // Copying the plan once, timed: what freeing the search's copies of it at the end takes is
  // of that order (the hard end below leaves room for it).
  const Clock::time_point copy0 = Clock::now();
  result.plan = plan;
  const Duration copy_cost = Since(copy0);
  SLUICE_ASSIGN_OR_RETURN(SimResult base, Simulate(plan, sim));
  result.before = result.after = base.iteration_time;
  auto elapsed = [&] {
    return Duration::Nanos(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
  };
  // What checking and simulating one plan costs: the order search and the placement end this
  // much before their share of the budget, so scoring what they found stays within it.
  const Duration eval_cost = elapsed();
  if (base.outcome != SimOutcome::kOk) {
    result.wall = elapsed();
    return result;
  }
  // The hard end: no candidate is scored after it, and a simulation still running then stops (the
  // simulator asks every few hundred events), its candidate dropped; what the search kept so far is
  // returned. The soft checks below (a phase or a step is not started when it would not end in
  // time) keep that rare; this bounds the rest: a step slower than any before it (a busy machine,
  // a page fault). Its reserve covers the simulator's check interval and what follows the last
  // check: a fortieth of the budget (1.25 ms of 50), and four plan copies' time for freeing the
  // search's copies of the plan and its simulations (a 16-rank T5 plan of 150 micro-batches:
  // 0.7-0.9 ms were measured between the search's end and its caller's).
  // The checks below that foresee (a phase or a step is started only when it ends in time) aim
  // at the hard end too, so that the reserve is left for what it covers.
  const Duration usable = Duration::Nanos(std::max<int64_t>(
      0, options.budget.nanos() - options.budget.nanos() / 40 - 4 * copy_cost.nanos()));
  const Clock::time_point hard_end = t0 + std::chrono::nanoseconds(usable.nanos());
  bool out_of_time = false;
  SimOptions bounded = sim;
  bounded.cancelled = [&] {
    out_of_time = out_of_time || Clock::now() >= hard_end;
    return out_of_time || (sim.cancelled && sim.cancelled());
  };
  // The candidate simulated, or nullopt (and budget_hit) when the hard end came first.
  auto score = [&](const ExecutionPlan& p) -> StatusOr<std::optional<SimResult>> {
    out_of_time = out_of_time || Clock::now() >= hard_end;
    if (!out_of_time) {
      StatusOr<SimResult> r = Simulate(p, bounded);
      if (r.ok()) return std::optional<SimResult>(std::move(r).value());
      if (!out_of_time) return r.status();
    }
    result.budget_hit = true;
    return std::optional<SimResult>();
  };
  Rng rng(options.seed);
  ExecutionPlan current = plan;
  Duration current_time = base.iteration_time;
  std::vector<passes::PassRecord> current_path;
  // Keeps `next` (simulated as `r`) as the current and best plan.
  auto keep = [&](ExecutionPlan next, SimResult r, passes::PassRecord record) {
    ++result.accepted;
    current = std::move(next);
    current_time = r.iteration_time;
    base = std::move(r);
    current_path.push_back(std::move(record));
    result.after = current_time;
    result.plan = current;
    result.applied = current_path;
  };
  // The orders the plan's replicas run (permutations of the input's micro-batches) and the
  // estimates the order search measures against.
  std::vector<std::vector<int64_t>> orders;
  const bool reorder =
      options.relowerer != nullptr && options.max_steps > 0 && options.order_estimates > 0;
  if (reorder) {
    orders.resize(static_cast<size_t>(options.relowerer->dp()));
    for (int64_t d = 0; d < options.relowerer->dp(); ++d) {
      orders[d].resize(static_cast<size_t>(options.relowerer->size(d)));
      for (int64_t i = 0; i < options.relowerer->size(d); ++i) orders[d][i] = i;
    }
  }
  // The micro-batch order search (see the header) with `rl`, until `order_end` after t0. Returns
  // whether an order was kept.
  // The estimates the order search may spend before the placement: all of them, unless the plan
  // recomputes somewhere and a pricer is given (the placement may then change levels), when the
  // search after the placement keeps its share of them.
  int64_t first_estimates = options.order_estimates;
  if (reorder && options.pricer != nullptr && options.placed_order_share > 0) {
    bool recomputes = false;
    for (const RankProgram& p : plan.ranks) {
      for (const Instruction& in : p.instructions) {
        recomputes = recomputes || (in.op == OpKind::kForward && in.recompute != Recompute::kNone);
      }
    }
    if (recomputes) {
      first_estimates = static_cast<int64_t>(
          static_cast<double>(options.order_estimates) * options.order_budget_share /
          std::min(1.0, options.order_budget_share + options.placed_order_share));
    }
  }
  // The longest lowering, check and simulation of an order tried, and the first placement's
  // time: what the search after the placement leaves room for.
  Duration longest_try = Duration::Zero();
  Duration placement_wall = Duration::Zero();
  // `kicks`: SearchReplicaOrder's iterated local search after its descent.
  auto order_phase = [&](const Relowerer& rl, Duration order_end, int64_t max_estimates, bool kicks,
                         const std::string& kind = "reorder-microbatches") -> StatusOr<bool> {
    if (result.order_estimates + rl.dp() >= max_estimates) return false;
    if (elapsed() >= order_end) {
      result.budget_hit = true;
      return false;
    }
    const int64_t dp = rl.dp();
    std::vector<bool> searched(static_cast<size_t>(dp), false);
    std::vector<Duration> estimate(static_cast<size_t>(dp), Duration::Zero());
    std::vector<std::vector<int64_t>> found = orders;
    bool any = false;
    // The estimates of the plan's own orders.
    ScheduleCosts scratch;
    for (int64_t d = 0; d < dp; ++d) {
      SLUICE_ASSIGN_OR_RETURN(ScheduleResult r, rl.Estimate(d, orders[d], &scratch));
      ++result.order_estimates;
      estimate[d] = r.estimate.makespan;
    }
    while (result.simulations < options.max_steps) {
      if (out_of_time || elapsed() >= usable) {
        result.budget_hit = true;
        break;
      }
      const int64_t critical = CriticalReplica(current, base);
      if (critical < 0 || searched[critical]) break;
      const Clock::time_point c0 = Clock::now();
      CandidateKindStats& stats = StatsOf(&result, kind);
      // Critical replica first, then every replica still estimated longer, slowest first.
      std::vector<int64_t> todo = {critical};
      std::vector<int64_t> rest;
      for (int64_t d = 0; d < dp; ++d) {
        if (d != critical && !searched[d]) rest.push_back(d);
      }
      std::stable_sort(rest.begin(), rest.end(),
                       [&](int64_t a, int64_t b) { return estimate[a] > estimate[b]; });
      todo.insert(todo.end(), rest.begin(), rest.end());
      Duration target = Duration::Zero();
      std::vector<int64_t> changed;
      for (size_t k = 0; k < todo.size(); ++k) {
        const int64_t d = todo[k];
        if (d != critical && estimate[d] <= target) continue;
        // An equal part of what is left, for this replica and each one after it.
        const int64_t parts = static_cast<int64_t>(todo.size() - k);
        const int64_t left = (max_estimates - result.order_estimates) / parts;
        const Duration time_left = order_end - elapsed();
        if (left <= 0 || time_left <= Duration::Zero()) {
          result.budget_hit = result.budget_hit || time_left <= Duration::Zero();
          break;
        }
        const Clock::time_point deadline =
            Clock::now() + std::chrono::nanoseconds(time_left.nanos() / parts);
        SLUICE_ASSIGN_OR_RETURN(
            OrderSearch os,
            SearchReplicaOrder(rl, d, orders[d], left, options.order_exhaustive_up_to, deadline,
                               /*kicks=*/kicks));
        result.order_estimates += os.estimates;
        result.budget_hit = result.budget_hit || os.deadline_hit;
        searched[d] = true;
        if (os.order != orders[d]) {
          found[d] = os.order;
          changed.push_back(d);
        }
        target = std::max(target, os.makespan);
      }
      if (changed.empty()) {
        stats.wall += Duration::Nanos(
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - c0).count());
        break;
      }
      // All the changed replicas together, then (if that is not shorter) the critical one alone.
      std::vector<std::vector<std::vector<int64_t>>> tries;
      tries.push_back(orders);
      for (int64_t d : changed) tries.back()[d] = found[d];
      if (changed.size() > 1 && changed.front() == critical) {
        tries.push_back(orders);
        tries.back()[critical] = found[critical];
      }
      bool kept = false;
      for (size_t k = 0; k < tries.size(); ++k) {
        const std::vector<std::vector<int64_t>>& t = tries[k];
        if (result.simulations >= options.max_steps) break;
        // A try only when it ends within the budget, as long as the longest one so far (twice
        // the input's check and simulation before the first: lowering the orders again is the
        // part the hard end cannot stop), a quarter more on top.
        const Duration expect = std::max(longest_try, eval_cost + eval_cost);
        if (elapsed() + expect + Duration::Nanos(expect.nanos() / 4) >= usable) {
          result.budget_hit = true;
          break;
        }
        ++stats.tried;
        const Clock::time_point l0 = Clock::now();
        StatusOr<ExecutionPlan> next = rl.Lower(t);
        if (!next.ok() || !ValidatePlan(*next).ok()) {
          ++result.invalid;
          continue;
        }
        SLUICE_ASSIGN_OR_RETURN(std::optional<SimResult> scored, score(*next));
        if (!scored.has_value()) break;
        SimResult& r = *scored;
        longest_try = std::max(longest_try, Since(l0));
        ++result.simulations;
        ++stats.simulated;
        if (r.outcome != SimOutcome::kOk || r.iteration_time >= current_time) continue;
        passes::PassRecord record;
        record.pass = "reorder-microbatches";
        record.changed = true;
        for (int64_t d = 0; d < dp; ++d) {
          bool identity = true;
          for (int64_t i = 0; i < rl.size(d); ++i) identity = identity && t[d][i] == i;
          if (identity) continue;
          std::string text;
          for (int64_t i : t[d]) text += fmt::format("{}{}", text.empty() ? "" : " ", i);
          record.changes.push_back(fmt::format("replica {}: micro-batches in the order {} of the "
                                               "lowered plan",
                                               d, text));
        }
        // With placed levels (WithLevelsOf) the record also lists them, in the new plan's
        // micro-batch indices: it replaces the placement's record.
        for (const RankProgram& p : next->ranks) {
          for (const Instruction& in : p.instructions) {
            if (in.op != OpKind::kForward) continue;
            const Recompute own = next->replicas[p.dp_index].micro_batches[in.microbatch].recompute;
            if (in.recompute == own) continue;
            record.changes.push_back(fmt::format(
                "replica {} micro-batch {} stage {}: {} -> {} (placed before the reorder)",
                p.dp_index, in.microbatch, in.stage, RecomputeName(own),
                RecomputeName(in.recompute)));
          }
        }
        ++stats.accepted;
        stats.gain += current_time - r.iteration_time;
        for (int64_t d = 0; d < dp; ++d) {
          if (t[d] != orders[d]) {
            SLUICE_ASSIGN_OR_RETURN(ScheduleResult e, rl.Estimate(d, t[d], &scratch));
            ++result.order_estimates;
            estimate[d] = e.estimate.makespan;
          }
        }
        orders = t;
        // The record holds every replica's order from the input, and the levels it keeps: it
        // replaces the earlier ones.
        current_path.clear();
        keep(std::move(next).value(), std::move(r), std::move(record));
        kept = true;
        any = true;
        break;
      }
      stats.wall += Duration::Nanos(
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - c0).count());
      if (!kept) break;
    }
    return any;
  };
  // The whole-plan recompute placement, the one bulk move (it changes many (micro-batch, stage)
  // pairs at once, which single moves would take many steps to reach). Returns whether it was
  // kept.
  auto placement_phase = [&]() -> StatusOr<bool> {
    const bool place = options.pricer != nullptr && options.max_steps > 0 &&
                       result.simulations < options.max_steps;
    if (!place || out_of_time) return false;
    // Its simulation at the end is as long as the input's, a quarter more on top (as a step's
    // margin, below).
    const Duration last = eval_cost + Duration::Nanos(eval_cost.nanos() / 4);
    if (elapsed() + last >= usable) {
      result.budget_hit = true;
      return false;
    }
    const Clock::time_point c0 = Clock::now();
    CandidateKindStats& stats = StatsOf(&result, "recompute-placement");
    ++stats.tried;
    ExecutionPlan next = current;
    const Clock::time_point deadline =
        t0 + std::chrono::nanoseconds((usable - last).nanos());
    SLUICE_ASSIGN_OR_RETURN(passes::PassRecord record,
                            passes::RecomputePlacementPass(options.pricer, deadline).Run(&next));
    if (!record.degraded.empty()) result.budget_hit = true;
    bool kept = false;
    if (record.changed) {
      SLUICE_ASSIGN_OR_RETURN(std::optional<SimResult> scored, score(next));
      if (!scored.has_value()) {
        stats.wall += Since(c0);
        return false;
      }
      SimResult& r = *scored;
      ++result.simulations;
      ++stats.simulated;
      if (r.outcome == SimOutcome::kOk && r.iteration_time < current_time) {
        ++stats.accepted;
        stats.gain += current_time - r.iteration_time;
        keep(std::move(next), std::move(r), std::move(record));
        kept = true;
      }
    } else if (!record.rejected.empty() && record.degraded.empty()) {
      ++result.invalid;
    }
    stats.wall += Since(c0);
    placement_wall = std::max(placement_wall, Since(c0));
    return kept;
  };
  const auto share_end = [&](double share) {
    return Duration::Nanos(
               static_cast<int64_t>(static_cast<double>(options.budget.nanos()) * share)) -
           eval_cost;
  };
  // The orders, the placement, and (when the placement was kept and changed levels) the orders
  // again at the placed levels, then the placement again (see the header).
  if (reorder) {
    SLUICE_RETURN_IF_ERROR(order_phase(*options.relowerer, share_end(options.order_budget_share),
                                       first_estimates,
                                       /*kicks=*/true)
                               .status());
  }
  SLUICE_ASSIGN_OR_RETURN(const bool placed, placement_phase());
  if (reorder && placed && options.placed_order_share > 0) {
    SLUICE_ASSIGN_OR_RETURN(const Relowerer at_levels,
                            options.relowerer->WithLevelsOf(current, orders));
    // It ends early enough for its try (the orders lowered, checked and simulated) and the
    // placement after it, a quarter more on top.
    const Duration one_try = std::max(longest_try, eval_cost + eval_cost);
    const Duration after = one_try + placement_wall + eval_cost;
    const Duration end =
        std::min(share_end(std::min(1.0, options.order_budget_share + options.placed_order_share)),
                 usable - after - Duration::Nanos(after.nanos() / 4));
    if (at_levels.level_changes() > 0 && elapsed() < end) {
      SLUICE_ASSIGN_OR_RETURN(const bool moved,
                              // Without kicks: at the placed levels an order tuned further to
                              // its estimate left the placement after it less to gain
                              // (docs/benchmarks.md, "Kicks in the order search").
                              order_phase(at_levels, end, options.order_estimates,
                                          /*kicks=*/false, "reorder-microbatches (placed levels)"));
      // The placement again, when it ends within the budget as long as the first one took, half
      // of it more on top (one its deadline stops while pricing changes nothing: that time would
      // be lost).
      if (moved) {
        if (elapsed() + placement_wall + Duration::Nanos(placement_wall.nanos() / 2) <
            usable) {
          SLUICE_RETURN_IF_ERROR(placement_phase().status());
        } else {
          result.budget_hit = true;
        }
      }
    }
  }
  // Then the MoE overlap rewrites, each on the same plan; the shortest is kept if shorter.
  if (!options.moe_overlaps.empty() && options.max_steps > 0 && !out_of_time) {
    const Clock::time_point c0 = Clock::now();
    CandidateKindStats& stats = StatsOf(&result, "moe-overlap");
    const ExecutionPlan start = current;
    const Duration start_time = current_time;
    for (const passes::MoeOverlap overlap : options.moe_overlaps) {
      ExecutionPlan next = start;
      ++stats.tried;
      SLUICE_ASSIGN_OR_RETURN(
          passes::PassRecord record,
          passes::MoeOverlapPass(overlap, options.moe_overlap_options).Run(&next));
      if (!record.changed) {
        if (!record.rejected.empty()) ++result.invalid;
        continue;
      }
      SLUICE_ASSIGN_OR_RETURN(std::optional<SimResult> scored, score(next));
      if (!scored.has_value()) break;
      SimResult& r = *scored;
      ++result.simulations;
      ++stats.simulated;
      if (r.outcome == SimOutcome::kOk && r.iteration_time < current_time) {
        ++result.accepted;
        current = std::move(next);
        current_time = r.iteration_time;
        base = std::move(r);
        result.applied = current_path;
        result.applied.push_back(std::move(record));
        result.after = current_time;
        result.plan = current;
      }
    }
    if (current_time < start_time) {
      ++stats.accepted;
      stats.gain += start_time - current_time;
    }
    current_path = result.applied;
    stats.wall += Duration::Nanos(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - c0).count());
  }
  std::vector<Candidate> pool;
  std::vector<std::string> pool_kinds;  // pool[i]'s kind
  auto new_pool = [&](const SimResult& r) {
    pool = CriticalPathCandidates(current, r, options.pricer);
    pool_kinds.clear();
    for (const Candidate& c : pool) pool_kinds.push_back(KindOf(c->Describe()));
  };
  new_pool(base);
  // The candidates are tried on `next`, a copy of `current` kept between steps: after a refused
  // or rejected candidate only what the pass changed is copied back (RestoreFrom).
  ExecutionPlan next = current;
  // A step is not started when the longest one so far would end past the budget (a step, a
  // simulation of the whole plan, takes milliseconds on large plans); before the first, checking
  // and simulating the input stands in for it.
  Duration longest_step = eval_cost;
  while (result.simulations < options.max_steps && !pool.empty()) {
    // Half the longest step on top: a step on a busy machine can take longer than any before it
    // (without a margin, 0.3-1.0 ms past a 50 ms budget was measured; with a quarter, 0.5-1.8 ms
    // on the grid's T5 rows with the other core busy).
    if (out_of_time ||
        elapsed() + longest_step + Duration::Nanos(longest_step.nanos() / 2) >= usable) {
      result.budget_hit = true;
      break;
    }
    const Clock::time_point c0 = Clock::now();
    const size_t pick = DrawCandidate(options.draw, pool_kinds, result, current_time,
                                      static_cast<int64_t>(current.ranks.size()), &rng);
    const Candidate candidate = pool[pick];
    CandidateKindStats& stats = StatsOf(&result, pool_kinds[pick]);
    pool.erase(pool.begin() + static_cast<std::ptrdiff_t>(pick));
    pool_kinds.erase(pool_kinds.begin() + static_cast<std::ptrdiff_t>(pick));
    auto charge = [&] {
      const Duration step = Duration::Nanos(
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - c0).count());
      stats.wall += step;
      longest_step = std::max(longest_step, step);
    };
    ++stats.tried;
    SLUICE_ASSIGN_OR_RETURN(passes::PassRecord record, candidate->Run(&next));
    if (!record.changed) {
      if (!record.rejected.empty()) ++result.invalid;
      RestoreFrom(current, &next);
      charge();
      continue;
    }
    SLUICE_ASSIGN_OR_RETURN(std::optional<SimResult> scored, score(next));
    if (!scored.has_value()) {
      charge();
      break;
    }
    SimResult& r = *scored;
    ++result.simulations;
    ++stats.simulated;
    if (r.outcome != SimOutcome::kOk) {
      RestoreFrom(current, &next);
      charge();
      continue;
    }
    const double gain_pct = 100.0 * static_cast<double>((current_time - r.iteration_time).nanos()) /
                            static_cast<double>(std::max<int64_t>(current_time.nanos(), 1));
    bool accept = r.iteration_time < current_time;
    if (!accept && options.search == OptimizerSearch::kMcmc) {
      const double p =
          std::exp(options.beta * std::log(static_cast<double>(result.simulations) + 1) * gain_pct);
      accept = rng.Uniform01() < p;
    }
    if (!accept) {
      RestoreFrom(current, &next);
      charge();
      continue;
    }
    ++result.accepted;
    ++stats.accepted;
    stats.gain += current_time - r.iteration_time;
    current = next;
    current_time = r.iteration_time;
    current_path.push_back(std::move(record));
    new_pool(r);
    if (current_time < result.after) {
      result.after = current_time;
      result.plan = current;
      result.applied = current_path;
    }
    charge();
  }
  // The search's copies are freed here, inside the time it reports.
  next = ExecutionPlan();
  current = ExecutionPlan();
  base = SimResult();
  pool.clear();
  result.wall = elapsed();
  return result;
}

}  // namespace sluice
