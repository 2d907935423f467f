// Relowerer: a plan lowered again with other micro-batch orders (the optimizer's order move).
//
// The passes of passes/ edit a lowered plan in place, one instruction at a time; they cannot
// change the order in which whole micro-batches enter a pipeline, which decides how long the
// pipeline's fill and drain are (a long micro-batch first makes every later stage wait for it; a
// long one last leaves a long cool-down). That needs a new schedule and a new lowering, with
// buffer slots re-packed and transfers re-posted. A Relowerer holds what the lowering needs,
// rebuilt from the plan itself: each replica's micro-batches (their rows priced again by the
// evaluator at the level the batching chose, PlanMicroBatch::recompute), their schedule costs
// (schedule/schedule_costs.h) and the schedule kind the replica recorded (ParsePlanScheduleName;
// "interleaved-flex" in flexible rounds, "interleaved" in padded ones).
//
// Orders are permutations of the plan's own micro-batch indices, per replica: order[i] = the
// micro-batch of the given plan that runs i-th. Lowering every replica in its identity order gives
// the plan back as the planner lowered it (RelowerTest checks it); rewrites that passes made to
// the plan since (recompute per stage, buckets, moved ops) are not carried over.
//
// Not supported (Create says why): plans with per-micro-batch context parallelism or with expert
// parallelism (an expert group's replicas must run one action order), and micro-batches whose
// samples are not in the batch or whose price gives another shape than the plan's.
//
// Thread safety: immutable after Create; the const methods may run concurrently. REQUIRES: the
// evaluator outlives the Relowerer.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "base/rng.h"
#include "base/status.h"
#include "batching/micro_batch.h"
#include "batching/stage_cost.h"
#include "data/sample.h"
#include "model/cluster_spec.h"
#include "plan/execution_plan.h"
#include "plan/lower.h"
#include "schedule/generators.h"
#include "schedule/schedule_costs.h"

namespace sluice {

class Relowerer {
 public:
  // `batch`: samples including every sample id of `plan` (others are ignored). `schedule`: the
  // options the planner generated schedules with (max_in_flight; rounds come from the replica's
  // recorded schedule). `lower`: the planner's lowering options. Errors: FailedPrecondition
  // naming what the relowering does not support, or a micro-batch that cannot be priced again
  // as the plan has it.
  static StatusOr<Relowerer> Create(const ExecutionPlan& plan, const StageCostEvaluator& eval,
                                    const ClusterSpec& cluster, std::span<const Sample> batch,
                                    ScheduleOptions schedule = {}, LowerOptions lower = {});

  int64_t dp() const { return static_cast<int64_t>(replicas_.size()); }
  // Micro-batches of replica d.
  int64_t size(int64_t d) const { return static_cast<int64_t>(replicas_[d].size()); }
  // Schedule costs of replica d in the plan's order.
  const ScheduleCosts& costs(int64_t d) const { return costs_[d]; }

  // The schedule of replica d with its micro-batches in `order`, and its estimate
  // (schedule/estimator.h). `scratch` holds the permuted costs (reused between calls).
  // REQUIRES: order is a permutation of 0 .. size(d) - 1.
  StatusOr<ScheduleResult> Estimate(int64_t d, std::span<const int64_t> order,
                                    ScheduleCosts* scratch) const;

  // Estimate's makespan, Infinite when that schedule does not fit the memory budget or does not
  // run: what the order search compares. For 1F1B (whose action order is the same whatever the
  // micro-batches cost) the schedule is built once and only estimated again.
  // REQUIRES: order is a permutation of 0 .. size(d) - 1.
  StatusOr<Duration> Makespan(int64_t d, std::span<const int64_t> order,
                              ScheduleCosts* scratch) const;

  // The plan lowered with replica d's micro-batches in orders[d] (an empty order: the plan's).
  // The result is not validated (run ValidatePlan). Errors: orders.size() != dp(), an order that
  // is not a permutation, or the lowering's errors.
  StatusOr<ExecutionPlan> Lower(std::span<const std::vector<int64_t>> orders) const;

  // A copy whose micro-batches keep the recompute level each (micro-batch, stage) runs at in
  // `plan`, at the cost `plan` records for it (PlanMicroBatch::stages): the levels the recompute
  // placement (passes/recompute.h) chose travel with their micro-batch into every other order,
  // both in Estimate (the order search prices orders at them, memory included) and in Lower (the
  // lowered plan runs each pair at its level; the result is not validated: a level that fit
  // memory in one order may not in another). `plan` must be this Relowerer's lowering with
  // `orders` (rewritten since only in levels, durations and the like); the copy's orders are, as
  // this one's, permutations of the original micro-batch indices. Errors: orders that are not
  // permutations, or a plan whose replicas or micro-batches are not this Relowerer's in `orders`
  // (InvalidArgument).
  StatusOr<Relowerer> WithLevelsOf(const ExecutionPlan& plan,
                                   std::span<const std::vector<int64_t>> orders) const;
  // (Micro-batch, stage) pairs whose level differs from the micro-batch's own (WithLevelsOf).
  int64_t level_changes() const;

 private:
  Relowerer() = default;
  // Lower's last step with levels_: each pair not at its micro-batch's level gets it.
  void ApplyLevels(std::span<const std::vector<int64_t>> orders, ExecutionPlan* plan) const;

  const StageCostEvaluator* eval_ = nullptr;
  ClusterSpec cluster_;
  std::vector<Sample> batch_;                      // the plan's samples
  std::vector<std::vector<MicroBatch>> replicas_;  // [dp][plan order]
  std::vector<UnplacedSample> dropped_;
  std::string method_;
  std::vector<ScheduleCosts> costs_;  // [dp], plan order
  std::vector<ScheduleKind> kinds_;   // [dp]
  std::vector<std::optional<Schedule>> fixed_;     // [dp]: the 1F1B schedule, built once
  std::vector<ScheduleOptions> schedule_options_;  // [dp]
  LowerOptions lower_;
  // [dp][micro-batch][virtual stage]: the level a pair runs at when not the micro-batch's own
  // (WithLevelsOf); empty: every pair at its micro-batch's level.
  std::vector<std::vector<std::vector<Recompute>>> levels_;
};

// A shorter order for one replica, by its schedule estimate (schedule/estimator.h; DynaPipe's
// order search picks among cluster permutations, this one refines a given order):
//  1. the start order, and the "organ pipe" of its micro-batches (by total time over the stages:
//     the shortest first and last, the longest in the middle, so that neither the fill nor the
//     drain of the pipeline waits for a long one); the shorter that fits the budget is kept;
//  2. descent: first-improvement sweeps of insertion moves (micro-batch at position i moved to
//     position j, i and j ascending), and when a sweep improves nothing, a sweep of swaps
//     (positions i < j - 1 exchanged); again until neither improves;
//  3. with `kicks` (iterated local search): from the best order, three micro-batches moved to
//     random places (seeded by d and the replica's size), the descent again, the result kept when
//     shorter; until 2 m kicks in a row found nothing (a small replica does not spend the whole
//     bound on orders it has seen).
// Steps 2-3 end when `max_estimates` estimates were spent or the deadline has passed.
// With exhaustive_up_to >= m (at most 10), every permutation is estimated instead (steps 1-3
// skipped; max_estimates does not apply): the best order by the estimate, for measuring what
// the search leaves (the oracle of docs/benchmarks.md).
// A candidate counts only when its schedule fits the memory budget and its makespan is strictly
// shorter. Deterministic: a pure function of the costs, the start order and the bounds.
struct OrderSearch {
  std::vector<int64_t> order;  // the best order found (the start order when nothing was shorter)
  Duration start_makespan;     // estimate of the start order (Infinite when it does not fit)
  Duration makespan;           // estimate of `order`
  int64_t estimates = 0;       // schedules estimated
  int64_t moves = 0;           // improvements taken
  bool deadline_hit = false;   // the deadline ended the search (the result depends on timing)
};
// Errors: `start` is not a permutation of replica d's micro-batches, or the generator's errors.
// With a deadline, steps 1-3 also stop when it has passed (checked before each estimate).
// Errors also: exhaustive_up_to outside 0..10.
// One ReplicaOrderSearch run once to its bounds (below).
StatusOr<OrderSearch> SearchReplicaOrder(
    const Relowerer& relowerer, int64_t d, std::span<const int64_t> start, int64_t max_estimates,
    int64_t exhaustive_up_to = 0,
    std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt,
    bool kicks = true);

// The same search, resumable: Run goes on from where the last Run stopped (the phase, the sweep's
// positions, the kick's order, the generator's state), so that runs in pieces end where one run
// to the same bounds ends (OrderSearchTest checks it). The optimizer spends its estimates on the
// replica estimated longest, a piece at a time (see optimizer.h).
// REQUIRES: the relowerer outlives the search.
class ReplicaOrderSearch {
 public:
  // Estimates `start` (one estimate). Errors as SearchReplicaOrder's.
  static StatusOr<ReplicaOrderSearch> Start(const Relowerer& relowerer, int64_t d,
                                            std::span<const int64_t> start,
                                            int64_t exhaustive_up_to = 0, bool kicks = true);

  // Searches until `max_estimates` estimates were spent since Start (the start's included), the
  // deadline has passed (deadline_hit), the best makespan is shorter than `stop_below` (checked
  // before each estimate; Zero: never), or the search has converged. The exhaustive enumeration
  // stops only at `stop_below` or at its end.
  Status Run(int64_t max_estimates,
             std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt,
             Duration stop_below = Duration::Zero());

  // The best order so far (a kick's order when it is shorter than the best before it).
  OrderSearch result() const;
  Duration makespan() const;
  int64_t estimates() const { return estimates_; }
  // Nothing is left to search (the descent and the kicks ended, or the enumeration did).
  bool converged() const { return phase_ == Phase::kDone; }
  // The last Run ended because its deadline had passed.
  bool deadline_hit() const { return deadline_hit_; }

 private:
  enum class Phase { kExhaustive, kOrgan, kDescent, kKickStart, kKickDescent, kDone };
  ReplicaOrderSearch(const Relowerer& relowerer, int64_t d, bool kicks);
  StatusOr<Duration> Estimate(const std::vector<int64_t>& order);
  // Moves (i_, j_) to the descent's next move, starting the next sweep when one ends; false when
  // the descent has ended (a sweep of swaps after one of insertions improved nothing).
  bool NextMove();
  void BeginDescent();

  const Relowerer* relowerer_;
  int64_t d_;
  int64_t m_;
  bool kicks_;
  Phase phase_ = Phase::kDone;
  std::vector<int64_t> order_;  // the best order
  Duration start_makespan_;
  Duration makespan_;
  int64_t estimates_ = 0;
  int64_t moves_ = 0;
  bool deadline_hit_ = false;
  std::vector<int64_t> perm_;  // the enumeration's next permutation
  // The descent: its sweep (insertions, or swaps), the next move (i_, j_), whether this round's
  // sweeps improved.
  bool swaps_ = false;
  int64_t i_ = 0;
  int64_t j_ = 0;
  bool improved_ = false;
  // The kicks: the order being descended from a kick, its estimate, the generator, the kicks in a
  // row that found nothing.
  std::vector<int64_t> kicked_;
  Duration kicked_makespan_;
  int64_t kicked_moves_ = 0;
  Rng rng_;
  int64_t idle_ = 0;
  std::vector<int64_t> candidate_;
  ScheduleCosts scratch_;
};

}  // namespace sluice
