#include "plan/memory_rule.h"

#include <algorithm>
#include <vector>

#include "plan/moe_segments.h"

namespace sluice {
namespace {

// A slot's state as the rule follows it (the simulator's Slot without the timing).
struct SlotState {
  bool live = false;
  bool activation = false;  // an fp16 stage input (received or produced): coverable by a forward
  bool covered = false;     // inside a forward's stored activations until its B or I ends
  int64_t cover_mb = -1, cover_stage = -1;
  Bytes bytes;
};

// The bytes a receive allocates: its payload, or its shapes' when the payload is not given (the
// simulator's reading).
Bytes ReceiveBytes(const Instruction& in) {
  return in.bytes == Bytes::Zero() ? Fp16Bytes(in.shapes) : in.bytes;
}

// The level: activations and buffers on top of the model states, with the peak and the first
// change over the limit.
class Level {
 public:
  Level(Bytes states, Bytes limit, RankMemory* out) : states_(states), limit_(limit), out_(out) {
    out_->peak = states;
  }
  void Add(Bytes activations, Bytes buffers, int64_t instruction) {
    activations_ += activations;
    buffers_ += buffers;
    const Bytes level = states_ + activations_ + buffers_;
    if (level > out_->peak) {
      out_->peak = level;
      out_->peak_instruction = instruction;
      out_->peak_activations = activations_;
      out_->peak_buffers = buffers_;
    }
    if (level > limit_ && out_->first_over < 0) {
      out_->first_over = instruction;
      out_->over_level = level;
      out_->over_activations = activations_;
      out_->over_buffers = buffers_;
    }
  }

 private:
  const Bytes states_, limit_;
  RankMemory* out_;
  Bytes activations_, buffers_;
};

}  // namespace

RankMemory ReplayRankMemory(const ExecutionPlan& plan, const RankProgram& program, Bytes limit,
                            const MemoryRuleOptions& options) {
  RankMemory out;
  const auto& mbs = plan.replicas[program.dp_index].micro_batches;
  Level level(plan.model_states[program.pp_index], limit, &out);
  const bool buffers = options.count_buffers;
  const int64_t num_slots = std::max<int64_t>(program.buffer_slots, 0);
  std::vector<SlotState> slots(static_cast<size_t>(num_slots));
  auto slot_at = [&](int64_t s) -> SlotState* {
    return s >= 0 && s < num_slots ? &slots[s] : nullptr;
  };
  auto allocate = [&](int64_t s, Bytes bytes, bool activation) {
    if (SlotState* slot = slot_at(s)) *slot = SlotState{true, activation, false, -1, -1, bytes};
  };
  const Bytes zero = Bytes::Zero();
  // The covered slots, in ascending id order (a B or I releases its own in that order): only
  // these are looked at when a B or I ends, not every slot.
  std::vector<int64_t> covered;
  const std::vector<uint8_t> roles = PieceRoles(program);
  for (size_t idx = 0; idx < program.instructions.size(); ++idx) {
    const Instruction& in = program.instructions[idx];
    const int64_t i = static_cast<int64_t>(idx);
    switch (in.op) {
      case OpKind::kForward:
      case OpKind::kBackward:
      case OpKind::kBackwardInput:
      case OpKind::kBackwardWeight: {
        const ChunkCost& c = mbs[in.microbatch].stages[in.stage];
        const bool forward = in.op == OpKind::kForward;
        // A segmented op (moe_segments.h) starts at its first piece and ends at its last.
        const bool first = roles[idx] & kFirstPiece, last = roles[idx] & kLastPiece;
        const Bytes extra = std::max(zero, c.peak - c.stored);
        // At its start a forward's stage input joins its stored activations and the outputs are
        // allocated.
        if (forward && buffers) {
          for (int64_t s : in.inputs) {
            SlotState* slot = slot_at(s);
            if (slot == nullptr || !slot->activation || slot->covered) continue;
            slot->covered = true;
            slot->cover_mb = in.microbatch;
            slot->cover_stage = in.stage;
            const auto at = std::lower_bound(covered.begin(), covered.end(), s);
            if (at == covered.end() || *at != s) covered.insert(at, s);
            level.Add(zero, zero - slot->bytes, i);
          }
        }
        const Bytes out_bytes = Fp16Bytes(in.shapes);
        for (int64_t s : in.outputs) {
          allocate(s, out_bytes, forward);
          if (buffers) level.Add(zero, out_bytes, i);
        }
        // The op's own need while it runs; at its end it is given back and what the op keeps
        // or frees is applied.
        switch (in.op) {
          case OpKind::kForward:
            if (first) level.Add(c.peak, zero, i);
            if (last) level.Add(c.stored - c.peak, zero, i);
            break;
          case OpKind::kBackward:
            if (first) level.Add(extra, zero, i);
            if (last) level.Add(zero - extra - c.stored, zero, i);
            break;
          case OpKind::kBackwardInput:
            if (first) level.Add(extra, zero, i);
            if (last) level.Add(zero - extra - (c.stored - c.stored_until_w), zero, i);
            break;
          default:
            if (last) level.Add(zero - c.stored_until_w, zero, i);
            break;
        }
        if (buffers && last &&
            (in.op == OpKind::kBackward || in.op == OpKind::kBackwardInput)) {
          // The stage input leaves the stored activations with them: a buffer until freed. (A
          // segmented op read it at its first piece: every slot it covers is looked at.)
          size_t kept = 0;
          for (const int64_t s : covered) {
            SlotState& slot = slots[s];
            if (!slot.covered) continue;  // re-allocated since it was covered
            if (!slot.live || slot.cover_mb != in.microbatch || slot.cover_stage != in.stage) {
              covered[kept++] = s;
              continue;
            }
            slot.covered = false;
            level.Add(zero, slot.bytes, i);
          }
          covered.resize(kept);
        }
        break;
      }
      case OpKind::kLoadInput:
        for (int64_t s : in.outputs) {
          allocate(s, in.bytes, false);
          if (buffers) level.Add(zero, in.bytes, i);
        }
        break;
      case OpKind::kRecvActStart:
      case OpKind::kRecvGradStart: {
        const Bytes bytes = ReceiveBytes(in);
        for (int64_t s : in.outputs) {
          allocate(s, bytes, in.op == OpKind::kRecvActStart);
          if (buffers) level.Add(zero, bytes, i);
        }
        break;
      }
      case OpKind::kFreeBuffer: {
        SlotState* slot = in.inputs.size() == 1 ? slot_at(in.inputs[0]) : nullptr;
        if (slot == nullptr || !slot->live) break;
        if (buffers && !slot->covered) level.Add(zero, zero - slot->bytes, i);
        slot->live = false;
        break;
      }
      default:
        break;
    }
  }
  return out;
}

}  // namespace sluice
