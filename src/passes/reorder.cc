#include "passes/reorder.h"

#include <fmt/core.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace sluice::passes {
namespace {

bool Uses(const Instruction& in, int64_t slot) {
  return std::find(in.inputs.begin(), in.inputs.end(), slot) != in.inputs.end() ||
         std::find(in.outputs.begin(), in.outputs.end(), slot) != in.outputs.end();
}

// [begin, end) of the compute op at `pos` with the ops that travel with it: the LoadInput and
// Finish ops of its micro-batch and stage right before it, the FreeBuffers right after it.
std::pair<size_t, size_t> Group(const std::vector<Instruction>& p, size_t pos) {
  size_t b = pos;
  while (b > 0 && (p[b - 1].op == OpKind::kLoadInput || IsCommFinish(p[b - 1].op)) &&
         p[b - 1].microbatch == p[pos].microbatch && p[b - 1].stage == p[pos].stage) {
    --b;
  }
  size_t e = pos + 1;
  while (e < p.size() && p[e].op == OpKind::kFreeBuffer) ++e;
  return {b, e};
}

// Moves the compute op at position c[k] after the one at c[k + 1] (see the header).
void SwapWithNext(std::vector<Instruction>& p, size_t x_pos, size_t y_pos) {
  const auto [xs, xe] = Group(p, x_pos);
  const auto [ys, ye] = Group(p, y_pos);
  const Instruction& x = p[x_pos];
  std::vector<Instruction> stay, follow;  // the ops between the groups: stay, or follow x
  for (size_t i = xe; i < ys; ++i) {
    const Instruction& in = p[i];
    bool with_x = false;
    if (IsCommStart(in.op) && IsSend(in.op)) {
      for (int64_t s : x.outputs) with_x = with_x || Uses(in, s);
    } else if (in.op == OpKind::kFreeBuffer) {
      with_x = Uses(x, in.inputs.front());
    }
    (with_x ? follow : stay).push_back(in);
  }
  std::vector<Instruction> out;
  out.reserve(p.size());
  for (size_t i = 0; i < xs; ++i) out.push_back(std::move(p[i]));
  for (Instruction& in : stay) out.push_back(std::move(in));
  for (size_t i = ys; i < ye; ++i) out.push_back(std::move(p[i]));
  for (size_t i = xs; i < xe; ++i) out.push_back(std::move(p[i]));
  for (Instruction& in : follow) out.push_back(std::move(in));
  for (size_t i = ye; i < p.size(); ++i) out.push_back(std::move(p[i]));
  p = std::move(out);
}

Status CheckRank(const ExecutionPlan& plan, int64_t rank, std::string_view pass) {
  if (rank < 0 || rank >= static_cast<int64_t>(plan.ranks.size())) {
    return InvalidArgumentError(fmt::format("{}: rank {} is outside the plan's ranks 0..{}", pass,
                                            rank, static_cast<int64_t>(plan.ranks.size()) - 1));
  }
  return Status::Ok();
}

}  // namespace

std::vector<int64_t> ComputePositions(const RankProgram& program) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < program.instructions.size(); ++i) {
    if (IsCompute(program.instructions[i].op)) out.push_back(static_cast<int64_t>(i));
  }
  return out;
}

std::string MoveComputePass::Describe() const {
  return fmt::format("move-compute(rank {}, {} -> {})", rank_, from_, to_);
}

StatusOr<PassRecord> MoveComputePass::Run(ExecutionPlan* plan) const {
  SLUICE_RETURN_IF_ERROR(CheckRank(*plan, rank_, "move-compute"));
  RankProgram& program = plan->ranks[rank_];
  const int64_t n = static_cast<int64_t>(ComputePositions(program).size());
  if (from_ < 0 || from_ >= n || to_ < 0 || to_ >= n) {
    return InvalidArgumentError(
        fmt::format("move-compute: positions {} -> {} outside rank {}'s compute ops 0..{}", from_,
                    to_, rank_, n - 1));
  }
  PassRecord record;
  record.pass = Describe();
  if (from_ == to_) return record;
  RankProgram original = plan->ranks[rank_];
  std::vector<Instruction>& p = program.instructions;
  const std::string moved = InstructionText(p[ComputePositions(program)[from_]]);
  const int64_t step = to_ > from_ ? 1 : -1;
  std::string past;
  for (int64_t k = from_; k != to_; k += step) {
    const std::vector<int64_t> c = ComputePositions(program);
    const int64_t first = step > 0 ? k : k - 1;  // swap compute `first` with `first + 1`
    past = InstructionText(p[c[step > 0 ? k + 1 : k - 1]]);
    SwapWithNext(p, static_cast<size_t>(c[first]), static_cast<size_t>(c[first + 1]));
  }
  record.changed = true;
  record.changes.push_back(
      fmt::format("rank {}: {} {} {}", rank_, moved, step > 0 ? "after" : "before", past));
  KeepIfValid(rank_, std::move(original), plan, &record);
  return record;
}

std::string HoistStartPass::Describe() const {
  return fmt::format("hoist-start(rank {}, op {}, by {})", rank_, index_, by_);
}

StatusOr<PassRecord> HoistStartPass::Run(ExecutionPlan* plan) const {
  SLUICE_RETURN_IF_ERROR(CheckRank(*plan, rank_, "hoist-start"));
  std::vector<Instruction>& p = plan->ranks[rank_].instructions;
  if (index_ < 0 || index_ >= static_cast<int64_t>(p.size()) || !IsCommStart(p[index_].op)) {
    return InvalidArgumentError(fmt::format(
        "hoist-start: instruction {} of rank {} is not a transfer start (the rank has {} "
        "instructions)",
        index_, rank_, p.size()));
  }
  if (by_ < 1 || by_ > index_) {
    return InvalidArgumentError(fmt::format("hoist-start: by = {} outside 1..{}", by_, index_));
  }
  PassRecord record;
  record.pass = Describe();
  RankProgram original = plan->ranks[rank_];
  const std::string moved = InstructionText(p[index_]);
  const std::string past = InstructionText(p[index_ - by_]);
  std::rotate(p.begin() + (index_ - by_), p.begin() + index_, p.begin() + index_ + 1);
  record.changed = true;
  record.changes.push_back(fmt::format("rank {}: {} before {}", rank_, moved, past));
  KeepIfValid(rank_, std::move(original), plan, &record);
  return record;
}

}  // namespace sluice::passes
