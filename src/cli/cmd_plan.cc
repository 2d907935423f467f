// `sluice plan` (plan global batches into validated execution plans), `sluice plan check FILE`
// (validate a plan file) and `sluice plan csv FILE` (export a replica's pipeline order as
// PyTorch pipelining CSV).
#include <fmt/core.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "base/json_util.h"
#include "base/progress.h"
#include "cli/cli_common.h"
#include "cli/scenario_flags.h"
#include "plan/plan_json.h"
#include "plan/pytorch_csv.h"
#include "plan/validate.h"
#include "planner/planner.h"
#include "sim/simulator.h"
#include "trace/calibration.h"

namespace sluice::cli {
namespace {

struct PlanFlags {
  ScenarioFlags scenario;
  PlannerFlags planner;
  std::string out;
  bool out_given = false;  // --out was given (an empty value is refused by its check)
  int64_t show = 1;
  std::string calibration;         // --calibration FILE
  std::string layer_cut = "even";  // even | balanced
};

struct CsvFlags {
  std::string file;
  int64_t replica = 0;
  bool comms = false;
  std::string out;
};

// "plan.json" with the tag inserted before the extension: ("plan.json", "3") -> "plan-3.json".
std::string TaggedPath(const std::string& out, std::string_view tag) {
  const size_t dot = out.rfind('.');
  const size_t slash = out.rfind('/');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) {
    return fmt::format("{}-{}", out, tag);
  }
  return fmt::format("{}-{}{}", out.substr(0, dot), tag, out.substr(dot));
}

// "plan.json" for one batch; "plan-3.json" for batch 3 of several (docs/formats.md).
std::string OutPath(const std::string& out, int64_t index, bool several) {
  return several ? TaggedPath(out, std::to_string(index)) : out;
}

void PrintResult(const PlanResult& r, const GlobalBatch& batch, int64_t pp, bool details) {
  if (r.outcome != PlanOutcome::kOk) {
    fmt::print("batch {}: {} samples, {} tokens: {}: {}\n", batch.index, batch.samples.size(),
               batch.tokens, PlanOutcomeName(r.outcome), r.infeasible_reason);
    return;
  }
  int64_t mbs = 0;
  for (const auto& rep : r.batch_plan.replicas) mbs += static_cast<int64_t>(rep.size());
  fmt::print(
      "batch {}: {} samples, {} tokens, {} micro-batches, makespan {:.1f} ms (given order "
      "{:.1f} ms), bubble {:.1f}%, planned in {:.2f} ms\n",
      batch.index, batch.samples.size(), batch.tokens, mbs, r.makespan.millis(),
      r.given_order_makespan.millis(), 100.0 * r.bubble_fraction, r.planning_time.millis());
  if (!details) return;
  // The plan's memory rule (check 7): model states + activations + buffers, max over replicas.
  const std::vector<Bytes> rule = PredictPeakMemory(r.plan);
  std::vector<Bytes> stage_peak(static_cast<size_t>(pp));
  for (const RankProgram& p : r.plan.ranks) {
    stage_peak[p.pp_index] = std::max(stage_peak[p.pp_index], rule[p.rank]);
  }
  std::string peaks;
  for (int64_t s = 0; s < pp; ++s) {
    peaks += fmt::format("{}{:.0f}", s ? " / " : "", stage_peak[s].mb());
  }
  fmt::print(
      "  peak memory per stage (MB; model states + activations + buffers, limit {:.0f}): {}\n",
      r.plan.memory_limit().mb(), peaks);
  const bool enc_dec = r.plan.model.is_encoder_decoder();
  for (size_t d = 0; d < r.batch_plan.replicas.size(); ++d) {
    fmt::print("  replica {} ({} schedule, estimated {:.1f} ms):\n", d, r.plan.replicas[d].schedule,
               r.estimates[d].makespan.millis());
    for (size_t i = 0; i < r.batch_plan.replicas[d].size(); ++i) {
      const MicroBatch& mb = r.batch_plan.replicas[d][i];
      fmt::print("    mb {:>3}: {}x{}{}{} {:>3} samples, {:>5.1f}% padding, {}, {:.2f} ms\n", i,
                 mb.shape.mbs, mb.shape.seqlen,
                 enc_dec ? fmt::format("x{}", mb.shape.dec_seqlen) : "", mb.varlen ? " varlen" : "",
                 mb.num_samples(), 100.0 * mb.PaddingFraction(), RecomputeName(mb.recompute),
                 mb.Bottleneck().millis());
    }
  }
  size_t instructions = 0;
  for (const RankProgram& p : r.plan.ranks) instructions += p.instructions.size();
  fmt::print("  plan: {} rank programs, {} instructions, validated\n", r.plan.ranks.size(),
             instructions);
  if (r.optimized) {
    fmt::print("  optimized: simulated {} -> {} with {} passes in {:.1f} ms\n",
               FormatDuration(r.optimized->before), FormatDuration(r.optimized->after),
               r.optimized->passes.size(), r.optimized->wall.millis());
  }
}

Status RunPlan(const PlanFlags& f) {
  // Output path first: a bad one, or one that names an input, should not cost the planning.
  const std::vector<NamedInput> inputs = ScenarioInputs(f.scenario);
  if (f.out_given) {
    SLUICE_RETURN_IF_ERROR(CheckOutputFile("--out", f.out));
    SLUICE_RETURN_IF_ERROR(CheckNotAnInput("--out", f.out, inputs));
  }
  SLUICE_RETURN_IF_ERROR(ParseScheduleKind(f.planner.schedule).status());
  std::optional<trace::Calibration> calibration;
  if (!f.calibration.empty()) {
    StatusOr<trace::Calibration> c = trace::ReadCalibrationFile(f.calibration);
    if (!c.ok()) return c.status().WithPrefix("--calibration");
    calibration = std::move(*c);
  }
  SLUICE_ASSIGN_OR_RETURN(Scenario sc, ResolveScenarioFlags(f.scenario));
  // --layer-cut balanced: chosen on the first batches, which are then planned like the others.
  std::vector<GlobalBatch> pending;
  std::string cut_line;
  if (f.layer_cut == "balanced") pending = TakeLayerCutBatches(sc);
  SLUICE_ASSIGN_OR_RETURN(cut_line,
                          ApplyLayerCutFlag(f.layer_cut, &sc, f.scenario, f.planner, pending));
  SLUICE_ASSIGN_OR_RETURN(const Planner planner, MakePlannerFromFlags(sc, f.scenario, f.planner));
  // A bad --out folder is reported before planning, not after the first batch.
  if (!f.out.empty()) {
    SLUICE_RETURN_IF_ERROR(CheckOutputFile("--out", OutPath(f.out, 0, sc.iterations != 1)));
  }
  fmt::print("{}\n", sc.Describe());
  if (!cut_line.empty()) fmt::print("{}", cut_line);
  fmt::print("method:   {}, schedule {}{}\n\n", f.planner.method, f.planner.schedule,
             f.planner.no_search ? "" : ", micro-batch order searched");

  GlobalBatch batch;
  Progress progress("planning", sc.iterations, stderr, /*min_total=*/8);
  const ParallelConfig& par = *sc.parallel;
  SmallInputCheck small(sc.iterations, par.dp * par.pp,
                        fmt::format("dp x pp = {}", par.dp * par.pp), 0, "");
  int64_t done = 0, ok = 0;
  double makespan_ms = 0, bubble = 0, plan_ms = 0;
  double sim_before_ms = 0, sim_after_ms = 0, opt_ms = 0;  // --optimize-budget-ms, summed
  double opt_max_ms = 0;                                   // the slowest batch's optimizer
  int64_t opt_changed = 0, opt_budget_hit = 0;
  int64_t real_tokens = 0;
  const bool several = sc.iterations != 1;
  std::string first_written;  // the first plan file written (named in the summary)
  std::string first_reason;   // why the first batch that did not plan did not
  size_t next_pending = 0;
  auto next_batch = [&](GlobalBatch* out) {
    if (next_pending < pending.size()) {
      *out = pending[next_pending++];
      return true;
    }
    return sc.batcher->Next(out);
  };
  while ((sc.iterations == 0 || done < sc.iterations) && next_batch(&batch)) {
    small.Add(batch);
    StatusOr<PlanResult> planned = planner.Plan(batch.samples);
    if (!planned.ok()) {
      return planned.status().WithPrefix(fmt::format("global batch {}", batch.index));
    }
    PlanResult& r = *planned;
    if (calibration.has_value() && r.outcome == PlanOutcome::kOk) {
      // Priced with calibrated costs: the plan's durations and links, and its makespan again.
      trace::ApplyCalibration(*calibration, &r.plan);
      SimOptions o;
      o.record_timeline = false;
      o.record_memory = false;
      SLUICE_ASSIGN_OR_RETURN(SimResult sim, Simulate(r.plan, o));
      r.makespan = sim.iteration_time;
    }
    progress.Clear();
    PrintResult(r, batch, sc.parallel->pp, done < f.show);
    if (r.outcome != PlanOutcome::kOk && first_reason.empty()) {
      first_reason = fmt::format("batch {}: {}", batch.index, r.infeasible_reason);
    }
    if (r.outcome == PlanOutcome::kOk) {
      ++ok;
      makespan_ms += r.makespan.millis();
      bubble += r.bubble_fraction;
      plan_ms += r.planning_time.millis();
      real_tokens += batch.tokens;
      if (r.optimized) {
        sim_before_ms += r.optimized->before.millis();
        sim_after_ms += r.optimized->after.millis();
        opt_ms += r.optimized->wall.millis();
        opt_max_ms = std::max(opt_max_ms, r.optimized->wall.millis());
        opt_changed += r.optimized->passes.empty() ? 0 : 1;
        opt_budget_hit += r.optimized->budget_hit ? 1 : 0;
      }
      if (f.out_given) {
        const std::string path = OutPath(f.out, batch.index, several);
        SLUICE_RETURN_IF_ERROR(CheckNotAnInput("--out", path, inputs));
        SLUICE_RETURN_IF_ERROR(WritePlanFile(r.plan, path).WithPrefix("--out"));
        if (first_written.empty()) first_written = path;
        if (done < f.show) fmt::print("  wrote {}\n", path);
      }
    }
    ++done;
    progress.Add();
  }
  progress.Finish();
  if (done == 0) return sc.NoBatchError(FlagFieldNamer());
  std::fflush(stdout);
  for (const std::string& w : small.Warnings()) fmt::print(stderr, "warning: {}\n", w);
  fmt::print("\nsummary over {} global batches ({} planned, {} out of memory):\n", done, ok,
             done - ok);
  if (ok > 0) {
    fmt::print(
        "  mean makespan {:.1f} ms, mean bubble {:.1f}%, {:.0f} real tokens/s predicted, "
        "mean planning time {:.2f} ms\n",
        makespan_ms / ok, 100.0 * bubble / ok,
        static_cast<double>(real_tokens) / (makespan_ms / 1e3), plan_ms / ok);
  }
  if (ok > 0 && sim_before_ms > 0) {
    fmt::print(
        "  optimizer: mean simulated iteration {:.1f} ms -> {:.1f} ms ({:.2f}% shorter), "
        "{} of {} plans changed, mean optimizer time {:.1f} ms (max {:.1f} ms)\n",
        sim_before_ms / ok, sim_after_ms / ok,
        100.0 * (sim_before_ms - sim_after_ms) / sim_before_ms, opt_changed, ok, opt_ms / ok,
        opt_max_ms);
    if (opt_budget_hit > 0) {
      fmt::print(
          "  optimizer: the time budget ended the search in {} of {} batches, so another "
          "run may return other plans; for reproducible plans give a budget the search "
          "does not reach (it stops after its step bound), or use `sluice optimize "
          "--steps N`\n",
          opt_budget_hit, ok);
    }
  }
  if (f.out_given && ok > 0 && several) {
    fmt::print(
        "  plans written to {}: one file per planned batch, <batch> = the batch's index "
        "(e.g. {})\n",
        TaggedPath(f.out, "<batch>"), first_written);
  }
  if (ok == 0 && done > 0) {
    return FailedPreconditionError(fmt::format(
        "no batch could be planned within memory with method '{}' and schedule '{}' (the first: "
        "{})",
        f.planner.method, f.planner.schedule, first_reason));
  }
  return Status::Ok();
}

Status RunPlanCheck(const std::string& file) {
  SLUICE_ASSIGN_OR_RETURN(ExecutionPlan plan, ReadPlanFileOrSay(file));
  Status valid = ValidatePlan(plan);
  if (!valid.ok()) return InvalidArgumentError(fmt::format("{}: {}", file, valid.message()));
  size_t instructions = 0;
  for (const RankProgram& p : plan.ranks) instructions += p.instructions.size();
  fmt::print(
      "{}: valid plan of {} ({} dp x {} pp{}), {} rank programs, {} instructions, {} "
      "samples\n",
      file, plan.model.name, plan.dp(), plan.pp(),
      plan.vpp() > 1 ? fmt::format(" x {} vpp", plan.vpp()) : "", plan.ranks.size(), instructions,
      plan.sample_ids.size());
  return Status::Ok();
}

Status RunPlanCsv(const CsvFlags& f) {
  if (!f.out.empty()) {
    SLUICE_RETURN_IF_ERROR(CheckOutputFile("--out", f.out));
    SLUICE_RETURN_IF_ERROR(CheckNotAnInput("--out", f.out, {{"the plan file", f.file}}));
  }
  SLUICE_ASSIGN_OR_RETURN(ExecutionPlan plan, ReadPlanFileOrSay(f.file));
  if (f.replica < 0 || f.replica >= plan.dp()) {
    return InvalidArgumentError(fmt::format("--replica: {} is not a replica of {} (allowed: 0..{})",
                                            f.replica, f.file, plan.dp() - 1));
  }
  PipelineOrder order = PipelineOrderOf(plan, f.replica, /*reduce_grad=*/f.comms);
  if (!f.comms) {
    for (auto& row : order.ranks) {
      std::erase_if(row, [](const PipeAction& a) {
        return a.op != PipeOp::kForward && a.op != PipeOp::kBackward &&
               a.op != PipeOp::kBackwardInput && a.op != PipeOp::kBackwardWeight;
      });
    }
  }
  const std::string csv = PipelineOrderToCsv(order);
  if (f.out.empty()) {
    fmt::print("{}", csv);
    return Status::Ok();
  }
  return WriteStringToFile(f.out, csv).WithPrefix("--out");
}

}  // namespace

void RegisterPlanCommands(CLI::App* app, RunState* state) {
  auto flags = std::make_shared<PlanFlags>();
  CLI::App* p = app->add_subcommand(
      "plan",
      "Plan global batches into validated per-rank execution plans (and check/export them)");
  AddScenarioFlags(p, &flags->scenario);
  AddPlannerFlags(p, &flags->planner);
  CLI::Option* out =
      p->add_option("--out", flags->out,
                    "Write the plan (.json, or .msgpack for the binary form); with several batches "
                    "PATH-<batch>.json per batch")
          ->type_name("FILE")
          ->check(PathCheck());
  p->add_option("--calibration", flags->calibration,
                "Price the plans with a calibration file (sluice calibrate --out): their op "
                "durations, links and the makespan shown (the planner's choices keep the cost "
                "model; default: none)")
      ->type_name("FILE");
  p->add_option("--layer-cut", flags->layer_cut,
                "Layers per pipeline chunk: even (the same number each, or --parallel's "
                "layer_cut=...) or balanced (the cut whose plans of the first 3 batches run "
                "shortest: searched by the planner's estimate, settled in simulation, kept only "
                "when it simulates shorter than the even cut; planner/layer_cut.h)")
      ->type_name("even|balanced")
      ->capture_default_str();
  p->add_option("--show", flags->show, "Print micro-batches of this many first batches")
      ->check(IntegerCheck(0, kNoMaxInteger))
      ->capture_default_str();
  // `plan` runs only when neither `plan check` nor `plan csv` was chosen.
  p->callback([p, out, state, flags] {
    if (!p->get_subcommands().empty()) return;
    flags->out_given = out->count() > 0;
    state->status = RunGuarded("plan", [flags] { return RunPlan(*flags); });
  });

  auto check_files = std::make_shared<std::vector<std::string>>();
  CLI::App* check = p->add_subcommand(
      "check", "Validate plan files (JSON or msgpack); the first invalid one fails the check");
  check->add_option("files", *check_files, "Plan files (e.g. plan-*.json from plan --out)")
      ->required()
      ->type_name("FILE...");
  SetHandler(check, state, [check_files] {
    for (const std::string& file : *check_files) SLUICE_RETURN_IF_ERROR(RunPlanCheck(file));
    return Status::Ok();
  });

  auto csv = std::make_shared<CsvFlags>();
  CLI::App* c = p->add_subcommand(
      "csv", "Export one replica's pipeline order as torch.distributed.pipelining CSV");
  c->add_option("file", csv->file, "Plan file")->required()->type_name("FILE");
  c->add_option("--replica", csv->replica, "Data-parallel replica")->capture_default_str();
  c->add_flag("--comms", csv->comms,
              "compute_comms format (with SEND_F/RECV_F/SEND_B/RECV_B and REDUCE_GRAD); default "
              "compute_only");
  c->add_option("--out", csv->out, "Output file (default: standard output)")
      ->type_name("FILE")
      ->check(PathCheck());
  SetHandler(c, state, [csv] { return RunPlanCsv(*csv); });
}

}  // namespace sluice::cli
