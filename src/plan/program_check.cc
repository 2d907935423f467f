#include "plan/program_check.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
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
  const std::vector<int64_t> layers = MoeLayersOfStage(plan.model, in.stage, plan.num_stages());
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
    if (produces ? IsBoundaryShapes(in.shapes, plan.model, mb.shape, b, S) : in.shapes.empty()) {
      return std::nullopt;
    }
    return want_shapes(produces ? BoundaryShapes(plan.model, mb.shape, b, S)
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
  if (!IsBoundaryShapes(in.shapes, plan.model, mb.shape, link->boundary, S)) {
    return want_shapes(BoundaryShapes(plan.model, mb.shape, link->boundary, S));
  }
  if (in.bytes != Fp16Bytes(in.shapes)) {
    return fmt::format("bytes {} differ from the {} of the fp16 tensors", in.bytes.count(),
                       Fp16Bytes(in.shapes).count());
  }
  const bool allocates = in.op == OpKind::kRecvActStart || in.op == OpKind::kRecvGradStart;
  return want_counts(allocates ? 0 : 1, allocates ? 1 : 0);
}

// Walks a program in order; see validate.h check 5.
class OrderChecker {
 public:
  OrderChecker(const ExecutionPlan& plan, const RankProgram& program)
      : plan_(plan),
        program_(program),
        m_(static_cast<int64_t>(plan.replicas[program.dp_index].micro_batches.size())),
        S_(plan.num_stages()),
        state_(m_ * S_, 0),
        backward_begun_(m_ * S_, false),
        forward_rc_(m_ * S_, Recompute::kNone),
        holder_(3 * m_ * S_, -1),
        open_(2 * m_ * S_, -1),
        slots_(static_cast<size_t>(program.buffer_slots)),
        reduced_(S_, false),
        segments_(plan, program) {}

  std::optional<ProgramProblem> Run() {
    const auto& list = program_.instructions;
    for (size_t i = 0; i < list.size(); ++i) {
      index_ = static_cast<int64_t>(i);
      if (auto p = Step(list[i])) return ProgramProblem{index_, *p};
    }
    index_ = static_cast<int64_t>(list.size());
    for (size_t s = 0; s < slots_.size(); ++s) {
      if (slots_[s].live) {
        return ProgramProblem{
            index_, fmt::format("slot {} allocated by instruction {} ({}) is "
                                "never freed",
                                s, slots_[s].since,
                                InstructionText(list[slots_[s].since]))};
      }
    }
    for (int64_t t = 0; t < static_cast<int64_t>(open_.size()); ++t) {
      if (open_[t] >= 0) {
        return ProgramProblem{index_, fmt::format("instruction {} ({}) is never finished", open_[t],
                                                  InstructionText(list[open_[t]]))};
      }
    }
    if (next_a2a_ < a2a_.size()) {
      return ProgramProblem{index_, fmt::format("the program ends before {}",
                                                InstructionText(a2a_[next_a2a_]))};
    }
    if (auto p = segments_.Finish()) return ProgramProblem{index_, *p};
    if (!stepped_) return ProgramProblem{index_, "the program has no optimizer-step"};
    if (gathered_ != scattered_) {
      return ProgramProblem{index_, fmt::format("all-gathers {} parameter buckets after the step "
                                                "but reduce-scattered {} gradient buckets (they "
                                                "must match one to one, in order)",
                                                gathered_.size(), scattered_.size())};
    }
    return std::nullopt;
  }

 private:
  enum Kind { kLoad = 0, kAct = 1, kGrad = 2 };
  enum State { kNone = 0, kForwarded = 1, kInputGrad = 2, kDone = 3 };
  struct Slot {
    bool live = false;
    bool ready = false;
    int64_t content = -1;
    int64_t sends = 0;   // sends in flight from this slot
    int64_t since = -1;  // allocating instruction
  };

  // The state of slot `slot`. REQUIRES: 0 <= slot < buffer_slots (CheckProgramFields).
  Slot& At(int64_t slot) { return slots_[static_cast<size_t>(slot)]; }

  int64_t Key(Kind kind, int64_t mb, int64_t b) const { return (kind * m_ + mb) * S_ + b; }
  std::string KeyText(int64_t key) const {
    const int64_t b = key % S_, mb = (key / S_) % m_, kind = key / S_ / m_;
    if (kind == kLoad) return fmt::format("the tokens of micro-batch {} on stage {}", mb, b);
    return fmt::format("the {} of micro-batch {} across boundary {}-{}",
                       kind == kAct ? "activations" : "gradients", mb, b, b + 1);
  }

  std::optional<std::string> Read(int64_t slot, int64_t key) {
    const Slot& s = At(slot);
    if (!s.live) return fmt::format("reads slot {}, which is not allocated", slot);
    if (s.content != key) {
      return fmt::format("reads slot {} for {}, but it holds {}", slot, KeyText(key),
                         KeyText(s.content));
    }
    if (!s.ready) {
      return fmt::format("reads slot {} before its receive (instruction {}) finished", slot,
                         s.since);
    }
    return std::nullopt;
  }

  std::optional<std::string> Write(int64_t slot, int64_t key, bool ready) {
    Slot& s = At(slot);
    if (s.live) {
      return fmt::format("allocates slot {}, which still holds {} (allocated by instruction {})",
                         slot, KeyText(s.content), s.since);
    }
    if (holder_[key] >= 0) {
      return fmt::format("produces {} again (slot {} already holds it)", KeyText(key),
                         holder_[key]);
    }
    s = {true, ready, key, 0, index_};
    holder_[key] = slot;
    return std::nullopt;
  }

  // `begin`: the op's first piece (a whole op is both): it checks the state and reads the
  // inputs; `end`: the piece that completes it writes the outputs and moves the state.
  std::optional<std::string> Compute(const Instruction& in, bool begin = true, bool end = true) {
    const int64_t mb = in.microbatch, s = in.stage, last = S_ - 1;
    int64_t& state = state_[mb * S_ + s];
    if (in.op == OpKind::kBackwardWeight) {
      if (!end) return std::nullopt;  // a piece of a segmented W: the tracker checked its I
      if (state != kInputGrad) {
        return fmt::format("W of micro-batch {} on stage {} needs its I first{}", mb, s,
                           state == kDone ? " (and runs only once)" : "");
      }
      state = kDone;
      return std::nullopt;
    }
    const bool forward = in.op == OpKind::kForward;
    if (!begin && end && forward && state != kNone) {
      return fmt::format("micro-batch {} runs F on stage {} twice", mb, s);
    }
    if (begin && forward != (state == kNone)) {
      return forward ? fmt::format("micro-batch {} runs F on stage {} twice", mb, s)
                     : fmt::format("{} of micro-batch {} on stage {} {}", OpKindName(in.op), mb, s,
                                   state == kNone ? "precedes its F" : "runs twice");
    }
    Recompute& rc = forward_rc_[mb * S_ + s];
    if (!begin) {
    } else if (forward) {
      rc = in.recompute;
    } else if (in.recompute != rc) {
      return fmt::format("recompute '{}' differs from its F's '{}' (micro-batch {}, stage {})",
                         RecomputeName(in.recompute), RecomputeName(rc), mb, s);
    }
    // What it must read and write, in order (at most 4 and 1 buffers).
    std::array<int64_t, 4> reads{};
    size_t num_reads = 0, num_writes = 0;
    int64_t write = -1;
    reads[num_reads++] = s == 0 ? Key(kLoad, mb, 0) : Key(kAct, mb, s - 1);
    if (s == last && s > 0) reads[num_reads++] = Key(kLoad, mb, s);
    if (!forward && s < last) {
      reads[num_reads++] = Key(kAct, mb, s);
      reads[num_reads++] = Key(kGrad, mb, s);
    }
    if (forward && s < last) write = Key(kAct, mb, s);
    if (!forward && s > 0) write = Key(kGrad, mb, s - 1);
    num_writes = write >= 0 ? 1 : 0;
    if (!begin) num_reads = 0;
    if (!end) num_writes = 0;
    if (in.inputs.size() != num_reads || in.outputs.size() != num_writes) {
      return fmt::format(
          "reads {} and writes {} buffers; {} on stage {} of {} stages reads {} "
          "and writes {}{}",
          in.inputs.size(), in.outputs.size(), OpKindName(in.op), s, S_, num_reads, num_writes,
          in.segment >= 0 ? " (a segmented op reads at its first piece and writes at its last)"
                          : "");
    }
    for (size_t k = 0; k < num_reads; ++k) {
      if (auto p = Read(in.inputs[k], reads[k])) return p;
    }
    if (!end) return std::nullopt;
    if (write >= 0) {
      if (auto p = Write(in.outputs[0], write, true)) return p;
    }
    state = forward ? kForwarded : (in.op == OpKind::kBackward ? kDone : kInputGrad);
    return std::nullopt;
  }

  std::optional<std::string> Comm(const Instruction& in) {
    // CheckProgramFields passed: the op has its link.
    const TransferLink link = *LinkOf(in.op, in.stage, S_);
    const int64_t key = Key(link.gradient ? kGrad : kAct, in.microbatch, link.boundary);
    const bool recv = !IsSend(in.op);
    if (IsCommStart(in.op)) {
      if (open_[in.tag] >= 0) {
        return fmt::format("posts tag {} again while instruction {} is unfinished", in.tag,
                           open_[in.tag]);
      }
      open_[in.tag] = index_;
      if (recv) return Write(in.outputs[0], key, false);
      if (auto p = Read(in.inputs[0], key)) return p;
      ++At(in.inputs[0]).sends;
      return std::nullopt;
    }
    const int64_t start = open_[in.tag];
    if (start < 0 || program_.instructions[start].op != StartOf(in.op)) {
      return fmt::format("finishes a {} of tag {} that this rank has not started",
                         recv ? "receive" : "send", in.tag);
    }
    if (program_.instructions[start].peer != in.peer) {
      return fmt::format("finishes instruction {} with peer {}, not {}", start,
                         program_.instructions[start].peer, in.peer);
    }
    open_[in.tag] = -1;
    Slot& slot = At(in.inputs[0]);
    if (!slot.live || slot.content != key) {
      return fmt::format("slot {} does not hold {}", in.inputs[0], KeyText(key));
    }
    if (recv) {
      slot.ready = true;
    } else {
      --slot.sends;
    }
    return std::nullopt;
  }

  // The all-to-alls a compute op performs follow it, separated only by FreeBuffers.
  std::optional<std::string> AllToAllOrder(const Instruction& in) {
    if (IsAllToAll(in.op)) {
      if (next_a2a_ >= a2a_.size()) {
        // Not a whole op's: it belongs to a segmented one.
        return segments_.AllToAll(in, index_,
                                  state_[in.microbatch * S_ + in.stage] != kNone);
      }
      Instruction want = a2a_[next_a2a_++];
      want.duration = in.duration;
      if (in == want) return std::nullopt;
      return fmt::format(
          "differs from the all-to-all the compute op before it performs here: want {} group "
          "[{}] send [{}] recv [{}] shapes {} bytes {}; has {} group [{}] send [{}] recv [{}] "
          "shapes {} bytes {}",
          InstructionText(want), fmt::join(want.group, ", "), fmt::join(want.send_splits, ", "),
          fmt::join(want.recv_splits, ", "), ShapesText(want.shapes), want.bytes.count(),
          InstructionText(in), fmt::join(in.group, ", "), fmt::join(in.send_splits, ", "),
          fmt::join(in.recv_splits, ", "), ShapesText(in.shapes), in.bytes.count());
    }
    if (in.op == OpKind::kFreeBuffer) return std::nullopt;
    if (next_a2a_ < a2a_.size()) {
      return fmt::format("comes before {} that the compute op before it performs",
                         InstructionText(a2a_[next_a2a_]));
    }
    if (IsCompute(in.op) && in.segment < 0 && plan_.parallel.ep > 1) {
      a2a_ = AllToAllsOf(plan_, program_.rank, in.op, in.microbatch, in.stage);
      next_a2a_ = 0;
    }
    return std::nullopt;
  }

  std::optional<std::string> Step(const Instruction& in) {
    if (auto p = AllToAllOrder(in)) return p;
    if (IsAllToAll(in.op)) return std::nullopt;
    if (in.op == OpKind::kAllToAllWait) return segments_.Wait(in);
    if (IsCompute(in.op) && in.segment >= 0) {
      SegmentTracker::PieceRole role;
      if (auto p = segments_.Piece(in, index_, &role)) return p;
      if (in.op != OpKind::kForward) backward_begun_[in.microbatch * S_ + in.stage] = true;
      return Compute(in, role.first, role.last);
    }
    if (stepped_ && in.op != OpKind::kAllGatherParams) {
      return "only all-gathers may follow the optimizer step";
    }
    switch (in.op) {
      case OpKind::kLoadInput:
        return Write(in.outputs[0], Key(kLoad, in.microbatch, in.stage), true);
      case OpKind::kFreeBuffer: {
        Slot& s = At(in.inputs[0]);
        if (!s.live) return fmt::format("frees slot {}, which is not allocated", in.inputs[0]);
        if (s.sends > 0 || !s.ready) {
          return fmt::format("frees slot {} while a transfer of it is unfinished", in.inputs[0]);
        }
        holder_[s.content] = -1;
        s = Slot();
        return std::nullopt;
      }
      case OpKind::kAllReduceGrad:
      case OpKind::kReduceScatterGrad:
        reduced_[in.stage] = true;
        if (in.op == OpKind::kReduceScatterGrad) scattered_.push_back({in.bucket, in.bytes});
        {
          // Every backward of the stage is done, or all but one whose segmented backward has
          // begun: a bucket posted during the last backward (passes/grad_overlap.h, DDP-style).
          int64_t open = -1, open_count = 0;
          for (int64_t mb = 0; mb < m_; ++mb) {
            if (state_[mb * S_ + in.stage] != kDone) {
              if (open < 0) open = mb;
              ++open_count;
            }
          }
          if (open >= 0 && (open_count > 1 || !backward_begun_[open * S_ + in.stage])) {
            return fmt::format(
                "reduces stage {}'s gradients before micro-batch {}'s backward "
                "there",
                in.stage, open);
          }
        }
        return std::nullopt;
      case OpKind::kAllGatherParams:
        if (!stepped_) return "gathers parameters before the optimizer step";
        gathered_.push_back({in.bucket, in.bytes});
        return std::nullopt;
      case OpKind::kOptimizerStep:
        for (int64_t s = program_.pp_index; s < S_; s += plan_.pp()) {
          for (int64_t mb = 0; mb < m_; ++mb) {
            if (state_[mb * S_ + s] != kDone) {
              return fmt::format("steps before micro-batch {} finished its {} on stage {}", mb,
                                 state_[mb * S_ + s] == kNone ? "F" : "backward", s);
            }
          }
          if (plan_.dp() * plan_.parallel.cp > 1 && !reduced_[s]) {
            return fmt::format(
                "steps before reducing stage {}'s gradients across the {} "
                "data-parallel replicas",
                s, plan_.dp());
          }
        }
        stepped_ = true;
        return std::nullopt;
      default:
        break;
    }
    if (IsCompute(in.op)) return Compute(in);
    return Comm(in);
  }

  const ExecutionPlan& plan_;
  const RankProgram& program_;
  const int64_t m_, S_;
  std::vector<int64_t> state_;   // [mb * S + stage]: State
  std::vector<Recompute> forward_rc_;  // [mb * S + stage]: the recompute level of its F
  std::vector<int64_t> holder_;  // [content key]: slot holding it, -1
  std::vector<int64_t> open_;    // [tag]: unfinished Start, -1
  std::vector<Slot> slots_;      // [slot id]: dense, buffer_slots entries
  std::vector<bool> reduced_;  // [stage]: its gradients were reduced across replicas
  std::vector<bool> backward_begun_;  // [mb * S + stage]: a piece of its segmented backward ran
  std::vector<std::pair<int64_t, Bytes>> scattered_, gathered_;  // (bucket, bytes) in order
  int64_t index_ = 0;
  bool stepped_ = false;
  SegmentTracker segments_;       // the segmented ops
  std::vector<Instruction> a2a_;  // the all-to-alls of the last compute op
  size_t next_a2a_ = 0;           // the first of them not seen yet
};

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

std::optional<ProgramProblem> CheckProgramOrder(const ExecutionPlan& plan,
                                                const RankProgram& program) {
  return OrderChecker(plan, program).Run();
}

}  // namespace sluice
