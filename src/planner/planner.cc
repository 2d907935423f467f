#include "planner/planner.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "batching/dynamic_cp.h"
#include "batching/expert_groups.h"
#include "plan/validate.h"
#include "planner/recompute_pricer.h"
#include "schedule/schedule_costs.h"
#include "sim/simulator.h"

namespace sluice {

StatusOr<std::shared_ptr<const StageCostEvaluator>> MakePlannerEvaluator(
    const CostModel& cost, const ParallelConfig& parallel, const ClusterSpec& cluster,
    ScheduleKind schedule, StageCostOptions options) {
  options.in_flight = InFlightPolicyFor(schedule, parallel.vpp);
  SLUICE_ASSIGN_OR_RETURN(StageCostEvaluator eval,
                          StageCostEvaluator::Create(cost, parallel, cluster, options));
  return std::make_shared<const StageCostEvaluator>(std::move(eval));
}

StatusOr<Planner> Planner::Create(const CostModel& cost, const ParallelConfig& parallel,
                                  const ClusterSpec& cluster, PlannerOptions options) {
  SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<const StageCostEvaluator> eval,
                          MakePlannerEvaluator(cost, parallel, cluster, options.schedule));
  return Create(std::move(eval), cluster, std::move(options));
}

StatusOr<Planner> Planner::Create(std::shared_ptr<const StageCostEvaluator> eval,
                                  const ClusterSpec& cluster, PlannerOptions options) {
  SLUICE_CHECK_MSG(eval != nullptr, "Planner::Create: no evaluator");
  const ScheduleKind kind = options.schedule;
  const int64_t vpp = eval->parallel().vpp;
  if (!SupportsVpp(kind, vpp)) {
    return InvalidArgumentError(
        fmt::format("schedule '{}' does not run with vpp = {} (gpipe, 1f1b and zb-h1 run vpp = 1; "
                    "interleaved and adaptive run any vpp)",
                    ScheduleKindName(kind), vpp));
  }
  const InFlightPolicy policy = InFlightPolicyFor(kind, vpp);
  if (eval->options().in_flight != policy) {
    return InvalidArgumentError(fmt::format(
        "planner: schedule '{}' needs a cost evaluator made for its in-flight rule (GPipe keeps "
        "every micro-batch's activations, interleaved at vpp > 1 Megatron's interleaved count, "
        "the others a pipeline's depth): make it with MakePlannerEvaluator",
        ScheduleKindName(kind)));
  }
  Planner planner(std::move(eval), cluster, std::move(options));
  if (planner.options_.dynamic_cp) {
    ParallelConfig par = planner.eval_->parallel();
    // A sub-group of cp / 2^j devices: priced on the configuration with cp / 2^j and 2^j times
    // the dp, so the model states keep their sharding over the same dp x cp devices.
    while (par.cp > 1) {
      par.cp /= 2;
      par.dp *= 2;
      SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<const StageCostEvaluator> narrow,
                              MakePlannerEvaluator(planner.eval_->cost_model(), par, cluster,
                                                   kind, planner.eval_->options()));
      planner.narrower_.push_back(std::move(narrow));
    }
  }
  return planner;
}

bool Planner::SameBatching(const Planner& other) const {
  return eval_ == other.eval_ && options_.method == other.options_.method &&
         options_.batching == other.options_.batching &&
         options_.dynamic_cp_rule == other.options_.dynamic_cp_rule &&
         narrower_.size() == other.narrower_.size();
}

StatusOr<BatchPlan> Planner::Batch(std::span<const Sample> batch) const {
  return BatchWith(batch, !narrower_.empty());
}

StatusOr<BatchPlan> Planner::BatchWith(std::span<const Sample> batch, bool split) const {
  if (static_cast<int64_t>(batch.size()) < eval_->parallel().dp) {
    return InvalidArgumentError(fmt::format(
        "a global batch of {} sample{} cannot feed {} data-parallel replicas: every replica needs "
        "at least one sample (use fewer replicas, or more samples per batch)",
        batch.size(), batch.size() == 1 ? "" : "s", eval_->parallel().dp));
  }
  SLUICE_ASSIGN_OR_RETURN(BatchPlan plan,
                          RunMethod(options_.method, batch, *eval_, options_.batching));
  if (plan.outcome == PlanOutcome::kOk && split) {
    ApplyDynamicCp(&plan, batch, *eval_, narrower_, options_.dynamic_cp_rule);
  }
  const ParallelConfig& par = eval_->parallel();
  if (plan.outcome == PlanOutcome::kOk && par.ep > 1 && par.dp % par.ep == 0) {
    // The replicas of an expert-parallel group pair their all-to-alls one by one. A group that
    // cannot be equalised within the memory limit makes the batch infeasible (an outcome).
    StatusOr<int64_t> changes = EqualizeExpertGroups(&plan, batch, *eval_, par.ep);
    if (!changes.ok()) {
      if (changes.status().code() != StatusCode::kFailedPrecondition) return changes.status();
      plan.outcome = PlanOutcome::kOutOfMemory;
      plan.infeasible_reason = changes.status().message();
    }
  }
  return plan;
}

StatusOr<PlanResult> Planner::Plan(std::span<const Sample> batch) const {
  const auto start = std::chrono::steady_clock::now();
  SLUICE_ASSIGN_OR_RETURN(BatchPlan batching, Batch(batch));
  SLUICE_ASSIGN_OR_RETURN(PlanResult result, PlanBatched(batch, std::move(batching)));
  result.planning_time = Duration::Nanos(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                             std::chrono::steady_clock::now() - start)
                                             .count());
  return result;
}

StatusOr<PlanResult> Planner::PlanBatched(std::span<const Sample> batch,
                                          BatchPlan batching) const {
  const auto start = std::chrono::steady_clock::now();
  SLUICE_ASSIGN_OR_RETURN(PlanResult result, PlanBatchedOnce(batch, std::move(batching)));
  if (result.outcome != PlanOutcome::kOk && result.cp_splits > 0) {
    // A split micro-batch made a later memory check fail: every micro-batch whole again.
    SLUICE_ASSIGN_OR_RETURN(BatchPlan whole, BatchWith(batch, false));
    SLUICE_ASSIGN_OR_RETURN(result, PlanBatchedOnce(batch, std::move(whole)));
  }
  result.planning_time = Duration::Nanos(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                             std::chrono::steady_clock::now() - start)
                                             .count());
  return result;
}

StatusOr<PlanResult> Planner::PlanBatchedOnce(std::span<const Sample> batch,
                                              BatchPlan batching) const {
  const auto start = std::chrono::steady_clock::now();
  PlanResult result;
  result.batch_plan = std::move(batching);
  auto finish = [&](PlanResult r) {
    r.planning_time = Duration::Nanos(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                          std::chrono::steady_clock::now() - start)
                                          .count());
    return r;
  };
  if (result.batch_plan.outcome != PlanOutcome::kOk) {
    result.outcome = result.batch_plan.outcome;
    result.infeasible_reason = "batching: " + result.batch_plan.infeasible_reason;
    return finish(std::move(result));
  }
  for (const std::vector<MicroBatch>& replica : result.batch_plan.replicas) {
    for (const MicroBatch& mb : replica) result.cp_splits += mb.cp_split > 1 ? 1 : 0;
  }

  const int64_t dp = eval_->parallel().dp;
  std::vector<Schedule> schedules(static_cast<size_t>(dp));
  result.estimates.resize(static_cast<size_t>(dp));
  result.peak_memory.assign(static_cast<size_t>(eval_->pp()), Bytes::Zero());
  ScheduleCostOptions cost_options = options_.lower.costs;
  const InterleavedRounds rounds =
      eval_->parallel().ep > 1 ? InterleavedRounds::kPadded : options_.interleaved_rounds;
  std::vector<ScheduleCosts> replica_costs(static_cast<size_t>(dp));  // in the final order
  for (int64_t d = 0; d < dp; ++d) {
    std::vector<MicroBatch>& mbs = result.batch_plan.replicas[d];
    cost_options.replica = d;
    SLUICE_ASSIGN_OR_RETURN(ScheduleCosts costs,
                            BuildScheduleCosts(mbs, *eval_, cluster_, cost_options));
    ScheduleResult chosen;
    Duration given;
    if (options_.search_order) {
      OrderSearchOptions search = options_.search;
      search.seed = options_.batching.seed + static_cast<uint64_t>(d);
      search.schedule.rounds = rounds;
      SLUICE_ASSIGN_OR_RETURN(OrderSearchResult found,
                              SearchMicroBatchOrder(options_.schedule, costs, search));
      if (found.outcome != PlanOutcome::kOk) {
        result.outcome = found.outcome;
        result.infeasible_reason = fmt::format("schedule {} on replica {}: {}",
                                               ScheduleKindName(options_.schedule), d,
                                               found.infeasible_reason);
        return finish(std::move(result));
      }
      std::vector<MicroBatch> reordered;
      reordered.reserve(mbs.size());
      for (int64_t i : found.order) reordered.push_back(std::move(mbs[i]));
      mbs = std::move(reordered);
      chosen = std::move(found.result);
      given = found.given_makespan;
      PermuteMicroBatches(costs, found.order, &replica_costs[d]);
    } else {
      ScheduleOptions schedule_options = options_.schedule_options;
      schedule_options.rounds = rounds;
      SLUICE_ASSIGN_OR_RETURN(chosen,
                              GenerateSchedule(options_.schedule, costs, schedule_options));
      replica_costs[d] = std::move(costs);
      if (chosen.outcome != PlanOutcome::kOk) {
        result.outcome = chosen.outcome;
        result.infeasible_reason = fmt::format("schedule {} on replica {}: {}",
                                               ScheduleKindName(options_.schedule), d,
                                               chosen.infeasible_reason);
        return finish(std::move(result));
      }
      given = chosen.estimate.makespan;
    }
    const ScheduleEstimate& est = chosen.estimate;
    if (est.makespan >= result.makespan) {
      result.makespan = est.makespan;
      result.bubble_fraction = est.bubble_fraction;
    }
    result.given_order_makespan = std::max(result.given_order_makespan, given);
    for (size_t r = 0; r < est.peak_memory.size() && r < result.peak_memory.size(); ++r) {
      result.peak_memory[r] = std::max(result.peak_memory[r], est.peak_memory[r]);
    }
    result.estimates[d] = est;
    schedules[d] = std::move(chosen.schedule);
  }

  // Lowers `s` and checks the result (the plan's memory rule apart).
  ValidateOptions without_memory;
  without_memory.check_memory = false;
  auto lower = [&](const std::vector<Schedule>& s) -> StatusOr<ExecutionPlan> {
    SLUICE_ASSIGN_OR_RETURN(ExecutionPlan plan, LowerPlan(result.batch_plan, batch, s, *eval_,
                                                          cluster_, options_.lower));
    Status valid = ValidatePlan(plan, without_memory);
    if (!valid.ok()) {
      return InternalError(fmt::format("the planned execution plan failed validation: {}",
                                       valid.message()));
    }
    return plan;
  };
  // The replicas in flexible interleaved rounds moved to padded ones (same micro-batch order) in
  // `s` and `est`; returns which.
  auto to_padded = [&](std::vector<Schedule>* s,
                       std::vector<ScheduleEstimate>* est) -> StatusOr<std::vector<int64_t>> {
    std::vector<int64_t> moved;
    ScheduleOptions padded = options_.schedule_options;
    padded.rounds = InterleavedRounds::kPadded;
    for (int64_t d = 0; d < dp; ++d) {
      if ((*s)[d].name != kInterleavedFlexName) continue;
      SLUICE_ASSIGN_OR_RETURN(ScheduleResult again,
                              GenerateSchedule(options_.schedule, replica_costs[d], padded));
      if (again.outcome != PlanOutcome::kOk) continue;
      (*s)[d] = std::move(again.schedule);
      (*est)[d] = std::move(again.estimate);
      moved.push_back(d);
    }
    return moved;
  };
  // result's makespan, bubble and peaks from its estimates.
  auto summarize = [&] {
    result.makespan = Duration::Zero();
    result.peak_memory.assign(static_cast<size_t>(eval_->pp()), Bytes::Zero());
    for (const ScheduleEstimate& est : result.estimates) {
      if (est.makespan >= result.makespan) {
        result.makespan = est.makespan;
        result.bubble_fraction = est.bubble_fraction;
      }
      for (size_t r = 0; r < est.peak_memory.size() && r < result.peak_memory.size(); ++r) {
        result.peak_memory[r] = std::max(result.peak_memory[r], est.peak_memory[r]);
      }
    }
  };

  if (eval_->parallel().ep > 1 && dp % eval_->parallel().ep == 0) {
    // The replicas of an expert-parallel group pair their all-to-alls one by one, so they run one
    // action order: of the members' own orders, the one whose slowest member is estimated
    // shortest among those that fit every member's memory.
    const int64_t ep = eval_->parallel().ep;
    for (int64_t first = 0; first < dp; first += ep) {
      bool same = true;
      for (int64_t d = first + 1; d < first + ep; ++d) {
        same = same && schedules[d].ranks == schedules[first].ranks;
      }
      if (same) continue;
      std::optional<int64_t> best;
      Duration best_time;
      std::vector<ScheduleEstimate> best_estimates;
      std::string first_problem;  // why the first rejected order was
      for (int64_t c = first; c < first + ep; ++c) {
        std::vector<ScheduleEstimate> estimates;
        Duration slowest;
        bool ok = true;
        for (int64_t d = first; d < first + ep && ok; ++d) {
          ScheduleEstimate e = EstimateSchedule(schedules[c], replica_costs[d]);
          ok = e.completed && e.fits_memory;
          if (!ok && first_problem.empty()) {
            first_problem = fmt::format("replica {}'s order on replica {}: {}", c, d,
                                        e.completed ? e.memory_problem : e.problem);
          }
          slowest = std::max(slowest, e.makespan);
          estimates.push_back(std::move(e));
        }
        if (ok && (!best.has_value() || slowest < best_time)) {
          best = c;
          best_time = slowest;
          best_estimates = std::move(estimates);
        }
      }
      if (!best.has_value()) {
        result.outcome = PlanOutcome::kOutOfMemory;
        result.infeasible_reason = fmt::format(
            "expert parallelism: replicas {}-{} (ep = {}) must run one action order so that their "
            "all-to-alls pair up, and no member's {} order runs on every member ({})",
            first, first + ep - 1, ep, ScheduleKindName(options_.schedule), first_problem);
        return finish(std::move(result));
      }
      for (int64_t d = first; d < first + ep; ++d) {
        if (d != *best) schedules[d] = schedules[*best];
        result.estimates[d] = std::move(best_estimates[d - first]);
      }
    }
    summarize();
  }

  SLUICE_ASSIGN_OR_RETURN(result.plan, lower(schedules));
  // The one memory rule (check 7) on the lowered plan, whose buffers are known only now. The
  // budgets above keep room for them, so this rarely rejects.
  std::optional<MemoryProblem> problem = CheckPlanMemory(result.plan);
  if (problem && rounds == InterleavedRounds::kAuto) {
    // Flexible rounds hold more chunks than the padded ones: fall back to padded rounds for the
    // replicas that run them, and check again.
    SLUICE_ASSIGN_OR_RETURN(std::vector<int64_t> moved, to_padded(&schedules, &result.estimates));
    if (!moved.empty()) {
      summarize();
      SLUICE_ASSIGN_OR_RETURN(result.plan, lower(schedules));
      problem = CheckPlanMemory(result.plan);
    }
  }
  if (std::optional<MemoryProblem> p = problem) {
    const RankProgram& rank = result.plan.ranks[p->rank];
    result.outcome = PlanOutcome::kOutOfMemory;
    result.infeasible_reason = fmt::format(
        "lowered plan: rank {} (dp {}, pp {}) at instruction {} ({}): {}", p->rank, rank.dp_index,
        rank.pp_index, p->instruction,
        p->instruction >= 0 ? InstructionText(rank.instructions[p->instruction]) : "start",
        p->message);
    result.plan = ExecutionPlan{};
    return finish(std::move(result));
  }
  if (options_.optimize) {
    const auto opt_start = std::chrono::steady_clock::now();
    OptimizerOptions o = options_.optimizer;
    o.sim.samples.assign(batch.begin(), batch.end());
    if (o.pricer == nullptr) {
      o.pricer = std::make_shared<EvaluatorPricer>(*eval_, cluster_, o.sim.samples,
                                                   options_.lower.costs);
    }
    // The rounds by simulation: the estimator chose flexible rounds for some replicas; the plan
    // with those replicas in padded rounds is lowered and simulated too, and the shorter kept (no
    // passes/ rewrite can switch rounds: it reorders every rank's messages at once).
    std::optional<passes::PassRecord> rounds_record;
    std::optional<Duration> lowered_time;
    if (rounds == InterleavedRounds::kAuto) {
      std::vector<Schedule> alt = schedules;
      std::vector<ScheduleEstimate> alt_estimates = result.estimates;
      SLUICE_ASSIGN_OR_RETURN(std::vector<int64_t> moved, to_padded(&alt, &alt_estimates));
      if (!moved.empty()) {
        SLUICE_ASSIGN_OR_RETURN(ExecutionPlan alt_plan, lower(alt));
        if (!CheckPlanMemory(alt_plan)) {
          SimOptions so = o.sim;
          so.record_timeline = false;
          so.record_memory = false;
          SLUICE_ASSIGN_OR_RETURN(SimResult flex_sim, Simulate(result.plan, so));
          SLUICE_ASSIGN_OR_RETURN(SimResult pad_sim, Simulate(alt_plan, so));
          const bool both_ok =
              flex_sim.outcome == SimOutcome::kOk && pad_sim.outcome == SimOutcome::kOk;
          if (both_ok) lowered_time = flex_sim.iteration_time;
          if (both_ok && pad_sim.iteration_time < flex_sim.iteration_time) {
            passes::PassRecord record;
            record.pass = "interleaved-rounds(padded)";
            record.changed = true;
            for (int64_t d : moved) {
              record.changes.push_back(fmt::format(
                  "replica {}: flexible -> padded rounds (simulated {} -> {})", d,
                  FormatDuration(flex_sim.iteration_time), FormatDuration(pad_sim.iteration_time)));
            }
            rounds_record = std::move(record);
            schedules = std::move(alt);
            result.estimates = std::move(alt_estimates);
            summarize();
            result.plan = std::move(alt_plan);
          }
        }
      }
    }
    if (o.relowerer == nullptr) {
      // Order moves: relowered from the plan as it goes to the optimizer (the rounds switch
      // above included). A plan the relowering does not support gets no order moves.
      ScheduleOptions so = options_.search_order ? options_.search.schedule
                                                 : options_.schedule_options;
      StatusOr<Relowerer> rl =
          Relowerer::Create(result.plan, *eval_, cluster_, batch, so, options_.lower);
      if (rl.ok()) o.relowerer = std::make_shared<const Relowerer>(std::move(rl).value());
    }
    // The budget covers the preparation above too (the pricer's index, the relowering, the
    // rounds check): the optimizer gets what is left of it, at least a microsecond.
    o.budget = BudgetLeft(o.budget, opt_start);
    SLUICE_ASSIGN_OR_RETURN(OptimizeResult opt, OptimizePlan(result.plan, o));
    std::vector<passes::PassRecord> applied;
    if (rounds_record) applied.push_back(std::move(*rounds_record));
    for (passes::PassRecord& p : opt.applied) applied.push_back(std::move(p));
    const Duration wall = Duration::Nanos(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                              std::chrono::steady_clock::now() - opt_start)
                                              .count());
    result.optimized = PlanOptimization{lowered_time.value_or(opt.before), opt.after, wall,
                                        std::move(applied), opt.budget_hit};
    result.plan = std::move(opt.plan);
  }
  return finish(std::move(result));
}

}  // namespace sluice
