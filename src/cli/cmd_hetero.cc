// `sluice hetero`: heterogeneous replicas (planner/hetero.h) planned and simulated on a compare
// scenario's global batches: one given mix (--replicas SPEC|FILE, model/hetero_config.h) or the
// best 2-shape mix found by the search (--search). Prints each batch's groups, the cross-group
// reduction and the simulated iteration, then the run's real tokens/s and planning time per
// batch: the `sluice-hetero` row beside `sluice compare`'s rows of the same scenario.
//
// Exit codes: 0 when the run finished (batches that did not fit are counted and reported); 1 when
// no batch ran or the search found no feasible mix; 2 for bad flags or input (a spec that does not
// cover the cluster's devices, or whose groups cannot hold the run's longest sample).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/files.h"
#include "base/json_util.h"
#include "cli/cli_common.h"
#include "compare/compare_scenario.h"
#include "model/hetero_config.h"
#include "planner/config_search.h"
#include "planner/hetero.h"
#include "planner/scenario.h"
#include "planner/search_space.h"

namespace sluice::cli {
namespace {

struct HeteroFlags {
  std::string scenario_file;
  std::string replicas;
  bool search = false;
  int64_t iterations = 0;  // 0: the scenario's
  std::string method = "hydraulis";
  std::string schedule = "1f1b";
  int64_t shuffles = 16;
  int64_t top = 3;
  int64_t show = 1;
  std::string out;  // --out: the first planned batch's heterogeneous plan (JSON)
};

struct Resolved {
  CompareScenario cs;
  Scenario sc;
  std::vector<GlobalBatch> batches;
};

StatusOr<Resolved> ResolveRun(const HeteroFlags& f) {
  Resolved r;
  if (!f.scenario_file.empty()) {
    SLUICE_ASSIGN_OR_RETURN(r.cs, ReadCompareScenarioFile(f.scenario_file));
  }
  if (f.iterations > 0) r.cs.iterations = f.iterations;
  const std::string source = f.scenario_file.empty() ? "default scenario" : f.scenario_file;
  SLUICE_RETURN_IF_ERROR(ValidateCompareScenario(r.cs, source));
  // A compare scenario's fields that hetero has no use for: said, not silently dropped.
  const CompareScenario unset;
  std::vector<std::string> ignored;
  if (r.cs.methods != unset.methods) ignored.push_back("methods");
  if (r.cs.reference != unset.reference) ignored.push_back("reference");
  if (r.cs.controlled_method != unset.controlled_method) ignored.push_back("controlled_method");
  if (r.cs.controlled != unset.controlled) ignored.push_back("controlled");
  if (r.cs.moe_overlap != unset.moe_overlap) ignored.push_back("moe_overlap");
  if (!ignored.empty()) {
    fmt::print(stderr,
               "warning: {}: sluice hetero ignores field(s) {} (sluice compare's; hetero plans "
               "its own mixes of dense replicas)\n",
               source, fmt::join(ignored, ", "));
  }
  ScenarioSpec spec;
  spec.model = r.cs.model;
  spec.cluster = r.cs.cluster;
  spec.memory_limit_mb = r.cs.memory_limit_mb;
  spec.memory_reserve_mb = r.cs.memory_reserve_mb;
  spec.cost = r.cs.cost;
  spec.flash_attention = r.cs.flash_attention;
  spec.data = r.cs.data;
  spec.samples = r.cs.samples;
  spec.seed = r.cs.seed;
  spec.tokens_per_batch = r.cs.tokens_per_batch;
  spec.max_seqlen = r.cs.max_seqlen;
  spec.long_samples = r.cs.long_samples;
  spec.iterations = r.cs.iterations;
  const FieldNamer field = [&](std::string_view name) {
    return fmt::format("{}: field '{}'", source, name);
  };
  SLUICE_ASSIGN_OR_RETURN(r.sc, ResolveScenario(spec, field));
  GlobalBatch batch;
  while ((r.cs.iterations == 0 || static_cast<int64_t>(r.batches.size()) < r.cs.iterations) &&
         r.sc.batcher->Next(&batch)) {
    r.batches.push_back(std::move(batch));
  }
  if (r.batches.empty()) return r.sc.NoBatchError(field);
  return r;
}

// The scenario's memory limit (or reserve) on every group that gives none.
void ApplyScenarioMemory(const Scenario& sc, HeteroConfig* h) {
  for (ParallelConfig& g : h->groups) {
    if (g.memory_limit.has_value() || g.memory_reserve.has_value()) continue;
    g.memory_limit = sc.memory_limit;
    if (!g.memory_limit.has_value()) g.memory_reserve = sc.memory_reserve;
  }
}

// Exit 2 when no group holds the run's longest sample (a spec that cannot hold the data).
Status CheckHoldsLongest(const HeteroPlanner& planner, const std::vector<GlobalBatch>& batches) {
  int64_t longest = 0, batch_of = 0;
  for (const GlobalBatch& b : batches) {
    for (const Sample& s : b.samples) {
      if (s.input_len + s.target_len > longest) {
        longest = s.input_len + s.target_len;
        batch_of = b.index;
      }
    }
  }
  const std::vector<int64_t>& caps = planner.capacities();
  if (*std::max_element(caps.begin(), caps.end()) >= longest) return Status::Ok();
  std::string held;
  for (size_t g = 0; g < caps.size(); ++g) {
    HeteroConfig one{.groups = {planner.config().groups[g]}};
    held += fmt::format("{}group {} ({}): {} tokens", g ? ", " : "", g + 1, DescribeHetero(one),
                        caps[g]);
  }
  return InvalidArgumentError(fmt::format(
      "--replicas: no replica group holds the run's longest sample ({} tokens, global batch {}); "
      "the longest each group holds alone: {}; allowed: at least one group holding {} tokens "
      "(a larger tp, cp or pp, or memory_limit_mb)",
      longest, batch_of, held, longest));
}

Status RunHetero(const HeteroFlags& f) {
  if (f.search == !f.replicas.empty()) {
    return InvalidArgumentError(
        "--replicas / --search: give exactly one (--replicas 'dp=4,tp=2;dp=1,tp=8' runs that mix, "
        "--search finds the best 2-shape mix)");
  }
  if (!f.out.empty()) SLUICE_RETURN_IF_ERROR(CheckOutputFile("--out", f.out));
  if (!IsBatchingName(f.method)) {
    SLUICE_RETURN_IF_ERROR(MethodSpecFor(f.method, "--method").status());
  }
  SLUICE_ASSIGN_OR_RETURN(const ScheduleKind schedule, ParseScheduleKind(f.schedule));
  std::optional<HeteroConfig> given;
  if (!f.replicas.empty()) {
    SLUICE_ASSIGN_OR_RETURN(given, ResolveHetero(f.replicas, "--replicas"));
  }
  SLUICE_ASSIGN_OR_RETURN(Resolved r, ResolveRun(f));
  fmt::print("{}\n", r.sc.Describe({.parallel = false,
                                    .batches_taken = static_cast<int64_t>(r.batches.size())}));
  HeteroPlannerOptions options;
  options.planner.method = f.method;
  options.planner.schedule = schedule;
  options.planner.batching.seed = r.cs.seed;
  options.planner.batching.max_seqlen = r.cs.max_seqlen;
  options.shuffles = f.shuffles;
  SimOptions sim;
  sim.collectives =
      r.cs.stepwise_collectives ? CollectiveMode::kStepwise : CollectiveMode::kClosedForm;
  sim.record_timeline = false;
  sim.record_memory = false;

  HeteroConfig config;
  if (given.has_value()) {
    config = *given;
    ApplyScenarioMemory(r.sc, &config);
  } else {
    std::vector<HeteroConfig> mixes;
    for (int64_t zero : {1, 2}) {
      std::vector<HeteroConfig> some = EnumerateHeteroMixes(r.sc.model, r.sc.cluster, zero,
                                                            r.sc.memory_limit, r.sc.memory_reserve);
      mixes.insert(mixes.end(), some.begin(), some.end());
    }
    std::vector<GlobalBatch> score;
    for (size_t i :
         PickScoreBatches(r.batches, r.cs.search.score_batches, r.cs.search.score_extremes)) {
      score.push_back(r.batches[i]);
    }
    SLUICE_ASSIGN_OR_RETURN(
        HeteroSearch s, SearchHetero(*r.sc.cost, r.sc.cluster, mixes, score, options, sim, f.top));
    int64_t feasible = 0;
    for (const HeteroCandidate& c : s.ranked) feasible += c.feasible ? 1 : 0;
    fmt::print(
        "search: {} 2-shape mixes, {} feasible on {} score batches, {} simulated, {:.1f} s\n",
        s.ranked.size(), feasible, score.size(), std::min<int64_t>(f.top, feasible), s.seconds);
    for (size_t i = 0; i < s.ranked.size() && i < 10; ++i) {
      const HeteroCandidate& c = s.ranked[i];
      if (!c.feasible && !c.simulated) break;
      fmt::print("  {:>2}. {:<40} estimated {:>9.0f} tok/s{}\n", i + 1, DescribeHetero(c.config),
                 c.estimated_tokens_per_s,
                 c.simulated ? (c.feasible ? fmt::format(", simulated {:.0f} tok/s",
                                                         c.simulated_tokens_per_s)
                                           : fmt::format(", simulated: {}", c.reason))
                             : "");
    }
    if (!s.best.has_value()) {
      return FailedPreconditionError(
          "--search: no 2-shape mix of the cluster runs the score batches within memory");
    }
    config = s.best->config;
    fmt::print("best mix: {}\n", DescribeHetero(config));
  }
  SLUICE_ASSIGN_OR_RETURN(
      HeteroPlanner planner,
      HeteroPlanner::Create(*r.sc.cost, config, r.sc.cluster, options, "--replicas"));
  SLUICE_RETURN_IF_ERROR(CheckHoldsLongest(planner, r.batches));
  fmt::print("replicas: {} ({} replicas on {} devices); longest sequence per group:",
             DescribeHetero(config), config.replicas(), config.devices());
  for (size_t g = 0; g < config.groups.size(); ++g) {
    fmt::print(" {}{}", g ? "/ " : "", planner.capacities()[g]);
  }
  fmt::print("\nreduction groups (layers: stage per group; cross-group time):\n");
  for (const ReductionGroup& rg : planner.reductions()) {
    std::string stages;
    for (const ReductionMember& m : rg.members) {
      stages += fmt::format("{}g{}:s{}", stages.empty() ? "" : " ", m.group + 1, m.stage);
    }
    fmt::print("  layers {:>3}-{:<3}{}{} {:>6.1f} M params  {}  {:.2f} ms\n", rg.first_layer,
               rg.first_layer + rg.layers - 1, rg.embedding ? " +emb" : "     ",
               rg.output_head ? " +head" : "      ", static_cast<double>(rg.params) / 1e6, stages,
               PriceReduction(rg, config, r.sc.cluster).millis());
  }
  int64_t ok = 0, shown = 0, tokens = 0;
  bool written = false;
  double iter_ms = 0, plan_ms = 0, max_plan_ms = 0, cross_ms = 0;
  for (const GlobalBatch& b : r.batches) {
    SLUICE_ASSIGN_OR_RETURN(HeteroPlanResult p, planner.Plan(b.samples));
    plan_ms += p.planning_time.millis();
    max_plan_ms = std::max(max_plan_ms, p.planning_time.millis());
    const bool show = shown++ < f.show;
    if (p.outcome != PlanOutcome::kOk) {
      fmt::print("batch {}: {} samples, {} tokens: out-of-memory: {}\n", b.index, b.samples.size(),
                 b.tokens, p.infeasible_reason);
      continue;
    }
    if (!f.out.empty() && !written) {
      SLUICE_RETURN_IF_ERROR(
          WriteStringToFile(f.out, HeteroPlanToJson(p, config, r.sc.cluster).dump() + "\n")
              .WithPrefix("--out"));
      written = true;
      fmt::print("wrote {} (global batch {})\n", f.out, b.index);
    }
    SLUICE_ASSIGN_OR_RETURN(HeteroSimResult s, SimulateHetero(p, sim));
    if (s.outcome != SimOutcome::kOk || s.memory_exceeded) {
      fmt::print("batch {}: simulation {}: {}\n", b.index,
                 s.memory_exceeded ? "out-of-memory" : SimOutcomeName(s.outcome), s.problem);
      continue;
    }
    ++ok;
    tokens += s.real_tokens;
    iter_ms += s.iteration_time.millis();
    cross_ms += s.cross_exposed.millis();
    fmt::print(
        "batch {}: {} samples, {} tokens: iteration {:.1f} ms (slowest group {:.1f} + "
        "cross-group {:.1f} exposed of {:.1f}), planned in {:.2f} ms\n",
        b.index, b.samples.size(), b.tokens, s.iteration_time.millis(), s.slowest_group.millis(),
        s.cross_exposed.millis(), s.cross_sync.millis(), p.planning_time.millis());
    if (!show) continue;
    for (size_t g = 0; g < p.groups.size(); ++g) {
      int64_t mbs = 0, longest = 0;
      for (const auto& rep : p.groups[g].batch_plan.replicas)
        mbs += static_cast<int64_t>(rep.size());
      for (const Sample& smp : p.samples[g])
        longest = std::max(longest, smp.input_len + smp.target_len);
      HeteroConfig one{.groups = {config.groups[g]}};
      fmt::print(
          "  group {} ({}): {} samples (longest {}), {} micro-batches, estimated {:.1f} "
          "ms, simulated {:.1f} ms\n",
          g + 1, DescribeHetero(one), p.samples[g].size(), longest, mbs,
          p.groups[g].makespan.millis(), s.groups[g].iteration_time.millis());
    }
  }
  fmt::print(
      "\nsummary: {} of {} batches ran; sluice-hetero {:.0f} real tokens/s (simulated), "
      "mean iteration {:.1f} ms (cross-group exposed {:.1f} ms), planning {:.2f} ms per batch "
      "(max {:.2f})\n",
      ok, r.batches.size(), iter_ms > 0 ? static_cast<double>(tokens) / (iter_ms / 1e3) : 0,
      ok ? iter_ms / ok : 0, ok ? cross_ms / ok : 0,
      plan_ms / static_cast<double>(r.batches.size()), max_plan_ms);
  if (ok == 0) {
    return FailedPreconditionError(
        fmt::format("no batch ran within memory on {}", DescribeHetero(config)));
  }
  return Status::Ok();
}

}  // namespace

void RegisterHeteroCommands(CLI::App* app, RunState* state) {
  auto f = std::make_shared<HeteroFlags>();
  CLI::App* c = app->add_subcommand(
      "hetero",
      "Plan and simulate heterogeneous replicas (data-parallel replicas of different tp, pp, "
      "cp) on a compare scenario's batches: a given mix or the best 2-shape mix");
  c->add_option("--scenario", f->scenario_file,
                "A JSON compare scenario (docs/formats.md): model, cluster, data, batch budget, "
                "memory, cost model (default: sluice compare's embedded default scenario)")
      ->type_name("FILE");
  c->add_option("--replicas", f->replicas,
                "Replica groups separated by ';', each K=V pairs of --parallel with dp = the "
                "replicas of that shape, e.g. 'dp=4,tp=2;dp=1,tp=8'; or a JSON file "
                "{\"replicas\": [...]}. Groups cover every device; vpp 1, ep 1, one zero of 0-2")
      ->type_name("SPEC|FILE");
  c->add_flag(
      "--search", f->search,
      "Search 2-shape mixes (narrow: tp 1-2, cp 1-2, pp 1-4; wide: tp x cp 4-16, pp 1-2; ZeRO-1 "
      "and 2) and run the best");
  c->add_option("--iterations", f->iterations,
                "Global batches to plan and simulate (default: the scenario's)")
      ->check(IntegerCheck(1, kNoMaxInteger));
  c->add_option("--method", f->method, "Batching method of each group's planner")
      ->capture_default_str();
  c->add_option("--schedule", f->schedule, "Pipeline schedule of each group")
      ->capture_default_str();
  c->add_option("--shuffles", f->shuffles, "Shuffles of stage 1 across shapes")
      ->check(IntegerCheck(1, 100000))
      ->capture_default_str();
  c->add_option("--top", f->top, "Searched mixes simulated after the estimate")
      ->check(IntegerCheck(1, 1000))
      ->capture_default_str();
  c->add_option("--out", f->out,
                "Write the first planned batch's heterogeneous plan: replica groups, reduction "
                "groups and each group's plan (JSON, sluice-hetero-plan/1)")
      ->type_name("FILE")
      ->check(PathCheck());
  c->add_option("--show", f->show, "Print per-group details of this many first batches")
      ->check(IntegerCheck(0, kNoMaxInteger))
      ->capture_default_str();
  SetHandler(c, state, [f] { return RunHetero(*f); });
}

}  // namespace sluice::cli
