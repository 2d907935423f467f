// `sluice optimize PLAN --out FILE`: rewrites a plan with the plan passes where the simulator says
// it is shorter (planner/optimizer.h), prints before/after and what changed, and writes the
// result (also when nothing changed: then it is the input plan).
//
// With --data (the lengths the plan was made from) the search also lowers recompute levels, priced
// by the plan's cost model rebuilt from its model and cluster (planner/recompute_pricer.h), and
// re-lowers replicas with other micro-batch orders (planner/relower.h; plans it does not support,
// e.g. ep > 1 or cp > 1, get no order moves, and the output says why). The
// samples are clipped at --max-seqlen as the plan's batches were (plan, compare and train clip at
// their --max-seqlen, default 2048): unclipped lengths give other shapes than the plan's, and the
// pricer refuses such micro-batches, so their recompute moves would be lost.
//
// Exit codes: 0 when the optimized plan was written; 2 for bad flags, an unreadable plan, one that
// fails `sluice plan check`, or an --out that is the input or cannot be written (checked before
// the search).
#include <fmt/core.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cli/cli_common.h"
#include "cost/cost_factory.h"
#include "data/data_source.h"
#include "data/global_batcher.h"
#include "plan/plan_json.h"
#include "planner/optimizer.h"
#include "planner/planner.h"
#include "planner/recompute_pricer.h"
#include "planner/relower.h"
#include "schedule/generators.h"

namespace sluice::cli {
namespace {

struct OptimizeFlags {
  std::string file;
  std::string out;
  double budget_ms = 50;
  int64_t steps = 200;
  uint64_t seed = 0;
  std::string search = "greedy";
  std::string draw = "by-kind";
  std::string collectives = "closed-form";
  std::string data;  // the lengths the plan was made from: enables recompute moves
  int64_t samples = 0;
  uint64_t data_seed = 0;
  int64_t max_seqlen = 2048;  // with --data: the clip the plan was made with
  int64_t order_estimates = OptimizerOptions{}.order_estimates;
  int64_t order_exhaustive_up_to = 0;
  double order_share = OptimizerOptions{}.order_budget_share;
  double placed_order_share = OptimizerOptions{}.placed_order_share;
};

// The recompute pricer for a plan file (passes/recompute.h): the plan's cost model rebuilt from
// its model and cluster (it must describe itself as the plan's `cost_model` does) and the samples
// of --data. Owns what the pricer refers to.
struct FilePricer {
  std::unique_ptr<CostModel> cost;
  std::shared_ptr<const StageCostEvaluator> eval;
  std::shared_ptr<const passes::RecomputePricer> pricer;
  std::shared_ptr<const Relowerer> relowerer;  // null: no order moves (relower_off says why)
  std::string relower_off;
};

StatusOr<FilePricer> MakeFilePricer(const OptimizeFlags& f, const ExecutionPlan& plan) {
  FilePricer out;
  for (bool flash : {false, true}) {
    CostModelOptions co;
    co.flash_attention = flash;
    StatusOr<std::unique_ptr<CostModel>> cost = MakeCostModel(plan.model, plan.cluster, co);
    if (cost.ok() && (*cost)->Describe() == plan.cost_model) {
      out.cost = std::move(cost).value();
      break;
    }
  }
  if (out.cost == nullptr) {
    return InvalidArgumentError(fmt::format(
        "--data: recompute moves need the cost model {} was planned with ('{}'), and this build's "
        "default cost model for its model and cluster is another; optimize without --data",
        f.file, plan.cost_model));
  }
  for (size_t d = 0; d < plan.replicas.size(); ++d) {
    const std::vector<PlanMicroBatch>& mbs = plan.replicas[d].micro_batches;
    for (size_t k = 0; k < mbs.size(); ++k) {
      const int64_t len = std::max(mbs[k].shape.seqlen, mbs[k].shape.dec_seqlen);
      if (len > f.max_seqlen) {
        return InvalidArgumentError(fmt::format(
            "{}: micro-batch {} of replica {} is {} tokens long, but --data is clipped at "
            "--max-seqlen {}: the plan was made with a larger --max-seqlen (at least {}); give "
            "the --max-seqlen it was planned with",
            f.file, k, d, len, f.max_seqlen, len));
      }
    }
  }
  StatusOr<ScheduleKind> kind = ParsePlanScheduleName(plan.replicas.front().schedule);
  if (!kind.ok()) return kind.status().WithPrefix(f.file);
  StatusOr<std::shared_ptr<const StageCostEvaluator>> eval =
      MakePlannerEvaluator(*out.cost, plan.parallel, plan.cluster, *kind);
  if (!eval.ok()) return eval.status().WithPrefix(f.file);
  out.eval = *eval;
  DataOptions data;
  data.seed = f.data_seed;
  data.num_samples = f.samples;
  StatusOr<Dataset> dataset = LoadData(f.data, data);
  if (!dataset.ok()) return dataset.status().WithPrefix("--data");
  // Clipped as the batcher clipped them (data/global_batcher.h): a decoder-only model sees prompt
  // and response as one sequence.
  const SeqlenLimit limit =
      plan.model.is_encoder_decoder() ? SeqlenLimit::kEachSide : SeqlenLimit::kTotal;
  std::vector<Sample> samples;
  samples.reserve(dataset->samples().size());
  for (const Sample& s : dataset->samples()) {
    samples.push_back(ClipSample(s, f.max_seqlen, limit));
  }
  StatusOr<Relowerer> relowerer = Relowerer::Create(plan, *out.eval, plan.cluster, samples);
  if (relowerer.ok()) {
    out.relowerer = std::make_shared<const Relowerer>(std::move(relowerer).value());
  } else {
    out.relower_off = relowerer.status().message();
  }
  out.pricer = std::make_shared<EvaluatorPricer>(*out.eval, plan.cluster, std::move(samples));
  return out;
}

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
  if (f.draw == "by-kind") {
    options.draw = CandidateDraw::kByKind;
  } else if (f.draw == "uniform") {
    options.draw = CandidateDraw::kUniform;
  } else {
    return InvalidArgumentError(
        fmt::format("--draw '{}': allowed values are by-kind, uniform", f.draw));
  }
  if (f.collectives == "stepwise") {
    options.sim.collectives = CollectiveMode::kStepwise;
  } else if (f.collectives == "closed-form") {
    options.sim.collectives = CollectiveMode::kClosedForm;
  } else {
    return InvalidArgumentError(
        fmt::format("--collectives '{}': allowed values are stepwise, closed-form", f.collectives));
  }
  options.budget = Duration::Millis(f.budget_ms);
  options.max_steps = f.steps;
  options.seed = f.seed;
  options.order_estimates = f.order_estimates;
  options.order_exhaustive_up_to = f.order_exhaustive_up_to;
  options.order_budget_share = f.order_share;
  options.placed_order_share = f.placed_order_share;
  SLUICE_ASSIGN_OR_RETURN(ExecutionPlan plan, ReadPlanFileOrSay(f.file));
  FilePricer pricer;
  if (!f.data.empty()) {
    SLUICE_ASSIGN_OR_RETURN(pricer, MakeFilePricer(f, plan));
    options.pricer = pricer.pricer;
    options.relowerer = pricer.relowerer;
    if (pricer.relowerer == nullptr) fmt::print("no order moves: {}\n", pricer.relower_off);
  }
  StatusOr<OptimizeResult> run = OptimizePlan(plan, options);
  if (!run.ok()) return InvalidArgumentError(fmt::format("{}: {}", f.file, run.status().message()));
  const OptimizeResult& r = *run;
  const double gain = r.before.nanos() > 0
                          ? 100.0 * static_cast<double>((r.before - r.after).nanos()) /
                                static_cast<double>(r.before.nanos())
                          : 0.0;
  fmt::print("{}: simulated iteration {} -> {} ({:.2f}% shorter; collectives {})\n", f.file,
             FormatDuration(r.before), FormatDuration(r.after), gain, f.collectives);
  fmt::print(
      "search {} seed {}: {} simulations, {} candidates refused by the plan check, {} "
      "accepted, {} passes kept, {:.1f} ms{}\n",
      f.search, f.seed, r.simulations, r.invalid, r.accepted, r.applied.size(), r.wall.millis(),
      r.budget_hit ? " (budget reached: not reproducible)" : "");
  for (const CandidateKindStats& k : r.kinds) {
    fmt::print(
        "  kind {}: {} tried, {} simulated, {} accepted, {:.1f} ms, {} shorter{}\n", k.kind,
        k.tried, k.simulated, k.accepted, k.wall.millis(), FormatDuration(k.gain),
        k.kind == "reorder-microbatches" ? fmt::format(" ({} schedule estimates)", r.order_estimates)
                                         : "");
  }
  for (const passes::PassRecord& p : r.applied) {
    for (const std::string& c : p.changes) fmt::print("  {}: {}\n", p.pass, c);
    if (!p.degraded.empty()) fmt::print("  {}: {}\n", p.pass, p.degraded);
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
      ->check(NumberCheck(1e-3, false, 1e9, "a number of ms in [0.001, 1e9]"))
      ->capture_default_str();
  o->add_option("--steps", flags->steps, "Simulations of candidates at most")
      ->check(IntegerCheck(0, 1000000))
      ->capture_default_str();
  AddSeedFlag(o, &flags->seed)->description("Seed of the search's draws");
  o->add_option("--search", flags->search,
                "greedy (only shorter plans) or mcmc (dPRO's Metropolis rule)")
      ->type_name("greedy|mcmc")
      ->capture_default_str();
  o->add_option("--draw", flags->draw,
                "How a step draws its candidate: by-kind (a kind by the time it saved per "
                "simulation so far, then one of its candidates) or uniform (dPRO's: every "
                "candidate alike)")
      ->type_name("by-kind|uniform")
      ->capture_default_str();
  o->add_option("--collectives", flags->collectives,
                "How the simulator scores: stepwise or closed-form collectives")
      ->type_name("stepwise|closed-form")
      ->capture_default_str();
  AddDataFlag(o, &flags->data)
      ->description(
          "The lengths the plan was made from (as for `sluice simulate`): enables recompute "
          "moves, priced with the plan's cost model (without it: reorders and buckets only)");
  o->add_option("--samples", flags->samples, "With --data: how many samples it holds (0 = all)")
      ->check(IntegerCheck(0, kMaxSamples, kSamplesAllowed))
      ->capture_default_str();
  o->add_option("--data-seed", flags->data_seed, "With a generator --data preset: its seed")
      ->check(IntegerCheck(0, kNoMaxInteger))
      ->capture_default_str();
  o->add_option("--order-estimates", flags->order_estimates,
                "With --data: schedule estimates the micro-batch order search may spend")
      ->check(IntegerCheck(0, 1000000000))
      ->capture_default_str();
  o->add_option("--order-exhaustive-up-to", flags->order_exhaustive_up_to,
                "With --data: replicas of at most this many micro-batches try every order (0-10; "
                "0 = off; for measuring the search, it ignores the budget)")
      ->check(IntegerCheck(0, 10))
      ->capture_default_str();
  o->add_option("--order-share", flags->order_share,
                "With --data: the share of --budget-ms the micro-batch order search may spend "
                "before the recompute placement (the rest goes to the other moves)")
      ->check(NumberCheck(0, true, 1, "a number in (0, 1]"))
      ->capture_default_str();
  o->add_option("--placed-order-share", flags->placed_order_share,
                "With --data: after a kept recompute placement, the share of --budget-ms more "
                "that the order search may spend again with the placed levels (0 = not again)")
      ->check(NumberCheck(0, false, 1, "a number in [0, 1]"))
      ->capture_default_str();
  AddMaxSeqlenFlag(o, &flags->max_seqlen)
      ->description(
          "With --data: samples longer than this are clipped as the plan's batches were (give the "
          "plan's --max-seqlen)");
  SetHandler(o, state, [flags] { return RunOptimize(*flags); });
}

}  // namespace sluice::cli
