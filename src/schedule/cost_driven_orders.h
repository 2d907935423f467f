// Internal to schedule/: the two generators whose per-rank order depends on the costs, each in a
// file named after it: ZB-H1 (zb_h1_schedule.cc) and DynaPipe's adaptive schedule
// (adaptive_schedule.cc).
//
// Both simulate the pipeline to decide the order; the adaptive one leaves timing to
// EstimateSchedule, ZB-H1's simulation times its list as EstimateSchedule would (ListTimes). Each
// returns "" and fills `out` (name, pp, vpp, num_microbatches, ranks) on success, or the reason
// the micro-batches cannot fit memory (then `out` is left partly filled and must not be used).
// REQUIRES: ValidateScheduleCosts(costs) is OK.
//
// Thread safety: pure functions.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "base/units.h"
#include "schedule/action.h"

namespace sluice::schedule_internal {

// Sets `out`'s name and shape from `c` and empties its rank lists (capacity kept).
inline void InitSchedule(const ScheduleCosts& c, const char* name, Schedule* out) {
  out->name = name;
  out->pp = c.pp;
  out->vpp = c.vpp;
  out->num_microbatches = c.num_microbatches();
  out->ranks.assign(static_cast<size_t>(c.pp), {});
  for (std::vector<Action>& r : out->ranks) {
    r.clear();
    r.reserve(static_cast<size_t>(3 * c.num_microbatches() * c.vpp));
  }
}

// Bytes a backward needs beyond the held activations: max(0, peak - stored).
inline int64_t Transient(const ChunkCost& c) {
  return std::max<int64_t>(0, c.peak.count() - c.stored.count());
}

// Per rank, as the generator's simulation timed and walked its list: time computing, end of its
// last action, and its memory peak (RankPeakMemory of the list).
struct ListTimes {
  std::vector<Duration> busy, finish;
  std::vector<Bytes> peak;
};

// ZB-H1's activation bound per rank: the pipeline's 1F1B peak, capped by each rank's budget.
std::vector<Bytes> ZbH1Bound(const ScheduleCosts& costs);

// ZB-H1 by greedy list scheduling (generators.h): `bound` is the activation bound per rank. With
// `times`, the simulation's timing and memory peaks of the list, which are EstimateSchedule's
// (zb_h1_schedule.cc): the generator then replays nothing (EstimateTimedSchedule). `out` may be
// null: the lists are not kept (for timing only).
// REQUIRES: costs.vpp == 1, bound.size() == pp.
std::string ZbH1Order(const ScheduleCosts& costs, const std::vector<Bytes>& bound, Schedule* out,
                      ListTimes* times = nullptr);

// DynaPipe's memory-throttled cyclic order (generators.h). `max_in_flight` 0 = unlimited.
std::string AdaptiveOrder(const ScheduleCosts& costs, int64_t max_in_flight, Schedule* out);

}  // namespace sluice::schedule_internal
