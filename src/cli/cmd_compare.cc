// `sluice compare`: every method side by side on the same data and cluster (compare/compare.h).
//
// The scenario comes from the flags (defaults: the embedded default scenario), from a JSON file
// (--scenario FILE), or from every *.json file of a folder (--scenario-dir DIR); scenario flags
// given explicitly override the file's values. Writes OUT/results.json (docs/formats.md, "Compare
// results") and OUT/report.html, or OUT/<scenario>/... plus OUT/summary.md for a folder, and
// prints the tables and the absolute paths. The output folder is created and checked before the
// run. Ctrl-C stops after the current batch and writes the partial results, marked as partial
// (exit code 1).
#include <fmt/core.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <map>
#include <memory>
#include <string_view>
#include <utility>

#include "base/json_util.h"
#include "base/split.h"
#include "cli/cli_common.h"
#include "cli/compare_report.h"
#include "cli/scenario_flags.h"
#include "compare/compare.h"
#include "compare/compare_json.h"
#include "compare/compare_scenario.h"
#include "model/parallel_config.h"
#include "passes/moe_overlap.h"
#include "trace/calibration.h"

namespace sluice::cli {
namespace {

struct CompareFlags {
  CompareScenario scenario;  // the flags' values (defaults: the embedded default scenario)
  std::string iterations = "20";
  std::string score_batches = "2";
  bool score_extremes = false;     // --score-extremes
  bool no_score_extremes = false;  // --no-score-extremes
  std::string methods;             // comma-separated
  std::string parallel;            // every method's configuration (no search)
  std::string controlled;          // the controlled comparison's configuration only
  std::string scenario_file;
  std::string calibration;  // --calibration FILE
  std::string scenario_dir;
  std::string out = "sluice-compare";
  bool no_html = false;
  bool closed_form = false;  // deprecated --closed-form
  std::string collectives = "stepwise";
  double optimize_budget_ms = 0;    // --optimize-budget-ms: > 0 adds the "(optimized)" rows
  std::string cp = "1";             // --cp: context-parallel degrees searched
  std::string ep = "1";             // --ep: expert-parallel degrees searched
  std::string layer_cut = "even";   // --layer-cut: even | balanced
  std::string moe_overlap = "off";  // --moe-overlap: off or a passes::MoeOverlap name
  // --dynamic-screen: sluice-dynamic's screen margin, or "off" (checked by DynamicScreenMargin).
  std::string dynamic_screen = fmt::format("{}", kDynamicScreenMargin);
  std::string dynamic_refresh = "quick";  // --dynamic-refresh: quick | full
  // The options, to tell which flags were given explicitly.
  std::map<std::string, CLI::Option*> options;
};

// --dynamic-screen's value: nullopt for "off", else the margin; an error names what is allowed.
StatusOr<std::optional<double>> DynamicScreenMargin(std::string_view in) {
  if (in == "off") return std::optional<double>();
  double v = 0;
  const char* end = in.data() + in.size();
  auto [ptr, ec] = std::from_chars(in.data(), end, v);
  if (ec != std::errc() || ptr != end || !(v >= 0 && v < 1)) {
    return InvalidArgumentError(
        fmt::format("'{}' is not allowed; allowed: off, or a margin in [0, 1) (e.g. {})", in,
                    kDynamicScreenMargin));
  }
  return std::optional<double>(v);
}

bool Given(const CompareFlags& f, const std::string& name) {
  auto it = f.options.find(name);
  return it != f.options.end() && it->second->count() > 0;
}

// `text` of the flag `flag` (--cp, --ep): comma-separated degrees, sorted and unique, or 'all'
// (an empty list: every power of two that fits).
StatusOr<std::vector<int64_t>> ParseDegrees(std::string_view flag, const std::string& text) {
  std::vector<int64_t> out;
  if (text == "all") return out;
  for (const std::string_view item : SplitOn(text, ',')) {
    int64_t n = 0;
    auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), n);
    if (ec != std::errc() || ptr != item.data() + item.size() || n < 1 || n > 1048576) {
      return InvalidArgumentError(fmt::format(
          "{} '{}': '{}' is not allowed; allowed: comma-separated integers in 1..1048576 "
          "(e.g. 1,2,4), or 'all'",
          flag, text, item));
    }
    out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// Applies the scenario flags given explicitly (all of them when `all`) to `s`.
Status ApplyFlags(const CompareFlags& f, bool all, CompareScenario* s) {
  const CompareScenario& v = f.scenario;
  auto use = [&](const char* name) { return all || Given(f, name); };
  if (use("--model")) s->model = v.model;
  if (use("--cluster")) s->cluster = v.cluster;
  if (use("--data")) s->data = v.data;
  if (use("--samples")) s->samples = v.samples;
  if (use("--cost")) s->cost = v.cost;
  if (use("--flash-attention")) s->flash_attention = v.flash_attention;
  if (use("--tokens-per-batch")) s->tokens_per_batch = v.tokens_per_batch;
  if (use("--max-seqlen")) s->max_seqlen = v.max_seqlen;
  if (use("--long")) s->long_samples = v.long_samples;
  if (use("--memory-limit")) s->memory_limit_mb = v.memory_limit_mb;
  if (use("--memory-reserve")) s->memory_reserve_mb = v.memory_reserve_mb;
  if (use("--seed")) s->seed = v.seed;
  if (use("--reference")) s->reference = v.reference;
  if (use("--score-batches")) {
    if (f.score_batches == "all") {
      s->search.score_batches = 0;
    } else {
      int64_t n = 0;
      const char* end = f.score_batches.data() + f.score_batches.size();
      auto [ptr, ec] = std::from_chars(f.score_batches.data(), end, n);
      if (ec != std::errc() || ptr != end || n < 1 || n > 64) {
        return InvalidArgumentError(fmt::format(
            "--score-batches: '{}' is not allowed; allowed: an integer in 1..64, or 'all'",
            f.score_batches));
      }
      s->search.score_batches = n;
    }
  }
  if (Given(f, "--score-extremes")) {
    s->search.score_extremes = true;
  } else if (Given(f, "--no-score-extremes")) {
    s->search.score_extremes = false;
  } else if (all) {
    s->search.score_extremes = v.search.score_extremes;
  }
  if (use("--simulate-top")) s->search.simulate_top = v.search.simulate_top;
  if (use("--layer-cut")) {
    if (f.layer_cut != "even" && f.layer_cut != "balanced") {
      return InvalidArgumentError(fmt::format(
          "--layer-cut: '{}' is not a cut rule (allowed: even, balanced)", f.layer_cut));
    }
    s->search.balance_layer_cut = f.layer_cut == "balanced";
  }
  if (use("--cp")) {
    SLUICE_ASSIGN_OR_RETURN(s->search.cp, ParseDegrees("--cp", f.cp));
  }
  if (use("--ep")) {
    SLUICE_ASSIGN_OR_RETURN(s->search.ep, ParseDegrees("--ep", f.ep));
  }
  if (use("--moe-overlap")) {
    if (f.moe_overlap != "off") {
      StatusOr<passes::MoeOverlap> overlap =
          passes::ParseMoeOverlap(f.moe_overlap, "--moe-overlap");
      if (!overlap.ok()) return InvalidArgumentError(overlap.status().message() + ", off");
    }
    s->moe_overlap = f.moe_overlap == "off" ? "" : f.moe_overlap;
  }
  if (use("--collectives")) {
    if (f.collectives != "stepwise" && f.collectives != "closed-form") {
      return InvalidArgumentError(fmt::format(
          "--collectives '{}': allowed values are stepwise, closed-form", f.collectives));
    }
    s->stepwise_collectives = f.collectives == "stepwise";
  }
  if (Given(f, "--closed-form")) s->stepwise_collectives = !f.closed_form;
  if (use("--iterations")) {
    SLUICE_ASSIGN_OR_RETURN(s->iterations, ParseIterations(f.iterations));
  }
  if (Given(f, "--methods")) {
    s->methods.clear();
    size_t start = 0;
    while (start <= f.methods.size()) {
      size_t end = f.methods.find(',', start);
      if (end == std::string::npos) end = f.methods.size();
      const std::string name = f.methods.substr(start, end - start);
      SLUICE_ASSIGN_OR_RETURN(MethodSpec m, MethodSpecFor(name, "--methods"));
      s->methods.push_back(std::move(m));
      start = end + 1;
    }
    // A reference or controlled method left out of the list falls back to the first method.
    auto listed = [&](const std::string& n) {
      return std::any_of(s->methods.begin(), s->methods.end(),
                         [&](const MethodSpec& m) { return m.name == n; });
    };
    if (!Given(f, "--reference") && !listed(s->reference)) s->reference = s->methods[0].name;
    if (!listed(s->controlled_method)) {
      // The last method of one configuration (heterogeneous or per-batch methods have none).
      s->controlled_method = s->methods.back().name;
      for (const MethodSpec& m : s->methods) {
        if (m.kind == MethodKind::kHomogeneous) s->controlled_method = m.name;
      }
    }
  }
  if (Given(f, "--parallel")) {
    // As for every other command: the configuration the run uses. Each method's search space is
    // that one configuration (schedules are still chosen per method), and the controlled
    // comparison uses it too.
    SLUICE_ASSIGN_OR_RETURN(ParallelConfig par, ResolveParallel(f.parallel));
    s->search.tp = {par.tp};
    s->search.pp = {par.pp};
    s->search.cp = {par.cp};
    s->search.ep = {par.ep};
    s->search.zero = {par.zero};
    if (par.vpp > 1) s->search.vpp = {par.vpp};
    s->controlled = par;
  }
  if (Given(f, "--controlled")) {
    SLUICE_ASSIGN_OR_RETURN(ParallelConfig par, ResolveParallel(f.controlled));
    s->controlled = par;
  }
  return Status::Ok();
}

// Names a field of the scenario read from `source` ("" = the flags alone) with the flags applied:
// the flag, for a field that a flag set, else "SOURCE: field 'F'".
FieldNamer CompareFieldNamer(const CompareFlags& f, const std::string& source) {
  return [&f, source](std::string_view field) {
    // --parallel sets the search lists and the controlled configuration (unless --controlled).
    const bool by_parallel =
        (field == "search.tp" || field == "search.pp" || field == "search.cp" ||
         field == "search.ep" || field == "search.zero" || field == "search.vpp" ||
         (field == "controlled" && !Given(f, "--controlled")));
    if (by_parallel && Given(f, "--parallel")) return std::string("--parallel");
    const std::string_view flag = FlagForField(field);
    if (!flag.empty() && (source.empty() || Given(f, std::string(flag)))) {
      return std::string(flag);
    }
    return fmt::format("{}: field '{}'", source.empty() ? "flags" : source, field);
  };
}

// `path` made absolute (so a user can open it from anywhere), or as given if that fails.
std::string Absolute(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path abs = std::filesystem::absolute(path, ec);
  return ec ? path : abs.lexically_normal().string();
}

struct Written {
  std::string results;
  std::string report;
};

// InvalidArgument when a file the run writes into `dir` (results.json, report.html) is one the
// scenario reads: its own file `source`, the model, cluster, data or cost table.
Status CheckOutputsNotInputs(const CompareScenario& s, const std::string& source,
                             const std::string& dir) {
  std::vector<NamedInput> inputs = {{"the scenario file", source},
                                    {"the model", s.model},
                                    {"the cluster", s.cluster},
                                    {"the data", s.data}};
  const size_t colon = s.cost.find(':');
  if (colon != std::string::npos) inputs.push_back({"the cost table", s.cost.substr(colon + 1)});
  for (const char* name : {"results.json", "report.html"}) {
    const std::string path = (std::filesystem::path(dir) / name).string();
    SLUICE_RETURN_IF_ERROR(CheckNotAnInput("--out", path, inputs));
  }
  return Status::Ok();
}

// REQUIRES: `dir` exists (PrepareOutputDir).
StatusOr<Written> WriteOutputs(const CompareResult& r, const std::string& dir, bool html) {
  Written w;
  w.results = (std::filesystem::path(dir) / "results.json").string();
  SLUICE_RETURN_IF_ERROR(WriteCompareResultFile(r, w.results).WithPrefix("--out"));
  if (html) {
    w.report = (std::filesystem::path(dir) / "report.html").string();
    SLUICE_RETURN_IF_ERROR(
        report::WriteHtmlReport(BuildCompareReport(r), w.report).WithPrefix("--out"));
  }
  return w;
}

// Runs one scenario and writes its outputs into `dir` (absolute, existing). Returns the result.
StatusOr<CompareResult> RunOne(const CompareFlags& f, const CompareScenario& s,
                               const std::string& source, const std::string& dir, bool html) {
  fmt::print("scenario: {}{}\n", s.name, source.empty() ? "" : fmt::format(" ({})", source));
  std::fflush(stdout);  // before the progress bars on stderr
  CompareOptions options;
  options.cancelled = [] { return Interrupted(); };
  options.field_name = CompareFieldNamer(f, source);
  options.optimize_budget_ms = f.optimize_budget_ms;
  SLUICE_ASSIGN_OR_RETURN(options.dynamic_screen, DynamicScreenMargin(f.dynamic_screen));
  if (f.dynamic_refresh != "quick" && f.dynamic_refresh != "full") {
    return InvalidArgumentError(
        fmt::format("--dynamic-refresh '{}': allowed values are quick, full", f.dynamic_refresh));
  }
  options.dynamic_quick_refresh = f.dynamic_refresh == "quick";
  if (!f.calibration.empty()) {
    StatusOr<trace::Calibration> c = trace::ReadCalibrationFile(f.calibration);
    if (!c.ok()) return c.status().WithPrefix("--calibration");
    options.adjust_plan = [c = *c](ExecutionPlan* plan) { trace::ApplyCalibration(c, plan); };
  }
  SLUICE_ASSIGN_OR_RETURN(CompareResult r, RunCompare(s, options, source));
  for (const std::string& w : r.warnings) fmt::print(stderr, "warning: {}\n", w);
  fmt::print("{}\n\n{}", r.description, FormatCompareTables(r));
  fmt::print("search: {} candidates in {:.1f} s; runs: {:.1f} s\n", r.candidates_scored,
             r.search_seconds, r.run_seconds);
  SLUICE_ASSIGN_OR_RETURN(Written w, WriteOutputs(r, dir, html));
  fmt::print("wrote {}{}\n", w.results, w.report.empty() ? "" : fmt::format(" and {}", w.report));
  if (!w.report.empty()) fmt::print("report: {}\n", w.report);
  fmt::print("\n");
  return r;
}

// RunCompareCommand's work, writing into `out` (absolute).
Status RunScenarios(const CompareFlags& f, const std::string& out) {
  InterruptGuard guard;
  std::vector<CompareResult> results;
  if (!f.scenario_dir.empty()) {
    std::vector<std::string> files;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(f.scenario_dir, ec)) {
      if (e.is_regular_file() && e.path().extension() == ".json")
        files.push_back(e.path().string());
    }
    if (ec) {
      return InvalidArgumentError(
          fmt::format("--scenario-dir: cannot read '{}': {}", f.scenario_dir, ec.message()));
    }
    if (files.empty()) {
      return InvalidArgumentError(
          fmt::format("--scenario-dir: '{}' holds no *.json scenario file", f.scenario_dir));
    }
    std::sort(files.begin(), files.end());
    // Read (and so validate) every file before running any.
    std::vector<CompareScenario> scenarios;
    std::map<std::string, std::string> file_of_name;
    for (const std::string& file : files) {
      SLUICE_ASSIGN_OR_RETURN(CompareScenario s, ReadCompareScenarioFile(file));
      SLUICE_RETURN_IF_ERROR(ApplyFlags(f, /*all=*/false, &s));
      SLUICE_RETURN_IF_ERROR(ValidateCompareScenario(s, CompareFieldNamer(f, file)));
      auto [it, added] = file_of_name.emplace(s.name, file);
      if (!added) {
        return InvalidArgumentError(fmt::format(
            "--scenario-dir: {} and {} both have the name '{}' (field 'name'; default: the file's "
            "stem), so their outputs would share {}/{}; allowed: distinct names",
            it->second, file, s.name, out, s.name));
      }
      SLUICE_RETURN_IF_ERROR(
          CheckOutputsNotInputs(s, file, (std::filesystem::path(out) / s.name).string()));
      scenarios.push_back(std::move(s));
    }
    std::vector<NamedInput> scenario_files;
    for (const std::string& file : files) scenario_files.push_back({"--scenario-dir", file});
    SLUICE_RETURN_IF_ERROR(CheckNotAnInput(
        "--out", (std::filesystem::path(out) / "summary.md").string(), scenario_files));
    SLUICE_RETURN_IF_ERROR(PrepareOutputDir("--out", out));
    for (size_t i = 0; i < scenarios.size() && !Interrupted(); ++i) {
      const std::string dir = (std::filesystem::path(out) / scenarios[i].name).string();
      SLUICE_RETURN_IF_ERROR(PrepareOutputDir("--out", dir));
      SLUICE_ASSIGN_OR_RETURN(CompareResult r, RunOne(f, scenarios[i], files[i], dir, !f.no_html));
      results.push_back(std::move(r));
    }
    const std::string summary = (std::filesystem::path(out) / "summary.md").string();
    SLUICE_RETURN_IF_ERROR(
        WriteStringToFile(summary, FormatScenarioSummary(results)).WithPrefix("--out"));
    fmt::print("{}\nwrote {}\n", FormatScenarioSummary(results), summary);
  } else {
    CompareScenario s;
    std::string source;
    if (!f.scenario_file.empty()) {
      SLUICE_ASSIGN_OR_RETURN(s, ReadCompareScenarioFile(f.scenario_file));
      SLUICE_RETURN_IF_ERROR(ApplyFlags(f, /*all=*/false, &s));
      source = f.scenario_file;
    } else {
      SLUICE_RETURN_IF_ERROR(ApplyFlags(f, /*all=*/true, &s));
    }
    SLUICE_RETURN_IF_ERROR(ValidateCompareScenario(s, CompareFieldNamer(f, source)));
    SLUICE_RETURN_IF_ERROR(CheckOutputsNotInputs(s, source, out));
    SLUICE_RETURN_IF_ERROR(PrepareOutputDir("--out", out));
    SLUICE_ASSIGN_OR_RETURN(CompareResult r, RunOne(f, s, source, out, !f.no_html));
    results.push_back(std::move(r));
  }
  const bool partial =
      Interrupted() ||
      std::any_of(results.begin(), results.end(), [](const CompareResult& r) { return r.partial; });
  if (partial) {
    return FailedPreconditionError(
        "interrupted: the results written above are partial (marked \"partial\": true)");
  }
  for (const CompareResult& r : results) {
    if (std::none_of(r.own.begin(), r.own.end(),
                     [](const MethodRun& m) { return m.ok_batches > 0; })) {
      return FailedPreconditionError(fmt::format(
          "scenario '{}': no method fits memory under any configuration (see the reasons above)",
          r.scenario.name));
    }
  }
  return Status::Ok();
}

Status RunCompareCommand(const CompareFlags& f) {
  if (!f.scenario_file.empty() && !f.scenario_dir.empty()) {
    return InvalidArgumentError("--scenario and --scenario-dir: give one of them");
  }
  const std::string out = Absolute(f.out);
  std::error_code ec;
  const bool existed = std::filesystem::exists(out, ec);
  Status status = RunScenarios(f, out);
  // A run that failed before writing anything leaves no empty output folder behind (remove
  // deletes only an empty folder).
  if (!status.ok() && !existed) std::filesystem::remove(out, ec);
  return status;
}

}  // namespace

void RegisterCompareCommands(CLI::App* app, RunState* state) {
  auto f = std::make_shared<CompareFlags>();
  CLI::App* c = app->add_subcommand(
      "compare",
      "Compare batching methods and schedules, each under its best parallel configuration, in "
      "simulation (no flags: the embedded default scenario)");
  CompareScenario& s = f->scenario;
  auto& o = f->options;
  o["--scenario"] = c->add_option("--scenario", f->scenario_file,
                                  "A JSON scenario file (docs/formats.md); flags given as well "
                                  "override its fields (default: none, the flags' scenario)")
                        ->type_name("FILE");
  o["--scenario-dir"] = c->add_option("--scenario-dir", f->scenario_dir,
                                      "Run every *.json scenario of a folder and write a summary "
                                      "(default: none)")
                            ->type_name("DIR");
  o["--out"] = c->add_option("--out", f->out,
                             "Output folder: results.json and report.html (one sub-folder per "
                             "scenario with --scenario-dir)")
                   ->type_name("DIR")
                   ->check(PathCheck())
                   ->capture_default_str();
  o["--model"] = AddModelFlag(c, &s.model)->capture_default_str();
  o["--cluster"] = AddClusterFlag(c, &s.cluster)->capture_default_str();
  o["--data"] = AddDataFlag(c, &s.data)->capture_default_str();
  o["--samples"] = c->add_option("--samples", s.samples,
                                 "Generator presets: samples to generate (0 = 20000); files: "
                                 "first N samples (0 = all)")
                       ->check(IntegerCheck(0, kMaxSamples, kSamplesAllowed))
                       ->capture_default_str();
  o["--cost"] =
      c->add_option("--cost", s.cost, "Cost model: auto, analytic, profiled:PATH or analytic:PATH")
          ->capture_default_str();
  o["--flash-attention"] = c->add_flag("--flash-attention", s.flash_attention,
                                       "Analytic cost model: fused attention (default: off)");
  o["--tokens-per-batch"] = AddTokensPerBatchFlag(c, &s.tokens_per_batch);
  o["--max-seqlen"] = AddMaxSeqlenFlag(c, &s.max_seqlen);
  o["--long"] =
      c->add_option("--long", s.long_samples, "Samples longer than --max-seqlen: clip or drop")
          ->check(CLI::Validator(
              [](std::string& v) {
                return v == "clip" || v == "drop"
                           ? std::string()
                           : fmt::format("'{}' is not allowed; allowed: clip, drop", v);
              },
              ""))
          ->capture_default_str();
  o["--iterations"] = c->add_option("--iterations", f->iterations,
                                    "Global batches planned and simulated per method: a number, "
                                    "or 'all' for the whole dataset")
                          ->capture_default_str();
  o["--memory-limit"] = c->add_option("--memory-limit", s.memory_limit_mb,
                                      "Per-device memory budget in MB (10^6 bytes), used as given "
                                      "(default: the device's memory less --memory-reserve)")
                            ->check(NumberCheck(0, true, 1e9, "a size in MB in (0, 1e9]"));
  o["--memory-reserve"] = AddMemoryReserveFlag(c, &s.memory_reserve_mb);
  o["--seed"] = AddSeedFlag(c, &s.seed);
  o["--methods"] = c->add_option("--methods", f->methods,
                                 "Methods to compare, comma-separated: packing, token-budget, "
                                 "multipack, dynapipe, hydraulis, sluice, padding, sorted, "
                                 "megatron-gbp, sluice-hetero (heterogeneous replicas), "
                                 "sluice-dynamic (a strategy per batch) or ASSIGNER+BATCHER "
                                 "(default: packing, token-budget, multipack, dynapipe, "
                                 "hydraulis, sluice)")
                       ->type_name("M,...");
  o["--reference"] =
      c->add_option("--reference", s.reference, "The method ratios are given against")
          ->capture_default_str();
  o["--parallel"] = AddParallelFlag(c, &f->parallel)
                        ->description(
                            "Run every method under this configuration (dp, pp, tp, cp, zero), "
                            "without the search; the controlled comparison uses it too "
                            "(default: each method's best)");
  o["--controlled"] = c->add_option("--controlled", f->controlled,
                                    "The controlled comparison's shared configuration only, as "
                                    "for --parallel (default: sluice's best)")
                          ->type_name("K=V,...|FILE");
  o["--score-batches"] =
      c->add_option("--score-batches", f->score_batches,
                    "The first global batches each candidate configuration is scored on: 1..64, "
                    "or 'all' (plus the longest and densest batches; see --no-score-extremes)")
          ->type_name("N|all")
          ->capture_default_str();
  o["--score-extremes"] =
      c->add_flag("--score-extremes", f->score_extremes,
                  "Also score candidates on the batch with the longest sample and the densest "
                  "batches (the default; overrides a scenario's \"score_extremes\": false)");
  o["--no-score-extremes"] =
      c->add_flag("--no-score-extremes", f->no_score_extremes,
                  "Score candidates on the first --score-batches only (default: off)")
          ->excludes(o["--score-extremes"]);
  o["--cp"] = c->add_option("--cp", f->cp,
                            "Context-parallel degrees the configuration search tries (ring "
                            "attention; decoder-only models): comma-separated, e.g. 1,2,4, or "
                            "'all' (every power of two that fits)")
                  ->type_name("N,...|all")
                  ->capture_default_str();
  o["--ep"] = c->add_option("--ep", f->ep,
                            "Expert-parallel degrees the configuration search tries (MoE models; "
                            "ep divides the experts and dp): comma-separated, e.g. 1,4,8, or "
                            "'all' (every power of two that fits)")
                  ->type_name("N,...|all")
                  ->capture_default_str();
  o["--layer-cut"] =
      c->add_option("--layer-cut", f->layer_cut,
                    "Layers per pipeline chunk: even (the same number each) or balanced (each "
                    "method's best pipeline also tries the cut the layer cut search finds on the "
                    "score batches, planner/layer_cut.h; overrides a scenario's "
                    "search.layer_cut)")
          ->type_name("even|balanced")
          ->capture_default_str();
  o["--moe-overlap"] =
      c->add_option("--moe-overlap", f->moe_overlap,
                    "Rewrite every planned batch of an expert-parallel configuration with this "
                    "MoE overlap before simulating it (passes/moe_overlap.h): off (the plans as "
                    "lowered), none (segmented, nothing overlapped), tutel, megatron, dw, "
                    "partition, lancet, lancet-megatron; the configuration search does not see "
                    "it")
          ->type_name("NAME")
          ->capture_default_str();
  o["--calibration"] =
      c->add_option("--calibration", f->calibration,
                    "Price every planned batch with a calibration file (sluice calibrate --out) "
                    "before simulating it; the configuration search keeps the cost model (default: "
                    "none)")
          ->type_name("FILE");
  o["--simulate-top"] = c->add_option("--simulate-top", s.search.simulate_top,
                                      "Best estimates per method that are simulated")
                            ->check(NumberCheck(1, false, 64, "an integer in [1, 64]"))
                            ->capture_default_str();
  o["--collectives"] =
      c->add_option("--collectives", f->collectives,
                    "stepwise (ring steps over the links, with contention) or closed-form "
                    "(alpha-beta, one interval each, faster), as for `sluice simulate`")
          ->type_name("stepwise|closed-form")
          ->capture_default_str();
  // Deprecated spelling of --collectives closed-form (hidden: the empty group).
  o["--closed-form"] =
      c->add_flag("--closed-form", f->closed_form, "Deprecated: --collectives closed-form")
          ->group("");
  o["--dynamic-refresh"] =
      c->add_option("--dynamic-refresh", f->dynamic_refresh,
                    "sluice-dynamic: how a heterogeneous strategy the screen would skip is "
                    "planned when its periodic refresh is due: quick (from the scales it has "
                    "learnt, stage 1 once) or full (three rounds of stage 1, as when it competes)")
          ->type_name("quick|full")
          ->capture_default_str();
  o["--dynamic-screen"] =
      c->add_option("--dynamic-screen", f->dynamic_screen,
                    "sluice-dynamic: skip planning a heterogeneous strategy for a batch when its "
                    "stage-1 estimate, less this margin, still loses to the best strategy planned "
                    "(a margin in [0, 1); 'off' plans every strategy on every batch)")
          ->type_name("MARGIN|off")
          ->check(CLI::Validator(
              [](std::string& in) -> std::string {
                const StatusOr<std::optional<double>> m = DynamicScreenMargin(in);
                return m.ok() ? std::string() : std::string(m.status().message());
              },
              ""))
          ->capture_default_str();
  c->add_flag("--no-html", f->no_html, "Do not write report.html (default: off, it is written)");
  c->add_option("--optimize-budget-ms", f->optimize_budget_ms,
                "Also run each method's configuration with the plan optimizer (`sluice "
                "optimize`) on every plan, this many ms per batch, as a 'METHOD (optimized)' row "
                "where it changed a plan (0 = off)")
      ->check(NumberCheck(0, false, 1e9, "a number of ms in [0, 1e9], 0 = off"))
      ->capture_default_str();
  SetHandler(c, state, [f] { return RunCompareCommand(*f); });
}

}  // namespace sluice::cli
