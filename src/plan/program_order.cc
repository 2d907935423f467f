// CheckProgramOrder (program_check.h): one rank's program walked in order, validate.h check 5.
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <utility>
#include <vector>

#include "plan/comm_replay.h"
#include "plan/moe_segments.h"
#include "plan/program_check.h"

namespace sluice {
namespace {

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
                                s, slots_[s].since, InstructionText(list[slots_[s].since]))};
      }
    }
    for (int64_t t = 0; t < static_cast<int64_t>(open_.size()); ++t) {
      if (open_[t] >= 0) {
        return ProgramProblem{index_, fmt::format("instruction {} ({}) is never finished", open_[t],
                                                  InstructionText(list[open_[t]]))};
      }
    }
    if (next_a2a_ < a2a_.size()) {
      return ProgramProblem{
          index_, fmt::format("the program ends before {}", InstructionText(a2a_[next_a2a_]))};
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
        return segments_.AllToAll(in, index_, state_[in.microbatch * S_ + in.stage] != kNone);
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
  std::vector<int64_t> state_;         // [mb * S + stage]: State
  std::vector<Recompute> forward_rc_;  // [mb * S + stage]: the recompute level of its F
  std::vector<int64_t> holder_;        // [content key]: slot holding it, -1
  std::vector<int64_t> open_;          // [tag]: unfinished Start, -1
  std::vector<Slot> slots_;            // [slot id]: dense, buffer_slots entries
  std::vector<bool> reduced_;          // [stage]: its gradients were reduced across replicas
  std::vector<bool> backward_begun_;   // [mb * S + stage]: a piece of its segmented backward ran
  std::vector<std::pair<int64_t, Bytes>> scattered_, gathered_;  // (bucket, bytes) in order
  int64_t index_ = 0;
  bool stepped_ = false;
  SegmentTracker segments_;       // the segmented ops
  std::vector<Instruction> a2a_;  // the all-to-alls of the last compute op
  size_t next_a2a_ = 0;           // the first of them not seen yet
};

}  // namespace

std::optional<ProgramProblem> CheckProgramOrder(const ExecutionPlan& plan,
                                                const RankProgram& program) {
  return OrderChecker(plan, program).Run();
}

}  // namespace sluice
