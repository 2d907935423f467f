#include "cli/scenario_flags.h"

#include <fmt/core.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <utility>
#include <vector>

#include "cli/cli_common.h"
#include "model/chunk_cut.h"
#include "model/parallel_config.h"
#include "planner/layer_cut.h"
#include "sim/simulator.h"

namespace sluice::cli {

void AddScenarioFlags(CLI::App* app, ScenarioFlags* f) {
  AddModelFlag(app, &f->model)->capture_default_str();
  AddClusterFlag(app, &f->cluster)->capture_default_str();
  AddParallelFlag(app, &f->parallel)->capture_default_str();
  AddDataFlag(app, &f->data)->capture_default_str();
  app->add_option("--cost", f->cost, "Cost model: auto, analytic, profiled:PATH or analytic:PATH")
      ->capture_default_str();
  AddTokensPerBatchFlag(app, &f->tokens_per_batch);
  AddMaxSeqlenFlag(app, &f->max_seqlen);
  app->add_option("--long", f->long_samples,
                  "Samples longer than --max-seqlen: clip or drop (counted either way)")
      ->capture_default_str();
  app->add_option("--iterations", f->iterations,
                  "Global batches to plan: a number, or 'all' for the whole dataset")
      ->capture_default_str();
  app->add_option("--memory-limit", f->memory_limit_mb,
                  "Per-device memory budget in MB (10^6 bytes), used as given; default: the "
                  "device's memory less --memory-reserve")
      ->check(NumberCheck(0, true, 1e9, "a size in MB in (0, 1e9]"));
  AddMemoryReserveFlag(app, &f->memory_reserve_mb);
  app->add_option("--samples", f->samples,
                  "Generator presets: samples to generate (0 = 20000); files: first N samples "
                  "(0 = all)")
      ->check(IntegerCheck(0, kMaxSamples, kSamplesAllowed))
      ->capture_default_str();
  AddSeedFlag(app, &f->seed);
}

std::string_view FlagForField(std::string_view field) {
  static constexpr std::pair<std::string_view, std::string_view> kFlags[] = {
      {"model", "--model"},
      {"cluster", "--cluster"},
      {"parallel", "--parallel"},
      {"controlled", "--controlled"},
      {"memory_limit_mb", "--memory-limit"},
      {"memory_reserve_mb", "--memory-reserve"},
      {"cost", "--cost"},
      {"flash_attention", "--flash-attention"},
      {"data", "--data"},
      {"samples", "--samples"},
      {"seed", "--seed"},
      {"tokens_per_batch", "--tokens-per-batch"},
      {"max_seqlen", "--max-seqlen"},
      {"long", "--long"},
      {"iterations", "--iterations"},
      {"methods", "--methods"},
      {"reference", "--reference"},
      {"search.score_batches", "--score-batches"},
      {"search.score_extremes", "--score-extremes"},
      {"search.simulate_top", "--simulate-top"},
      {"search.cp", "--cp"},
      {"search.ep", "--ep"},
      {"search.layer_cut", "--layer-cut"},
      {"moe_overlap", "--moe-overlap"},
  };
  for (const auto& [f, flag] : kFlags) {
    if (f == field) return flag;
  }
  return "";
}

FieldNamer FlagFieldNamer() {
  return [](std::string_view field) {
    const std::string_view flag = FlagForField(field);
    return flag.empty() ? fmt::format("flags: field '{}'", field) : std::string(flag);
  };
}

std::vector<NamedInput> ScenarioInputs(const ScenarioFlags& f) {
  std::vector<NamedInput> in = {{"--model", f.model},
                                {"--cluster", f.cluster},
                                {"--parallel", f.parallel},
                                {"--data", f.data}};
  const size_t colon = f.cost.find(':');
  if (colon != std::string::npos) in.push_back({"--cost", f.cost.substr(colon + 1)});
  return in;
}

StatusOr<int64_t> ParseIterations(const std::string& text) {
  if (text == "all") return int64_t{0};
  int64_t n = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, n);
  if (ec != std::errc() || ptr != end || n < 1) {
    return InvalidArgumentError(
        fmt::format("--iterations: '{}' is not a positive integer or 'all'", text));
  }
  return n;
}

StatusOr<Scenario> ResolveScenarioFlags(const ScenarioFlags& f) {
  ScenarioSpec spec;
  spec.model = f.model;
  spec.cluster = f.cluster;
  SLUICE_ASSIGN_OR_RETURN(spec.parallel, ResolveParallel(f.parallel));
  spec.memory_limit_mb = f.memory_limit_mb;
  spec.memory_reserve_mb = f.memory_reserve_mb;
  spec.cost = f.cost;
  spec.data = f.data;
  spec.samples = f.samples;
  spec.seed = f.seed;
  spec.tokens_per_batch = f.tokens_per_batch;
  spec.max_seqlen = f.max_seqlen;
  spec.long_samples = f.long_samples;
  SLUICE_ASSIGN_OR_RETURN(spec.iterations, ParseIterations(f.iterations));
  return ResolveScenario(spec, FlagFieldNamer());
}

StatusOr<StageCostEvaluator> MakeEvaluator(const Scenario& sc) {
  auto eval = StageCostEvaluator::Create(*sc.cost, *sc.parallel, sc.cluster);
  if (!eval.ok()) return InvalidArgumentError(eval.status().message());
  return std::move(eval).value();
}

StatusOr<Planner> MakePlanner(const Scenario& sc, PlannerOptions options) {
  auto eval = MakePlannerEvaluator(*sc.cost, *sc.parallel, sc.cluster, options.schedule);
  if (!eval.ok()) return InvalidArgumentError(eval.status().message());
  auto planner = Planner::Create(std::move(eval).value(), sc.cluster, std::move(options));
  if (!planner.ok()) return planner.status().WithPrefix("--schedule");
  return planner;
}

void AddPlannerFlags(CLI::App* app, PlannerFlags* flags) {
  app->add_option("--method", flags->method, "Batching method (see `sluice batch --help`)")
      ->capture_default_str();
  app->add_option("--schedule", flags->schedule, "gpipe, 1f1b, interleaved, zb-h1 or adaptive")
      ->capture_default_str();
  app->add_option("--interleaved-rounds", flags->interleaved_rounds,
                  "interleaved with vpp > 1 when pp does not divide the micro-batch count: padded "
                  "(Megatron's rounds of pp), flexible (PyTorch's rounds of >= pp, more chunks in "
                  "flight) or auto (flexible where it fits memory and is shorter)")
      ->type_name("auto|padded|flexible")
      ->capture_default_str();
  app->add_option("--recompute", flags->recompute,
                  "none, selective or full for every micro-batch (default: the method chooses)");
  app->add_flag("--no-search", flags->no_search, "Keep the batching order (no order search)");
  app->add_option("--optimize-budget-ms", flags->optimize_budget_ms,
                  "Run the plan optimizer (`sluice optimize`) on every batch's plan with this "
                  "wall-clock budget in ms (0 = off)")
      ->check(NumberCheck(0, false, 1e9, "a number of ms in [0, 1e9], 0 = off"))
      ->capture_default_str();
}

StatusOr<Planner> MakePlannerFromFlags(const Scenario& scenario,
                                       const ScenarioFlags& scenario_flags,
                                       const PlannerFlags& flags) {
  SLUICE_ASSIGN_OR_RETURN(ScheduleKind kind, ParseScheduleKind(flags.schedule));
  PlannerOptions options;
  options.method = flags.method;
  options.schedule = kind;
  options.search_order = !flags.no_search;
  StatusOr<InterleavedRounds> rounds = ParseInterleavedRounds(flags.interleaved_rounds);
  if (!rounds.ok()) return rounds.status().WithPrefix("--interleaved-rounds");
  options.interleaved_rounds = *rounds;
  options.batching.seed = scenario_flags.seed;
  options.batching.max_seqlen = scenario.max_seqlen;
  if (!flags.recompute.empty()) {
    SLUICE_ASSIGN_OR_RETURN(options.batching.recompute, ParseRecompute(flags.recompute));
  }
  if (flags.optimize_budget_ms > 0) {
    options.optimize = true;
    options.optimizer.budget = Duration::Millis(flags.optimize_budget_ms);
    options.optimizer.seed = scenario_flags.seed;
  }
  // The planner's evaluator sizes micro-batches for the in-flight count of the schedule.
  return MakePlanner(scenario, std::move(options));
}

std::vector<GlobalBatch> TakeLayerCutBatches(Scenario& scenario) {
  const int64_t take = scenario.iterations == 0
                           ? kLayerCutBatches
                           : std::min<int64_t>(kLayerCutBatches, scenario.iterations);
  std::vector<GlobalBatch> out;
  GlobalBatch b;
  while (static_cast<int64_t>(out.size()) < take && scenario.batcher->Next(&b)) out.push_back(b);
  return out;
}

StatusOr<std::string> ApplyLayerCutFlag(std::string_view rule, Scenario* scenario,
                                        const ScenarioFlags& scenario_flags,
                                        const PlannerFlags& flags,
                                        std::span<const GlobalBatch> batches) {
  if (rule == "even") return std::string();
  if (rule != "balanced") {
    return InvalidArgumentError(
        fmt::format("--layer-cut: '{}' is not a cut rule (allowed: even, balanced)", rule));
  }
  Scenario& sc = *scenario;
  if (!sc.parallel->layer_cut.empty()) {
    return InvalidArgumentError(
        fmt::format("--layer-cut balanced: --parallel already gives layer_cut={}; give one of them",
                    DescribeLayerCut(sc.parallel->layer_cut)));
  }
  SLUICE_ASSIGN_OR_RETURN(const Planner even, MakePlannerFromFlags(sc, scenario_flags, flags));
  std::vector<Sample> samples;
  for (const GlobalBatch& g : batches) {
    samples.insert(samples.end(), g.samples.begin(), g.samples.end());
  }
  const ParallelConfig base = *sc.parallel;
  const auto start = std::chrono::steady_clock::now();
  SLUICE_ASSIGN_OR_RETURN(
      LayerCutChoice choice,
      ChooseLayerCut(*sc.cost, base, samples,
                     PlannerLayerCutScorer(*sc.cost, sc.cluster, base, even.options(), batches)));
  // The estimate ranks the cuts; the simulator settles the last one-layer moves from its best
  // (PolishLayerCut) and keeps a cut only when it simulates shorter than the even cut.
  auto score = [](const LayerCutScore& x) {
    return x.failed_batches > 0 ? fmt::format("{:.1f} ms ({} batch(es) out of memory)",
                                              x.time.millis(), x.failed_batches)
                                : fmt::format("{:.1f} ms", x.time.millis());
  };
  if (!choice.searched) {
    return fmt::format(
        "layer cut: even ({}; the balanced cut is searched for vpp = 1 and more than one "
        "chunk)\n",
        sc.parallel->vpp > 1 ? "vpp > 1" : "one chunk");
  }
  const std::vector<int64_t> estimated = choice.cut;
  std::string simulated;
  int64_t simulations = 0;
  if (choice.even_exists) {
    LayerCutScorer sim = [&](const std::vector<int64_t>& cut) -> StatusOr<LayerCutScore> {
      ++simulations;
      return SimulateLayerCut(*sc.cost, sc.cluster, base, even.options(), batches, cut,
                              SimOptions{});
    };
    const std::vector<int64_t> even_cut = EvenLayerCut(sc.model, base.chunks());
    SLUICE_ASSIGN_OR_RETURN(const LayerCutScore even_sim, sim(even_cut));
    const std::vector<int64_t> from = estimated.empty() ? even_cut : estimated;
    LayerCutScore from_sim = even_sim;
    if (from != even_cut) {
      SLUICE_ASSIGN_OR_RETURN(from_sim, sim(from));
    }
    LayerCutSearchOptions polish;
    polish.max_evaluations = kSimulatedLayerCuts;
    LayerCutScore final_sim;
    int64_t polished = 0;
    SLUICE_ASSIGN_OR_RETURN(const std::vector<int64_t> final_cut,
                            PolishLayerCut(from, from_sim, sim, polish, &final_sim, &polished));
    const bool keep = final_cut != even_cut && final_sim < even_sim;
    choice.cut = keep ? final_cut : std::vector<int64_t>{};
    simulated = fmt::format("; simulated: even {}, {} {}", score(even_sim),
                            DescribeLayerCut(from == even_cut ? std::vector<int64_t>{} : from),
                            score(from_sim));
    if (final_cut != from) {
      simulated += fmt::format(", after the simulated moves {} {}", DescribeLayerCut(final_cut),
                               score(final_sim));
    }
    if (!keep && final_cut != even_cut) simulated += ", not shorter, so the even cut is kept";
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  sc.parallel->layer_cut = choice.cut;
  return fmt::format(
      "layer cut: {} ({}), chosen on the first {} batches: estimated even {} -> {} {}{}; {} cuts "
      "estimated, {} simulated, in {:.0f} ms\n",
      DescribeLayerCut(choice.cut), choice.cut.empty() ? "no other cut was shorter" : "balanced",
      batches.size(), choice.even_exists ? score(choice.even) : "(none: the layers do not divide)",
      DescribeLayerCut(estimated), score(choice.chosen), simulated, choice.evaluated, simulations,
      ms);
}

}  // namespace sluice::cli
