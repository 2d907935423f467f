// PlanPass: one rewrite of an ExecutionPlan (plan -> plan), with a record of what it changed.
//
// A pass keeps a valid plan valid: given a plan that passes ValidatePlan (plan/validate.h), the
// plan it leaves passes it too (memory check included). Passes that build the new program from
// rules that always hold (gradient bucketing) say so; passes whose rewrite may break a check on a
// given plan (a reorder that would reuse a slot still live, or go over the memory limit) run
// ValidatePlan on their result and, when it fails, leave the plan as it was and record why
// (PassRecord::changed = false). Either way the caller gets a valid plan back.
//
// Passes are deterministic: the same plan and pass give the same result. They change only the
// rank programs (and the plan fields their header names), never samples or micro-batch shapes.
//
// Thread safety: passes are immutable values; Run may be called concurrently on distinct plans.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "plan/execution_plan.h"

namespace sluice::passes {

// What one pass run did to a plan.
struct PassRecord {
  std::string pass;                  // the pass's Describe(), e.g. "bucket(16 MiB)"
  bool changed = false;              // the plan differs from the one given
  std::vector<std::string> changes;  // one line per change, e.g. "rank 3: 2W5 before 2F7"
  std::string rejected;              // why nothing changed (empty when changed or a no-op)
  // Applied, but less than the pass aims for, and why (e.g. an MoE overlap that interleaves fewer
  // B/F pairs because all of them break the memory limit); empty otherwise.
  std::string degraded;

  friend bool operator==(const PassRecord&, const PassRecord&) = default;
};

class PlanPass {
 public:
  virtual ~PlanPass() = default;
  // A short text naming the pass and its parameters, e.g. "move-compute(rank 2, op 14, +1)".
  virtual std::string Describe() const = 0;
  // Rewrites *plan in place. REQUIRES: *plan passes ValidatePlan. Returns the record; on return
  // *plan passes ValidatePlan. Errors only for parameters that do not fit the plan (a rank or an
  // instruction index outside it: InvalidArgument naming the field and the allowed range).
  virtual StatusOr<PassRecord> Run(ExecutionPlan* plan) const = 0;
};

// Runs `pass` on a copy of `plan`: {new plan, record}. Errors: Run's.
struct PassResult {
  ExecutionPlan plan;
  PassRecord record;
};
StatusOr<PassResult> ApplyPass(const PlanPass& pass, const ExecutionPlan& plan);

// Validates *candidate (ValidatePlan with the memory check), in which only rank `rank`'s program
// was rewritten from `original`; when it fails, that program is restored, record->changed =
// false, record->changes is cleared and record->rejected = the first line of the validator's
// message. Returns whether the candidate was kept. Used by passes whose rewrite may break a check.
bool KeepIfValid(int64_t rank, RankProgram original, ExecutionPlan* candidate, PassRecord* record);

}  // namespace sluice::passes
