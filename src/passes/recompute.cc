#include "passes/recompute.h"

#include <fmt/core.h>

#include <utility>

namespace sluice::passes {

std::string RecomputePass::Describe() const {
  return fmt::format("recompute(replica {}, mb {}, stage {}, {})", dp_index_, microbatch_, stage_,
                     RecomputeName(level_));
}

std::optional<Recompute> RecomputeAt(const ExecutionPlan& plan, int64_t dp_index,
                                     int64_t microbatch, int64_t stage) {
  const RankProgram& p = plan.ranks[plan.RankId(dp_index, plan.PipelineRankOf(stage))];
  for (const Instruction& in : p.instructions) {
    if (in.op == OpKind::kForward && in.microbatch == microbatch && in.stage == stage) {
      return in.recompute;
    }
  }
  return std::nullopt;
}

StatusOr<PassRecord> RecomputePass::Run(ExecutionPlan* plan) const {
  if (dp_index_ < 0 || dp_index_ >= plan->dp()) {
    return InvalidArgumentError(fmt::format("recompute pass: replica {} outside 0..{}", dp_index_,
                                            plan->dp() - 1));
  }
  PlanReplica& replica = plan->replicas[dp_index_];
  const int64_t m = static_cast<int64_t>(replica.micro_batches.size());
  if (microbatch_ < 0 || microbatch_ >= m || stage_ < 0 || stage_ >= plan->num_stages()) {
    return InvalidArgumentError(fmt::format(
        "recompute pass: micro-batch {} stage {} outside replica {}'s micro-batches 0..{} and "
        "stages 0..{}",
        microbatch_, stage_, dp_index_, m - 1, plan->num_stages() - 1));
  }
  PassRecord record;
  record.pass = Describe();
  const std::optional<Recompute> now = RecomputeAt(*plan, dp_index_, microbatch_, stage_);
  if (!now.has_value() || *now == level_) return record;
  const std::optional<std::vector<ChunkCost>> costs =
      pricer_->Price(*plan, dp_index_, microbatch_, level_);
  if (!costs.has_value() || static_cast<int64_t>(costs->size()) != plan->num_stages()) {
    record.rejected = fmt::format("the cost model cannot price micro-batch {} at '{}'",
                                  microbatch_, RecomputeName(level_));
    return record;
  }
  const ChunkCost& cost = (*costs)[stage_];
  ChunkCost& recorded = replica.micro_batches[microbatch_].stages[stage_];
  const ChunkCost old_cost = recorded;
  const int64_t rank = plan->RankId(dp_index_, plan->PipelineRankOf(stage_));
  RankProgram original = plan->ranks[rank];
  recorded = cost;
  for (Instruction& in : plan->ranks[rank].instructions) {
    if (!IsCompute(in.op) || in.microbatch != microbatch_ || in.stage != stage_) continue;
    switch (in.op) {
      case OpKind::kForward:
        in.duration = cost.forward;
        break;
      case OpKind::kBackward:
        in.duration = cost.backward();
        break;
      case OpKind::kBackwardInput:
        in.duration = cost.backward_input;
        break;
      default:
        in.duration = cost.backward_weight;
        break;
    }
    if (in.op != OpKind::kBackwardWeight) in.recompute = level_;
  }
  record.changed = true;
  record.changes.push_back(fmt::format("replica {} micro-batch {} stage {}: {} -> {}", dp_index_,
                                       microbatch_, stage_, RecomputeName(*now),
                                       RecomputeName(level_)));
  if (!KeepIfValid(rank, std::move(original), plan, &record)) {
    plan->replicas[dp_index_].micro_batches[microbatch_].stages[stage_] = old_cost;
  }
  return record;
}

}  // namespace sluice::passes
