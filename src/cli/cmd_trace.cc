// `sluice replay TRACES...` and `sluice calibrate TRACES... --plan ... --out FILE`: reads what a
// run did (sluice's runtime traces, torch.profiler traces), aligns the ranks' clocks, builds the
// global data-flow graph, replays it and reports; fits the cost model's corrections (src/trace/,
// docs/trace.md).
//
// Exit codes: 0 a replay (or calibration) that ran, partial results included (their notes say
// what was left out); 2 for bad flags or traces that cannot be read (the message names the file
// and the event).
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/json_util.h"
#include "cli/cli_common.h"
#include "cli/replay_report.h"
#include "plan/plan_json.h"
#include "sim/simulator.h"
#include "trace/analyze.h"
#include "trace/calibration.h"
#include "trace/plan_whatif.h"

namespace sluice::cli {
namespace {

struct ReplayFlags {
  std::vector<std::string> inputs;
  std::vector<std::string> plans;
  std::vector<std::string> what_if;
  std::vector<std::string> what_if_plans;
  std::string json;
  std::string report;
  int64_t report_iteration = -1;
  int top = 10;
  bool median = false;
};

Status RunReplay(const ReplayFlags& f) {
  if (!f.json.empty()) SLUICE_RETURN_IF_ERROR(CheckOutputFile("--json", f.json));
  if (!f.report.empty()) SLUICE_RETURN_IF_ERROR(CheckOutputFile("--report", f.report));
  std::vector<trace::WhatIf> what_if;
  for (const std::string& w : f.what_if) {
    SLUICE_ASSIGN_OR_RETURN(trace::WhatIf parsed, trace::ParseWhatIf(w));
    what_if.push_back(parsed);
  }
  if (!f.what_if_plans.empty() && f.plans.empty()) {
    return InvalidArgumentError(
        "--what-if-plan needs --plan: the plans the traced run executed (one per iteration), "
        "to tie the trace's ops to instructions");
  }
  std::vector<ExecutionPlan> what_if_plans;
  for (const std::string& p : f.what_if_plans) {
    SLUICE_ASSIGN_OR_RETURN(ExecutionPlan plan, ReadPlanFile(p));
    what_if_plans.push_back(std::move(plan));
  }
  SLUICE_ASSIGN_OR_RETURN(trace::Analysis a, trace::AnalyzeFiles(f.inputs));
  SLUICE_ASSIGN_OR_RETURN(
      trace::Replays replays,
      trace::ReplayAll(a, f.median ? trace::ClassStat::kMedian : trace::ClassStat::kMean,
                       f.what_if_plans.empty() ? what_if : std::vector<trace::WhatIf>{}));
  std::string pricing_json;
  std::vector<trace::OpCorrection> departures;
  if (!f.plans.empty()) {
    // Ties every op of the trace to its plan's instruction (an error names the event of a trace
    // of another plan) and compares the measured costs with the plan's durations.
    for (const trace::RankTrace& r : a.set.ranks) {
      if (r.format != trace::TraceFormat::kSluice) {
        return InvalidArgumentError(fmt::format(
            "--plan: {} is a {} trace; plans are tied to sluice's runtime traces (sluice train "
            "--plan ... --trace-dir)",
            r.source, trace::TraceFormatName(r.format)));
      }
    }
    std::vector<ExecutionPlan> plans;
    for (const std::string& p : f.plans) {
      SLUICE_ASSIGN_OR_RETURN(ExecutionPlan plan, ReadPlanFile(p));
      plans.push_back(std::move(plan));
    }
    trace::FitOptions fit;
    fit.fit_link = false;
    fit.fit_iteration = false;
    SLUICE_ASSIGN_OR_RETURN(trace::Calibration c, trace::FitCalibration(a, plans, fit));
    for (const trace::OpCorrection& o : c.ops) {
      if (o.stage >= 0) departures.push_back(o);
    }
    std::stable_sort(departures.begin(), departures.end(), [](const auto& x, const auto& y) {
      return x.mean_abs_error_before > y.mean_abs_error_before;
    });
    fmt::print("tied to {} plan(s): every rank's ops are its program's instructions\n",
               plans.size());
    if (!what_if_plans.empty()) {
      SLUICE_ASSIGN_OR_RETURN(trace::PlanWhatIf w,
                              trace::BuildPlanWhatIf(a, plans, what_if_plans, f.what_if_plans));
      const std::string name =
          what_if_plans.size() == 1
              ? fmt::format("plan {}", f.what_if_plans[0])
              : fmt::format("plans {} .. {}", f.what_if_plans.front(), f.what_if_plans.back());
      SLUICE_RETURN_IF_ERROR(trace::ReplayPlanWhatIf(w, what_if, name, &replays));
      fmt::print("{}", trace::PricingText(w.pricing));
      const trace::PlanPricing& p = w.pricing;
      nlohmann::json pj = {{"measured", p.measured},
                           {"by_class", p.by_class},
                           {"derived", p.derived},
                           {"calibrated", p.calibrated},
                           {"plan", p.plan},
                           {"transfers_measured", p.transfers_measured},
                           {"transfers_by_class", p.transfers_by_class},
                           {"collectives", p.collectives}};
      pricing_json = pj.dump();
    }
    fmt::print("op classes against the plan's durations (largest mean |error| first):\n");
    fmt::print("  stage  op                samples  plan's mean |error|  fitted line\n");
    for (size_t i = 0; i < departures.size() && static_cast<int>(i) < f.top; ++i) {
      const trace::OpCorrection& o = departures[i];
      fmt::print("  {:>5}  {:<16}  {:>7}  {:>18.1f}%  {}\n", o.stage, o.op, o.samples,
                 100 * o.mean_abs_error_before, o.Describe());
    }
  }
  fmt::print("{}", trace::FormatReplayReport(a, replays, f.top));
  fmt::print("{}", trace::FormatWhatIfReport(replays));
  if (!f.json.empty()) {
    std::string text = trace::ReplayJson(a, replays);
    if (!pricing_json.empty()) {
      nlohmann::json j = nlohmann::json::parse(text);
      j["what_if"]["pricing"] = nlohmann::json::parse(pricing_json);
      text = j.dump(1);
    }
    SLUICE_RETURN_IF_ERROR(WriteStringToFile(f.json, text));
  }
  if (!f.report.empty()) {
    const auto& its = replays.whole_run.iterations;
    if (f.report_iteration >= 0 &&
        std::none_of(its.begin(), its.end(), [&](const trace::IterationTime& it) {
          return it.iteration == f.report_iteration;
        })) {
      return InvalidArgumentError(fmt::format(
          "--report-iteration {}: not an iteration with ops on every rank (allowed: {})",
          f.report_iteration,
          its.empty() ? std::string("none")
                      : fmt::format("{}..{}", its.front().iteration, its.back().iteration)));
    }
    SLUICE_RETURN_IF_ERROR(report::WriteHtmlReport(
        BuildReplayReport(a, replays, f.report_iteration, f.plans.empty() ? nullptr : &departures),
        f.report));
    fmt::print("report written to {}\n", f.report);
  }
  return Status::Ok();
}

struct CalibrateFlags {
  std::vector<std::string> inputs;
  std::vector<std::string> plans;
  std::string fit_iterations;
  std::string out;
  bool no_link = false;
  bool no_iteration_offset = false;
  std::string fit = "features";
  std::string metrics;
};

// train --metrics: [iteration] -> peak_tensor_bytes_by_rank (empty where a line has none).
StatusOr<std::vector<std::vector<int64_t>>> ReadPeakBytes(const std::string& path) {
  SLUICE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  std::vector<std::vector<int64_t>> out;
  size_t at = 0;
  int line_no = 0;
  while (at < text.size()) {
    const size_t end = std::min(text.find('\n', at), text.size());
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto bad = [&](const std::string& what) {
      return InvalidArgumentError(fmt::format(
          "--metrics {}: line {}: {} (expected the JSON lines of sluice train --metrics, with "
          "'iteration' and 'peak_tensor_bytes_by_rank')",
          path, line_no, what));
    };
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
    if (!j.contains("iteration") || !j["iteration"].is_number_integer() ||
        j["iteration"].get<int64_t>() < 0 || j["iteration"].get<int64_t>() > 10'000'000) {
      return bad("no 'iteration' (an integer >= 0)");
    }
    const int64_t k = j["iteration"].get<int64_t>();
    if (!j.contains("peak_tensor_bytes_by_rank")) continue;  // a build that does not count
    const nlohmann::json& peaks = j["peak_tensor_bytes_by_rank"];
    if (!peaks.is_array()) return bad("'peak_tensor_bytes_by_rank' is not an array");
    std::vector<int64_t> v;
    for (const nlohmann::json& x : peaks) {
      if (!x.is_number_integer()) return bad("'peak_tensor_bytes_by_rank' holds a non-integer");
      v.push_back(x.get<int64_t>());
    }
    if (static_cast<int64_t>(out.size()) <= k) out.resize(k + 1);
    out[k] = std::move(v);
  }
  return out;
}

// "1-8" or "0,2,5" -> iterations.
StatusOr<std::vector<int64_t>> ParseIterations(const std::string& text) {
  std::vector<int64_t> out;
  if (text.empty()) return out;
  auto bad = [&] {
    return InvalidArgumentError(fmt::format(
        "--fit-iterations '{}': expected FIRST-LAST or a comma-separated list of iterations "
        "(integers >= 0), e.g. 1-8",
        text));
  };
  try {
    const size_t dash = text.find('-');
    if (dash != std::string::npos) {
      size_t u1 = 0, u2 = 0;
      const int64_t a = std::stoll(text.substr(0, dash), &u1);
      const int64_t b = std::stoll(text.substr(dash + 1), &u2);
      if (u1 != dash || u2 != text.size() - dash - 1 || a < 0 || b < a || b - a > 1'000'000) {
        return bad();
      }
      for (int64_t k = a; k <= b; ++k) out.push_back(k);
      return out;
    }
    size_t at = 0;
    while (at <= text.size()) {
      const size_t comma = std::min(text.find(',', at), text.size());
      size_t used = 0;
      const int64_t k = std::stoll(text.substr(at, comma - at), &used);
      if (used != comma - at || k < 0) return bad();
      out.push_back(k);
      at = comma + 1;
    }
  } catch (const std::exception&) {
    return bad();
  }
  return out;
}

StatusOr<int64_t> SimulatedNs(const ExecutionPlan& plan, const std::string& file) {
  SimOptions o;
  o.record_timeline = false;
  o.record_memory = false;
  Simulator sim(plan, o);
  StatusOr<SimResult> r = sim.Run();
  if (!r.ok()) return r.status().WithPrefix(file);
  if (r->outcome == SimOutcome::kDeadlock) {
    return FailedPreconditionError(fmt::format("{}: the plan deadlocks in the simulator", file));
  }
  return r->iteration_time.nanos();
}

Status RunCalibrate(const CalibrateFlags& f) {
  if (f.fit != "features" && f.fit != "scale") {
    return InvalidArgumentError(
        fmt::format("--fit '{}': not a fit (allowed: features, scale)", f.fit));
  }
  SLUICE_RETURN_IF_ERROR(CheckOutputFile("--out", f.out));
  SLUICE_ASSIGN_OR_RETURN(std::vector<int64_t> fit_on, ParseIterations(f.fit_iterations));
  SLUICE_ASSIGN_OR_RETURN(trace::Analysis a, trace::AnalyzeFiles(f.inputs));
  for (const trace::RankTrace& r : a.set.ranks) {
    if (r.format != trace::TraceFormat::kSluice) {
      return InvalidArgumentError(fmt::format(
          "{}: calibration needs sluice's runtime traces (sluice train --plan ... --trace-dir); "
          "this is a {} trace",
          r.source, trace::TraceFormatName(r.format)));
    }
  }
  // --out must not be one of the inputs (a trace found in a folder included).
  std::vector<NamedInput> inputs;
  for (const trace::RankTrace& r : a.set.ranks) inputs.push_back({"trace", r.source});
  for (const std::string& p : f.plans) inputs.push_back({"--plan", p});
  if (!f.metrics.empty()) inputs.push_back({"--metrics", f.metrics});
  SLUICE_RETURN_IF_ERROR(CheckNotAnInput("--out", f.out, inputs));
  std::vector<ExecutionPlan> plans;
  for (const std::string& p : f.plans) {
    SLUICE_ASSIGN_OR_RETURN(ExecutionPlan plan, ReadPlanFile(p));
    plans.push_back(std::move(plan));
  }
  trace::FitOptions options;
  options.iterations = fit_on;
  options.fit_link = !f.no_link;
  options.fit_features = f.fit == "features";
  options.fit_iteration = !f.no_iteration_offset;
  if (!f.metrics.empty()) {
    SLUICE_ASSIGN_OR_RETURN(options.peak_bytes, ReadPeakBytes(f.metrics));
    bool any = false;
    for (const auto& v : options.peak_bytes) any = any || !v.empty();
    if (!any) {
      return InvalidArgumentError(fmt::format(
          "--metrics {}: no line has 'peak_tensor_bytes_by_rank' (a sluice train run that "
          "counted tensor memory writes it)",
          f.metrics));
    }
  }
  int64_t nested_a2a_ns = 0;
  options.nested_all_to_all_ns = &nested_a2a_ns;
  SLUICE_ASSIGN_OR_RETURN(trace::Calibration c, trace::FitCalibration(a, plans, options));
  SLUICE_RETURN_IF_ERROR(WriteStringToFile(f.out, trace::CalibrationToJson(c)));
  fmt::print("calibration from {}\n", c.source);
  fmt::print("  stage  op                samples  error before  after  fitted line (ns)\n");
  for (const trace::OpCorrection& o : c.ops) {
    fmt::print("  {:>5}  {:<16} {:>8}  {:>11.1f}% {:>5.1f}%  {}\n",
               o.stage < 0 ? std::string("any") : std::to_string(o.stage), o.op, o.samples,
               100 * o.mean_abs_error_before, 100 * o.mean_abs_error_after, o.Describe());
  }
  if (c.link.fitted) {
    // 1e6 GB/s is the fit's stand-in for "no measurable time per byte" (calibration.cc).
    const std::string bandwidth =
        c.link.bandwidth_gb_per_s >= 1e6
            ? std::string("unbounded (the transfers' time did not grow with their size)")
            : fmt::format("{:.3f} GB/s (plan bytes)", c.link.bandwidth_gb_per_s);
    fmt::print("  link: latency {:.1f} us, bandwidth {} from {} transfers\n", c.link.latency_us,
               bandwidth, c.link.samples);
  }
  if (nested_a2a_ns > 0) {
    fmt::print(
        "  MoE all-to-alls inside whole compute ops: {:.1f} ms over the fitted iterations and "
        "ranks, taken out of those ops' measured time (the plans price them as all-to-alls)\n",
        static_cast<double>(nested_a2a_ns) * 1e-6);
  }
  if (c.iteration.samples > 0) {
    fmt::print(
        "  iteration: {:+.1f} us left out by the simulator (median over {} iterations; "
        "charged to every rank's optimizer step)\n",
        c.iteration.offset_us, c.iteration.samples);
  }
  // Simulated iteration time before and after, against the measured one.
  const std::vector<int64_t> measured = trace::MeasuredIterationTimes(a);
  std::vector<char> fitted(plans.size(), fit_on.empty() ? 1 : 0);
  for (int64_t k : fit_on) fitted[k] = 1;
  double err[2][2] = {{0, 0}, {0, 0}};  // [fitted?][before/after]
  int count[2] = {0, 0};
  fmt::print("iteration  fitted  measured ms  simulated ms  calibrated ms  error before  after\n");
  for (size_t k = 0; k < plans.size() && k < measured.size(); ++k) {
    if (measured[k] <= 0) continue;
    SLUICE_ASSIGN_OR_RETURN(int64_t before, SimulatedNs(plans[k], f.plans[k]));
    ExecutionPlan calibrated = plans[k];
    trace::ApplyCalibration(c, &calibrated);
    SLUICE_ASSIGN_OR_RETURN(int64_t after, SimulatedNs(calibrated, f.plans[k]));
    const double m = static_cast<double>(measured[k]);
    const double eb = (static_cast<double>(before) - m) / m;
    const double ea = (static_cast<double>(after) - m) / m;
    fmt::print("{:>9}  {:>6}  {:>11.3f}  {:>12.3f}  {:>13.3f}  {:>+11.1f}% {:>+5.1f}%\n", k,
               fitted[k] ? "yes" : "no", m * 1e-6, before * 1e-6, after * 1e-6, 100 * eb, 100 * ea);
    err[fitted[k]][0] += std::abs(eb);
    err[fitted[k]][1] += std::abs(ea);
    ++count[fitted[k]];
  }
  for (int s = 1; s >= 0; --s) {
    if (count[s] == 0) continue;
    fmt::print("{} iterations ({}): mean |error| {:.1f}% before, {:.1f}% after calibration\n",
               s ? "fitted" : "held-out", count[s], 100 * err[s][0] / count[s],
               100 * err[s][1] / count[s]);
  }
  if (!c.memory.empty()) {
    for (const trace::MemoryCorrection& m : c.memory) {
      fmt::print(
          "  memory, pipeline rank {}: {:+.1f} MB framework/workspace, activations x {:.3f} "
          "(from {} peaks; fitted mean |error| {:.1f}% before, {:.1f}% after)\n",
          m.pp_rank, m.offset_bytes * 1e-6, m.activation_scale, m.samples,
          100 * m.mean_abs_error_before, 100 * m.mean_abs_error_after);
    }
    fmt::print("iteration  rank  fitted  measured MB  simulated MB  calibrated MB  error before  after\n");
    double merr[2][2] = {{0, 0}, {0, 0}};
    int mcount[2] = {0, 0};
    for (size_t k = 0; k < plans.size() && k < options.peak_bytes.size(); ++k) {
      const std::vector<int64_t>& meas = options.peak_bytes[k];
      if (meas.empty()) continue;
      SLUICE_ASSIGN_OR_RETURN(std::vector<int64_t> before, trace::SimulatedPeakBytes(plans[k]));
      ExecutionPlan calibrated = plans[k];
      trace::ApplyCalibration(c, &calibrated);
      SLUICE_ASSIGN_OR_RETURN(std::vector<int64_t> after, trace::SimulatedPeakBytes(calibrated));
      for (size_t r = 0; r < meas.size() && r < before.size(); ++r) {
        if (meas[r] <= 0) continue;
        const double m = static_cast<double>(meas[r]);
        const double eb = static_cast<double>(before[r]) / m - 1;
        const double ea = static_cast<double>(after[r]) / m - 1;
        fmt::print("{:>9}  {:>4}  {:>6}  {:>11.2f}  {:>12.2f}  {:>13.2f}  {:>+11.1f}% {:>+5.1f}%\n",
                   k, r, fitted[k] ? "yes" : "no", m * 1e-6, before[r] * 1e-6, after[r] * 1e-6,
                   100 * eb, 100 * ea);
        merr[fitted[k]][0] += std::abs(eb);
        merr[fitted[k]][1] += std::abs(ea);
        ++mcount[fitted[k]];
      }
    }
    for (int s = 1; s >= 0; --s) {
      if (mcount[s] == 0) continue;
      fmt::print(
          "{} peaks ({} iteration x rank): peak memory mean |error| {:.1f}% before, {:.1f}% "
          "after calibration\n",
          s ? "fitted" : "held-out", mcount[s], 100 * merr[s][0] / mcount[s],
          100 * merr[s][1] / mcount[s]);
    }
  }
  fmt::print("calibration written to {}\n", f.out);
  return Status::Ok();
}

void RegisterCalibrateCommand(CLI::App* app, RunState* state) {
  auto f = std::make_shared<CalibrateFlags>();
  CLI::App* c = app->add_subcommand(
      "calibrate",
      "Fit per-stage, per-op corrections to the cost model (a robust line on the plan's "
      "features: duration, tokens, attention work, rows, tokens recomputed in full, a "
      "constant), a link (latency, bandwidth) and a per-iteration offset from traces of sluice "
      "train --plan runs; write "
      "them for --calibration (plan, simulate, compare, train); print simulated vs measured "
      "iteration time before and after");
  c->add_option("traces", f->inputs, "sluice train --trace-dir folders or trace files")
      ->required()
      ->type_name("DIR|FILE...");
  c->add_option("--plan", f->plans,
                "The plan files the run executed, in order (iteration k ran the k-th); a train "
                "--trace-dir holds them as plan-K.json (as run: rewritten by --moe-overlap, "
                "adjusted by --calibration)")
      ->required()
      ->type_name("FILE");
  c->add_option("--fit-iterations", f->fit_iterations,
                "Fit on these iterations only (FIRST-LAST or a list); the others are held out "
                "(default: all)")
      ->type_name("RANGE");
  c->add_option("--fit", f->fit,
                "The per-op line: features (robust, non-negative, chosen by BIC) or scale "
                "(scale x predicted + offset by least squares, what sluice-calibration/1 fitted)")
      ->capture_default_str();
  c->add_option("--out", f->out, "Calibration file to write (sluice-calibration/2 JSON)")
      ->required()
      ->type_name("FILE");
  c->add_option("--metrics", f->metrics,
                "The run's sluice train --metrics file: also fit each pipeline rank's peak "
                "memory (a constant for framework/workspace memory and a scale on activations) "
                "to its peak_tensor_bytes_by_rank, and print the peak memory error before and "
                "after")
      ->type_name("FILE");
  c->add_flag("--no-link", f->no_link, "Keep the plan's links; fit compute only");
  c->add_flag("--no-iteration-offset", f->no_iteration_offset,
              "Fit no per-iteration offset (what the simulator leaves out per iteration)");
  SetHandler(c, state, [f] { return RunCalibrate(*f); });
}

}  // namespace

void RegisterTraceCommands(CLI::App* app, RunState* state) {
  auto rf = std::make_shared<ReplayFlags>();
  CLI::App* r = app->add_subcommand(
      "replay",
      "Read what a run did (sluice train --trace-dir, torch.profiler traces), align the ranks' "
      "clocks, build the global data-flow graph and replay it: replayed vs measured iteration "
      "time, where each rank's time went, the critical path, what-ifs");
  r->add_option("traces", rf->inputs,
                "Trace files or folders (a folder: its trace-rank-*.json, else every *.json): "
                "sluice runtime traces, torch 1.13 export_chrome_trace files, Kineto JSON")
      ->required()
      ->type_name("DIR|FILE...");
  r->add_option("--plan", rf->plans,
                "The plan files a sluice train --plan run executed, in order: ties every op to "
                "its instruction (a trace of another plan is an error) and lists the op classes "
                "whose measured cost departs most from the plan's")
      ->type_name("FILE ...");
  r->add_option("--what-if", rf->what_if,
                "WHAT=FACTOR or WHAT+=DURATION (ns, us, ms, s): replay again with WHAT's times "
                "scaled or lengthened and print the predicted iteration times; WHAT: compute, "
                "comm, link, gap, optimizer or a text the op's name or annotation contains; "
                "link+=D starts each transfer D after its send was posted, as train "
                "--link-delay-ms does (repeatable)")
      ->type_name("SPEC");
  r->add_option("--what-if-plan", rf->what_if_plans,
                "Plan files of the same batches in another order or schedule (e.g. zb-h1 for a "
                "1f1b run, or sluice optimize's output), one per --plan file: replay the trace's "
                "measured op times and gaps in their order and print the predicted iteration "
                "times (needs --plan; ops the trace has no measurement of are priced by the "
                "calibrated cost model, and counted)")
      ->type_name("FILE ...");
  r->add_flag("--median", rf->median,
              "Class replay with each class's median instead of its mean (dPRO's avg)");
  r->add_option("--json", rf->json, "Write the figures as JSON (sluice-replay/2)")
      ->type_name("FILE");
  r->add_option("--report", rf->report,
                "Write an HTML report: measured and replayed timelines of one iteration, the "
                "critical path, the error table")
      ->type_name("FILE");
  r->add_option("--report-iteration", rf->report_iteration,
                "The iteration the report draws (default: the one with the median measured "
                "time)")
      ->check(NumberCheck(0, false, 1e9, "an integer >= 0"))
      ->type_name("N");
  r->add_option("--top", rf->top, "Longest critical-path steps (and op classes) to list")
      ->check(NumberCheck(0, false, 1000, "an integer in 0..1000"));
  SetHandler(r, state, [rf] { return RunReplay(*rf); });
  RegisterCalibrateCommand(app, state);
}

}  // namespace sluice::cli
