// Recompute placement per (micro-batch, virtual stage).
//
// The batching method picks one recompute level per micro-batch (none, selective, full) so that
// the busiest stage fits memory; the other stages then recompute for nothing. RecomputePass sets
// the level of one (micro-batch, stage): its F, B or I and W take the new level and durations,
// and the plan's per-stage cost of that micro-batch (PlanMicroBatch::stages[stage], which the
// memory rule reads) becomes the new level's. PlanMicroBatch::recompute stays the batching
// method's choice; the instructions carry the level each (micro-batch, stage) runs at (the runtime
// follows the instruction's level).
//
// Prices come from a RecomputePricer: what the lowering would have recorded for that micro-batch
// at that level (the planner's pricer uses its StageCostEvaluator and the batch's samples,
// planner/recompute_pricer.h). A level that cannot be priced, or that puts the rank over the
// memory limit (ValidatePlan's check 7), leaves the plan as it was (pass.h, KeepIfValid).
//
// Thread safety: immutable values; a pricer must allow concurrent Price calls.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cost/cost_model.h"
#include "passes/pass.h"

namespace sluice::passes {

class RecomputePricer {
 public:
  virtual ~RecomputePricer() = default;
  // The per-virtual-stage costs (pp * vpp entries) micro-batch `microbatch` of replica
  // `dp_index` of `plan` has at `level`, as the lowering records them; nullopt when the cost
  // model cannot price it. REQUIRES: the indices are within the plan.
  virtual std::optional<std::vector<ChunkCost>> Price(const ExecutionPlan& plan, int64_t dp_index,
                                                      int64_t microbatch,
                                                      Recompute level) const = 0;
};

class RecomputePass final : public PlanPass {
 public:
  // REQUIRES: pricer != nullptr.
  RecomputePass(std::shared_ptr<const RecomputePricer> pricer, int64_t dp_index, int64_t microbatch,
                int64_t stage, Recompute level)
      : pricer_(std::move(pricer)),
        dp_index_(dp_index),
        microbatch_(microbatch),
        stage_(stage),
        level_(level) {}
  std::string Describe() const override;
  // Errors: dp_index, microbatch or stage outside the plan (InvalidArgument naming the range).
  StatusOr<PassRecord> Run(ExecutionPlan* plan) const override;

 private:
  std::shared_ptr<const RecomputePricer> pricer_;
  int64_t dp_index_, microbatch_, stage_;
  Recompute level_;
};

// Recompute placement over the whole plan: every (replica, micro-batch, stage) that recomputes
// is offered a lower level (none; selective after full), largest time saved first, and keeps it
// when its rank still fits the memory limit (greedy: the bytes a cheap saving takes are not
// offered to a bigger one later). The record lists every change. Prices: one Price call per
// (micro-batch, level). Memory: an offer whose largest possible rise stays within the limit over
// an upper bound of its rank's peak is taken without a replay of the rank (the bound then grows
// by that rise); otherwise the rank is replayed: the decisions are a replay per offer's.
// With a deadline (the optimizer's wall-clock budget), no option is tried after it: the plan
// keeps the options applied so far (the largest savings) and PassRecord::degraded says how many
// were left untried; a deadline that passes while the micro-batches are priced leaves the plan
// unchanged (degraded says how many were priced). Without one the result is deterministic.
class RecomputePlacementPass final : public PlanPass {
 public:
  using Deadline = std::chrono::steady_clock::time_point;
  // REQUIRES: pricer != nullptr.
  explicit RecomputePlacementPass(std::shared_ptr<const RecomputePricer> pricer,
                                  std::optional<Deadline> deadline = std::nullopt)
      : pricer_(std::move(pricer)), deadline_(deadline) {}
  std::string Describe() const override;
  StatusOr<PassRecord> Run(ExecutionPlan* plan) const override;

 private:
  std::shared_ptr<const RecomputePricer> pricer_;
  std::optional<Deadline> deadline_;
};

// The recompute level (micro-batch `microbatch`, stage `stage`) of replica `dp_index` runs at in
// `plan` (its F's), or nullopt when the plan has no such F. REQUIRES: dp_index < plan.dp().
std::optional<Recompute> RecomputeAt(const ExecutionPlan& plan, int64_t dp_index,
                                     int64_t microbatch, int64_t stage);

}  // namespace sluice::passes
