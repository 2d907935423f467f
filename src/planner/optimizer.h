// The plan optimizer: dPRO's search (MLSys'22, its optimizer over a replayable graph) on sluice's
// IR. It rewrites a valid plan with the passes of passes/ and keeps what the simulator says is
// shorter.
//
// With a relowerer (relower.h), the first move is the micro-batch order: the replica that holds
// most of the simulated critical path is given a shorter order by its schedule estimate
// (SearchReplicaOrder: the organ pipe, then insertion moves), then each other replica whose
// estimate is still longer than that replica's new one, slowest first; the plan is lowered again
// with those orders, validated (ValidatePlan, memory included) and simulated, and kept when
// shorter (record "reorder-microbatches"); when the orders together are not shorter, the critical
// replica's order alone is tried. This repeats while the critical path moves to a replica not
// searched yet. The estimates are bounded by `order_estimates` (deterministic) and by
// `order_budget_share` of the wall-clock budget (then budget_hit is set); the relowered plans are
// scored by the simulator like every other candidate.
// With a pricer, the next candidate is the whole-plan recompute placement
// (passes/recompute.h, RecomputePlacementPass), kept when the simulation says it is shorter.
// When it is kept, the order search runs again (to `placed_order_share` more of the budget) with
// the micro-batches at the levels it placed (Relowerer::WithLevelsOf: the first search priced
// them at the batching's levels, which leave memory the placement then spends, and a zero-bubble
// schedule is generated again from the placed costs), and after a kept order the placement
// again (it offers the pairs that did not fit before). The reorder's record then holds the
// orders and the levels, and replaces the earlier records.
// Then each MoE overlap of `moe_overlaps` (passes/moe_overlap.h) is applied to that plan and the
// shortest kept when it is shorter (the overlap rewrites are whole-plan moves, tried once,
// whatever is left of the budget: they are the moves an MoE plan gains most from).
// Then each step:
//  1. Candidates from the simulated critical path of the current plan (SimResult::critical_path):
//     for a compute op on the path, moving it one place earlier or later on its rank, and moving
//     the rank's next W (zero-bubble weight gradient) to just before it; for a transfer on the
//     path, posting its Start (on both ranks) earlier: one instruction, or before the nearest
//     blocking Finish; for a collective on the path, halving or doubling the gradient buckets;
//     for an F, B or I on the path that recomputes (and a pricer is given), a lower recompute
//     level for that (micro-batch, stage) (none, or selective after full).
//     The candidate list is rebuilt after every accepted step (dPRO rebuilds its candidate space
//     from the new critical path after each accept).
//  2. One candidate, drawn (seeded; OptimizerOptions::draw: by kind, or uniformly as dPRO) from
//     those not yet tried on the current plan, is applied to a copy; a pass that would break the plan (ValidatePlan, memory included) leaves
//     it unchanged and the candidate is dropped without a simulation.
//  3. The copy is simulated; search kMcmc accepts it with dPRO's rule
//     p = exp(beta * ln(step + 1) * (C_cur - C_new) / C_cur * 100)  (C: simulated iteration time;
//     always when shorter), search kGreedy only when shorter. The best plan seen is kept.
// The search ends after max_steps simulations, when no untried candidate is left (greedy: a
// local optimum), or when the wall-clock budget is spent. Checking and simulating the input is
// timed first and stands for the cost of scoring one plan: the order search ends that much
// before its share, the placement gets a deadline that much before the budget, and a step is
// started only when the longest step so far (that cost before the first), and half of it
// more, ends within it. Those checks foresee; one more bounds: at the hard end (a fortieth of the
// budget, and four times what copying the plan once took, before the budget; the checks that
// foresee aim at it) no candidate is scored, and a simulation still running stops (the simulator
// asks every 512 events, SimOptions::cancelled) and its candidate is dropped, so a step slower
// than any before it does not carry the search past the budget. The search frees its copies of
// the plan before it returns, inside the time it reports (OptimizeResult::wall).
//
// Guarantees: the returned plan passes ValidatePlan and its simulated iteration time (with
// `sim`) is at most the input's; the input is returned unchanged when nothing was shorter.
// Deterministic: the same plan, options and seed give the same plan, unless the wall-clock budget
// stopped the search (OptimizeResult::budget_hit says so; give a larger budget or fewer
// max_steps for a reproducible result). Scoring a candidate: the pass rewrites a kept copy of the
// current plan (only what it changed is copied back afterwards), the pass's plan check validates
// only the rewritten rank (ValidateRankRewrite: ValidatePlan's result, exactly), and the whole
// plan is simulated. The simulation is not resumed from a checkpoint: it is the smaller part of a
// candidate's cost (docs/benchmarks.md, "Scoring candidates"), where copying and re-validating
// the whole plan were the larger.
//
// Thread safety: pure function.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "base/units.h"
#include "passes/moe_overlap.h"
#include "passes/pass.h"
#include "passes/recompute.h"
#include "plan/execution_plan.h"
#include "planner/relower.h"
#include "sim/simulator.h"

namespace sluice {

enum class OptimizerSearch : uint8_t {
  kMcmc,    // dPRO's Metropolis rule (may accept a longer plan to leave a local optimum)
  kGreedy,  // first improvement: accept only a shorter plan
};
std::string_view OptimizerSearchName(OptimizerSearch search);  // "mcmc", "greedy"

// How a step draws its candidate from the untried ones on the current plan.
enum class CandidateDraw : uint8_t {
  kUniform,  // dPRO's: every candidate alike
  // A kind first ("move-compute", "bucket", ...), with weight
  // (gain + g0) / (1 + simulated + refused / ranks): the simulated time that kind's candidates
  // saved so far in this search per simulation they cost (a refused one costs one rank's
  // validation), after a prior of one simulation that saves a thousandth of the current plan's
  // time (g0); a kind that pays is drawn more, one that does not fades as it is tried, none is
  // starved. Then one of its candidates uniformly. Counts, not the clock: the same seed draws
  // the same on any machine. A kind with many candidates (the compute moves of a long critical
  // path) no longer crowds out one with few (the buckets).
  kByKind,
};
std::string_view CandidateDrawName(CandidateDraw draw);  // "uniform", "by-kind"

// The simulator options the optimizer scores with by default: closed-form collectives (the fast
// mode; within 1% of the stepwise one on an uncontended collective, sim/simulator.h).
inline SimOptions ScoringSimOptions() {
  SimOptions o;
  o.collectives = CollectiveMode::kClosedForm;
  return o;
}

struct OptimizerOptions {
  // Greedy by default: as good as kMcmc on the DynaPipe grid and faster (docs/benchmarks.md).
  OptimizerSearch search = OptimizerSearch::kGreedy;
  int64_t max_steps = 200;                 // simulations of candidates at most (>= 0)
  Duration budget = Duration::Millis(50);  // wall-clock cap (> 0)
  uint64_t seed = 0;                       // the draws of candidates and of acceptance
  double beta = 10.0;                      // kMcmc: dPRO's mcmc_beta (> 0), per percent
  CandidateDraw draw = CandidateDraw::kByKind;
  // Scoring: the simulator's options. The timeline is always recorded (the critical path);
  // memory is not (validation checks it).
  SimOptions sim = ScoringSimOptions();
  // Prices other recompute levels (passes/recompute.h); null: no recompute candidates. The
  // planner passes its EvaluatorPricer (recompute_pricer.h).
  std::shared_ptr<const passes::RecomputePricer> pricer;
  // Relowers the plan with other micro-batch orders (relower.h), built from the same plan; null:
  // no order moves. The planner passes one made from its batch.
  std::shared_ptr<const Relowerer> relowerer;
  // Order moves: schedule estimates at most over the whole order search (>= 0).
  int64_t order_estimates = 20000;
  // Order moves: the share of `budget` the order search may spend (in (0, 1]); each replica
  // searched gets an equal part of what is left. The rest goes to the other moves.
  double order_budget_share = 0.45;
  // Order moves: when the recompute placement was kept, the order search runs again with each
  // (micro-batch, stage) at the level the placement chose (Relowerer::WithLevelsOf), until
  // order_budget_share + placed_order_share of `budget` (at most all of it; in [0, 1]; 0: not
  // run), and the placement again when an order was kept.
  double placed_order_share = 0.45;
  // Order moves: replicas of at most this many micro-batches try every order instead (0..10;
  // SearchReplicaOrder). 0: off. For measuring the search's headroom, not for the time budget.
  int64_t order_exhaustive_up_to = 0;
  // MoE overlap rewrites to try before the search (empty: none); see the header comment.
  std::vector<passes::MoeOverlap> moe_overlaps;
  passes::MoeOverlapOptions moe_overlap_options;
};

// Where the optimizer's time went, per kind of candidate ("reorder-microbatches",
// "recompute-placement", "moe-overlap", "move-compute", "hoist-start", "bucket", "recompute").
struct CandidateKindStats {
  std::string kind;
  int64_t tried = 0;      // candidates built (a refused one included)
  int64_t simulated = 0;  // of which simulated
  int64_t accepted = 0;
  Duration wall;          // time spent building, checking and simulating them
  Duration gain;          // simulated time saved by the accepted ones (kMcmc: net)
};

struct OptimizeResult {
  ExecutionPlan plan;  // the best plan found (the input when nothing was shorter)
  Duration before;     // simulated iteration time of the input
  Duration after;      // of `plan` (<= before)
  std::vector<passes::PassRecord> applied;  // the passes that lead from the input to `plan`
  int64_t simulations = 0;                  // candidates simulated
  int64_t invalid = 0;                      // candidates a pass refused (they would break the plan)
  int64_t accepted = 0;                     // steps accepted (kMcmc: worse ones included)
  bool budget_hit = false;                  // the wall-clock budget ended the search
  Duration wall;                            // time the search took
  std::vector<CandidateKindStats> kinds;    // per kind of candidate, in order of first use
  int64_t order_estimates = 0;              // schedule estimates of the order search
  bool changed() const { return !applied.empty(); }
};

// What is left of `budget` after the time since `since` (at least a microsecond): the budget a
// caller that prepared the optimizer's inputs (pricer, relowerer) gives OptimizePlan, so that the
// whole optimization stays within the budget it reports.
Duration BudgetLeft(Duration budget, std::chrono::steady_clock::time_point since);

// Optimizes `plan`. Errors: options out of range (InvalidArgument naming the field), the plan
// fails ValidatePlan (InvalidArgument with the validator's message), or the simulator's errors.
// A plan whose simulation does not end ok (deadlock, out of memory) is returned unchanged.
StatusOr<OptimizeResult> OptimizePlan(const ExecutionPlan& plan,
                                      const OptimizerOptions& options = {});

}  // namespace sluice
