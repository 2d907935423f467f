// `sluice simulate PLAN.json|PLAN.msgpack`: runs the discrete-event simulator (sim/simulator.h)
// on a plan file, prints the summary table and writes the optional trace, report and JSON.
//
// Exit codes: 0 when the simulation ran to its end, also when the plan runs out of memory (printed
// first, in capitals: OOM is an outcome of the plan, and the figures are still meaningful); 1 when
// the plan deadlocks (no complete iteration exists); 2 for bad flags, an unreadable plan or a
// structurally broken one. Files asked for are written in every one of the first two cases (their
// paths are checked before the run). Ctrl-C stops the simulation and writes no further file
// (exit code 1).
#include <fmt/core.h>

#include <memory>
#include <string>
#include <vector>

#include "base/json_util.h"
#include "cli/cli_common.h"
#include "data/data_source.h"
#include "passes/moe_overlap.h"
#include "plan/plan_json.h"
#include "plan/validate.h"
#include "report/html_report.h"
#include "sim/chrome_trace.h"
#include "sim/sim_report.h"
#include "sim/simulator.h"
#include "sim/summary.h"
#include "trace/calibration.h"

namespace sluice::cli {
namespace {

struct SimulateFlags {
  std::string file;
  std::string trace;
  std::string report;
  std::string json;
  std::string collectives = "stepwise";
  double compute_scale = 1.0;
  std::vector<std::string> stragglers;
  double intra_bw_scale = 1.0;
  double inter_bw_scale = 1.0;
  double intra_latency_scale = 1.0;
  double inter_latency_scale = 1.0;
  double memory_limit_mb = 0;
  double memory_reserve_mb = -1;  // < 0: the plan's
  std::string data;
  int64_t samples = 0;
  uint64_t seed = 0;
  bool no_buffers = false;
  bool no_check = false;
  std::string calibration;
  std::string moe_overlap;  // empty: the plan as given
};

// "RANK:FACTOR", e.g. "3:1.5".
StatusOr<Straggler> ParseStraggler(const std::string& text) {
  const size_t colon = text.find(':');
  Straggler s;
  size_t used_rank = 0, used_factor = 0;
  bool ok = colon != std::string::npos && colon > 0 && colon + 1 < text.size();
  try {
    if (ok) {
      s.rank = std::stoll(text.substr(0, colon), &used_rank);
      s.slowdown = std::stod(text.substr(colon + 1), &used_factor);
      ok = used_rank == colon && used_factor == text.size() - colon - 1;
    }
  } catch (const std::exception&) {
    ok = false;
  }
  if (!ok) {
    return InvalidArgumentError(fmt::format(
        "--straggler '{}': expected RANK:FACTOR, e.g. 3:1.5 (rank 3's compute 1.5x slower)", text));
  }
  return s;
}

StatusOr<SimOptions> MakeOptions(const SimulateFlags& f) {
  SimOptions o;
  if (f.collectives == "stepwise") {
    o.collectives = CollectiveMode::kStepwise;
  } else if (f.collectives == "closed-form") {
    o.collectives = CollectiveMode::kClosedForm;
  } else {
    return InvalidArgumentError(
        fmt::format("--collectives '{}': allowed values are stepwise, closed-form", f.collectives));
  }
  o.compute_scale = f.compute_scale;
  o.intra_node = {f.intra_bw_scale, f.intra_latency_scale};
  o.inter_node = {f.inter_bw_scale, f.inter_latency_scale};
  for (const std::string& s : f.stragglers) {
    SLUICE_ASSIGN_OR_RETURN(Straggler st, ParseStraggler(s));
    o.stragglers.push_back(st);
  }
  o.count_buffers = !f.no_buffers;
  if (!f.data.empty()) {
    DataOptions data;
    data.seed = f.seed;
    data.num_samples = f.samples;
    // Ids are the dataset's (the batcher keeps them); lengths beyond a row's padded length are
    // clipped to it when counted, as the batcher clipped them when planning.
    StatusOr<Dataset> dataset = LoadData(f.data, data);
    if (!dataset.ok()) return dataset.status().WithPrefix("--data");
    o.samples = dataset->samples();
  }
  return o;
}

// Option errors of the simulator name SimOptions fields; say which flag sets them.
Status FlagError(const Status& s) {
  std::string m = s.message();
  for (const auto& [field, flag] : std::vector<std::pair<std::string, std::string>>{
           {"'compute_scale'", "--compute-scale"},
           {"'intra_node.bandwidth_scale'", "--intra-bw-scale"},
           {"'inter_node.bandwidth_scale'", "--inter-bw-scale"},
           {"'intra_node.latency_scale'", "--intra-latency-scale"},
           {"'inter_node.latency_scale'", "--inter-latency-scale"},
           {"'stragglers", "--straggler"},
           {"'samples'", "--data"}}) {
    if (m.find(field) != std::string::npos) return InvalidArgumentError(flag + ": " + m);
  }
  return s;
}

// --moe-overlap all: every rewrite of passes/moe_overlap.h simulated side by side.
Status CompareMoeOverlaps(const ExecutionPlan& plan, const SimOptions& options) {
  fmt::print("\nMoE overlap (passes/moe_overlap.h), each rewrite of this plan simulated:\n");
  fmt::print("{:<16} {:>14} {:>16} {:>18} {:>9} {:>10}  {}\n", "overlap", "iteration ms",
             "all-to-all ms", "exposed a2a ms", "speedup", "exposed %", "note");
  Duration base_time, base_exposed;
  for (int k = 0; k <= static_cast<int>(passes::MoeOverlap::kLancetMegatron); ++k) {
    const auto overlap = static_cast<passes::MoeOverlap>(k);
    ExecutionPlan next = plan;
    SLUICE_ASSIGN_OR_RETURN(passes::PassRecord record,
                            passes::MoeOverlapPass(overlap).Run(&next));
    StatusOr<SimResult> run = Simulate(next, options);
    if (!run.ok()) return run.status().WithPrefix(std::string(passes::MoeOverlapName(overlap)));
    Duration a2a, exposed;
    for (const RankSimStats& st : run->ranks) {
      a2a += st.all_to_all;
      exposed += st.exposed_all_to_all;
    }
    const int64_t n = std::max<int64_t>(static_cast<int64_t>(run->ranks.size()), 1);
    const Duration mean_a2a = Duration::Nanos(a2a.nanos() / n);
    const Duration mean_exposed = Duration::Nanos(exposed.nanos() / n);
    if (k == 0) {
      base_time = run->iteration_time;
      base_exposed = mean_exposed;
    }
    std::string note = run->outcome == SimOutcome::kOk ? "" : run->problem;
    if (!record.rejected.empty()) note = "not applied: " + record.rejected;
    fmt::print(
        "{:<16} {:>14.3f} {:>16.3f} {:>18.3f} {:>8.3f}x {:>9.1f}%  {}\n",
        passes::MoeOverlapName(overlap), run->iteration_time.millis(), mean_a2a.millis(),
        mean_exposed.millis(),
        run->iteration_time.nanos() > 0 ? base_time.millis() / run->iteration_time.millis() : 0.0,
        base_exposed.nanos() > 0 ? 100.0 * mean_exposed.millis() / base_exposed.millis() : 0.0,
        note);
  }
  fmt::print("(speedup and exposed % against none: the plan's MoE ops segmented, nothing "
             "overlapped; all-to-all and exposed: mean per rank)\n");
  fmt::print(
      "(sliced pieces of tutel, partition, lancet and lancet-megatron priced with {:.1f} us each: "
      "{})\n",
      passes::SliceOverheadFor(plan, {}).micros(),
      plan.moe_slice_overhead.has_value()
          ? "measured by the plan's cost model (moe_slice_overhead_ns)"
          : "the default; a `sluice profile` table with moe_parts measures it");
  return Status::Ok();
}

// Status of a run that Ctrl-C stopped (exit code 1).
Status InterruptedError(const SimulateFlags& f, std::string_view when) {
  return FailedPreconditionError(
      fmt::format("{}: interrupted (Ctrl-C) {}; no further files written", f.file, when));
}

Status RunSimulate(const SimulateFlags& f) {
  // Output paths first: a bad one should not cost the simulation.
  const std::vector<NamedInput> inputs = {{"the plan file", f.file}, {"--data", f.data}};
  for (const auto& [flag, path] : {std::pair<std::string_view, const std::string&>{"--trace", f.trace},
                                   {"--json", f.json},
                                   {"--report", f.report}}) {
    if (path.empty()) continue;
    SLUICE_RETURN_IF_ERROR(CheckOutputFile(flag, path));
    SLUICE_RETURN_IF_ERROR(CheckNotAnInput(flag, path, inputs));
  }
  InterruptGuard guard;
  SLUICE_ASSIGN_OR_RETURN(ExecutionPlan plan, ReadPlanFileOrSay(f.file));
  if (!f.calibration.empty()) {
    StatusOr<trace::Calibration> c = trace::ReadCalibrationFile(f.calibration);
    if (!c.ok()) return c.status().WithPrefix("--calibration");
    trace::ApplyCalibration(*c, &plan);
  }
  if (f.memory_limit_mb > 0 && f.memory_reserve_mb >= 0) {
    return InvalidArgumentError(
        "--memory-reserve: applies only without --memory-limit (an explicit limit is the budget "
        "as given); give one of them");
  }
  if (f.memory_limit_mb > 0) {
    plan.parallel.memory_limit = Bytes::MB(f.memory_limit_mb);
    plan.parallel.memory_reserve.reset();
  }
  if (f.memory_reserve_mb >= 0) {
    if (Bytes::MB(f.memory_reserve_mb) >= plan.cluster.device.memory) {
      return InvalidArgumentError(fmt::format(
          "--memory-reserve: {:.0f} MB leaves nothing of the {:.0f} MB of one {} device "
          "(allowed: 0..{:.0f})",
          f.memory_reserve_mb, plan.cluster.device.memory.mb(), plan.cluster.device.name,
          plan.cluster.device.memory.mb() - 1));
    }
    plan.parallel.memory_limit.reset();
    plan.parallel.memory_reserve = Bytes::MB(f.memory_reserve_mb);
  }
  SLUICE_ASSIGN_OR_RETURN(SimOptions options, MakeOptions(f));
  bool overlap_all = false;
  if (!f.moe_overlap.empty()) {
    overlap_all = f.moe_overlap == "all";
    if (!overlap_all) {
      StatusOr<passes::MoeOverlap> overlap = passes::ParseMoeOverlap(f.moe_overlap,
                                                                    "--moe-overlap");
      if (!overlap.ok()) {
        return InvalidArgumentError(overlap.status().message() + ", all");
      }
      if (plan.parallel.ep <= 1 || !plan.model.moe.has_value()) {
        return InvalidArgumentError(fmt::format(
            "--moe-overlap {}: {} has no expert parallelism (needs an MoE model and ep > 1)",
            f.moe_overlap, f.file));
      }
      const Status valid = ValidatePlan(plan, ValidateOptions{.grid_context = 2});
      if (!valid.ok()) {
        return InvalidArgumentError(
            fmt::format("--moe-overlap: the plan must pass `sluice plan check` first: {}",
                        valid.message()));
      }
      SLUICE_ASSIGN_OR_RETURN(passes::PassRecord record,
                              passes::MoeOverlapPass(*overlap).Run(&plan));
      if (!record.rejected.empty()) {
        fmt::print("--moe-overlap {}: not applied ({}); simulating the plan as given\n",
                   f.moe_overlap, record.rejected);
      } else if (!record.changes.empty()) {
        fmt::print("--moe-overlap {}: {} ({} ranks like it)\n", f.moe_overlap,
                   record.changes.front(), record.changes.size() - 1);
      }
      if (!record.degraded.empty()) {
        fmt::print("--moe-overlap {}: {}\n", f.moe_overlap, record.degraded);
      }
    } else if (plan.parallel.ep <= 1 || !plan.model.moe.has_value()) {
      return InvalidArgumentError(fmt::format(
          "--moe-overlap all: {} has no expert parallelism (needs an MoE model and ep > 1)",
          f.file));
    }
  }
  options.cancelled = [] { return Interrupted(); };
  if (Interrupted()) return InterruptedError(f, "before the simulation");
  Status valid;
  if (!f.no_check) {
    ValidateOptions check;
    check.check_memory = false;  // the simulation reports memory itself
    check.grid_context = 3;
    valid = ValidatePlan(plan, check);
  }
  StatusOr<SimResult> run = Simulate(plan, options);
  if (Interrupted()) return InterruptedError(f, "during the simulation");
  // A plan the simulator refuses gets that one message; the check's finding is shown only
  // beside a simulation that ran.
  if (!run.ok()) return FlagError(run.status().WithPrefix(f.file));
  if (!valid.ok()) {
    fmt::print("warning: {} does not pass `sluice plan check` (simulating it anyway):\n{}\n\n",
               f.file, valid.message());
  }
  const SimResult& r = *run;
  size_t instructions = 0;
  for (const RankProgram& p : plan.ranks) instructions += p.instructions.size();
  fmt::print("{}: {} on {}, dp {} x pp {} x tp {}{}, {} ranks, {} instructions; collectives {}\n",
             f.file, plan.model.name, plan.cluster.name, plan.dp(), plan.pp(), plan.parallel.tp,
             (plan.parallel.cp > 1 ? fmt::format(" x cp {}", plan.parallel.cp) : "") +
                 (plan.vpp() > 1 ? fmt::format(" x vpp {}", plan.vpp()) : ""),
             plan.ranks.size(),
             instructions, f.collectives);
  fmt::print("{}", FormatSimSummary(plan, r));
  if (overlap_all) SLUICE_RETURN_IF_ERROR(CompareMoeOverlaps(plan, options));
  if (!f.trace.empty()) {
    if (Interrupted()) return InterruptedError(f, "before writing --trace");
    SLUICE_RETURN_IF_ERROR(WriteChromeTrace(plan, r, f.trace).WithPrefix("--trace"));
    fmt::print("wrote trace {} (chrome://tracing or ui.perfetto.dev)\n", f.trace);
  }
  if (!f.json.empty()) {
    if (Interrupted()) return InterruptedError(f, "before writing --json");
    SLUICE_RETURN_IF_ERROR(
        WriteStringToFile(f.json, SimResultToJson(plan, r).dump(1) + "\n").WithPrefix("--json"));
    fmt::print("wrote {}\n", f.json);
  }
  if (!f.report.empty()) {
    if (Interrupted()) return InterruptedError(f, "before writing --report");
    SLUICE_RETURN_IF_ERROR(
        report::WriteHtmlReport(BuildSimulationReport(plan, r), f.report).WithPrefix("--report"));
    fmt::print("wrote report {}\n", f.report);
  }
  if (r.outcome == SimOutcome::kDeadlock) {
    return FailedPreconditionError(fmt::format("{}: {}", f.file, r.problem));
  }
  return Status::Ok();
}

}  // namespace

void RegisterSimulateCommands(CLI::App* app, RunState* state) {
  auto flags = std::make_shared<SimulateFlags>();
  CLI::App* s = app->add_subcommand(
      "simulate",
      "Simulate a plan file: per-rank streams, links with contention, collectives, memory; "
      "exit 1 on deadlock, 0 otherwise (out of memory included)");
  s->add_option("plan", flags->file, "Plan file (sluice-plan/1 JSON or MessagePack)")
      ->required()
      ->type_name("PLAN.json|PLAN.msgpack");
  s->add_option("--trace", flags->trace, "Write a Chrome/Perfetto trace JSON")
      ->type_name("FILE")
      ->check(PathCheck());
  s->add_option("--report", flags->report, "Write an HTML report")
      ->type_name("FILE")
      ->check(PathCheck());
  s->add_option("--json", flags->json, "Write the result as JSON (sluice-sim-result/1)")
      ->type_name("FILE")
      ->check(PathCheck());
  s->add_option("--collectives", flags->collectives,
                "stepwise (ring steps over the links, with contention) or closed-form (alpha-beta)")
      ->type_name("stepwise|closed-form")
      ->capture_default_str();
  s->add_option("--compute-scale", flags->compute_scale, "Every compute duration x this factor")
      ->capture_default_str();
  s->add_option("--straggler", flags->stragglers,
                "RANK:FACTOR: that rank's compute x FACTOR (repeatable)")
      ->type_name("RANK:FACTOR");
  s->add_option("--intra-bw-scale", flags->intra_bw_scale, "Intra-node bandwidth x this factor")
      ->capture_default_str();
  s->add_option("--inter-bw-scale", flags->inter_bw_scale, "Inter-node bandwidth x this factor")
      ->capture_default_str();
  s->add_option("--intra-latency-scale", flags->intra_latency_scale,
                "Intra-node latency x this factor")
      ->capture_default_str();
  s->add_option("--inter-latency-scale", flags->inter_latency_scale,
                "Inter-node latency x this factor")
      ->capture_default_str();
  s->add_option("--memory-limit", flags->memory_limit_mb,
                "Per-device memory limit in MB (10^6 bytes); 0 = the plan's")
      ->check(NumberCheck(0, false, 1e9, "a size in MB in [0, 1e9], 0 = the plan's"))
      ->capture_default_str();
  AddMemoryReserveFlag(s, &flags->memory_reserve_mb)
      ->description(
          "The plan's budget becomes the device's memory less this many MB (10^6 bytes) "
          "(default: the plan's limit or reserve)");
  AddDataFlag(s, &flags->data)
      ->description(
          "The lengths the plan was made from, to count real tokens (plans hold ids "
          "only; without it the padded shapes count)");
  s->add_option("--samples", flags->samples, "With --data: how many samples it holds (0 = all)")
      ->check(IntegerCheck(0, kMaxSamples, kSamplesAllowed))
      ->capture_default_str();
  AddSeedFlag(s, &flags->seed)->description("With a generator --data preset: its seed");
  s->add_flag("--no-buffers", flags->no_buffers,
              "Memory: the plan's activation rule only (as `sluice plan check`), no buffers "
              "(default: off)");
  s->add_flag("--no-check", flags->no_check,
              "Skip the plan check before simulating (default: off)");
  s->add_option("--calibration", flags->calibration,
                "Correct the plan's op durations and links with a calibration file (sluice "
                "calibrate --out)")
      ->type_name("FILE");
  s->add_option("--moe-overlap", flags->moe_overlap,
                "Rewrite the plan's MoE ops to overlap all-to-all with compute before simulating "
                "(passes/moe_overlap.h): none (segmented, no overlap), tutel, megatron, dw, "
                "partition, lancet (dw + partition), lancet-megatron (pp 1: megatron's B/F pairs, "
                "the forwards outside them partitioned); all: simulate the plan as given, then "
                "every rewrite side by side")
      ->type_name("none|tutel|megatron|dw|partition|lancet|lancet-megatron|all");
  SetHandler(s, state, [flags] { return RunSimulate(*flags); });
}

}  // namespace sluice::cli
