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
//  - interleaved (any vpp; vpp = 1 is 1f1b): Megatron's interleaved 1F1B over rounds of pp
//    micro-batches; when pp does not divide m, the last round is padded with phantom
//    micro-batches (InterleavedRounds::kPadded), or the micro-batches are cut into
//    max(1, m / pp) rounds of at least min(m, pp) (kFlexible: PyTorch's ScheduleInterleaved1F1B
//    rule, no idle slot at a chunk switch for more chunks in flight), or the shorter of the two
//    that fits the budget is taken (kAuto).
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

// How interleaved 1F1B (vpp > 1) groups micro-batches into rounds, each run chunk by chunk. The
// two orders differ only when pp does not divide m (docs/schedules.md, "interleaved").
enum class InterleavedRounds {
  kPadded,  // Megatron's rounds of pp; the last one padded with phantom micro-batches
  // max(1, m / pp) rounds of ceil(m / rounds) slots, the last ones with one phantom each, so
  // that every round runs >= min(m, pp) micro-batches (PyTorch's rule, for any m)
  kFlexible,
  kAuto,  // both: the flexible order when it fits the budget and is strictly shorter
};
// "padded" | "flexible" | "auto".
std::string_view InterleavedRoundsName(InterleavedRounds rounds);
// The inverse of InterleavedRoundsName; the error lists the allowed names.
StatusOr<InterleavedRounds> ParseInterleavedRounds(std::string_view name);
// The name of a schedule (and of a plan replica's schedule) in flexible rounds that differ from
// the padded ones.
inline constexpr std::string_view kInterleavedFlexName = "interleaved-flex";
// The kind of a schedule name as plans record it: ParseScheduleKind's names, and
// kInterleavedFlexName (interleaved).
StatusOr<ScheduleKind> ParsePlanScheduleName(std::string_view name);

struct ScheduleOptions {
  // adaptive: most micro-batches in flight (entered, backward of stage 0 not yet run); 0 = only
  // memory limits it.
  int64_t max_in_flight = 0;
  // interleaved with vpp > 1: the rounds (see InterleavedRounds).
  InterleavedRounds rounds = InterleavedRounds::kPadded;
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

// GenerateSchedule's estimated makespan, or Duration::Infinite() when its outcome is not kOk or
// its estimate did not complete: for searches that score many orders of the same micro-batches.
// ZB-H1 is timed by its generator alone, without building the lists or the estimate (about a
// third faster); the other kinds as GenerateSchedule. Errors: GenerateSchedule's.
StatusOr<Duration> ScheduleMakespan(ScheduleKind kind, const ScheduleCosts& costs,
                                    const ScheduleOptions& options = {});

// The static per-rank orders, without costs (for tests and golden files). REQUIRES: pp, vpp, m
// >= 1 (vpp = 1 except for the interleaved order).
Schedule GPipeOrder(int64_t pp, int64_t m);
Schedule OneFOneBOrder(int64_t pp, int64_t m);
// `rounds` is kPadded or kFlexible; the flexible order is named kInterleavedFlexName when it
// differs from the padded one.
Schedule InterleavedOrder(int64_t pp, int64_t vpp, int64_t m,
                          InterleavedRounds rounds = InterleavedRounds::kPadded);
// The slots per round of InterleavedOrder: pp for kPadded; for kFlexible ceil(m / max(1, m / pp))
// (m itself when m < pp). REQUIRES: pp, m >= 1, rounds != kAuto.
int64_t InterleavedRoundSize(int64_t pp, int64_t m, InterleavedRounds rounds);

// Per rank, the most (micro-batch, stage) chunks whose F has run and whose B (or I) has not, in
// the rank's list order: the activations a rank holds at once, in chunks.
std::vector<int64_t> ChunksInFlight(const Schedule& schedule);

}  // namespace sluice
