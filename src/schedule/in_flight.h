// InFlightPolicyFor: the in-flight rule (batching/stage_cost.h) that the micro-batches run by a
// pipeline schedule are sized for. The one mapping from schedule to rule: the planner's
// evaluators (planner/planner.h MakePlannerEvaluator) and every caller that prices micro-batches
// for a schedule use it.
//
// Thread safety: a pure function.
#pragma once

#include <cstdint>

#include "batching/stage_cost.h"
#include "schedule/generators.h"

namespace sluice {

// GPipe keeps every micro-batch's activations (kGPipe); interleaved 1F1B with vpp > 1 keeps
// Megatron's interleaved count (kInterleaved); 1F1B, ZB-H1, adaptive and interleaved at vpp = 1
// keep at most a pipeline's depth (k1F1B).
constexpr InFlightPolicy InFlightPolicyFor(ScheduleKind kind, int64_t vpp) {
  if (kind == ScheduleKind::kGPipe) return InFlightPolicy::kGPipe;
  if (kind == ScheduleKind::kInterleaved && vpp > 1) return InFlightPolicy::kInterleaved;
  return InFlightPolicy::k1F1B;
}

}  // namespace sluice
