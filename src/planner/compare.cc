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

// What the scenario resolves to.
struct Resolved {
  ModelSpec model;
  ClusterSpec cluster;
  std::unique_ptr<CostModel> cost;
  std::optional<Bytes> memory_limit;
  std::vector<GlobalBatch> batches;
  std::string description;
};

// "FILE: field 'model'" for a scenario file, "--model" for flags.
std::string FieldName(std::string_view source, std::string_view field, std::string_view flag) {
  if (source.empty()) return std::string(flag);
  return fmt::format("{}: field '{}'", source, field);
}

Status Prefixed(const Status& s, const std::string& where) {
  if (s.ok()) return s;
  return Status(s.code(), fmt::format("{}: {}", where, s.message()));
}

StatusOr<Resolved> Resolve(const CompareScenario& sc, std::string_view source) {
  Resolved r;
  auto model = ResolveModel(sc.model);
  if (!model.ok()) return Prefixed(model.status(), FieldName(source, "model", "--model"));
  r.model = std::move(model).value();
  auto cluster = ResolveCluster(sc.cluster);
  if (!cluster.ok()) return Prefixed(cluster.status(), FieldName(source, "cluster", "--cluster"));
  r.cluster = std::move(cluster).value();
  if (sc.memory_limit_mb > 0) {
    r.memory_limit = Bytes::MB(sc.memory_limit_mb);
    if (*r.memory_limit > r.cluster.device.memory) {
      return InvalidArgumentError(fmt::format(
          "{}: {:.0f} MB exceeds the memory of one {} device ({:.0f} MB; allowed: 1..{:.0f})",
          FieldName(source, "memory_limit_mb", "--memory-limit"), sc.memory_limit_mb,
          r.cluster.device.name, r.cluster.device.memory.mb(), r.cluster.device.memory.mb()));
    }
  }
  if (sc.max_seqlen > r.model.max_position) {
    return InvalidArgumentError(
        fmt::format("{}: {} exceeds the max position {} of model '{}' (allowed: 1..{})",
                    FieldName(source, "max_seqlen", "--max-seqlen"), sc.max_seqlen,
                    r.model.max_position, r.model.name, r.model.max_position));
  }
  CostModelOptions cost_options;
  cost_options.kind = sc.cost;
  cost_options.flash_attention = sc.flash_attention;
  auto cost = MakeCostModel(r.model, r.cluster, cost_options);
  if (!cost.ok()) return Prefixed(cost.status(), FieldName(source, "cost", "--cost"));
  r.cost = std::move(cost).value();

  DataOptions data_options;
  data_options.seed = sc.seed;
  data_options.num_samples = sc.samples;
  auto dataset = LoadData(sc.data, data_options);
  if (!dataset.ok()) return Prefixed(dataset.status(), FieldName(source, "data", "--data"));
  BatcherOptions batcher_options;
  batcher_options.tokens_per_batch = sc.tokens_per_batch;
  batcher_options.max_seqlen = sc.max_seqlen;
  SLUICE_ASSIGN_OR_RETURN(batcher_options.long_samples, ParseLongSamplePolicy(sc.long_samples));
  batcher_options.limit =
      r.model.is_encoder_decoder() ? SeqlenLimit::kEachSide : SeqlenLimit::kTotal;
  batcher_options.seed = sc.seed;
  SLUICE_ASSIGN_OR_RETURN(GlobalBatcher batcher, GlobalBatcher::Create(*dataset, batcher_options));
  GlobalBatch batch;
  while ((sc.iterations == 0 || static_cast<int64_t>(r.batches.size()) < sc.iterations) &&
         batcher.Next(&batch)) {
    r.batches.push_back(std::move(batch));
  }
  if (r.batches.empty()) {
    return InvalidArgumentError(fmt::format("{}: '{}' yields no global batch of {} tokens",
                                            FieldName(source, "data", "--data"), sc.data,
                                            sc.tokens_per_batch));
  }
  const Bytes limit = r.memory_limit.value_or(r.cluster.device.memory);
  r.description = fmt::format(
      "model:    {} ({}, {} layers{})\n"
      "cluster:  {} ({} devices), memory limit {:.0f} MB per device\n"
      "cost:     {}\n"
      "data:     {} ({} samples), {} tokens per global batch, max seqlen {} ({}), {} batches{}",
      r.model.name, ModelKindName(r.model.kind), r.model.layers,
      r.model.is_encoder_decoder() ? fmt::format(" + {}", r.model.decoder_layers) : "",
      r.cluster.name, r.cluster.num_devices(), limit.mb(), r.cost->Describe(), dataset->source(),
      dataset->size(), sc.tokens_per_batch, sc.max_seqlen, sc.long_samples, r.batches.size(),
      sc.iterations == 0 ? " (all)" : "");
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
    SLUICE_ASSIGN_OR_RETURN(
        const StageCostEvaluator* eval,
        scorer_.Evaluator(run->config.parallel,
                          PolicyFor(run->config.schedule, run->config.parallel.vpp)));
    const Planner planner(*eval, r_.cluster, scorer_.OptionsFor(run->config));
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
          account = AccountBatch(plan, s, *eval, batch.samples, flops_, r_.cluster.num_devices());
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
  SLUICE_RETURN_IF_ERROR(ValidateCompareScenario(sc, source.empty() ? "flags" : source));
  SLUICE_ASSIGN_OR_RETURN(Resolved r, Resolve(sc, source));
  CompareResult out;
  out.scenario = sc;
  out.description = r.description;
  out.batches = static_cast<int64_t>(r.batches.size());
  out.devices = r.cluster.num_devices();
  out.memory_limit_mb = r.memory_limit.value_or(r.cluster.device.memory).mb();
  auto cancelled = [&] { return options.cancelled && options.cancelled(); };

  const FlopCounter flops(r.model);
  std::vector<int64_t> tps;
  for (int64_t tp = 1; tp <= std::max<int64_t>(1, r.cluster.devices_per_node); tp *= 2) {
    tps.push_back(tp);
  }
  for (int64_t tp : sc.search.tp) {
    if (std::find(tps.begin(), tps.end(), tp) == tps.end()) tps.push_back(tp);
  }
  out.sweep_rate = SweepAchievableRate(*r.cost, flops, tps);

  // The search.
  const auto search_start = Clock::now();
  ParallelSpace space =
      EnumerateParallelConfigs(r.model, r.cluster, *r.cost, sc.search, r.memory_limit);
  out.skipped_configs = space.skipped;
  if (sc.controlled.has_value()) {
    ParallelConfig fixed = *sc.controlled;
    fixed.vpp = 1;
    fixed.memory_limit = r.memory_limit;
    Status fits = CheckParallelFits(fixed, r.model, &r.cluster,
                                    FieldName(source, "controlled", "--parallel"));
    if (!fits.ok()) return fits;
    const bool listed = std::any_of(space.configs.begin(), space.configs.end(),
                                    [&](const ParallelConfig& p) { return SameShared(p, fixed); });
    if (!listed) space.configs.push_back(fixed);
  }
  const std::vector<MethodSpec> methods = ScenarioMethods(sc);
  std::vector<std::vector<Candidate>> candidates;
  int64_t total = 0;
  for (const MethodSpec& m : methods) {
    candidates.push_back(ExpandCandidates(space.configs, m, r.model, sc.search));
    total += static_cast<int64_t>(candidates.back().size());
  }
  const size_t score_n = std::min(r.batches.size(), static_cast<size_t>(sc.search.score_batches));
  BatchingOptions batching;
  batching.seed = sc.seed;
  batching.max_seqlen = sc.max_seqlen;
  SimOptions sim;
  sim.collectives =
      sc.stepwise_collectives ? CollectiveMode::kStepwise : CollectiveMode::kClosedForm;
  CandidateScorer scorer(*r.cost, r.cluster,
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
    out.controlled_config.memory_limit = r.memory_limit;
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
