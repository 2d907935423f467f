// Internal to schedule/: the two generators whose per-rank order depends on the costs.
//
// Both simulate the pipeline to decide the order, then leave timing to EstimateSchedule. Each
// returns "" and fills `out` (name, pp, vpp, num_microbatches, ranks) on success, or the reason
// the micro-batches cannot fit memory (then `out` is left partly filled and must not be used).
// REQUIRES: ValidateScheduleCosts(costs) is OK.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/units.h"
#include "schedule/action.h"

namespace sluice::schedule_internal {

// ZB-H1 by greedy list scheduling (generators.h): `bound` is the activation bound per rank.
// REQUIRES: costs.vpp == 1, bound.size() == pp.
std::string ZbH1Order(const ScheduleCosts& costs, const std::vector<Bytes>& bound, Schedule* out);

// DynaPipe's memory-throttled cyclic order (generators.h). `max_in_flight` 0 = unlimited.
std::string AdaptiveOrder(const ScheduleCosts& costs, int64_t max_in_flight, Schedule* out);

}  // namespace sluice::schedule_internal
