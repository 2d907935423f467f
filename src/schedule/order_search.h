// SearchMicroBatchOrder: DynaPipe's micro-batch order search, scored by EstimateSchedule.
//
// The order micro-batches enter the pipeline changes both the makespan (a long micro-batch
// late in the order leaves a long cool-down) and the memory peak (which micro-batches are in
// flight together). The search (docs/schedules.md §order search):
//  1. candidates: the given order; longest first (by total time over stages); with at most
//     `exhaustive_up_to` micro-batches every permutation; otherwise k-means clusters on
//     (forward of the first stage, forward of the last, backward of the first, backward of the
//     last) with k = 4 (3 above 20 micro-batches, DynaPipe's rule), deterministic farthest-point
//     initialisation, and for every permutation of the clusters one order with each cluster's
//     micro-batches in their given order plus `shuffles` orders with them shuffled by an Rng
//     seeded from `seed`;
//  2. each distinct candidate is generated with the schedule kind and estimated; candidates that
//     do not fit memory are dropped;
//  3. the feasible candidate with the smallest makespan wins; ties go to the earlier candidate,
//     so the result is never worse than the given order when that fits.
// The result is a pure function of the costs, the kind and the options.
//
// Thread safety: pure function.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/units.h"
#include "batching/micro_batch.h"
#include "schedule/generators.h"

namespace sluice {

struct OrderSearchOptions {
  uint64_t seed = 0;             // the within-cluster shuffles
  int64_t clusters = 0;          // k; 0 = DynaPipe's rule (4, or 3 above 20 micro-batches)
  int64_t exhaustive_up_to = 5;  // try all m! orders when m is at most this (5! = 120)
  int64_t shuffles = 1;          // shuffled orders per cluster permutation
  ScheduleOptions schedule;      // passed to GenerateSchedule
};

struct OrderSearchResult {
  PlanOutcome outcome = PlanOutcome::kOk;  // kOutOfMemory: no candidate fits
  std::string infeasible_reason;
  // order[i] = index (in the given costs) of the micro-batch that runs i-th. Apply it to the
  // replica's micro-batches: the schedule's actions number micro-batches in this new order.
  std::vector<int64_t> order;
  ScheduleResult result;    // the best candidate's schedule and estimate
  Duration given_makespan;  // the given order's makespan (Infinite when it does not fit)
  int64_t candidates = 0;   // distinct orders scored
  int64_t feasible = 0;     // of which fit memory
};

// Errors: invalid costs or a kind that does not support costs.vpp (as GenerateSchedule), or
// options out of range (clusters < 0, exhaustive_up_to < 0 or > 8, shuffles < 0).
StatusOr<OrderSearchResult> SearchMicroBatchOrder(ScheduleKind kind, const ScheduleCosts& costs,
                                                  const OrderSearchOptions& options = {});

// The clusters of step 1: cluster index per micro-batch, clusters numbered by decreasing
// centroid total (0 = the longest). Exposed for tests. REQUIRES: valid costs, k >= 1.
std::vector<int64_t> ClusterMicroBatches(const ScheduleCosts& costs, int64_t k);

}  // namespace sluice
