// RunCompare: every method of a scenario, side by side, on the same data and cluster — the main
// job of sluice (`sluice compare`).
//
// The phases: the scenario is resolved (planner/scenario.h) and its global batches taken; for each
// method the configuration search (config_search.h) picks its own best configuration on the
// score batches (the first few global batches and the longest and densest ones,
// PickScoreBatches); then every global batch of the run is planned (Planner) and
// simulated (Simulate) under it. A second comparison runs every method under one shared
// ("controlled") parallel configuration (dp, pp, tp, ZeRO), each with its best schedule there.
// Per method and batch it records real (unpadded) tokens, iteration time, padding, bubble and
// exposed communication, peak memory, planning time and the accounting of ideal_bound.h. A batch
// that fails (out of memory, deadlock) is a failure of its configuration: a run's throughput
// counts every batch and runs are ranked by the rule of planner/run_tally.h (complete runs first);
// the
// ideal bound uses the achievable rate over the sweep and every compared plan, so no method ever
// exceeds it. A method that fits memory under no configuration is reported out-of-memory with
// the reason, never dropped; one whose batching does not support the model is "unsupported".
// Last, the summary: R, the ideal, each run's figures and its ratio to the reference.
//
// Cancellation: `CompareOptions::cancelled` is polled between candidates and between batches;
// the result then holds what finished, with `partial` set.
//
// Thread safety: RunCompare is a pure function of its inputs (single-threaded, deterministic
// except for the measured planning times).
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "compare/compare_scenario.h"
#include "compare/ideal_bound.h"
#include "model/hetero_config.h"
#include "model/parallel_config.h"
#include "plan/execution_plan.h"
#include "planner/config_search.h"
#include "planner/run_tally.h"
#include "planner/scenario.h"
#include "sim/simulator.h"

namespace sluice {

// sluice-dynamic's default screen margin (CompareOptions::dynamic_screen).
inline constexpr double kDynamicScreenMargin = 0.15;

struct CompareOptions {
  // Polled between candidates and batches; true stops the run with partial results.
  std::function<bool()> cancelled;
  std::FILE* progress = stderr;  // progress bars (base/progress.h); nullptr: none
  bool keep_examples = true;     // keep one planned + simulated batch per method (timelines)
  // Names a scenario field (compare_scenario.h) in errors; empty: "SOURCE: field 'F'" with the
  // `source` of RunCompare ("flags" when it is empty). The CLI maps fields to its flags.
  FieldNamer field_name;
  // > 0: after each method's own run, the same configuration again with the plan optimizer
  // (planner/optimizer.h) run on every batch's plan with this wall-clock budget; the run is added
  // to `own` as "METHOD (optimized)" when the optimizer changed at least one plan.
  double optimize_budget_ms = 0;
  // Applied to each planned batch before it is simulated (e.g. `--calibration`: calibrated op
  // durations and links); the configuration search does not see it. Empty: none.
  std::function<void(ExecutionPlan*)> adjust_plan;
  // sluice-dynamic's screen (compare_dynamic.h): the margin in [0, 1); nullopt plans every
  // strategy on every batch.
  std::optional<double> dynamic_screen = kDynamicScreenMargin;
  // sluice-dynamic: a mix the screen would skip but whose refresh is due is planned from its
  // learnt scales in one round of stage 1 (true) or in full (false) (compare_dynamic.h).
  bool dynamic_quick_refresh = true;
};

// How one method's global batch went.
enum class BatchOutcome {
  kOk,
  kOutOfMemory,     // planning found no plan within memory
  kSimOutOfMemory,  // the plan's simulation exceeded the memory limit
  kDeadlock,        // the plan's simulation deadlocked
};
// "ok" | "out-of-memory" | "sim-out-of-memory" | "deadlock" (results files and reports).
std::string_view BatchOutcomeName(BatchOutcome outcome);

// How one method's run went.
enum class RunState {
  kOk,           // it ran (some batches may have failed; see BatchRecord::outcome)
  kOutOfMemory,  // no configuration fits memory, or none of its batches did
  kUnsupported,  // no batching method of the method supports the model
  kNotRun,       // interrupted before it ran
};
// "ok" | "out-of-memory" | "unsupported" | "not-run" (results files and reports).
std::string_view RunStateName(RunState state);

// One method on one global batch.
struct BatchRecord {
  int64_t batch = 0;  // GlobalBatch::index
  BatchOutcome outcome = BatchOutcome::kOk;
  std::string reason;         // why not ok
  int64_t tokens = 0;         // the global batch's tokens (input + target), whether it ran or not
  int64_t real_tokens = 0;    // placed, unpadded (0 when planning failed)
  int64_t padded_tokens = 0;  // allocated by the micro-batch shapes
  int64_t micro_batches = 0;
  int64_t cp_splits = 0;      // micro-batches run at a smaller cp (PlanResult::cp_splits)
  double iteration_ms = 0;    // simulated
  double ideal_ms = 0;        // useful FLOPs of the placed samples / (devices x R)
  double length_aware_ms = 0; // the placed samples at their length rates R(L) / devices
  double planning_ms = 0;     // Planner::Plan wall time
  double bubble = 0;          // mean over ranks of bubble / iteration time
  double comm = 0;            // mean over ranks of exposed communication / iteration time
  double peak_memory_mb = 0;  // max over ranks (simulated, model states included)
  // Expert parallelism: mean over ranks of the all-to-all stream's busy time, and of the part of
  // it the rank's compute waited for (SimResult's RankSimStats); 0 without all-to-alls.
  double all_to_all_ms = 0;
  double exposed_all_to_all_ms = 0;
  Breakdown breakdown;
  // sluice-dynamic: the strategy run (index into MethodRun::strategies; -1: other methods), and
  // the modelled time of switching to it from the previous batch's (included in iteration_ms).
  int64_t strategy = -1;
  double switch_ms = 0;
  // sluice-dynamic: the strategies its screen did not plan for this batch (DynamicOptions).
  std::vector<int64_t> screened;

  friend bool operator==(const BatchRecord&, const BatchRecord&) = default;
};

// A planned and simulated batch kept for the report's timeline.
struct ExampleRun {
  ExecutionPlan plan;
  SimResult sim;
};

// One method under one configuration over the run.
struct MethodRun {
  std::string method;
  RunState state = RunState::kOk;
  std::string reason;  // why not ok
  // The configuration it ran under; absent when the search found none (or was interrupted).
  std::optional<Candidate> config;
  // Set when the configuration is another method's choice that lies in this method's space and
  // ranked before this method's own choice over the whole run (RanksBefore of run_tally.h: it ran
  // every batch where this one failed some, or both did and it was faster).
  std::string adopted_from;
  // sluice-hetero (MethodKind::kHetero): the heterogeneous replicas it ran (config is absent).
  std::optional<HeteroConfig> hetero;
  // sluice-dynamic (MethodKind::kDynamic): the strategies it chose among, described
  // ("dp 2 x cp 4, ZeRO-2, 1f1b, hydraulis" or a mix), and how many batches switched strategy.
  std::vector<std::string> strategies;
  int64_t switches = 0;
  // sluice-dynamic: its screen's margin (CompareOptions::dynamic_screen; nullopt: off).
  std::optional<double> screen_margin;
  int64_t candidates = 0;  // search: candidates scored, feasible by estimate, simulated
  int64_t feasible = 0;
  int64_t simulated = 0;
  std::vector<BatchRecord> batches;
  // Summary. Throughput and its ratios count every batch (run_tally.h): a failed batch trains
  // none of its tokens and is charged the mean iteration time of the batches that ran; the other
  // figures are over the batches that ran (outcome ok).
  int64_t ok_batches = 0;
  double tokens_per_s = 0;         // the headline: RunTally::TokensPerSecond
  double ran_tokens_per_s = 0;     // real tokens / simulated time of the batches that ran only
  int64_t untrained_tokens = 0;    // tokens of the failed batches
  double charged_ms = 0;           // time charged for the failed batches
  double ideal_tokens_per_s = 0;   // the trained tokens at the ideal times
  double fraction_of_ideal = 0;    // ideal time of the trained tokens / (time + charged_ms)
  double fraction_of_length_aware = 0;  // length-aware time of the trained tokens / (time +
                                        // charged_ms) (ideal_bound.h); >= fraction_of_ideal
  double ratio_to_reference = 0;   // tokens_per_s / the reference's; 0 when it did not run
  double padding = 0;             // padded - real over padded tokens
  double bubble = 0;              // time-weighted over batches
  double comm = 0;
  double peak_memory_mb = 0;          // max over batches
  double planning_ms = 0;             // mean per batch
  double all_to_all_ms = 0;           // mean per batch of BatchRecord::all_to_all_ms
  double exposed_all_to_all_ms = 0;   // mean per batch of BatchRecord::exposed_all_to_all_ms
  // MoE overlap (CompareScenario::moe_overlap): batches whose rewrite the pass rejected (they
  // ran as lowered), with the first reason.
  int64_t moe_overlap_rejected = 0;
  std::string moe_overlap_reason;
  Breakdown breakdown;                // device-time weighted over batches
  std::optional<ExampleRun> example;  // not serialised

  // Every field but `example`.
  friend bool operator==(const MethodRun& a, const MethodRun& b) {
    return a.method == b.method && a.state == b.state && a.reason == b.reason &&
           a.config == b.config && a.adopted_from == b.adopted_from && a.hetero == b.hetero &&
           a.strategies == b.strategies && a.switches == b.switches &&
           a.screen_margin == b.screen_margin && a.candidates == b.candidates &&
           a.feasible == b.feasible && a.simulated == b.simulated && a.batches == b.batches &&
           a.ok_batches == b.ok_batches && a.tokens_per_s == b.tokens_per_s &&
           a.ran_tokens_per_s == b.ran_tokens_per_s && a.untrained_tokens == b.untrained_tokens &&
           a.charged_ms == b.charged_ms && a.ideal_tokens_per_s == b.ideal_tokens_per_s &&
           a.fraction_of_ideal == b.fraction_of_ideal &&
           a.fraction_of_length_aware == b.fraction_of_length_aware &&
           a.ratio_to_reference == b.ratio_to_reference && a.padding == b.padding &&
           a.bubble == b.bubble && a.comm == b.comm && a.peak_memory_mb == b.peak_memory_mb &&
           a.planning_ms == b.planning_ms && a.all_to_all_ms == b.all_to_all_ms &&
           a.exposed_all_to_all_ms == b.exposed_all_to_all_ms &&
           a.moe_overlap_rejected == b.moe_overlap_rejected &&
           a.moe_overlap_reason == b.moe_overlap_reason && a.breakdown == b.breakdown;
  }
};

struct CompareResult {
  CompareScenario scenario;
  std::string description;  // a few lines: model, cluster, cost model, data
  bool partial = false;     // interrupted: some runs hold fewer batches or did not run
  int64_t batches = 0;      // global batches in the run
  int64_t devices = 0;
  double memory_limit_mb = 0;    // the per-device budget every plan respects
  double memory_reserve_mb = 0;  // held back from the device's memory (0: an explicit limit)
  DataLoss data_loss;  // what the length limits cost the dataset (clipped, dropped)
  // Inputs too small for the figures to say much (SmallInputCheck): fewer batches than asked, or
  // fewer samples in all than devices. Printed to stderr by the CLI.
  std::vector<std::string> warnings;
  AchievableRate sweep_rate;      // the sweep part of R
  AchievableRate rate;            // R itself (sweep, or a compared plan's op when higher)
  double ideal_tokens_per_s = 0;  // every batch's samples at the ideal times
  LengthRates length_rates;       // R(L) of the length-aware bound (ideal_bound.h)
  double length_aware_tokens_per_s = 0;  // every batch's samples at their length rates
  // dp, pp, tp, zero of the controlled comparison; absent when the controlled method found no
  // configuration (there is then no controlled comparison).
  std::optional<ParallelConfig> controlled_config;
  std::vector<MethodRun> own;                // each method under its own best configuration
  std::vector<MethodRun> controlled;         // each method under controlled_config
  std::vector<std::string> skipped_configs;  // configurations left out, with the reason
  std::vector<int64_t> score_batches;        // GlobalBatch::index of the search's score batches
  int64_t candidates_scored = 0;
  double search_seconds = 0;
  double run_seconds = 0;

  friend bool operator==(const CompareResult&, const CompareResult&) = default;
};

// The tally of a run's batches (planner/run_tally.h), and the ranking of two runs by it.
RunTally TallyOf(const MethodRun& run);
bool RunRanksBefore(const MethodRun& a, const MethodRun& b);

// Runs the comparison (see above). `source` names where the scenario came from for messages
// ("FILE", or "" for flags). Errors: a scenario that does not resolve (unknown model, data,
// a max length beyond the model's, ...) as InvalidArgument/NotFound naming the field
// (scenario.h; the scenario's 'controlled' is the resolver's parallel configuration); bugs.
StatusOr<CompareResult> RunCompare(const CompareScenario& scenario, const CompareOptions& options,
                                   std::string_view source = "");

}  // namespace sluice
