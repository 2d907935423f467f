// Planner: the façade that turns one global batch into a validated ExecutionPlan.
//
// The chain (ARCHITECTURE.md, "Data flow"): a batching method splits the batch into per-replica
// micro-batches (batching/method.h); each replica's micro-batches are priced per virtual stage
// (schedule/schedule_costs.h); the order search picks the order the schedule generator runs best
// (schedule/order_search.h) — or the batching order is kept when the search is off; the
// schedules are lowered into per-rank instruction streams (plan/lower.h); and every plan is
// validated (plan/validate.h) before it is returned. Infeasibility at any step (a batch or a
// schedule that cannot fit memory, or a lowered plan over the plan's memory rule, check 7, which
// counts every buffer of the program) is PlanOutcome::kOutOfMemory with the reason; a Status is
// returned only for bad input or a plan that fails checks 1-6 (a bug). Every plan returned passes
// check 7, so it never runs out of memory in the simulator (docs/simulator.md, "Memory"); the
// batching and schedule budgets keep room for buffers, so that check rarely rejects.
//
// With PlannerOptions::optimize the validated plan then goes through the plan optimizer
// (optimizer.h: passes/ rewrites scored by the simulator).
//
// A Planner prices micro-batches with a StageCostEvaluator whose in-flight rule is the one its
// schedule runs (InFlightPolicyFor, schedule/in_flight.h): Create builds that evaluator, or takes
// a shared one made by MakePlannerEvaluator (config_search.h caches them per configuration), and
// checks the schedule against the configuration once, up front.
//
// Thread safety: a Planner is immutable after Create; Plan() may run concurrently. Copies share
// the evaluator.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/units.h"
#include "batching/dynamic_cp.h"
#include "batching/method.h"
#include "batching/micro_batch.h"
#include "batching/stage_cost.h"
#include "cost/cost_model.h"
#include "data/sample.h"
#include "model/cluster_spec.h"
#include "model/parallel_config.h"
#include "plan/execution_plan.h"
#include "plan/lower.h"
#include "planner/optimizer.h"
#include "schedule/estimator.h"
#include "schedule/generators.h"
#include "schedule/in_flight.h"
#include "schedule/order_search.h"

namespace sluice {

struct PlannerOptions {
  std::string method = "dynapipe";               // batching method (batching/method.h)
  ScheduleKind schedule = ScheduleKind::k1F1B;   // pipeline schedule generator
  BatchingOptions batching;                      // seed, max_seqlen, fixed sizes, ...
  bool search_order = true;                      // run the micro-batch order search
  // Order search options (seed is batching.seed). Cluster permutations only by default: the
  // within-cluster shuffles (`shuffles` = 1) improve the makespan by < 1% on 65,536-token GPT
  // batches but double the search time (docs/benchmarks.md).
  OrderSearchOptions search{.shuffles = 0};
  ScheduleOptions schedule_options;              // used when the search is off
  // Interleaved 1F1B with vpp > 1 and m not a multiple of pp: padded rounds, flexible rounds, or
  // (kAuto) the flexible ones for a replica whose flexible order fits its memory budget and is
  // estimated shorter. Overrides schedule_options.rounds and search.schedule.rounds. A plan whose
  // flexible rounds fail the lowered plan's memory check is lowered again in padded rounds; with
  // ep > 1 every replica runs padded rounds (an expert group's replicas run one action order).
  // With `optimize`, a plan with flexible rounds is also lowered with those replicas in padded
  // rounds, both are simulated, and the shorter goes on to the optimizer (a kept switch is the
  // optimization's first PassRecord, "interleaved-rounds(padded)"). The plan records the
  // choice: replica schedule "interleaved-flex".
  InterleavedRounds interleaved_rounds = InterleavedRounds::kAuto;
  LowerOptions lower;                            // gradient buckets, W memory share
  // Run the plan optimizer (optimizer.h) on every plan that fits; `optimizer.sim.samples` is set
  // to the batch. Off by default: the plan is the lowered one.
  bool optimize = false;
  OptimizerOptions optimizer;
  // With cp > 1: after batching, each micro-batch may run its samples in sub-groups of a smaller
  // cp (batching/dynamic_cp.h, Megatron-Core's dynamic context parallelism). Off by default.
  // When a plan with split micro-batches then fails a later memory check (the schedule's order
  // or the lowered plan), the batch is planned again with every micro-batch whole.
  bool dynamic_cp = false;
  // How a micro-batch's split is chosen (batching/dynamic_cp.h): the fastest predicted one, or
  // Megatron-Core's length rule (the `megatron-gbp` method).
  DynamicCpRule dynamic_cp_rule = DynamicCpRule::kFastest;
};

// What the optimizer did to a plan (PlannerOptions::optimize).
struct PlanOptimization {
  Duration before;  // simulated iteration time of the lowered plan
  Duration after;   // of the returned plan (<= before)
  Duration wall;    // time the optimizer took
  std::vector<passes::PassRecord> passes;  // kept passes, in order (empty: plan unchanged)
  bool budget_hit = false;  // the wall-clock budget ended the search: not reproducible
};

struct PlanResult {
  PlanOutcome outcome = PlanOutcome::kOk;
  std::string infeasible_reason;         // which step could not fit, and why
  BatchPlan batch_plan;                  // micro-batches in their final (searched) order
  std::vector<ScheduleEstimate> estimates;  // [dp replica] the fast estimator's figures
  ExecutionPlan plan;                    // validated; empty unless outcome == kOk
  Duration makespan;                     // slowest replica's estimated iteration
  double bubble_fraction = 0;            // of the slowest replica
  // [pipeline rank] max over replicas of the estimator's peak: activations and held buffers (the
  // plan's rule, with every buffer and the model states: PredictPeakMemory(plan)).
  std::vector<Bytes> peak_memory;
  Duration given_order_makespan;         // slowest replica before the order search
  Duration planning_time;                // wall time of Plan() (the optimizer's included)
  int64_t cp_splits = 0;                 // micro-batches run at a smaller cp (dynamic cp)
  std::optional<PlanOptimization> optimized;  // set when the optimizer ran
};

// The evaluator a planner of `schedule` prices micro-batches with: `options` with the in-flight
// rule InFlightPolicyFor(schedule, parallel.vpp) (options.in_flight is ignored). REQUIRES: `cost`
// outlives the evaluator. Errors: StageCostEvaluator::Create's (`parallel` does not fit, or the
// model states alone exceed the memory limit).
StatusOr<std::shared_ptr<const StageCostEvaluator>> MakePlannerEvaluator(
    const CostModel& cost, const ParallelConfig& parallel, const ClusterSpec& cluster,
    ScheduleKind schedule, StageCostOptions options = {});

class Planner {
 public:
  // A planner with its own evaluator (MakePlannerEvaluator for options.schedule). REQUIRES: `cost`
  // outlives the planner. Errors: options.schedule does not run parallel.vpp virtual stages
  // (InvalidArgument), or MakePlannerEvaluator's.
  static StatusOr<Planner> Create(const CostModel& cost, const ParallelConfig& parallel,
                                  const ClusterSpec& cluster, PlannerOptions options);
  // A planner sharing `eval`, made by MakePlannerEvaluator for `cluster` and a schedule of the same
  // in-flight rule as options.schedule. REQUIRES: eval != nullptr. Errors (InvalidArgument):
  // options.schedule does not run eval's vpp, or eval's in-flight rule is not its rule.
  static StatusOr<Planner> Create(std::shared_ptr<const StageCostEvaluator> eval,
                                  const ClusterSpec& cluster, PlannerOptions options);

  const PlannerOptions& options() const { return options_; }
  const StageCostEvaluator& evaluator() const { return *eval_; }
  const ClusterSpec& cluster() const { return cluster_; }

  // Plans one global batch. Errors: an unknown method or one that does not support the model,
  // or fewer samples than data-parallel replicas (InvalidArgument), or an internal inconsistency.
  StatusOr<PlanResult> Plan(std::span<const Sample> batch) const;

  // Plan in two steps, for callers that plan one batch with several planners whose batching is
  // the same (SameBatching: e.g. one configuration under several schedules): Batch is Plan's
  // batching step (the method's micro-batches, then dynamic cp's sub-groups, then, at ep > 1,
  // EqualizeExpertGroups' splits; its errors are Batch's), PlanBatched the
  // rest given its result. PlanBatched(batch, *Batch(batch)) returns what Plan(batch) does, but
  // for planning_time, which counts PlanBatched's own time only. Errors: as Plan.
  StatusOr<BatchPlan> Batch(std::span<const Sample> batch) const;
  StatusOr<PlanResult> PlanBatched(std::span<const Sample> batch, BatchPlan batching) const;
  // Whether `other`'s Batch returns this planner's for every batch: the same evaluator object,
  // batching method and options, and dynamic cp setting.
  bool SameBatching(const Planner& other) const;

 private:
  // Batch() with (split) or without per-micro-batch cp.
  StatusOr<BatchPlan> BatchWith(std::span<const Sample> batch, bool split) const;
  // PlanBatched without the fallback to whole micro-batches.
  StatusOr<PlanResult> PlanBatchedOnce(std::span<const Sample> batch, BatchPlan batching) const;
  Planner(std::shared_ptr<const StageCostEvaluator> eval, ClusterSpec cluster,
          PlannerOptions options)
      : eval_(std::move(eval)), cluster_(std::move(cluster)), options_(std::move(options)) {}

  std::shared_ptr<const StageCostEvaluator> eval_;
  // options_.dynamic_cp: [j] the evaluator of cp >> (j + 1) (batching/dynamic_cp.h).
  std::vector<std::shared_ptr<const StageCostEvaluator>> narrower_;
  ClusterSpec cluster_;
  PlannerOptions options_;
};

}  // namespace sluice
