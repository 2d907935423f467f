#include "compare/compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <span>
#include <utility>

#include "base/progress.h"
#include "compare/compare_dynamic.h"
#include "compare/compare_hetero.h"
#include "compare/compare_resolve.h"
#include "compare/compare_run.h"
#include "compare/compare_summary.h"
#include "data/global_batcher.h"
#include "passes/moe_overlap.h"
#include "planner/optimizer.h"
#include "planner/recompute_pricer.h"
#include "planner/relower.h"

namespace sluice {
namespace {

using compare_internal::Resolve;
using compare_internal::Resolved;
using compare_internal::ScenarioSim;
using compare_internal::ScoreBatches;
using compare_internal::ScoreBatching;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// One comparison, phase by phase (RunCompare): the result's header, the search, each method
// under its own configuration, the controlled comparison, the summary. The phases share the
// resolved scenario, the methods and the candidate scorer (its evaluators and scores are reused
// from the search by the runs).
class Comparison {
 public:
  // REQUIRES: every argument outlives the comparison.
  Comparison(const CompareScenario& sc, const CompareOptions& options, const Resolved& r)
      : sc_(sc),
        options_(options),
        r_(r),
        flops_(r.sc.model),
        methods_(ScenarioMethods(sc)),
        score_batches_(ScoreBatches(r.batches, sc.search)),
        scorer_(*r.sc.cost, r.sc.cluster, score_batches_, ScoreBatching(sc), ScenarioSim(sc)) {}

  bool Cancelled() const { return options_.cancelled && options_.cancelled(); }

  // What the scenario resolved to, and the sweep part of the achievable rate.
  CompareResult Start() const {
    CompareResult out;
    out.scenario = sc_;
    out.description = r_.description;
    out.batches = static_cast<int64_t>(r_.batches.size());
    out.devices = r_.sc.cluster.num_devices();
    out.memory_limit_mb = r_.sc.MemoryLimit().mb();
    out.memory_reserve_mb = r_.sc.MemoryReserve().mb();
    out.data_loss = r_.sc.Loss();
    SmallInputCheck small(sc_.iterations, 0, "", out.devices,
                          fmt::format("the {} devices", out.devices));
    for (const GlobalBatch& b : r_.batches) small.Add(b);
    out.warnings = small.Warnings();
    for (const GlobalBatch& b : score_batches_) out.score_batches.push_back(b.index);
    std::vector<int64_t> tps;
    for (int64_t tp = 1; tp <= std::max<int64_t>(1, r_.sc.cluster.devices_per_node); tp *= 2) {
      tps.push_back(tp);
    }
    for (int64_t tp : sc_.search.tp) {
      if (std::find(tps.begin(), tps.end(), tp) == tps.end()) tps.push_back(tp);
    }
    out.sweep_rate = SweepAchievableRate(*r_.sc.cost, flops_, tps);
    return out;
  }

  // R(L) of the length-aware bound (ideal_bound.h) over the same tp degrees and every cp up to
  // the devices (decoder-only models), capped at the sweep's R.
  void SweepLengths(CompareResult* out) {
    std::vector<int64_t> tps;
    for (int64_t tp = 1; tp <= std::max<int64_t>(1, r_.sc.cluster.devices_per_node); tp *= 2) {
      tps.push_back(tp);
    }
    std::vector<int64_t> cps = {1};
    if (!r_.sc.model.is_encoder_decoder()) {
      for (int64_t cp = 2; cp <= out->devices; cp *= 2) cps.push_back(cp);
    }
    length_rates_ = SweepLengthRates(*r_.sc.cost, flops_, r_.sc.cluster, tps, cps,
                                     out->sweep_rate.flops_per_s);
    out->length_rates = length_rates_;
  }

  // Each method's configuration search over the parallel configurations that fit (and the fixed
  // controlled one).
  Status Search(CompareResult* out) {
    const auto start = Clock::now();
    ParallelSpace space =
        EnumerateParallelConfigs(r_.sc.model, r_.sc.cluster, *r_.sc.cost, sc_.search,
                                 r_.sc.memory_limit, r_.sc.memory_reserve);
    out->skipped_configs = space.skipped;
    if (r_.sc.parallel.has_value()) {
      // The fixed controlled configuration (resolved and checked with the scenario).
      const ParallelConfig& fixed = *r_.sc.parallel;
      const bool listed =
          std::any_of(space.configs.begin(), space.configs.end(),
                      [&](const ParallelConfig& p) { return SameSharedLayout(p, fixed); });
      if (!listed) space.configs.push_back(fixed);
    }
    int64_t total = 0;
    for (const MethodSpec& m : methods_) {
      candidates_.push_back(m.kind == MethodKind::kHetero
                                ? std::vector<Candidate>{}
                                : ExpandCandidates(space.configs, m, r_.sc.model, sc_.search));
      total += static_cast<int64_t>(candidates_.back().size());
    }
    hetero_.resize(methods_.size());
    strategies_.resize(methods_.size());
    Progress progress("searching configurations", total, options_.progress);
    for (size_t i = 0; i < methods_.size(); ++i) {
      if (methods_[i].kind == MethodKind::kHetero) {
        searches_.push_back(MethodSearch{.method = methods_[i].name});
        if (Cancelled()) continue;
        SLUICE_ASSIGN_OR_RETURN(
            hetero_[i], SearchHeteroMixes(r_.sc, sc_, methods_[i], score_batches_,
                                          ScenarioSim(sc_)));
        continue;
      }
      SLUICE_ASSIGN_OR_RETURN(
          MethodSearch s, SearchMethod(
                              scorer_, methods_[i].name, candidates_[i], sc_.search.simulate_top,
                              [&] { progress.Add(); }, [this] { return Cancelled(); },
                              sc_.search.balance_layer_cut));
      searches_.push_back(std::move(s));
      if (methods_[i].kind == MethodKind::kDynamic && !Cancelled()) {
        SLUICE_ASSIGN_OR_RETURN(hetero_[i], SearchHeteroMixes(r_.sc, sc_, methods_[i],
                                                              score_batches_, ScenarioSim(sc_)));
      }
    }
    progress.Finish();
    out->candidates_scored = total;
    out->search_seconds = SecondsSince(start);
    return Status::Ok();
  }

  // Each method under its own best configuration (or another method's, AdoptRuns).
  StatusOr<CompareRuns> RunOwnConfigs(CompareResult* out) {
    CompareRuns own;
    own.runs.resize(methods_.size());
    own.accounts.resize(methods_.size());
    for (size_t i = 0; i < methods_.size(); ++i) {
      own.runs[i].method = methods_[i].name;
      if (methods_[i].kind == MethodKind::kHetero) {
        FillFromHetero(hetero_[i], &own.runs[i]);
      } else if (methods_[i].kind == MethodKind::kDynamic) {
        FillFromSearch(searches_[i], Cancelled(), &own.runs[i]);
        own.runs[i].config.reset();
        for (const Strategy& st : PickStrategies(searches_[i], hetero_[i], StrategyLimits{})) {
          own.runs[i].strategies.push_back(st.Describe());
          strategies_[i].push_back(st);
        }
        if (!own.runs[i].strategies.empty()) {
          own.runs[i].state = RunState::kOk;
          own.runs[i].reason.clear();
        } else if (own.runs[i].state == RunState::kOk) {
          own.runs[i].state = RunState::kOutOfMemory;
          own.runs[i].reason = "no strategy ran every score batch";
        }
      } else {
        FillFromSearch(searches_[i], Cancelled(), &own.runs[i]);
      }
    }
    int64_t runs = 0;
    auto runnable = [](const MethodRun& m) {
      return m.config.has_value() || m.hetero.has_value() || !m.strategies.empty();
    };
    for (const MethodRun& m : own.runs) runs += runnable(m);
    Progress progress("planning + simulating", runs * out->batches, options_.progress);
    for (size_t i = 0; i < own.runs.size(); ++i) {
      if (runnable(own.runs[i])) {
        SLUICE_RETURN_IF_ERROR(RunAll(&own.runs[i], &own.accounts[i], &progress, out));
      }
    }
    progress.Finish();
    AdoptRuns(methods_, &own);
    if (options_.optimize_budget_ms > 0) SLUICE_RETURN_IF_ERROR(RunOptimized(&own, out));
    return own;
  }

  // The "optimized" rows (CompareOptions::optimize_budget_ms): each run that ran, again with the
  // optimizer; kept when it changed some plan.
  Status RunOptimized(CompareRuns* own, CompareResult* out) {
    const size_t n = own->runs.size();
    int64_t runs = 0;
    for (size_t i = 0; i < n; ++i) runs += own->runs[i].config.has_value();
    Progress progress("optimizing", runs * out->batches, options_.progress);
    for (size_t i = 0; i < n; ++i) {
      if (!own->runs[i].config.has_value() || own->runs[i].state != RunState::kOk) continue;
      MethodRun run;
      run.method = own->runs[i].method + " (optimized)";
      run.config = own->runs[i].config;
      RunAccounts accounts;
      bool changed = false;
      SLUICE_ASSIGN_OR_RETURN(bool complete, RunBatches(&run, &accounts, &progress, &changed));
      if (!complete) out->partial = true;
      if (!changed) continue;
      own->runs.push_back(std::move(run));
      own->accounts.push_back(std::move(accounts));
    }
    progress.Finish();
    return Status::Ok();
  }

  // Every method on one (dp, pp, tp, ZeRO), its best schedule there: the fixed controlled
  // configuration, else the controlled method's own choice. No runs when there is neither.
  StatusOr<CompareRuns> RunControlled(const CompareRuns& own, CompareResult* out) {
    CompareRuns controlled;
    if (r_.sc.parallel.has_value()) {
      out->controlled_config = *r_.sc.parallel;
    } else {
      for (const MethodRun& run : own.runs) {
        if (run.method == sc_.controlled_method && run.config.has_value()) {
          out->controlled_config = run.config->parallel;
        }
      }
    }
    if (!out->controlled_config.has_value()) return controlled;
    ParallelConfig& shared_config = *out->controlled_config;
    shared_config.vpp = 1;
    shared_config.memory_limit = r_.sc.memory_limit;
    shared_config.memory_reserve = r_.sc.memory_reserve;
    controlled.runs.resize(methods_.size());
    controlled.accounts.resize(methods_.size());
    for (size_t i = 0; i < methods_.size(); ++i) {
      controlled.runs[i].method = methods_[i].name;
      if (methods_[i].kind != MethodKind::kHomogeneous) {
        controlled.runs[i].state = RunState::kNotRun;
        controlled.runs[i].reason = fmt::format(
            "{} runs no single configuration ({}): not part of the controlled comparison",
            methods_[i].name, MethodKindName(methods_[i].kind));
        continue;
      }
      std::vector<Candidate> shared;
      for (const Candidate& c : candidates_[i]) {
        if (SameSharedLayout(c.parallel, shared_config)) shared.push_back(c);
      }
      SLUICE_ASSIGN_OR_RETURN(
          MethodSearch s, SearchMethod(scorer_, methods_[i].name, shared, sc_.search.simulate_top,
                                       nullptr, [this] { return Cancelled(); },
                                       sc_.search.balance_layer_cut));
      FillFromSearch(s, Cancelled(), &controlled.runs[i]);
    }
    // A controlled run identical to the method's own run is copied, not repeated.
    auto same_as_own = [&](size_t i) {
      return own.runs[i].config.has_value() && own.runs[i].config == controlled.runs[i].config;
    };
    int64_t runs = 0;
    for (size_t i = 0; i < controlled.runs.size(); ++i) {
      runs += controlled.runs[i].config.has_value() && !same_as_own(i);
    }
    Progress progress("controlled runs", runs * out->batches, options_.progress);
    for (size_t i = 0; i < controlled.runs.size(); ++i) {
      MethodRun& run = controlled.runs[i];
      if (!run.config.has_value()) continue;
      if (same_as_own(i)) {
        const MethodRun searched = run;
        run = own.runs[i];
        run.candidates = searched.candidates;
        run.feasible = searched.feasible;
        run.simulated = searched.simulated;
        run.adopted_from.clear();
        controlled.accounts[i] = own.accounts[i];
        continue;
      }
      SLUICE_RETURN_IF_ERROR(RunAll(&run, &controlled.accounts[i], &progress, out));
    }
    progress.Finish();
    AdoptRuns(methods_, &controlled);
    return controlled;
  }

  // R (the sweep, or a compared plan's fastest op when higher), the ideal, every run's summary
  // and ratio to the reference; a run none of whose batches fit memory is out-of-memory.
  void Summarise(CompareRuns own, CompareRuns controlled, CompareResult* out) const {
    double max_op_rate = 0;
    for (const CompareRuns* runs : {&own, &controlled}) {
      for (const RunAccounts& acc : runs->accounts) {
        for (const BatchAccount& a : acc.account) {
          max_op_rate = std::max(max_op_rate, a.max_op_rate);
        }
      }
    }
    out->rate = out->sweep_rate;
    if (max_op_rate > out->rate.flops_per_s) {
      out->rate.flops_per_s = max_op_rate;
      out->rate.where = "a (micro-batch, stage) of a compared plan (above the sweep)";
    }
    double all_useful = 0;
    int64_t all_tokens = 0;
    for (const GlobalBatch& b : r_.batches) {
      for (const Sample& s : b.samples) all_useful += flops_.SampleTotal(s);
      all_tokens += b.tokens;
    }
    if (out->rate.flops_per_s > 0 && all_useful > 0) {
      out->ideal_tokens_per_s = static_cast<double>(all_tokens) *
                                static_cast<double>(out->devices) * out->rate.flops_per_s /
                                all_useful;
    }
    double all_length_aware = 0;
    for (const GlobalBatch& b : r_.batches) {
      all_length_aware += LengthAwareDeviceSeconds(length_rates_, flops_, b.samples);
    }
    if (all_length_aware > 0) {
      out->length_aware_tokens_per_s =
          static_cast<double>(all_tokens) * static_cast<double>(out->devices) / all_length_aware;
    }
    for (CompareRuns* runs : {&own, &controlled}) {
      for (size_t i = 0; i < runs->runs.size(); ++i) {
        SummarizeRun(&runs->runs[i], out->rate.flops_per_s, out->devices, runs->accounts[i]);
      }
      double ref = 0;
      for (const MethodRun& m : runs->runs) {
        if (m.method == sc_.reference && m.ok_batches > 0) ref = m.tokens_per_s;
      }
      for (MethodRun& m : runs->runs) {
        if (ref > 0 && m.ok_batches > 0) m.ratio_to_reference = m.tokens_per_s / ref;
        if (m.state == RunState::kOk &&
            (m.config.has_value() || m.hetero.has_value() || !m.strategies.empty()) &&
            m.ok_batches == 0 &&
            !m.batches.empty()) {
          m.state = RunState::kOutOfMemory;
          m.reason = fmt::format("batch {}: {}", m.batches.front().batch, m.batches.front().reason);
        }
      }
    }
    out->own = std::move(own.runs);
    out->controlled = std::move(controlled.runs);
  }

 private:
  // Runs `run->config` over every batch; marks `out` partial when cancelled before the end.
  Status RunAll(MethodRun* run, RunAccounts* accounts, Progress* progress, CompareResult* out) {
    bool complete = false;
    if (run->hetero.has_value()) {
      SLUICE_ASSIGN_OR_RETURN(complete, RunHeteroBatches(run, accounts, progress));
    } else if (!run->strategies.empty()) {
      SLUICE_ASSIGN_OR_RETURN(complete, RunDynamicBatches(run, accounts, progress));
    } else {
      SLUICE_ASSIGN_OR_RETURN(complete, RunBatches(run, accounts, progress));
    }
    if (!complete) {
      out->partial = true;
      if (run->batches.empty()) {
        run->state = RunState::kNotRun;
        run->reason = "interrupted before its first batch";
      }
    }
    return Status::Ok();
  }

  // Plans and simulates every batch under `run->config`; fills records, accounts and useful
  // FLOPs. Returns false when cancelled before the end.
  // With `optimized` set, every plan goes through the optimizer first and *optimized says
  // whether it changed any.
  StatusOr<bool> RunBatches(MethodRun* run, RunAccounts* accounts, Progress* progress,
                            bool* optimized = nullptr) {
    SLUICE_ASSIGN_OR_RETURN(const Planner planner, scorer_.PlannerFor(*run->config));
    SimOptions sim = ScenarioSim(sc_);
    sim.record_memory = false;
    // The calibration (options_.adjust_plan), then the scenario's MoE overlap rewrite, on every
    // planned batch; a rewrite the pass rejects leaves the plan as lowered and is counted.
    std::function<void(ExecutionPlan*)> adjust = options_.adjust_plan;
    Status overlap_error;
    if (!sc_.moe_overlap.empty()) {
      SLUICE_ASSIGN_OR_RETURN(const passes::MoeOverlap overlap,
                              passes::ParseMoeOverlap(sc_.moe_overlap, "moe_overlap"));
      adjust = [this, overlap, run, &overlap_error](ExecutionPlan* plan) {
        if (options_.adjust_plan) options_.adjust_plan(plan);
        StatusOr<passes::PassRecord> record = passes::MoeOverlapPass(overlap).Run(plan);
        if (!record.ok()) {
          if (overlap_error.ok()) overlap_error = record.status();
        } else if (!record->rejected.empty()) {
          if (run->moe_overlap_rejected++ == 0) run->moe_overlap_reason = record->rejected;
        }
      };
    }
    for (const GlobalBatch& batch : r_.batches) {
      if (Cancelled()) return false;
      const bool example = options_.keep_examples && !run->example.has_value();
      SLUICE_ASSIGN_OR_RETURN(PlanResult plan, planner.Plan(batch.samples));
      double optimizer_ms = 0;
      if (plan.outcome == PlanOutcome::kOk && optimized != nullptr) {
        const auto opt_start = std::chrono::steady_clock::now();
        SimOptions o_sim = sim;
        o_sim.samples = batch.samples;
        OptimizerOptions o;
        o.budget = Duration::Millis(options_.optimize_budget_ms);
        o.seed = sc_.seed;
        o.sim = o_sim;
        o.pricer = std::make_shared<EvaluatorPricer>(planner.evaluator(), planner.cluster(),
                                                     batch.samples, planner.options().lower.costs);
        // Micro-batch order moves (planner/relower.h); a plan it does not support gets none.
        const PlannerOptions& po = planner.options();
        StatusOr<Relowerer> rl = Relowerer::Create(
            plan.plan, planner.evaluator(), planner.cluster(), batch.samples,
            po.search_order ? po.search.schedule : po.schedule_options, po.lower);
        if (rl.ok()) o.relowerer = std::make_shared<const Relowerer>(std::move(rl).value());
        // The budget and the time counted cover the pricer and the relowering too (as the
        // planner's --optimize-budget-ms does).
        o.budget = BudgetLeft(o.budget, opt_start);
        SLUICE_ASSIGN_OR_RETURN(OptimizeResult opt, OptimizePlan(plan.plan, o));
        optimizer_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - opt_start)
                .count();
        *optimized = *optimized || opt.changed();
        plan.plan = std::move(opt.plan);
      }
      SLUICE_ASSIGN_OR_RETURN(
          BatchRun b, SimulateHomogeneous(std::move(plan), planner, batch, sim, flops_,
                                          r_.sc.cluster.num_devices(), adjust, example));
      SLUICE_RETURN_IF_ERROR(overlap_error);
      b.rec.planning_ms += optimizer_ms;
      if (b.example.has_value()) run->example = std::move(b.example);
      Record(std::move(b), run, accounts);
      if (progress != nullptr) progress->Add();
    }
    return true;
  }

  // The run of a heterogeneous mix (`run->hetero`) over every batch: HeteroPlanner, then
  // SimulateHetero. Returns false when cancelled before the end.
  StatusOr<bool> RunHeteroBatches(MethodRun* run, RunAccounts* accounts, Progress* progress) {
    const MethodSpec* method = nullptr;
    for (const MethodSpec& m : methods_) {
      if (m.name == run->method) method = &m;
    }
    SLUICE_ASSIGN_OR_RETURN(
        const HeteroPlanner planner,
        HeteroPlanner::Create(*r_.sc.cost, *run->hetero, r_.sc.cluster,
                              HeteroOptionsFor(*method, sc_), run->method));
    SimOptions sim = ScenarioSim(sc_);
    sim.record_memory = false;
    for (const GlobalBatch& batch : r_.batches) {
      if (Cancelled()) return false;
      SLUICE_ASSIGN_OR_RETURN(HeteroPlanResult plan, planner.Plan(batch.samples));
      SLUICE_ASSIGN_OR_RETURN(BatchRun b,
                              SimulateHeteroBatch(planner, plan, batch, sim, flops_,
                                                  r_.sc.cluster.num_devices()));
      Record(std::move(b), run, accounts);
      if (progress != nullptr) progress->Add();
    }
    return true;
  }

  // The per-batch strategy choice of a dynamic method (compare_dynamic.h) over every batch.
  StatusOr<bool> RunDynamicBatches(MethodRun* run, RunAccounts* accounts, Progress* progress) {
    size_t i = 0;
    while (methods_[i].name != run->method) ++i;
    SLUICE_ASSIGN_OR_RETURN(
        DynamicRunner runner,
        DynamicRunner::Create(scorer_, *r_.sc.cost, r_.sc.cluster, methods_[i], sc_, strategies_[i],
                              {.screen_margin = options_.dynamic_screen,
                               .quick_refresh = options_.dynamic_quick_refresh}));
    SimOptions sim = ScenarioSim(sc_);
    sim.record_memory = false;
    for (const GlobalBatch& batch : r_.batches) {
      if (Cancelled()) return false;
      SLUICE_ASSIGN_OR_RETURN(BatchRun b,
                              runner.Run(batch, sim, flops_, r_.sc.cluster.num_devices()));
      Record(std::move(b), run, accounts);
      run->switches = runner.switches();
      run->screen_margin = options_.dynamic_screen;
      if (progress != nullptr) progress->Add();
    }
    return true;
  }

  // A simulated batch into the run's records and accounts (the length-aware time of its placed
  // samples added here).
  void Record(BatchRun b, MethodRun* run, RunAccounts* accounts) const {
    const bool ok = b.rec.outcome == BatchOutcome::kOk;
    accounts->account.push_back(ok ? b.account : BatchAccount{});
    accounts->useful.push_back(ok ? b.account.useful_flops : 0);
    accounts->length_aware.push_back(
        ok ? LengthAwareDeviceSeconds(length_rates_, flops_, b.placed) : 0);
    run->batches.push_back(std::move(b.rec));
  }

  // The heterogeneous search's counts and choice (or why there is none) into a run.
  void FillFromHetero(const std::optional<HeteroChoice>& choice, MethodRun* run) const {
    if (!choice.has_value()) {
      run->state = RunState::kNotRun;
      run->reason = "interrupted before the search";
      return;
    }
    run->candidates = static_cast<int64_t>(choice->search.ranked.size());
    run->feasible = choice->feasible;
    run->simulated = choice->simulated;
    if (choice->best.has_value()) {
      run->hetero = choice->best;
    } else {
      run->state = RunState::kOutOfMemory;
      run->reason = choice->reason;
    }
  }

  const CompareScenario& sc_;
  const CompareOptions& options_;
  const Resolved& r_;
  const FlopCounter flops_;
  LengthRates length_rates_;  // by SweepLengths
  const std::vector<MethodSpec> methods_;
  const std::vector<GlobalBatch> score_batches_;  // the search's (PickScoreBatches)
  CandidateScorer scorer_;
  std::vector<std::vector<Candidate>> candidates_;  // [method], by Search
  std::vector<MethodSearch> searches_;              // [method], by Search
  std::vector<std::optional<HeteroChoice>> hetero_;  // [method], by Search (kHetero, kDynamic)
  std::vector<std::vector<Strategy>> strategies_;     // [method] (kDynamic), by RunOwnConfigs
};

}  // namespace

StatusOr<CompareResult> RunCompare(const CompareScenario& sc, const CompareOptions& options,
                                   std::string_view source) {
  // Resolve: the scenario, checked, and the global batches of the run.
  const FieldNamer field_name =
      options.field_name ? options.field_name
                         : FileFieldNamer(std::string(source.empty() ? "flags" : source));
  SLUICE_RETURN_IF_ERROR(ValidateCompareScenario(sc, field_name));
  SLUICE_ASSIGN_OR_RETURN(const Resolved r, Resolve(sc, field_name));
  Comparison comparison(sc, options, r);
  CompareResult out = comparison.Start();
  comparison.SweepLengths(&out);
  SLUICE_RETURN_IF_ERROR(comparison.Search(&out));
  const auto run_start = Clock::now();
  SLUICE_ASSIGN_OR_RETURN(CompareRuns own, comparison.RunOwnConfigs(&out));
  SLUICE_ASSIGN_OR_RETURN(CompareRuns controlled, comparison.RunControlled(own, &out));
  out.run_seconds = SecondsSince(run_start);
  if (comparison.Cancelled()) out.partial = true;
  comparison.Summarise(std::move(own), std::move(controlled), &out);
  return out;
}

}  // namespace sluice
