// What-if with another plan's order (dPRO §1.5's "what if the schedule changed"): the trace of a
// run of plans A is replayed in the instruction order of plans B of the same batches (another
// schedule, an optimized order), each of B's instructions priced with what A measured.
//
// Build. A's trace is tied to its plans (FitCalibration's check: every rank's ops of iteration k
// are plan k's instructions). Each of B's instructions is priced, in this order of preference:
//   1. measured: the op of A that is the same instruction — the same op kind, virtual stage, peer
//      and bucket of the same micro-batch (the same sample rows and shape, wherever B puts it in
//      its order) — on the same rank and iteration: its own time and the gap before it;
//   2. class: else the median own time and gap of A's ops of its class (op kind x stage x
//      micro-batch shape x recompute x peer) on the rank in that iteration, else in any iteration
//      (free-buffer ops: their kind only; their slots differ between plans);
//   3. derived: a backward-input / backward-weight of B where A ran the micro-batch's full
//      backward (1f1b -> zb-h1): A's measured backward split in the ratio of B's two planned
//      durations; a full backward of B where A ran the halves: their sum;
//   4. calibrated: the cost model: A's calibration line of its (stage, op) (calibration.h) at the
//      instruction's features; its gap the median gap of A's ops of that kind on the rank;
//   5. plan: the plan's own duration (an op kind A's trace has not at all).
// A transfer of B takes the per-iteration replay's time of A's transfer of the same message (the
// same (sending rank, op, stage, micro-batch)), rendezvous or eager as it went in A; a collective
// the time of A's collective that its posts match. Data dependencies (F -> B / I, I -> W) and
// every rank's stream order come from B's programs. Each node's measured times are A's (the
// rank's first and last op of the iteration), so that the replay's "measured" is A's iteration.
// Errors (naming the file): B of another model, parallel layout or batch (sample ids) than A,
// fewer or more B files than A's, a collective of B that none of A's matches, a B whose
// dependencies form a cycle (a plan that deadlocks).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "plan/execution_plan.h"
#include "trace/analyze.h"

namespace sluice::trace {

// How many of B's instructions each rule priced (plan_whatif.h's order).
struct PlanPricing {
  int64_t measured = 0;
  int64_t by_class = 0;
  int64_t derived = 0;
  int64_t calibrated = 0;
  int64_t plan = 0;
  int64_t transfers_measured = 0;  // B's transfers with A's transfer of the same message
  int64_t transfers_by_class = 0;  // the median of A's transfers of its (ranks, key) otherwise
  int64_t collectives = 0;
  std::vector<std::string> examples;  // up to 8 instructions priced by the cost model (4., 5.)
};

struct PlanWhatIf {
  TraceSet set;  // B's instructions as ops (name InstructionText, stream 0)
  Graph graph;   // replay it with Replay(graph, set, options)
  PlanPricing pricing;
};

// `ran[k]` is the plan iteration k of `a` ran; `what_if[k]` B's plan for the same batch, read
// from `files[k]` (for messages).
StatusOr<PlanWhatIf> BuildPlanWhatIf(const Analysis& a, const std::vector<ExecutionPlan>& ran,
                                     const std::vector<ExecutionPlan>& what_if,
                                     const std::vector<std::string>& files);

// Replays `w` per iteration (each iteration from A's measured start) and whole-run (chained), with
// `what_if` applied too, into r->what_if_per_iteration and r->what_if_whole_run; r->what_if_plan
// becomes `name`.
Status ReplayPlanWhatIf(const PlanWhatIf& w, const std::vector<WhatIf>& what_if,
                        const std::string& name, Replays* r);

// "priced: 120 measured, 4 by class, ..., transfers: ..." and the cost-model examples.
std::string PricingText(const PlanPricing& p);

}  // namespace sluice::trace
