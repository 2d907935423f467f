// `sluice trace replay TRACES...` and `sluice trace calibrate ...`: reads what a run did (sluice's
// runtime traces, torch.profiler traces), aligns the ranks' clocks, builds the global data-flow
// graph, replays it and reports (src/trace/, docs/trace.md).
//
// Exit codes: 0 a replay (or calibration) that ran, partial results included (their notes say
// what was left out); 2 for bad flags or traces that cannot be read (the message names the file
// and the event).
#include <fmt/core.h>

#include <memory>
#include <string>
#include <vector>

#include "base/json_util.h"
#include "cli/cli_common.h"
#include "trace/analyze.h"

namespace sluice::cli {
namespace {

struct ReplayFlags {
  std::vector<std::string> inputs;
  std::vector<std::string> what_if;
  std::string json;
  int top = 10;
  bool median = false;
};

// "KIND=FACTOR" -> WhatIf.
StatusOr<trace::WhatIf> ParseWhatIf(const std::string& text) {
  const size_t eq = text.rfind('=');
  trace::WhatIf w;
  bool ok = eq != std::string::npos && eq > 0 && eq + 1 < text.size();
  if (ok) {
    w.match = text.substr(0, eq);
    try {
      size_t used = 0;
      w.factor = std::stod(text.substr(eq + 1), &used);
      ok = used == text.size() - eq - 1;
    } catch (const std::exception&) {
      ok = false;
    }
  }
  if (!ok) {
    return InvalidArgumentError(fmt::format(
        "--what-if '{}': expected WHAT=FACTOR, WHAT one of compute, comm, gap, optimizer or a text "
        "the op's name or annotation contains (e.g. comm=0.5, 'forward=1.2')",
        text));
  }
  return w;
}

Status RunReplay(const ReplayFlags& f) {
  if (!f.json.empty()) SLUICE_RETURN_IF_ERROR(CheckOutputFile("--json", f.json));
  trace::ReplayOptions what_if;
  for (const std::string& w : f.what_if) {
    SLUICE_ASSIGN_OR_RETURN(trace::WhatIf parsed, ParseWhatIf(w));
    what_if.what_if.push_back(parsed);
  }
  SLUICE_ASSIGN_OR_RETURN(trace::Analysis a, trace::AnalyzeFiles(f.inputs));
  SLUICE_ASSIGN_OR_RETURN(trace::ReplayResult measured,
                          trace::Replay(a.graph, a.set, trace::ReplayOptions{}));
  trace::ReplayOptions median_options;
  median_options.durations = f.median ? trace::ClassStat::kMedian : trace::ClassStat::kMean;
  SLUICE_ASSIGN_OR_RETURN(trace::ReplayResult median,
                          trace::Replay(a.graph, a.set, median_options));
  fmt::print("{}", trace::FormatReplayReport(a, measured, median, f.top));
  if (!what_if.what_if.empty()) {
    what_if.durations = median_options.durations;
    SLUICE_ASSIGN_OR_RETURN(trace::ReplayResult w, trace::Replay(a.graph, a.set, what_if));
    std::string list;
    for (const std::string& s : f.what_if) list += (list.empty() ? "" : ", ") + s;
    fmt::print("what-if {}: mean iteration {:.3f} ms (class replay {:.3f} ms, {:+.1f}%)\n", list,
               w.mean_iteration_replayed_ns * 1e-6, median.mean_iteration_replayed_ns * 1e-6,
               100 * (w.mean_iteration_replayed_ns / std::max(1.0, median.mean_iteration_replayed_ns) - 1));
  }
  if (!f.json.empty()) {
    SLUICE_RETURN_IF_ERROR(WriteStringToFile(f.json, trace::ReplayJson(a, measured, median)));
  }
  return Status::Ok();
}

}  // namespace

void RegisterTraceCommands(CLI::App* app, RunState* state) {
  CLI::App* t = app->add_subcommand(
      "trace", "Read what a run did (sluice train --trace-dir, torch.profiler traces): replay, "
               "diagnose, calibrate the simulator");
  t->require_subcommand(1);
  auto rf = std::make_shared<ReplayFlags>();
  CLI::App* r = t->add_subcommand(
      "replay",
      "Align the ranks' clocks, build the global data-flow graph and replay it: replayed vs "
      "measured iteration time, where each rank's time went, the critical path");
  r->add_option("traces", rf->inputs,
                "Trace files or folders (a folder: its trace-rank-*.json, else every *.json): "
                "sluice runtime traces, torch 1.13 export_chrome_trace files, Kineto JSON")
      ->required()
      ->type_name("DIR|FILE...");
  r->add_option("--what-if", rf->what_if,
                "Replay again with WHAT's times x FACTOR: compute, comm, gap, optimizer or a text "
                "the op's name or annotation contains (repeatable)")
      ->type_name("WHAT=FACTOR");
  r->add_flag("--median", rf->median,
             "Class replay with each class's median instead of its mean (dPRO's avg)");
  r->add_option("--json", rf->json, "Write the figures as JSON (sluice-replay/1)")
      ->type_name("FILE");
  r->add_option("--top", rf->top, "Longest critical-path steps to list")
      ->check(NumberCheck(0, false, 1000, "an integer in 0..1000"));
  SetHandler(r, state, [rf] { return RunReplay(*rf); });
}

}  // namespace sluice::cli
