#include "passes/pass.h"

#include <utility>

#include "plan/validate.h"

namespace sluice::passes {

StatusOr<PassResult> ApplyPass(const PlanPass& pass, const ExecutionPlan& plan) {
  PassResult result{plan, {}};
  SLUICE_ASSIGN_OR_RETURN(result.record, pass.Run(&result.plan));
  return result;
}

bool KeepIfValid(int64_t rank, RankProgram original, ExecutionPlan* candidate, PassRecord* record) {
  // Only `rank` was rewritten and the plan was valid before (PlanPass::Run's REQUIRES):
  // ValidateRankRewrite gives ValidatePlan's result checking only what can have changed.
  const Status valid =
      ValidateRankRewrite(*candidate, rank, original, ValidateOptions{.grid_context = 0});
  if (valid.ok()) return true;
  candidate->ranks[rank] = std::move(original);
  const std::string& m = valid.message();
  record->rejected = m.substr(0, m.find('\n'));
  record->changed = false;
  record->changes.clear();
  return false;
}

}  // namespace sluice::passes
