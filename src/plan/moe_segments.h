// Segmented MoE ops: the rules behind instruction.h's "Segmented MoE ops" that the validator,
// the passes (passes/moe_overlap.h) and the simulator share.
//
// A compute op of a stage with k MoE layers has 2k+1 segments and 2k all-to-alls between them
// (AllToAllsOf's list, in the op's order). Cutting a segment or an all-to-all into n slices is
// deterministic: slice c of a count x is SplitPart(x, c, n), so the slices of an all-to-all pair
// up across the group exactly as the whole one does and sum to it.
//
// SegmentTracker follows the pieces of the segmented ops of one rank's program, in program order,
// and says what is wrong with the next piece, all-to-all or wait (ValidatePlan's order check).
//
// Thread safety: value types and pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "plan/execution_plan.h"

namespace sluice {

// x / n, the first x % n slices one more. REQUIRES: x >= 0, 0 <= c < n.
int64_t SplitPart(int64_t x, int64_t c, int64_t n);
// Segments of a compute op of `stage`: 2k+1 with k MoE layers when the plan has expert
// parallelism (ep > 1, an MoE model), else 0 (the stage's ops cannot be segmented).
int64_t NumSegments(const ExecutionPlan& plan, int64_t stage);
// Slice c of n of the whole all-to-all `whole` (an AllToAllsOf entry): its splits SplitPart of
// the whole's, shapes and bytes (the rows sent to members other than `rank`) from them,
// chunk/chunks set, tag and duration kept. REQUIRES: 0 <= c < n.
Instruction AllToAllSlice(const Instruction& whole, int64_t c, int64_t n, int64_t hidden,
                          int64_t rank);

// For every instruction of `program`: kFirstPiece when it is a compute op that starts its op
// (the first instruction of that op kind, micro-batch and stage in program order; a whole op
// always), kLastPiece when it ends it (the last such), 0 for other ops. The memory rule and the
// simulator apply an op's start at its first piece and its end at its last.
inline constexpr uint8_t kFirstPiece = 1, kLastPiece = 2;
std::vector<uint8_t> PieceRoles(const RankProgram& program);

// Whether `in` is a token slice (the forward partition's, passes/moe_overlap.h): a compute piece
// of an even (attention) segment cut into slices. Capacity slices (Tutel's) cut only the odd
// (MoE block) segments.
inline bool IsTokenSlice(const Instruction& in) {
  return IsCompute(in.op) && in.segment >= 0 && in.segment % 2 == 0 && in.chunks > 0;
}

// One rank's segmented ops. Feed it every piece (compute op with segment >= 0), every all-to-all
// that does not belong to a whole compute op, and every all-to-all wait, in program order.
class SegmentTracker {
 public:
  SegmentTracker(const ExecutionPlan& plan, const RankProgram& program);

  // What a compute piece does for its op: whether it is the op's first piece in program order
  // (it reads the op's inputs) and whether it completes the op (it writes the outputs).
  struct PieceRole {
    bool first = false;
    bool last = false;
  };
  // On success sets *role; else the problem (the caller checks the op's state and slots).
  std::optional<std::string> Piece(const Instruction& in, int64_t index, PieceRole* role);
  // `forward_done`: whether the F of its (mb, stage) has completed (then it is the backward's).
  std::optional<std::string> AllToAll(const Instruction& in, int64_t index, bool forward_done);
  std::optional<std::string> Wait(const Instruction& in);
  // At the end of the program: nothing left posted and not waited, no op half done.
  std::optional<std::string> Finish() const;

 private:
  // One element of an op's chain: a segment (even index) or an all-to-all (odd).
  struct Element {
    int64_t cut = -1;                  // -1: not seen; 0: whole; n: n slices
    std::vector<bool> started, done;   // per slice (one entry when whole)
    std::vector<int64_t> send_sum, recv_sum;  // all-to-all slices posted so far
  };
  struct Op {
    std::vector<Element> chain;  // 2P - 1 elements (W: P segments only)
    int64_t pieces_done = 0;
    bool started = false;
  };
  // The op key of (kind, mb, stage); kind 0: F, 1: B or I, 2: W.
  Op& OpOf(int kind, int64_t mb, int64_t stage, int64_t segments);
  // Whether the slices of `e` that slice c of n depends on are done.
  static bool Covered(const Element& e, int64_t c, int64_t n);
  static bool Complete(const Element& e);

  const ExecutionPlan& plan_;
  const RankProgram& program_;
  std::map<std::tuple<int, int64_t, int64_t>, Op> ops_;
  struct Open {
    int kind;
    int64_t mb, stage, element, slice;
    int64_t index;  // the instruction that posted it
  };
  std::map<int64_t, Open> open_;  // [tag]
};

}  // namespace sluice
