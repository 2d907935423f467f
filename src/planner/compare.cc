#include "planner/compare.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include "base/progress.h"
#include "cost/cost_factory.h"
#include "data/data_source.h"
#include "data/global_batcher.h"
#include "model/cluster_spec.h"
#include "model/model_spec.h"

namespace sluice {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// What the scenario resolves to: the resolved scenario (its parallel configuration is the fixed
// controlled one, when given) and the global batches of the run, taken up front.
struct Resolved {
  Scenario sc;
  std::vector<GlobalBatch> batches;
  std::string description;
};

StatusOr<Resolved> Resolve(const CompareScenario& sc, const FieldNamer& field_name) {
  ScenarioSpec spec;
  spec.model = sc.model;
  spec.cluster = sc.cluster;
  if (sc.controlled.has_value()) {
    spec.parallel = *sc.controlled;
    spec.parallel->vpp = 1;  // the controlled comparison shares dp, pp, tp and ZeRO, not vpp
  }
  spec.memory_limit_mb = sc.memory_limit_mb;
  spec.cost = sc.cost;
  spec.flash_attention = sc.flash_attention;
  spec.data = sc.data;
  spec.samples = sc.samples;
  spec.seed = sc.seed;
  spec.tokens_per_batch = sc.tokens_per_batch;
  spec.max_seqlen = sc.max_seqlen;
  spec.long_samples = sc.long_samples;
  spec.iterations = sc.iterations;
  // The scenario's parallel configuration is its field 'controlled'.
  const FieldNamer spec_field = [&](std::string_view field) {
    return field_name(field == "parallel" ? "controlled" : field);
  };
  Resolved r;
  SLUICE_ASSIGN_OR_RETURN(r.sc, ResolveScenario(spec, spec_field));
  GlobalBatch batch;
  while ((sc.iterations == 0 || static_cast<int64_t>(r.batches.size()) < sc.iterations) &&
         r.sc.batcher->Next(&batch)) {
    r.batches.push_back(std::move(batch));
  }
  if (r.batches.empty()) {
    return InvalidArgumentError(fmt::format("{}: '{}' yields no global batch of {} tokens",
                                            field_name("data"), sc.data, sc.tokens_per_batch));
  }
  r.description =
      r.sc.Describe({.parallel = false, .batches_taken = static_cast<int64_t>(r.batches.size())});
  return r;
}

// What a run's batches need once R is known: their accounts and the useful FLOPs they placed.
struct RunAccounts {
  std::vector<BatchAccount> account;
  std::vector<double> useful;
};

// The summary of a run, its batches' ideal times and breakdowns, under the achievable rate R.
void Summarize(MethodRun* run, double rate, int64_t devices, const RunAccounts& accounts) {
  const std::vector<BatchAccount>& acc = accounts.account;
  const std::vector<double>& useful = accounts.useful;
  int64_t tokens = 0, padded = 0;
  double time = 0, ideal = 0, bubble = 0, comm = 0, plan = 0;
  BatchAccount total;
  run->ok_batches = 0;
  for (size_t i = 0; i < run->batches.size(); ++i) {
    BatchRecord& b = run->batches[i];
    if (b.outcome != "ok") continue;
    b.ideal_ms = rate > 0 ? 1e3 * useful[i] / (static_cast<double>(devices) * rate) : 0;
    b.breakdown = Finalize(acc[i], rate);
    total.Add(acc[i]);
    ++run->ok_batches;
    tokens += b.real_tokens;
    padded += b.padded_tokens;
    time += b.iteration_ms;
    ideal += b.ideal_ms;
    bubble += b.bubble * b.iteration_ms;
    comm += b.comm * b.iteration_ms;
    plan += b.planning_ms;
    run->peak_memory_mb = std::max(run->peak_memory_mb, b.peak_memory_mb);
  }
  if (run->ok_batches == 0) return;
  run->tokens_per_s = time > 0 ? 1e3 * static_cast<double>(tokens) / time : 0;
  run->ideal_tokens_per_s = ideal > 0 ? 1e3 * static_cast<double>(tokens) / ideal : 0;
  run->fraction_of_ideal = time > 0 ? ideal / time : 0;
  run->padding =
      padded > 0 ? static_cast<double>(padded - tokens) / static_cast<double>(padded) : 0;
  run->bubble = time > 0 ? bubble / time : 0;
  run->comm = time > 0 ? comm / time : 0;
  run->planning_ms = plan / static_cast<double>(run->ok_batches);
  run->breakdown = Finalize(total, rate);
}

// Plans and simulates every batch of one run; fills records, accounts and useful FLOPs.
class RunContext {
 public:
  RunContext(const Resolved& r, const CompareScenario& sc, const CompareOptions& options,
             const FlopCounter& flops, CandidateScorer& scorer, Progress* progress)
      : r_(r), sc_(sc), options_(options), flops_(flops), scorer_(scorer), progress_(progress) {}

  // Runs `run->config` over every batch; marks `out` partial when cancelled before the end.
  Status RunAll(MethodRun* run, RunAccounts* accounts, CompareResult* out) {
    SLUICE_ASSIGN_OR_RETURN(bool complete, Run(run, &accounts->account, &accounts->useful));
    if (!complete) {
      out->partial = true;
      if (run->batches.empty()) {
        run->state = "not-run";
        run->reason = "interrupted before its first batch";
      }
    }
    return Status::Ok();
  }

 private:
  // Runs `run->config` over every batch; returns false when cancelled before the end.
  StatusOr<bool> Run(MethodRun* run, std::vector<BatchAccount>* accounts,
                     std::vector<double>* useful) {
    SLUICE_ASSIGN_OR_RETURN(const Planner planner, scorer_.PlannerFor(run->config));
    SimOptions sim;
    sim.collectives =
        sc_.stepwise_collectives ? CollectiveMode::kStepwise : CollectiveMode::kClosedForm;
    for (const GlobalBatch& batch : r_.batches) {
      if (options_.cancelled && options_.cancelled()) return false;
      const bool example = options_.keep_examples && !run->example.has_value();
      sim.record_timeline = example;
      sim.record_memory = false;
      BatchRecord rec;
      rec.batch = batch.index;
      BatchAccount account;
      double placed_flops = 0;
      SLUICE_ASSIGN_OR_RETURN(PlanResult plan, planner.Plan(batch.samples));
      rec.planning_ms = plan.planning_time.millis();
      if (plan.outcome != PlanOutcome::kOk) {
        rec.outcome = "out-of-memory";
        rec.reason = plan.infeasible_reason;
      } else {
        for (const auto& replica : plan.batch_plan.replicas) {
          rec.micro_batches += static_cast<int64_t>(replica.size());
          for (const MicroBatch& mb : replica) {
            rec.real_tokens += mb.real_tokens;
            rec.padded_tokens += mb.padded_tokens;
          }
        }
        sim.samples = batch.samples;  // real tokens from the samples' own lengths
        SLUICE_ASSIGN_OR_RETURN(SimResult s, Simulate(plan.plan, sim));
        if (s.outcome != SimOutcome::kOk || s.memory_exceeded) {
          rec.outcome = s.outcome == SimOutcome::kDeadlock ? "deadlock" : "sim-out-of-memory";
          rec.reason = s.memory_exceeded
                           ? fmt::format("rank {} exceeds the memory limit at instruction {}: {}",
                                         s.oom_rank, s.oom_instruction, s.problem)
                           : s.problem;
        } else {
          rec.iteration_ms = s.iteration_time.millis();
          double bubble = 0, comm = 0;
          for (const RankSimStats& rank : s.ranks) {
            bubble += rank.bubble.seconds();
            comm += rank.exposed_comm.seconds();
            rec.peak_memory_mb = std::max(rec.peak_memory_mb, rank.peak_memory.mb());
          }
          const double denom = static_cast<double>(s.ranks.size()) * s.iteration_time.seconds();
          rec.bubble = denom > 0 ? bubble / denom : 0;
          rec.comm = denom > 0 ? comm / denom : 0;
          account = AccountBatch(plan, s, planner.evaluator(), batch.samples, flops_,
                                 r_.sc.cluster.num_devices());
          placed_flops = account.useful_flops;
          if (example) run->example = ExampleRun{std::move(plan.plan), std::move(s)};
        }
      }
      run->batches.push_back(std::move(rec));
      accounts->push_back(account);
      useful->push_back(placed_flops);
      if (progress_ != nullptr) progress_->Add();
    }
    return true;
  }

  const Resolved& r_;
  const CompareScenario& sc_;
  const CompareOptions& options_;
  const FlopCounter& flops_;
  CandidateScorer& scorer_;
  Progress* progress_;
};

bool SameShared(const ParallelConfig& a, const ParallelConfig& b) {
  return a.dp == b.dp && a.pp == b.pp && a.tp == b.tp && a.zero == b.zero;
}

// The search's counts and choice (or why there is none) into a run about to be made.
void FillFromSearch(const MethodSearch& search, bool cancelled, MethodRun* run) {
  run->candidates = static_cast<int64_t>(search.ranked.size());
  for (const CandidateScore& s : search.ranked) {
    if (s.state == CandidateScore::State::kOk) ++run->feasible;
    if (s.simulated) ++run->simulated;
  }
  if (search.best.has_value()) {
    run->has_config = true;
    run->config = search.best->candidate;
  } else if (cancelled) {
    run->state = "not-run";
    run->reason = "interrupted during the search";
  } else {
    run->state = search.unsupported ? "unsupported" : "out-of-memory";
    run->reason = search.reason;
  }
}

// Real tokens / simulated seconds over the batches that ran.
double RunThroughput(const MethodRun& m) {
  int64_t tokens = 0;
  double ms = 0;
  for (const BatchRecord& b : m.batches) {
    if (b.outcome != "ok") continue;
    tokens += b.real_tokens;
    ms += b.iteration_ms;
  }
  return ms > 0 ? 1e3 * static_cast<double>(tokens) / ms : 0;
}

// A method whose space holds another method's chosen configuration, and which was slower over
// the whole run than that one (its choice was scored on a few batches), takes that run over:
// it is a configuration its own search could have returned, judged on every batch.
void Adopt(const std::vector<MethodSpec>& methods, std::vector<MethodRun>* runs,
           std::vector<RunAccounts>* accounts) {
  const std::vector<MethodRun> before = *runs;
  const std::vector<RunAccounts> before_acc = *accounts;
  for (size_t i = 0; i < methods.size(); ++i) {
    const MethodSpec& m = methods[i];
    double best = (*runs)[i].has_config ? RunThroughput(before[i]) : 0;
    for (size_t j = 0; j < before.size(); ++j) {
      const MethodRun& other = before[j];
      if (j == i || !other.has_config || !other.adopted_from.empty()) continue;
      if (other.batches.size() != before[i].batches.size() && before[i].has_config) continue;
      const Candidate& c = other.config;
      const bool in_space =
          std::find(m.batching.begin(), m.batching.end(), c.batching) != m.batching.end() &&
          std::find(m.schedules.begin(), m.schedules.end(), c.schedule) != m.schedules.end();
      if (!in_space || RunThroughput(other) <= best) continue;
      best = RunThroughput(other);
      MethodRun adopted = other;
      adopted.method = m.name;
      adopted.candidates = before[i].candidates;
      adopted.feasible = before[i].feasible;
      adopted.simulated = before[i].simulated;
      adopted.adopted_from = other.method;
      (*runs)[i] = std::move(adopted);
      (*accounts)[i] = before_acc[j];
    }
  }
}

}  // namespace

StatusOr<CompareResult> RunCompare(const CompareScenario& sc, const CompareOptions& options,
                                   std::string_view source) {
  const FieldNamer field_name =
      options.field_name ? options.field_name
                         : FileFieldNamer(std::string(source.empty() ? "flags" : source));
  SLUICE_RETURN_IF_ERROR(ValidateCompareScenario(sc, field_name));
  SLUICE_ASSIGN_OR_RETURN(Resolved r, Resolve(sc, field_name));
  CompareResult out;
  out.scenario = sc;
  out.description = r.description;
  out.batches = static_cast<int64_t>(r.batches.size());
  out.devices = r.sc.cluster.num_devices();
  out.memory_limit_mb = r.sc.MemoryLimit().mb();
  auto cancelled = [&] { return options.cancelled && options.cancelled(); };

  const FlopCounter flops(r.sc.model);
  std::vector<int64_t> tps;
  for (int64_t tp = 1; tp <= std::max<int64_t>(1, r.sc.cluster.devices_per_node); tp *= 2) {
    tps.push_back(tp);
  }
  for (int64_t tp : sc.search.tp) {
    if (std::find(tps.begin(), tps.end(), tp) == tps.end()) tps.push_back(tp);
  }
  out.sweep_rate = SweepAchievableRate(*r.sc.cost, flops, tps);

  // The search.
  const auto search_start = Clock::now();
  ParallelSpace space =
      EnumerateParallelConfigs(r.sc.model, r.sc.cluster, *r.sc.cost, sc.search, r.sc.memory_limit);
  out.skipped_configs = space.skipped;
  if (r.sc.parallel.has_value()) {
    // The fixed controlled configuration (resolved and checked with the scenario).
    const ParallelConfig& fixed = *r.sc.parallel;
    const bool listed = std::any_of(space.configs.begin(), space.configs.end(),
                                    [&](const ParallelConfig& p) { return SameShared(p, fixed); });
    if (!listed) space.configs.push_back(fixed);
  }
  const std::vector<MethodSpec> methods = ScenarioMethods(sc);
  std::vector<std::vector<Candidate>> candidates;
  int64_t total = 0;
  for (const MethodSpec& m : methods) {
    candidates.push_back(ExpandCandidates(space.configs, m, r.sc.model, sc.search));
    total += static_cast<int64_t>(candidates.back().size());
  }
  const size_t score_n = std::min(r.batches.size(), static_cast<size_t>(sc.search.score_batches));
  BatchingOptions batching;
  batching.seed = sc.seed;
  batching.max_seqlen = sc.max_seqlen;
  SimOptions sim;
  sim.collectives =
      sc.stepwise_collectives ? CollectiveMode::kStepwise : CollectiveMode::kClosedForm;
  CandidateScorer scorer(*r.sc.cost, r.sc.cluster,
                         std::span<const GlobalBatch>(r.batches.data(), score_n), batching, sim);
  std::vector<MethodSearch> searches;
  {
    Progress progress("searching configurations", total, options.progress);
    for (size_t i = 0; i < methods.size(); ++i) {
      SLUICE_ASSIGN_OR_RETURN(MethodSearch s,
                              SearchMethod(
                                  scorer, methods[i].name, candidates[i], sc.search.simulate_top,
                                  [&] { progress.Add(); }, cancelled));
      searches.push_back(std::move(s));
    }
    progress.Finish();
  }
  out.candidates_scored = total;
  out.search_seconds = SecondsSince(search_start);

  // Each method under its own best configuration.
  const auto run_start = Clock::now();
  std::vector<MethodRun> own(methods.size()), controlled;
  std::vector<RunAccounts> own_acc(methods.size()), ctl_acc;
  for (size_t i = 0; i < methods.size(); ++i) {
    own[i].method = methods[i].name;
    FillFromSearch(searches[i], cancelled(), &own[i]);
  }
  int64_t runs = 0;
  for (const MethodRun& m : own) runs += m.has_config;
  {
    Progress progress("planning + simulating", runs * out.batches, options.progress);
    RunContext ctx(r, sc, options, flops, scorer, &progress);
    for (size_t i = 0; i < own.size(); ++i) {
      if (own[i].has_config) SLUICE_RETURN_IF_ERROR(ctx.RunAll(&own[i], &own_acc[i], &out));
    }
    progress.Finish();
  }
  Adopt(methods, &own, &own_acc);

  // The controlled comparison: every method on one (dp, pp, tp, ZeRO), its best schedule there.
  if (sc.controlled.has_value()) {
    out.has_controlled = true;
    out.controlled_config = *sc.controlled;
  } else {
    for (const MethodRun& run : own) {
      if (run.method == sc.controlled_method && run.has_config) {
        out.has_controlled = true;
        out.controlled_config = run.config.parallel;
      }
    }
  }
  if (out.has_controlled) {
    out.controlled_config.vpp = 1;
    out.controlled_config.memory_limit = r.sc.memory_limit;
    controlled.resize(methods.size());
    ctl_acc.resize(methods.size());
    for (size_t i = 0; i < methods.size(); ++i) {
      controlled[i].method = methods[i].name;
      std::vector<Candidate> shared;
      for (const Candidate& c : candidates[i]) {
        if (SameShared(c.parallel, out.controlled_config)) shared.push_back(c);
      }
      SLUICE_ASSIGN_OR_RETURN(MethodSearch s,
                              SearchMethod(scorer, methods[i].name, shared, sc.search.simulate_top,
                                           nullptr, cancelled));
      FillFromSearch(s, cancelled(), &controlled[i]);
    }
    // A controlled run identical to the method's own run is copied, not repeated.
    runs = 0;
    for (size_t i = 0; i < controlled.size(); ++i) {
      runs +=
          controlled[i].has_config && !(own[i].has_config && own[i].config == controlled[i].config);
    }
    Progress progress("controlled runs", runs * out.batches, options.progress);
    RunContext ctx(r, sc, options, flops, scorer, &progress);
    for (size_t i = 0; i < controlled.size(); ++i) {
      if (!controlled[i].has_config) continue;
      if (own[i].has_config && own[i].config == controlled[i].config) {
        const MethodRun searched = controlled[i];
        controlled[i] = own[i];
        controlled[i].candidates = searched.candidates;
        controlled[i].feasible = searched.feasible;
        controlled[i].simulated = searched.simulated;
        controlled[i].adopted_from.clear();
        ctl_acc[i] = own_acc[i];
        continue;
      }
      SLUICE_RETURN_IF_ERROR(ctx.RunAll(&controlled[i], &ctl_acc[i], &out));
    }
    progress.Finish();
    Adopt(methods, &controlled, &ctl_acc);
  }
  out.run_seconds = SecondsSince(run_start);
  if (cancelled()) out.partial = true;

  // R, the ideal, and the summaries.
  double max_op_rate = 0;
  for (const std::vector<RunAccounts>* accs : {&own_acc, &ctl_acc}) {
    for (const RunAccounts& acc : *accs) {
      for (const BatchAccount& a : acc.account) max_op_rate = std::max(max_op_rate, a.max_op_rate);
    }
  }
  out.rate = out.sweep_rate;
  if (max_op_rate > out.rate.flops_per_s) {
    out.rate.flops_per_s = max_op_rate;
    out.rate.where = "a (micro-batch, stage) of a compared plan (above the sweep)";
  }
  double all_useful = 0;
  int64_t all_tokens = 0;
  for (const GlobalBatch& b : r.batches) {
    for (const Sample& s : b.samples) all_useful += flops.SampleTotal(s);
    all_tokens += b.tokens;
  }
  if (out.rate.flops_per_s > 0 && all_useful > 0) {
    out.ideal_tokens_per_s = static_cast<double>(all_tokens) * static_cast<double>(out.devices) *
                             out.rate.flops_per_s / all_useful;
  }
  for (size_t i = 0; i < own.size(); ++i) {
    Summarize(&own[i], out.rate.flops_per_s, out.devices, own_acc[i]);
  }
  for (size_t i = 0; i < controlled.size(); ++i) {
    Summarize(&controlled[i], out.rate.flops_per_s, out.devices, ctl_acc[i]);
  }
  for (std::vector<MethodRun>* runs_of : {&own, &controlled}) {
    double ref = 0;
    for (const MethodRun& m : *runs_of) {
      if (m.method == sc.reference && m.ok_batches > 0) ref = m.tokens_per_s;
    }
    for (MethodRun& m : *runs_of) {
      if (ref > 0 && m.ok_batches > 0) m.ratio_to_reference = m.tokens_per_s / ref;
      if (m.state == "ok" && m.has_config && m.ok_batches == 0 && !m.batches.empty()) {
        m.state = "out-of-memory";
        m.reason = fmt::format("batch {}: {}", m.batches.front().batch, m.batches.front().reason);
      }
    }
  }
  out.own = std::move(own);
  out.controlled = std::move(controlled);
  return out;
}

}  // namespace sluice
