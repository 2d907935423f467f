// Per-rank checks of ValidatePlan (validate.h, checks 3 and 5), one program at a time.
//
// CheckProgramFields looks at each instruction alone: its micro-batch, stage, peer, tag, slot ids,
// shapes and byte counts against what the op and the plan's micro-batch shapes require. Its first
// part, CheckInstructionIndices, is what anything that indexes by an instruction's fields needs;
// the simulator, which also runs plans that fail the check, checks exactly that.
// CheckProgramOrder walks the program in order with the rank's compute, buffer and transfer
// state. Both return the first problem with the index of the instruction it is about.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "plan/execution_plan.h"

namespace sluice {

struct ProgramProblem {
  int64_t index = -1;  // instruction index in the program; the program's size for "at the end"
  std::string message;
};

struct InstructionProblem {
  std::string_view field;  // the instruction's JSON field: "in", "out", "stage", "mb", "peer",
                           // "group", "send", "recv"
  std::string message;
};

// The fields of `in` that index something: every slot id in [0, buffer_slots); free-buffer
// releases one slot and writes none, a receive start writes one slot and reads none; a compute op
// (F, B, I, W) runs a stage of this pipeline rank for a micro-batch of the replica; a
// point-to-point op's peer is another rank of the plan; an all-to-all runs a stage of this rank
// for a micro-batch of the replica, its group lists distinct ranks of the plan including this
// one, with one send and one receive split per member, and it has no slots. Returns the first
// problem.
// REQUIRES: program.dp_index names one of plan.replicas.
std::optional<InstructionProblem> CheckInstructionIndices(const ExecutionPlan& plan,
                                                          const RankProgram& program,
                                                          const Instruction& in);

// CheckInstructionIndices, then the rest. REQUIRES: the plan's structure is valid (validate.h
// check 1).
std::optional<ProgramProblem> CheckProgramFields(const ExecutionPlan& plan,
                                                 const RankProgram& program);
// REQUIRES: CheckProgramFields passed for `program`.
std::optional<ProgramProblem> CheckProgramOrder(const ExecutionPlan& plan,
                                                const RankProgram& program);

}  // namespace sluice
