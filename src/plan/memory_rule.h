// The plan's memory rule: what one rank of an ExecutionPlan holds, replayed in program order.
// It is the one rule that decides whether a plan fits: ValidatePlan's check 7, PredictPeakMemory,
// the planner's check of every lowered plan (planner/planner.h) and `sluice plan check` use it,
// and the simulator's memory level is this rule's level laid on its compute stream's time axis
// (sim/simulator.h), so its peak is this rule's peak (docs/simulator.md, "Memory").
//
// A rank's level is its model states plus
//  - activations, from the plan's per-stage ChunkCost: F adds `peak` at its start and at its end
//    gives the peak back and keeps `stored`; B and I add max(0, peak - stored) while they run and
//    at their end free `stored` (I: all but `stored_until_w`); W frees `stored_until_w` at its
//    end;
//  - buffers (count_buffers): every slot from the instruction that allocates it (a compute op's
//    output at its start, a load, a receive's post) until its free-buffer, at the bytes of its
//    tensors (fp16 boundary tensors, int64 token ids and labels), except that an activation slot
//    a forward reads (its stage input) is inside that forward's `stored` from the forward's start
//    until the end of the B or I of the same micro-batch and stage, so it is counted once.
// Changes apply in program order, those of one instruction in the order above (a compute op's
// start before its end); the level is checked after every change and the peak is the highest.
// Program order is the order in which the runtime allocates and frees (its tensors, received
// buffers included, are created on the compute stream when the host reaches the instruction), so
// the rule is that of a stream-ordered caching allocator without fragmentation.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>

#include "base/units.h"
#include "plan/execution_plan.h"

namespace sluice {

struct MemoryRuleOptions {
  // Count buffers (slots) as well as activations; false: model states + activations only (the
  // figure of the simulator's --no-buffers).
  bool count_buffers = true;
};

// What the rule finds on one rank. Levels include the model states.
struct RankMemory {
  Bytes peak;                     // highest level
  int64_t peak_instruction = -1;  // the instruction whose change reached it (-1: model states)
  Bytes peak_activations;         // activations at the peak
  Bytes peak_buffers;             // live buffers at the peak
  // The first instruction whose change put the level above the limit (-1: never), and the level,
  // activations and buffers right after that change.
  int64_t first_over = -1;
  Bytes over_level, over_activations, over_buffers;
};

// Replays the rule on `program` (a rank of `plan`) against `limit`.
// REQUIRES: the plan passes ValidatePlan's checks 1-3 (structure, samples, fields); programs that
// fail check 5 (buffers used out of order) are replayed without crashing, with figures that mean
// nothing.
RankMemory ReplayRankMemory(const ExecutionPlan& plan, const RankProgram& program, Bytes limit,
                            const MemoryRuleOptions& options = {});

}  // namespace sluice
