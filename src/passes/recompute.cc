#include "passes/recompute.h"

#include <fmt/core.h>

#include <algorithm>
#include <utility>

#include "plan/memory_rule.h"

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
    return InvalidArgumentError(
        fmt::format("recompute pass: replica {} outside 0..{}", dp_index_, plan->dp() - 1));
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
    record.rejected = fmt::format("the cost model cannot price micro-batch {} at '{}'", microbatch_,
                                  RecomputeName(level_));
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
  // Only durations, levels and this cost changed: the structure is as valid as before, and only
  // this rank's memory (check 7) can change.
  const RankMemory memory = ReplayRankMemory(*plan, plan->ranks[rank], plan->memory_limit());
  if (memory.first_over >= 0) {
    plan->ranks[rank] = std::move(original);
    plan->replicas[dp_index_].micro_batches[microbatch_].stages[stage_] = old_cost;
    record.changed = false;
    record.changes.clear();
    record.rejected = fmt::format("rank {} would need {:.0f} MB of its {:.0f} MB limit", rank,
                                  memory.over_level.mb(), plan->memory_limit().mb());
  }
  return record;
}

std::string RecomputePlacementPass::Describe() const { return "recompute-placement"; }

StatusOr<PassRecord> RecomputePlacementPass::Run(ExecutionPlan* plan) const {
  PassRecord record;
  record.pass = Describe();
  // Every (replica, micro-batch, stage) that recomputes, with the time a lower level saves.
  struct Option {
    Duration saved;
    int64_t d, mb, stage;
    Recompute level;
  };
  std::vector<Option> options;
  for (int64_t d = 0; d < plan->dp(); ++d) {
    const int64_t m = static_cast<int64_t>(plan->replicas[d].micro_batches.size());
    for (int64_t mb = 0; mb < m; ++mb) {
      for (Recompute level : {Recompute::kNone, Recompute::kSelective}) {
        std::optional<std::vector<ChunkCost>> costs;
        for (int64_t s = 0; s < plan->num_stages(); ++s) {
          const std::optional<Recompute> now = RecomputeAt(*plan, d, mb, s);
          if (!now.has_value() || *now == Recompute::kNone) continue;
          if (level == Recompute::kSelective && *now != Recompute::kFull) continue;
          if (!costs.has_value()) costs = pricer_->Price(*plan, d, mb, level);
          if (!costs.has_value()) break;
          const ChunkCost& was = plan->replicas[d].micro_batches[mb].stages[s];
          const Duration saved =
              was.forward + was.backward() - (*costs)[s].forward - (*costs)[s].backward();
          if (saved > Duration::Zero()) options.push_back({saved, d, mb, s, level});
        }
      }
    }
  }
  // Largest saving first; ties by position (deterministic).
  std::stable_sort(options.begin(), options.end(),
                   [](const Option& a, const Option& b) { return a.saved > b.saved; });
  for (const Option& o : options) {
    const std::optional<Recompute> now = RecomputeAt(*plan, o.d, o.mb, o.stage);
    if (!now.has_value() || *now == Recompute::kNone ||
        (o.level == Recompute::kSelective && *now != Recompute::kFull)) {
      continue;
    }
    SLUICE_ASSIGN_OR_RETURN(PassRecord one,
                            RecomputePass(pricer_, o.d, o.mb, o.stage, o.level).Run(plan));
    if (!one.changed) continue;
    record.changed = true;
    for (std::string& c : one.changes) record.changes.push_back(std::move(c));
  }
  if (!record.changed && !options.empty()) {
    record.rejected = "no lower recompute level fits the memory limit";
  }
  return record;
}

}  // namespace sluice::passes
