// `sluice optimize PLAN --out FILE`: rewrites a plan with the plan passes where the simulator says
// it is shorter (planner/optimizer.h), prints before/after and what changed, and writes the
// result (also when nothing changed: then it is the input plan).
//
// Exit codes: 0 when the optimized plan was written; 2 for bad flags, an unreadable plan, one that
// fails `sluice plan check`, or an --out that is the input or cannot be written (checked before
// the search).
#include <fmt/core.h>

#include <memory>
#include <string>

#include "cli/cli_common.h"
#include "plan/plan_json.h"
#include "planner/optimizer.h"

namespace sluice::cli {
namespace {

struct OptimizeFlags {
  std::string file;
  std::string out;
  double budget_ms = 50;
  int64_t steps = 200;
  uint64_t seed = 0;
  std::string search = "mcmc";
  std::string collectives = "closed-form";
};

Status RunOptimize(const OptimizeFlags& f) {
  SLUICE_RETURN_IF_ERROR(CheckOutputFile("--out", f.out));
  SLUICE_RETURN_IF_ERROR(CheckNotAnInput("--out", f.out, {{"the plan file", f.file}}));
  OptimizerOptions options;
  if (f.search == "mcmc") {
    options.search = OptimizerSearch::kMcmc;
  } else if (f.search == "greedy") {
    options.search = OptimizerSearch::kGreedy;
  } else {
    return InvalidArgumentError(
        fmt::format("--search '{}': allowed values are mcmc, greedy", f.search));
  }
  if (f.collectives == "stepwise") {
    options.sim.collectives = CollectiveMode::kStepwise;
  } else if (f.collectives == "closed-form") {
    options.sim.collectives = CollectiveMode::kClosedForm;
  } else {
    return InvalidArgumentError(fmt::format(
        "--collectives '{}': allowed values are stepwise, closed-form", f.collectives));
  }
  options.budget = Duration::Millis(f.budget_ms);
  options.max_steps = f.steps;
  options.seed = f.seed;
  SLUICE_ASSIGN_OR_RETURN(ExecutionPlan plan, ReadPlanFileOrSay(f.file));
  StatusOr<OptimizeResult> run = OptimizePlan(plan, options);
  if (!run.ok()) return InvalidArgumentError(fmt::format("{}: {}", f.file, run.status().message()));
  const OptimizeResult& r = *run;
  const double gain = r.before.nanos() > 0
                          ? 100.0 * static_cast<double>((r.before - r.after).nanos()) /
                                static_cast<double>(r.before.nanos())
                          : 0.0;
  fmt::print("{}: simulated iteration {} -> {} ({:.2f}% shorter; collectives {})\n", f.file,
             FormatDuration(r.before), FormatDuration(r.after), gain, f.collectives);
  fmt::print("search {} seed {}: {} simulations, {} candidates refused by the plan check, {} "
             "accepted, {} passes kept, {:.1f} ms{}\n",
             f.search, f.seed, r.simulations, r.invalid, r.accepted, r.applied.size(),
             r.wall.millis(), r.budget_hit ? " (budget reached: not reproducible)" : "");
  for (const passes::PassRecord& p : r.applied) {
    for (const std::string& c : p.changes) fmt::print("  {}: {}\n", p.pass, c);
  }
  SLUICE_RETURN_IF_ERROR(WritePlanFile(r.plan, f.out).WithPrefix("--out"));
  fmt::print("wrote {}\n", f.out);
  return Status::Ok();
}

}  // namespace

void RegisterOptimizeCommands(CLI::App* app, RunState* state) {
  auto flags = std::make_shared<OptimizeFlags>();
  CLI::App* o = app->add_subcommand(
      "optimize",
      "Rewrite a plan with the plan passes (W placement, micro-batch order, transfer priority, "
      "gradient buckets) where the simulator says it is shorter");
  o->add_option("plan", flags->file, "Plan file (sluice-plan/1 JSON or MessagePack)")
      ->required()
      ->type_name("PLAN.json|PLAN.msgpack");
  o->add_option("--out", flags->out, "Write the optimized plan (.json, or .msgpack)")
      ->required()
      ->type_name("FILE")
      ->check(PathCheck());
  o->add_option("--budget-ms", flags->budget_ms, "Wall-clock budget of the search in ms")
      ->check(NumberCheck(0, true, 1e9, "a number of ms in (0, 1e9]"))
      ->capture_default_str();
  o->add_option("--steps", flags->steps, "Simulations of candidates at most")
      ->check(IntegerCheck(0, 1000000))
      ->capture_default_str();
  AddSeedFlag(o, &flags->seed)->description("Seed of the search's draws");
  o->add_option("--search", flags->search,
                "mcmc (dPRO's Metropolis rule) or greedy (only shorter plans)")
      ->type_name("mcmc|greedy")
      ->capture_default_str();
  o->add_option("--collectives", flags->collectives,
                "How the simulator scores: stepwise or closed-form collectives")
      ->type_name("stepwise|closed-form")
      ->capture_default_str();
  SetHandler(o, state, [flags] { return RunOptimize(*flags); });
}

}  // namespace sluice::cli
