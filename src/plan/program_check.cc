#include "plan/program_check.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "plan/comm_replay.h"
#include "plan/moe_segments.h"

namespace sluice {
namespace {

std::string CountsProblem(const Instruction& in, size_t inputs, size_t outputs) {
  return fmt::format("{} needs {} input and {} output slots, has {} and {}", OpKindName(in.op),
                     inputs, outputs, in.inputs.size(), in.outputs.size());
}

[[gnu::cold, gnu::noinline]] std::string StageProblem(const ExecutionPlan& plan,
                                                      const RankProgram& program, int64_t stage) {
  return fmt::format(
      "stage {} does not run on pipeline rank {} (stages 0..{}, stage s on rank "
      "s % {})",
      stage, program.pp_index, plan.num_stages() - 1, plan.pp());
}

// CheckInstructionIndices' findings (cold: built only for a broken plan).
[[gnu::cold, gnu::noinline]] InstructionProblem SlotProblem(std::string_view field, int64_t slot,
                                                            const RankProgram& program) {
  return {field, fmt::format("slot {} is outside the program's {} buffer slots", slot,
                             program.buffer_slots)};
}

[[gnu::cold, gnu::noinline]] InstructionProblem CountsProblemOf(const Instruction& in,
                                                                size_t inputs, size_t outputs) {
  return {in.inputs.size() != inputs ? "in" : "out", CountsProblem(in, inputs, outputs)};
}

[[gnu::cold, gnu::noinline]] InstructionProblem MicroBatchProblem(const ExecutionPlan& plan,
                                                                  const RankProgram& program,
                                                                  const Instruction& in) {
  return {"mb", fmt::format("micro-batch {} is not in [0, {})", in.microbatch,
                            plan.replicas[program.dp_index].micro_batches.size())};
}

[[gnu::cold, gnu::noinline]] InstructionProblem PeerProblem(const ExecutionPlan& plan,
                                                            const Instruction& in) {
  return {"peer", fmt::format("peer {} is not another rank of the plan (0..{})", in.peer,
                              static_cast<int64_t>(plan.ranks.size()) - 1)};
}

// An all-to-all's group: this rank among distinct ranks of the plan, one send and one receive
// split per member, no slots.
[[gnu::cold, gnu::noinline]] std::optional<InstructionProblem> AllToAllIndexProblem(
    const ExecutionPlan& plan, const RankProgram& program, const Instruction& in) {
  const int64_t n = static_cast<int64_t>(plan.ranks.size());
  std::vector<int64_t> sorted = in.group;
  std::sort(sorted.begin(), sorted.end());
  if (sorted.empty() || sorted.front() < 0 || sorted.back() >= n ||
      std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() ||
      !std::binary_search(sorted.begin(), sorted.end(), program.rank)) {
    return InstructionProblem{
        "group", fmt::format("group [{}] must list distinct ranks of the plan (0..{}), this rank "
                             "({}) among them",
                             fmt::join(in.group, ", "), n - 1, program.rank)};
  }
  if (in.send_splits.size() != in.group.size() || in.recv_splits.size() != in.group.size()) {
    return InstructionProblem{
        in.send_splits.size() != in.group.size() ? "send" : "recv",
        fmt::format("needs one send and one receive split per group member ({}), has {} and {}",
                    in.group.size(), in.send_splits.size(), in.recv_splits.size())};
  }
  if (!in.inputs.empty() || !in.outputs.empty()) return CountsProblemOf(in, 0, 0);
  return std::nullopt;
}

// An all-to-all's own fields: the plan has expert parallelism that the lowering's group rule
// covers (an MoE model, ep > 1 dividing dp), the group is this rank's, every member holds the
// micro-batch, and the layer is an MoE layer of the stage. What it moves is compared with
// AllToAllsOf by the order check, which knows the compute op it belongs to.
std::optional<std::string> AllToAllFieldProblem(const ExecutionPlan& plan,
                                                const RankProgram& program,
                                                const Instruction& in) {
  const int64_t ep = plan.parallel.ep;
  if (ep <= 1 || plan.dp() % ep != 0 || !plan.model.moe.has_value()) {
    return fmt::format(
        "all-to-alls need an MoE model and an expert-parallel degree ep > 1 that divides dp; "
        "the plan has ep = {}, dp = {}{}",
        ep, plan.dp(), plan.model.moe.has_value() ? "" : " and a dense model");
  }
  const std::vector<int64_t> group = EpGroupOf(plan, program.rank);
  if (in.group != group) {
    return fmt::format("group [{}] is not this rank's expert-parallel group [{}]",
                       fmt::join(in.group, ", "), fmt::join(group, ", "));
  }
  for (int64_t member : group) {
    const auto& mbs = plan.replicas[plan.ranks[member].dp_index].micro_batches;
    if (in.microbatch >= static_cast<int64_t>(mbs.size())) {
      return fmt::format("micro-batch {} is not in group member rank {}'s replica ({} "
                         "micro-batches): an expert-parallel group's replicas run the same "
                         "micro-batches",
                         in.microbatch, member, mbs.size());
    }
  }
  const std::vector<int64_t> layers = MoeLayersOfStage(plan.model, in.stage, plan.parallel);
  if (std::find(layers.begin(), layers.end(), in.layer) == layers.end()) {
    return fmt::format("layer {} is not an MoE layer of stage {} (its MoE layers: [{}])",
                       in.layer, in.stage, fmt::join(layers, ", "));
  }
  return std::nullopt;
}

std::optional<std::string> FieldProblem(const ExecutionPlan& plan, const RankProgram& program,
                                        const Instruction& in) {
  if (auto p = CheckInstructionIndices(plan, program, in)) return std::move(p->message);
  const int64_t S = plan.num_stages(), last = S - 1;
  const auto& mbs = plan.replicas[program.dp_index].micro_batches;
  auto want_counts = [&](size_t inputs, size_t outputs) -> std::optional<std::string> {
    if (in.inputs.size() == inputs && in.outputs.size() == outputs) return std::nullopt;
    return CountsProblem(in, inputs, outputs);
  };
  if (in.op == OpKind::kFreeBuffer) return std::nullopt;  // CheckInstructionIndices has it all
  if (in.op == OpKind::kOptimizerStep) return want_counts(0, 0);
  if (in.segment >= 0 && !IsCompute(in.op)) {
    return fmt::format("seg {} on a {}: only compute ops are cut into segments", in.segment,
                       OpKindName(in.op));
  }
  if (in.chunks > 0 ? (in.chunk < 0 || in.chunk >= in.chunks) : in.chunk != -1) {
    return fmt::format("chunk {} of {} chunks: a slice needs 0 <= chunk < chunks, a whole one "
                       "neither field",
                       in.chunk, in.chunks);
  }
  if (in.chunks > 0 && !IsAllToAll(in.op) && in.segment < 0) {
    return "chunk/chunks need a segment (seg) or an all-to-all";
  }
  if (in.stage < 0 || in.stage >= S || plan.PipelineRankOf(in.stage) != program.pp_index) {
    return StageProblem(plan, program, in.stage);
  }
  if (IsCollective(in.op)) {
    if (in.bucket < 0 || in.bytes.count() <= 0) {
      return fmt::format("needs a bucket id >= 0 and a positive byte count, has {} and {}",
                         in.bucket, in.bytes.count());
    }
    const bool sharded = plan.parallel.zero >= 2;
    if ((in.op == OpKind::kAllReduceGrad) == sharded) {
      return fmt::format("ZeRO-{} reduces gradients with {}", plan.parallel.zero,
                         sharded ? "reduce-scatter and all-gather" : "all-reduce");
    }
    return want_counts(0, 0);
  }
  if (in.microbatch < 0 || in.microbatch >= static_cast<int64_t>(mbs.size())) {
    return fmt::format("micro-batch {} is not in [0, {})", in.microbatch, mbs.size());
  }
  if (IsAllToAll(in.op)) return AllToAllFieldProblem(plan, program, in);
  if (in.op == OpKind::kAllToAllWait) {
    if (plan.parallel.ep <= 1 || plan.dp() % plan.parallel.ep != 0 || !plan.model.moe.has_value()) {
      return "an all-to-all wait needs expert parallelism (an MoE model, ep > 1 dividing dp)";
    }
    if (in.tag < 0) return "an all-to-all wait needs the tag of the all-to-all it waits for";
    return want_counts(0, 0);
  }
  const PlanMicroBatch& mb = mbs[in.microbatch];
  auto want_shapes = [&](const std::vector<TensorShape>& shapes) -> std::optional<std::string> {
    if (in.shapes == shapes) return std::nullopt;
    return fmt::format(
        "tensor shapes {} differ from the {} that micro-batch {} (mbs {}, seqlen "
        "{}, dec_seqlen {}) needs",
        ShapesText(in.shapes), ShapesText(shapes), in.microbatch, mb.shape.mbs, mb.shape.seqlen,
        mb.shape.dec_seqlen);
  };
  if (in.op == OpKind::kLoadInput) {
    const std::vector<TensorShape> load = LoadShapes(plan.model, mb.shape, in.stage, S);
    if (load.empty()) return fmt::format("stage {} loads no input", in.stage);
    if (auto p = want_shapes(load)) return p;
    if (in.bytes != TokenBytes(load)) {
      return fmt::format("bytes {} differ from the {} of int64 tokens", in.bytes.count(),
                         TokenBytes(load).count());
    }
    return want_counts(0, 1);
  }
  if (IsCompute(in.op)) {
    // Recompute is per (micro-batch, stage): the micro-batch's level unless a pass changed it
    // there (passes/recompute.h); the ordered check makes B and I follow their F's.
    // The boundary tensors it produces: F's output, B's and I's input gradient.
    const int64_t b = in.op == OpKind::kForward ? in.stage : in.stage - 1;
    const bool produces = in.op != OpKind::kBackwardWeight && b >= 0 && b < last &&
                          (in.segment < 0 || !in.outputs.empty());
    if (produces ? IsBoundaryShapes(in.shapes, plan.model, mb.shape, b, plan.parallel) : in.shapes.empty()) {
      return std::nullopt;
    }
    return want_shapes(produces ? BoundaryShapes(plan.model, mb.shape, b, plan.parallel)
                                : std::vector<TensorShape>{});
  }
  const std::optional<TransferLink> link = LinkOf(in.op, in.stage, S);
  if (!link) return fmt::format("stage {} has no neighbour to {}", in.stage, OpKindName(in.op));
  if (plan.PipelineRankOf(link->peer_stage) == program.pp_index) {
    return fmt::format("stages {} and {} run on the same rank and exchange no messages", in.stage,
                       link->peer_stage);
  }
  const int64_t peer = plan.RankId(program.dp_index, plan.PipelineRankOf(link->peer_stage));
  if (in.peer != peer) {
    return fmt::format("peer {} is not rank {}, which runs stage {}", in.peer, peer,
                       link->peer_stage);
  }
  const int64_t tag = MessageTag(in.microbatch, link->boundary, link->gradient, S);
  if (in.tag != tag) return fmt::format("tag {} differs from MessageTag() = {}", in.tag, tag);
  if (!IsBoundaryShapes(in.shapes, plan.model, mb.shape, link->boundary, plan.parallel)) {
    return want_shapes(BoundaryShapes(plan.model, mb.shape, link->boundary, plan.parallel));
  }
  if (in.bytes != Fp16Bytes(in.shapes)) {
    return fmt::format("bytes {} differ from the {} of the fp16 tensors", in.bytes.count(),
                       Fp16Bytes(in.shapes).count());
  }
  const bool allocates = in.op == OpKind::kRecvActStart || in.op == OpKind::kRecvGradStart;
  return want_counts(allocates ? 0 : 1, allocates ? 1 : 0);
}

}  // namespace

std::optional<InstructionProblem> CheckInstructionIndices(const ExecutionPlan& plan,
                                                          const RankProgram& program,
                                                          const Instruction& in) {
  // The simulator runs this on every instruction of plans of millions: the common case is a few
  // compares, and the messages are built out of line.
  for (const int64_t slot : in.inputs) {
    if (slot < 0 || slot >= program.buffer_slots) return SlotProblem("in", slot, program);
  }
  for (const int64_t slot : in.outputs) {
    if (slot < 0 || slot >= program.buffer_slots) return SlotProblem("out", slot, program);
  }
  switch (in.op) {
    case OpKind::kFreeBuffer:
      if (in.inputs.size() != 1 || !in.outputs.empty()) return CountsProblemOf(in, 1, 0);
      return std::nullopt;
    case OpKind::kForward:
    case OpKind::kBackward:
    case OpKind::kBackwardInput:
    case OpKind::kBackwardWeight:
      if (in.stage < 0 || in.stage >= plan.num_stages() ||
          plan.PipelineRankOf(in.stage) != program.pp_index) {
        return InstructionProblem{"stage", StageProblem(plan, program, in.stage)};
      }
      if (in.microbatch < 0 ||
          in.microbatch >=
              static_cast<int64_t>(plan.replicas[program.dp_index].micro_batches.size())) {
        return MicroBatchProblem(plan, program, in);
      }
      return std::nullopt;
    case OpKind::kAllToAllWait:
      if (in.stage < 0 || in.stage >= plan.num_stages() ||
          plan.PipelineRankOf(in.stage) != program.pp_index) {
        return InstructionProblem{"stage", StageProblem(plan, program, in.stage)};
      }
      if (in.microbatch < 0 ||
          in.microbatch >=
              static_cast<int64_t>(plan.replicas[program.dp_index].micro_batches.size())) {
        return MicroBatchProblem(plan, program, in);
      }
      if (!in.inputs.empty() || !in.outputs.empty()) return CountsProblemOf(in, 0, 0);
      return std::nullopt;
    case OpKind::kAllToAllDispatch:
    case OpKind::kAllToAllCombine:
      if (in.stage < 0 || in.stage >= plan.num_stages() ||
          plan.PipelineRankOf(in.stage) != program.pp_index) {
        return InstructionProblem{"stage", StageProblem(plan, program, in.stage)};
      }
      if (in.microbatch < 0 ||
          in.microbatch >=
              static_cast<int64_t>(plan.replicas[program.dp_index].micro_batches.size())) {
        return MicroBatchProblem(plan, program, in);
      }
      return AllToAllIndexProblem(plan, program, in);
    case OpKind::kSendActStart:
    case OpKind::kSendActFinish:
    case OpKind::kSendGradStart:
    case OpKind::kSendGradFinish:
    case OpKind::kRecvActStart:
    case OpKind::kRecvActFinish:
    case OpKind::kRecvGradStart:
    case OpKind::kRecvGradFinish:
      if (in.peer < 0 || in.peer >= static_cast<int64_t>(plan.ranks.size()) ||
          in.peer == program.rank) {
        return PeerProblem(plan, in);
      }
      if ((in.op == OpKind::kRecvActStart || in.op == OpKind::kRecvGradStart) &&
          (!in.inputs.empty() || in.outputs.size() != 1)) {
        return CountsProblemOf(in, 0, 1);
      }
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

std::optional<ProgramProblem> CheckProgramFields(const ExecutionPlan& plan,
                                                 const RankProgram& program) {
  for (size_t i = 0; i < program.instructions.size(); ++i) {
    if (auto p = FieldProblem(plan, program, program.instructions[i])) {
      return ProgramProblem{static_cast<int64_t>(i), *p};
    }
  }
  // Dense slot ids: every id below buffer_slots is allocated by some instruction. (The structure
  // check bounds buffer_slots by the program's allocations, so this vector is small.)
  std::vector<bool> allocated(static_cast<size_t>(program.buffer_slots), false);
  for (const Instruction& in : program.instructions) {
    for (int64_t slot : in.outputs) allocated[static_cast<size_t>(slot)] = true;
  }
  for (size_t s = 0; s < allocated.size(); ++s) {
    if (!allocated[s]) {
      return ProgramProblem{
          static_cast<int64_t>(program.instructions.size()),
          fmt::format("slot {} of the program's {} buffer slots is never allocated: slot ids must "
                      "be dense (0 .. buffer_slots-1, each allocated)",
                      s, program.buffer_slots)};
    }
  }
  return std::nullopt;
}

}  // namespace sluice
