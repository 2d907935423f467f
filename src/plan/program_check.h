// Per-rank checks of ValidatePlan (validate.h, checks 3 and 5), one program at a time.
//
// CheckProgramFields looks at each instruction alone: its micro-batch, stage, peer, tag, slot ids,
// shapes and byte counts against what the op and the plan's micro-batch shapes require.
// CheckProgramOrder walks the program in order with the rank's compute, buffer and transfer
// state. Both return the first problem with the index of the instruction it is about.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "plan/execution_plan.h"

namespace sluice {

struct ProgramProblem {
  int64_t index = -1;  // instruction index in the program; the program's size for "at the end"
  std::string message;
};

// REQUIRES: the plan's structure is valid (validate.h check 1).
std::optional<ProgramProblem> CheckProgramFields(const ExecutionPlan& plan,
                                                 const RankProgram& program);
// REQUIRES: CheckProgramFields passed for `program`.
std::optional<ProgramProblem> CheckProgramOrder(const ExecutionPlan& plan,
                                                const RankProgram& program);

}  // namespace sluice
