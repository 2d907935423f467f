// Reordering passes: the order of compute and the posting of transfers on one rank.
//
// The simulator (sim/simulator.h) runs a rank's compute ops on one stream in program order and
// blocks its issue at every *Finish until the transfer is done, so where a compute op or a Start
// sits in the program decides when it runs. The lowering places them by its own estimate of the
// timeline (plan/lower.h), which knows neither link contention nor collectives nor load times;
// these passes move them where the simulated critical path says the estimate was wrong.
//
//  - MoveComputePass(rank, k, to): the rank's k-th compute op (0-based, program order) becomes
//    its `to`-th, moved past its neighbours one swap at a time. A compute op moves with the
//    LoadInput and *Finish ops of its own micro-batch and stage right before it and the
//    FreeBuffers right after it; Starts that send what it produced and FreeBuffers of the
//    slots it uses move with it when it moves later. This is micro-batch order on one rank
//    (an F past another F), and W placement for zero-bubble schedules (a W moved into the gap
//    before a compute that waits for a transfer, or out of the way of the critical path).
//  - HoistStartPass(rank, i, by): the Start at instruction i is posted `by` instructions earlier
//    (communication priority: a receive posted before a Finish that blocks the rank, or one
//    transfer before another on a shared link). A transfer runs once both sides have posted it,
//    so posting earlier lets it start earlier.
//
// Both check their result with ValidatePlan (pass.h, KeepIfValid): a move that would reorder the
// messages between two ranks, read a slot before it is written or after it is freed, reuse a slot
// that is still live, reduce a stage before its last backward, or go over the memory limit leaves
// the plan as it was, with the reason in the record.
//
// Thread safety: immutable values.
#pragma once

#include <cstdint>
#include <string>

#include "passes/pass.h"

namespace sluice::passes {

class MoveComputePass final : public PlanPass {
 public:
  MoveComputePass(int64_t rank, int64_t from, int64_t to) : rank_(rank), from_(from), to_(to) {}
  std::string Describe() const override;
  // Errors: rank outside 0..ranks-1, from or to outside 0..(compute ops of the rank)-1.
  StatusOr<PassRecord> Run(ExecutionPlan* plan) const override;

 private:
  int64_t rank_, from_, to_;
};

class HoistStartPass final : public PlanPass {
 public:
  HoistStartPass(int64_t rank, int64_t index, int64_t by) : rank_(rank), index_(index), by_(by) {}
  std::string Describe() const override;
  // Errors: rank outside the plan, index not a *Start op of the rank, by outside 1..index.
  StatusOr<PassRecord> Run(ExecutionPlan* plan) const override;

 private:
  int64_t rank_, index_, by_;
};

// Positions (instruction indices) of the compute ops of `program`, in program order.
std::vector<int64_t> ComputePositions(const RankProgram& program);

}  // namespace sluice::passes
