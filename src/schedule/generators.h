// Pipeline schedule generators: GPipe, 1F1B, interleaved 1F1B, zero-bubble ZB-H1 and DynaPipe's
// adaptive schedule, each over per-micro-batch, per-virtual-stage costs (micro-batches differ).
//
// Every generator returns, for valid input, a ScheduleResult: a complete schedule (it passes
// CheckScheduleComplete and runs without deadlock) with its EstimateSchedule, and the outcome
// kOk when every rank's activation peak is within ScheduleCosts::budget, else kOutOfMemory with
// the reason (infeasible is an outcome, not an error). A Status error means invalid input: an
// empty or ragged cost table, negative costs, a kind that does not support costs.vpp.
// The rules, with their memory behaviour, are in docs/schedules.md:
//  - gpipe (vpp = 1): all F in micro-batch order, then all B in micro-batch order.
//  - 1f1b (vpp = 1): rank r runs min(pp - r - 1, m) warm-up F, then F/B pairs, then the rest B.
//  - interleaved (any vpp; vpp = 1 is 1f1b): Megatron's interleaved 1F1B over groups of pp
//    micro-batches; a last group of m mod pp micro-batches is scheduled like the others
//    (Megatron's microbatch_group_size_per_vp_stage = pp), so m need not divide by pp.
//  - zb-h1 (vpp = 1): B split into I and W; a greedy list scheduler runs I first, then F (at most
//    pp - r awaiting their I on rank r), and spends idle time or memory pressure on pending W,
//    keeping every rank within the 1F1B memory bound (the pipeline's 1F1B peak, and the budget).
//  - adaptive (any vpp): DynaPipe's memory-throttled cyclic order (a new micro-batch enters only
//    when its activations fit every rank's budget beside those in flight, and fewer than
//    max_in_flight are in flight), executed event-driven without cycle barriers.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "batching/micro_batch.h"
#include "schedule/action.h"
#include "schedule/estimator.h"

namespace sluice {

enum class ScheduleKind { kGPipe, k1F1B, kInterleaved, kZbH1, kAdaptive };

// "gpipe" | "1f1b" | "interleaved" | "zb-h1" | "adaptive".
std::string_view ScheduleKindName(ScheduleKind kind);
// The inverse of ScheduleKindName; the error lists the allowed names.
StatusOr<ScheduleKind> ParseScheduleKind(std::string_view name);
// Every kind, in the order above.
std::vector<ScheduleKind> AllScheduleKinds();
// Whether `kind` schedules `vpp` virtual stages per rank (gpipe, 1f1b, zb-h1: vpp = 1 only).
bool SupportsVpp(ScheduleKind kind, int64_t vpp);

struct ScheduleOptions {
  // adaptive: most micro-batches in flight (entered, backward of stage 0 not yet run); 0 = only
  // memory limits it.
  int64_t max_in_flight = 0;
};

struct ScheduleResult {
  PlanOutcome outcome = PlanOutcome::kOk;
  std::string infeasible_reason;  // set when outcome != kOk
  // The schedule (for kOutOfMemory: the one that did not fit, when one was built; generators
  // that stop early leave it empty) and its estimate.
  Schedule schedule;
  ScheduleEstimate estimate;
};

// Checks `costs` for the generators: pp >= 1, vpp >= 1, at least one micro-batch, pp * vpp
// stages per micro-batch, p2p empty or [m][pp * vpp - 1], budget empty or pp entries, durations
// and bytes non-negative, stored_until_w <= stored.
Status ValidateScheduleCosts(const ScheduleCosts& costs);

// Generates `kind` for `costs` (see above). Errors: invalid costs, vpp not supported by `kind`.
StatusOr<ScheduleResult> GenerateSchedule(ScheduleKind kind, const ScheduleCosts& costs,
                                          const ScheduleOptions& options = {});

// The static per-rank orders, without costs (for tests and golden files). REQUIRES: pp, vpp, m
// >= 1 (vpp = 1 except for the interleaved order).
Schedule GPipeOrder(int64_t pp, int64_t m);
Schedule OneFOneBOrder(int64_t pp, int64_t m);
Schedule InterleavedOrder(int64_t pp, int64_t vpp, int64_t m);

}  // namespace sluice
