// The scenario every planning subcommand starts from: model, cluster, parallel configuration,
// data, batch budget and cost model, given with the shared flags of ARCHITECTURE.md and resolved
// (validated) by the planner's scenario resolver (planner/scenario.h), whose errors name fields:
// this file maps each field to its flag.
//
// Defaults (a user who gives no flag gets DynaPipe's GPT setting): --model gpt-6.7b, --cluster
// a100-40g:8, --parallel dp=2,pp=4,zero=1, --data mixture-4task, --tokens-per-batch 65536,
// --max-seqlen 2048 (clip), --iterations 20, --memory-limit = the device's memory less
// --memory-reserve (default: 2 GiB + 5% of the device's memory, model/parallel_config.h).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "batching/stage_cost.h"
#include "cli/cli_common.h"
#include "planner/planner.h"
#include "planner/scenario.h"

namespace sluice::cli {

struct ScenarioFlags {
  std::string model = "gpt-6.7b";
  std::string cluster = "a100-40g:8";
  std::string parallel = "dp=2,pp=4,zero=1";
  std::string data = "mixture-4task";
  std::string cost = "auto";
  int64_t tokens_per_batch = 65536;
  int64_t max_seqlen = 2048;
  std::string long_samples = "clip";
  std::string iterations = "20";
  double memory_limit_mb = 0;     // 0 = --parallel's memory_limit_mb, else device memory - reserve
  double memory_reserve_mb = -1;  // < 0 = --parallel's memory_reserve_mb, else the default
  int64_t samples = 0;            // generator presets: how many samples (0 = default)
  uint64_t seed = 0;
};

// Adds --model, --cluster, --parallel, --data, --cost, --tokens-per-batch, --max-seqlen, --long,
// --iterations, --memory-limit, --memory-reserve, --samples and --seed.
void AddScenarioFlags(CLI::App* app, ScenarioFlags* flags);

// The flag that sets a scenario field (planner/scenario.h, compare_scenario.h): "model" ->
// "--model", "memory_limit_mb" -> "--memory-limit", "controlled" -> "--parallel" (`sluice
// compare`'s shared configuration), ...; "" for a field no flag sets.
std::string_view FlagForField(std::string_view field);
// A FieldNamer for a scenario given by flags: a field's flag, or "flags: field 'F'".
FieldNamer FlagFieldNamer();

// The files the flags name (--model, --cluster, --parallel, --data, --cost's PATH), for
// CheckNotAnInput; presets never match a file.
std::vector<NamedInput> ScenarioInputs(const ScenarioFlags& flags);

// `--iterations`: a positive integer, or "all" (0: the whole dataset).
StatusOr<int64_t> ParseIterations(const std::string& text);

// Resolves the flags (planner/scenario.h) with the parallel configuration of --parallel; errors
// name the flag and the allowed values.
StatusOr<Scenario> ResolveScenarioFlags(const ScenarioFlags& flags);

// The stage-cost evaluator of `scenario`'s parallel configuration, with the default in-flight rule
// (1F1B; `sluice batch` runs no schedule). REQUIRES: scenario.parallel is set. Errors (the model
// states alone exceed the memory limit) are InvalidArgument: bad input for the flags given.
StatusOr<StageCostEvaluator> MakeEvaluator(const Scenario& scenario);

// The planner of `scenario`'s parallel configuration (Planner::Create). REQUIRES:
// scenario.parallel is set; `scenario` outlives the planner. Errors are InvalidArgument: the
// evaluator's as MakeEvaluator's, a schedule that does not run the configuration named as
// --schedule.
StatusOr<Planner> MakePlanner(const Scenario& scenario, PlannerOptions options);

// The flags `plan` and `train` share to choose how a global batch is planned.
struct PlannerFlags {
  std::string method = "dynapipe";
  std::string schedule = "1f1b";
  std::string recompute;  // "" = the method chooses
  bool no_search = false;
  std::string interleaved_rounds = "auto";  // padded | flexible | auto
  double optimize_budget_ms = 0;  // > 0: run the plan optimizer per batch with this budget
};

// Adds --method, --schedule, --interleaved-rounds, --recompute, --no-search and
// --optimize-budget-ms.
void AddPlannerFlags(CLI::App* app, PlannerFlags* flags);

// MakePlanner with the options `flags` say (seed from the scenario flags, max_seqlen from the
// resolved scenario). Errors name the flag.
StatusOr<Planner> MakePlannerFromFlags(const Scenario& scenario,
                                       const ScenarioFlags& scenario_flags,
                                       const PlannerFlags& flags);

// Global batches `--layer-cut balanced` chooses the cut on: the run's first ones.
inline constexpr int64_t kLayerCutBatches = 3;
// Cuts `--layer-cut balanced` simulates beyond the even cut and the estimate's best, in the
// one-layer moves from the latter (PolishLayerCut).
inline constexpr int64_t kSimulatedLayerCuts = 8;

// The batches `--layer-cut balanced` chooses on: the next kLayerCutBatches of `scenario`'s
// batcher (fewer when the run has fewer iterations, or the data fewer batches).
std::vector<GlobalBatch> TakeLayerCutBatches(Scenario& scenario);

// --layer-cut (plan, train): "even" keeps the configuration's cut; "balanced" sets
// scenario->parallel->layer_cut to the cut planner/layer_cut.h's ChooseLayerCut finds on
// `batches` (the run's first kLayerCutBatches) under the planner options `flags` give, then
// moved by PolishLayerCut scored in simulation (SimulateLayerCut, at most kSimulatedLayerCuts
// cuts), and kept only when it simulates shorter than the even cut on them. Returns the line
// to print ("" for even). Deterministic: every rank of a `sluice train` job finds the same cut.
// Errors: an unknown rule, a --parallel that already gives a layer_cut.
StatusOr<std::string> ApplyLayerCutFlag(std::string_view rule, Scenario* scenario,
                                        const ScenarioFlags& scenario_flags,
                                        const PlannerFlags& flags,
                                        std::span<const GlobalBatch> batches);

}  // namespace sluice::cli
