#include "plan/moe_segments.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace sluice {
namespace {

std::string SliceText(int64_t c, int64_t n) {
  return n > 0 ? fmt::format(" slice {}/{}", c, n) : std::string();
}

const char* KindText(int kind) { return kind == 0 ? "F" : kind == 1 ? "backward" : "W"; }

}  // namespace

int64_t SplitPart(int64_t x, int64_t c, int64_t n) { return x / n + (c < x % n ? 1 : 0); }

int64_t NumSegments(const ExecutionPlan& plan, int64_t stage) {
  if (plan.parallel.ep <= 1 || !plan.model.moe.has_value()) return 0;
  const int64_t k =
      static_cast<int64_t>(MoeLayersOfStage(plan.model, stage, plan.parallel).size());
  return k == 0 ? 0 : 2 * k + 1;
}

Instruction AllToAllSlice(const Instruction& whole, int64_t c, int64_t n, int64_t hidden,
                          int64_t rank) {
  Instruction in = whole;
  in.chunk = c;
  in.chunks = n;
  int64_t sent = 0, received = 0, remote = 0;
  for (size_t j = 0; j < whole.group.size(); ++j) {
    in.send_splits[j] = SplitPart(whole.send_splits[j], c, n);
    in.recv_splits[j] = SplitPart(whole.recv_splits[j], c, n);
    sent += in.send_splits[j];
    received += in.recv_splits[j];
    if (whole.group[j] != rank) remote += in.send_splits[j];
  }
  in.shapes = {{sent, hidden}, {received, hidden}};
  in.bytes = Fp16Bytes({{remote, hidden}});
  return in;
}

std::vector<uint8_t> PieceRoles(const RankProgram& program) {
  const auto& list = program.instructions;
  std::vector<uint8_t> roles(list.size(), 0);
  std::map<std::tuple<int, int64_t, int64_t>, size_t> last;
  for (size_t i = 0; i < list.size(); ++i) {
    const Instruction& in = list[i];
    if (!IsCompute(in.op)) continue;
    if (in.segment < 0) {
      roles[i] = kFirstPiece | kLastPiece;
      continue;
    }
    const auto key = std::make_tuple(static_cast<int>(in.op), in.microbatch, in.stage);
    const auto it = last.find(key);
    if (it == last.end()) {
      roles[i] = kFirstPiece;
    } else {
      roles[it->second] &= static_cast<uint8_t>(~kLastPiece);
    }
    roles[i] |= kLastPiece;
    last[key] = i;
  }
  return roles;
}

SegmentTracker::SegmentTracker(const ExecutionPlan& plan, const RankProgram& program)
    : plan_(plan), program_(program) {}

SegmentTracker::Op& SegmentTracker::OpOf(int kind, int64_t mb, int64_t stage, int64_t segments) {
  Op& op = ops_[{kind, mb, stage}];
  if (op.chain.empty()) op.chain.resize(kind == 2 ? segments : 2 * segments - 1);
  return op;
}

bool SegmentTracker::Covered(const Element& e, int64_t c, int64_t n) {
  if (e.cut < 0) return false;
  if (e.cut == n) return e.done[static_cast<size_t>(n > 0 ? c : 0)];
  return Complete(e);
}

bool SegmentTracker::Complete(const Element& e) {
  return e.cut >= 0 && std::all_of(e.done.begin(), e.done.end(), [](bool b) { return b; });
}

std::optional<std::string> SegmentTracker::Piece(const Instruction& in, int64_t index,
                                                 PieceRole* role) {
  (void)index;
  const int kind = in.op == OpKind::kForward ? 0 : in.op == OpKind::kBackwardWeight ? 2 : 1;
  const int64_t P = NumSegments(plan_, in.stage);
  if (in.segment >= P) {
    return fmt::format("segment {} is not a segment of stage {} (it has {}: 2 per MoE layer + 1, "
                       "and none without expert parallelism)",
                       in.segment, in.stage, P);
  }
  const int64_t n = in.chunks, s = n > 0 ? in.chunk : 0;
  Op& op = OpOf(kind, in.microbatch, in.stage, P);
  const int64_t e = kind == 2 ? in.segment : 2 * in.segment;
  Element& el = op.chain[static_cast<size_t>(e)];
  if (el.cut < 0) {
    el.cut = n;
    el.started.assign(static_cast<size_t>(std::max<int64_t>(n, 1)), false);
    el.done = el.started;
  } else if (el.cut != n) {
    return fmt::format("segment {} of this {} is cut into {} slices here and {} before", in.segment,
                       KindText(kind), n, el.cut);
  }
  if (el.started[s]) {
    return fmt::format("runs segment {}{} of this {} twice", in.segment, SliceText(in.chunk, n),
                       KindText(kind));
  }
  if (kind == 2) {
    const auto it = ops_.find({1, in.microbatch, in.stage});
    if (it == ops_.end() || !Covered(it->second.chain[2 * in.segment], in.chunk, n)) {
      return fmt::format("the weight gradient of segment {}{} runs before that segment of its "
                         "segmented input gradient (I)",
                         in.segment, SliceText(in.chunk, n));
    }
  } else if (e > 0 && !Covered(op.chain[e - 1], in.chunk, n)) {
    return fmt::format("segment {}{} of this {} runs before the all-to-all before it completed "
                       "(its all-to-all #{}: posted with tag -1, or waited for)",
                       in.segment, SliceText(in.chunk, n), KindText(kind), in.segment - 1);
  }
  el.started[s] = true;
  el.done[s] = true;
  role->first = !op.started;
  op.started = true;
  ++op.pieces_done;
  role->last = std::all_of(op.chain.begin(), op.chain.end(),
                           [](const Element& x) { return Complete(x); });
  return std::nullopt;
}

std::optional<std::string> SegmentTracker::AllToAll(const Instruction& in, int64_t index,
                                                    bool forward_done) {
  const int kind = forward_done ? 1 : 0;
  const int64_t P = NumSegments(plan_, in.stage);
  const std::vector<Instruction> list = AllToAllsOf(
      plan_, program_.rank, kind == 0 ? OpKind::kForward : OpKind::kBackward, in.microbatch,
      in.stage);
  size_t j = 0;
  while (j < list.size() && (list[j].op != in.op || list[j].layer != in.layer)) ++j;
  const auto it = ops_.find({kind, in.microbatch, in.stage});
  if (P == 0 || j == list.size() || it == ops_.end()) {
    return fmt::format("an all-to-all that no compute op performs here: it neither follows a "
                       "whole {} of micro-batch {} on stage {} nor belongs to a segmented one "
                       "that has started (docs/formats.md)",
                       kind == 0 ? "F" : "backward", in.microbatch, in.stage);
  }
  Op& op = it->second;
  const int64_t n = in.chunks, s = n > 0 ? in.chunk : 0;
  Element& el = op.chain[2 * j + 1];
  if (el.cut < 0) {
    el.cut = n;
    el.started.assign(static_cast<size_t>(std::max<int64_t>(n, 1)), false);
    el.done = el.started;
  } else if (el.cut != n) {
    return fmt::format("all-to-all #{} of this {} is cut into {} slices here and {} before", j,
                       KindText(kind), n, el.cut);
  }
  if (el.started[s]) {
    return fmt::format("posts all-to-all #{}{} of this {} twice", j, SliceText(in.chunk, n),
                       KindText(kind));
  }
  if (!Covered(op.chain[2 * j], in.chunk, n)) {
    return fmt::format("all-to-all #{}{} is posted before segment {} (the computation it moves "
                       "the output of) ran",
                       j, SliceText(in.chunk, n), j);
  }
  Instruction want = n > 0 ? AllToAllSlice(list[j], in.chunk, n, plan_.model.hidden, program_.rank) : list[j];
  want.duration = in.duration;
  want.tag = in.tag;
  if (!(want == in)) {
    return fmt::format("differs from {} of the {} that it belongs to: want send [{}] recv [{}] "
                       "shapes {} bytes {}; has send [{}] recv [{}] shapes {} bytes {} (a slice "
                       "c of n moves SplitPart of every split, docs/formats.md)",
                       InstructionText(want), KindText(kind), fmt::join(want.send_splits, ", "),
                       fmt::join(want.recv_splits, ", "), want.shapes.size(), want.bytes.count(),
                       fmt::join(in.send_splits, ", "), fmt::join(in.recv_splits, ", "),
                       in.shapes.size(), in.bytes.count());
  }
  el.started[s] = true;
  if (in.tag < 0) {
    el.done[s] = true;
    return std::nullopt;
  }
  if (open_.count(in.tag)) {
    return fmt::format("posts all-to-all tag {} again while instruction {} with that tag is not "
                       "waited for",
                       in.tag, open_[in.tag].index);
  }
  open_[in.tag] = {kind, in.microbatch, in.stage, static_cast<int64_t>(2 * j + 1), s, index};
  return std::nullopt;
}

std::optional<std::string> SegmentTracker::Wait(const Instruction& in) {
  const auto it = open_.find(in.tag);
  if (in.tag < 0 || it == open_.end()) {
    return fmt::format("waits for all-to-all tag {}, which this rank has not posted (or already "
                       "waited for)",
                       in.tag);
  }
  const Open o = it->second;
  if (o.mb != in.microbatch || o.stage != in.stage) {
    return fmt::format("waits for tag {} as micro-batch {} stage {}, but instruction {} posted it "
                       "for micro-batch {} stage {}",
                       in.tag, in.microbatch, in.stage, o.index, o.mb, o.stage);
  }
  if (!in.inputs.empty() || !in.outputs.empty()) return "an all-to-all wait has no slots";
  ops_[{o.kind, o.mb, o.stage}].chain[o.element].done[o.slice] = true;
  open_.erase(it);
  return std::nullopt;
}

std::optional<std::string> SegmentTracker::Finish() const {
  if (!open_.empty()) {
    return fmt::format("all-to-all tag {} posted by instruction {} is never waited for",
                       open_.begin()->first, open_.begin()->second.index);
  }
  for (const auto& [key, op] : ops_) {
    for (size_t e = 0; e < op.chain.size(); ++e) {
      if (Complete(op.chain[e])) continue;
      const int kind = std::get<0>(key);
      const bool a2a = kind != 2 && e % 2 == 1;
      return fmt::format("the segmented {} of micro-batch {} on stage {} never completes its {} "
                         "{}",
                         KindText(kind), std::get<1>(key), std::get<2>(key),
                         a2a ? "all-to-all" : "segment", kind == 2 ? e : e / 2);
    }
  }
  return std::nullopt;
}

}  // namespace sluice
