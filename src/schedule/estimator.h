// EstimateSchedule: a fast event-driven estimate of a schedule's makespan and per-rank peak
// activation memory, cheap enough to score hundreds of candidate orders per global batch.
//
// Model (docs/schedules.md §estimator):
//  - Each rank has one compute stream that runs its action list in order. An action starts when
//    its rank is free and its inputs are there (schedule/dependencies.h): F(s) needs F(s-1) of
//    the micro-batch and the activation transfer; B/I(s) needs F(s) and B/I(s+1) plus the
//    gradient transfer (the last stage needs only its F); W(s) needs I(s). Durations come from
//    ScheduleCosts.
//  - A transfer between different ranks uses the channel of its (sender, receiver) direction,
//    one per ordered pair of neighbouring ranks (r -> r+1 and r -> r-1, mod pp); transfers on a
//    channel run one at a time in the order their data became ready. Stages on the same rank hand
//    over for free.
//  - Memory per rank follows its list order only (so it does not depend on timing): F holds
//    `stored` from its end until the stage's B, or until I for stored - stored_until_w and until W
//    for stored_until_w, and its held buffers (ScheduleCosts::held) from its start until B or I.
//    While an action runs the rank also needs: F its `peak` (its own high-water mark, stored
//    included); B and I the transient max(0, peak - stored); W nothing. This is the schedule's
//    share of the plan's memory rule (plan/memory_rule.h), which the lowered plan is checked
//    against; the budgets keep room for the buffers it counts beyond `held`.
//  - A rank whose next action can never start is a deadlock: the estimate says which ranks stop
//    where and what they wait for; it never hangs.
// Cost: O(A) time for A actions (each rank runs its list as far as its inputs are known; no event
// queue: the times do not depend on the order ranks are advanced in), vectors sized once per
// call, nothing allocated per action.
//
// Thread safety: a pure function of its arguments.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/units.h"
#include "schedule/action.h"

namespace sluice {

struct ScheduleEstimate {
  // Every action ran. False on a deadlock or an input the estimator cannot interpret (an action
  // outside the costs' micro-batches or stages, on a rank that does not own its stage, or costs
  // whose shape differs from the schedule's); `problem` then says which.
  bool completed = false;
  std::string problem;
  Duration makespan;               // end of the last action (0 for an empty schedule)
  std::vector<Duration> busy;      // [rank] sum of its action durations
  std::vector<Duration> finish;    // [rank] end of its last action
  std::vector<Bytes> peak_memory;  // [rank] high-water mark of activations and held buffers
  double bubble_fraction = 0;      // 1 - sum(busy) / (pp * makespan); 0 when makespan is 0
  // Every rank's peak is within its budget (ScheduleCosts::budget; no budget = unlimited).
  bool fits_memory = true;
  std::string memory_problem;  // the first rank over budget, when !fits_memory

  // Idle share of one rank: 1 - busy[rank] / makespan (0 when makespan is 0).
  double RankBubbleFraction(int64_t rank) const;
  // Idle time of one rank: makespan - busy[rank].
  Duration RankIdle(int64_t rank) const { return makespan - busy[rank]; }
};

// Duration of `a` under `costs`: F forward; I backward_input; W backward_weight; B both.
// REQUIRES: a's micro-batch and stage inside costs.
Duration ActionDuration(const Action& a, const ScheduleCosts& costs);

// The memory rule above, one action at a time: the bytes of activations and held buffers a rank
// holds after the actions applied so far, and their high-water mark. RankPeakMemory walks a whole
// list; a generator that builds its list action by action (ZB-H1) walks it as it goes.
struct MemoryWalk {
  int64_t held = 0;
  int64_t peak = 0;

  // REQUIRES: a's micro-batch and stage inside costs.
  void Apply(const Action& a, const ScheduleCosts& costs) {
    const ChunkCost& c = costs.chunks[a.microbatch][a.stage];
    const int64_t transient = std::max<int64_t>(0, c.peak.count() - c.stored.count());
    const int64_t buffers = costs.Held(a.microbatch, a.stage).count();
    switch (a.kind) {
      case ActionKind::kForward:
        Peak(held + c.peak.count() + buffers);
        held += c.stored.count() + buffers;
        break;
      case ActionKind::kBackward:
        Peak(held + transient);
        held -= c.stored.count() + buffers;
        break;
      case ActionKind::kBackwardInput:
        Peak(held + transient);
        held -= c.stored.count() - c.stored_until_w.count() + buffers;
        break;
      case ActionKind::kBackwardWeight:
        Peak(held);
        held -= c.stored_until_w.count();
        break;
    }
  }

 private:
  void Peak(int64_t bytes) { peak = std::max(peak, bytes); }
};

// High-water mark of activations and held buffers of one rank running `list` in order (the
// memory rule above).
// REQUIRES: every action's micro-batch and stage inside costs.
Bytes RankPeakMemory(std::span<const Action> list, const ScheduleCosts& costs);

// REQUIRES nothing: malformed input yields completed == false with a problem description.
// costs.p2p may be empty (free transfers); costs.budget may be empty (unlimited memory).
ScheduleEstimate EstimateSchedule(const Schedule& schedule, const ScheduleCosts& costs);

// The estimate of a schedule that its generator already timed and walked under this model
// (ZB-H1's simulation, schedule/cost_driven_orders.h): the timing from `busy` and `finish`, the
// memory from `peak` (per rank, RankPeakMemory of its list) checked against the budget, without
// replaying the schedule. Equal to EstimateSchedule when those are the model's (generators_test
// checks it for ZB-H1).
// REQUIRES: busy.size() == finish.size() == peak.size() == pp, costs.budget empty or of size pp.
ScheduleEstimate EstimateTimedSchedule(const Schedule& schedule, const ScheduleCosts& costs,
                                       std::span<const Duration> busy,
                                       std::span<const Duration> finish,
                                       std::span<const Bytes> peak);

// How ReplaySchedule times a schedule (EstimateSchedule uses the defaults).
struct ReplayOptions {
  // Transfers queue on their channel (the model above); false: each takes its own time, as if
  // every transfer had a link of its own.
  bool channel_contention = true;
  // Every action and every transfer between ranks lasts at least this long (the lowering uses
  // 1 ns so that simulated events stay strictly ordered).
  Duration min_duration;
};

// When each action of a schedule runs.
struct ScheduleTimeline {
  bool completed = false;  // every action ran; else `problem` says why (as ScheduleEstimate)
  std::string problem;
  std::vector<std::vector<Duration>> start, end;  // [rank][list index] of the actions that ran
};

// The estimator's replay (the dependency rules of schedule/dependencies.h, the model above),
// recording every action's start and end. REQUIRES nothing, as EstimateSchedule.
ScheduleTimeline ReplaySchedule(const Schedule& schedule, const ScheduleCosts& costs,
                                const ReplayOptions& options = {});

}  // namespace sluice
