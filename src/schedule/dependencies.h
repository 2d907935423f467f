// The one meaning of a pipeline action's dependencies, and the transfer channels between ranks.
//
// Every part of sluice that orders or times pipeline work — the schedule estimator, the cost-driven
// generators (ZB-H1), the lowering into instructions, the PyTorch CSV checker and the plan
// validator — asks these functions what an action consumes and produces, instead of spelling the
// rules out itself:
//  - F(mb, s) consumes the activations of boundary s - 1, produced by F(mb, s - 1) (none on s = 0).
//  - B(mb, s) and I(mb, s) need F(mb, s) on their own stage, and consume the gradient of boundary
//    s, produced by B or I of (mb, s + 1) (none on the last stage).
//  - W(mb, s) needs I(mb, s) on its own stage and exchanges nothing.
// Boundary b lies between virtual stages b and b + 1; stage s runs on pipeline rank s % pp.
//
// TransferChannels is the estimator's link model for list scheduling: one channel per (sender,
// direction) pair of neighbouring ranks; transfers on a channel run one at a time, in the order
// they are asked for.
//
// Thread safety: pure functions; a TransferChannels is a value owned by one replay.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "schedule/action.h"

namespace sluice {

// A boundary tensor crossing from one virtual stage to its neighbour.
struct BoundaryTransfer {
  int64_t boundary = 0;    // between stages `boundary` and `boundary + 1`
  int64_t from_stage = 0;  // the producing stage
  int64_t to_stage = 0;    // the consuming stage
  bool gradient = false;   // false: activations (forward), true: gradients (backward)

  friend bool operator==(const BoundaryTransfer&, const BoundaryTransfer&) = default;
};

// The boundary tensor an action of `kind` on `stage` receives from another stage; nullopt for W,
// for F on the first stage and for B/I on the last. REQUIRES: 0 <= stage < num_stages.
// (Inline: the estimator and the ZB-H1 generator ask it for every action.)
inline std::optional<BoundaryTransfer> ConsumedBoundary(ActionKind kind, int64_t stage,
                                                        int64_t num_stages) {
  switch (kind) {
    case ActionKind::kForward:
      if (stage == 0) return std::nullopt;
      return BoundaryTransfer{stage - 1, stage - 1, stage, false};
    case ActionKind::kBackward:
    case ActionKind::kBackwardInput:
      if (stage + 1 >= num_stages) return std::nullopt;
      return BoundaryTransfer{stage, stage + 1, stage, true};
    case ActionKind::kBackwardWeight:
      return std::nullopt;
  }
  return std::nullopt;
}
// The boundary tensor an action of `kind` on `stage` hands to another stage; nullopt for W, for F
// on the last stage and for B/I on the first. REQUIRES: 0 <= stage < num_stages.
inline std::optional<BoundaryTransfer> ProducedBoundary(ActionKind kind, int64_t stage,
                                                        int64_t num_stages) {
  switch (kind) {
    case ActionKind::kForward:
      if (stage + 1 >= num_stages) return std::nullopt;
      return BoundaryTransfer{stage, stage, stage + 1, false};
    case ActionKind::kBackward:
    case ActionKind::kBackwardInput:
      if (stage == 0) return std::nullopt;
      return BoundaryTransfer{stage - 1, stage, stage - 1, true};
    case ActionKind::kBackwardWeight:
      return std::nullopt;
  }
  return std::nullopt;
}
// The action of the same micro-batch and stage that must run first: F for B and I, I for W;
// nullopt for F.
std::optional<ActionKind> LocalPrerequisite(ActionKind kind);
// Whether an action of `kind` produces the boundary gradient (B or I: the "input gradient").
inline bool ProducesInputGradient(ActionKind kind) {
  return kind == ActionKind::kBackward || kind == ActionKind::kBackwardInput;
}

// The estimator's channels between pipeline ranks (see above), in nanoseconds.
class TransferChannels {
 public:
  explicit TransferChannels(int64_t pp) : pp_(pp), free_(static_cast<size_t>(2 * pp), 0) {}

  // When data of a transfer from rank `src` to rank `dst` that is ready at `ready` and takes
  // `duration` arrives; the channel is busy until then. Same rank: `ready` (free, no channel).
  // REQUIRES: 0 <= src, dst < pp.
  int64_t Arrive(int64_t src, int64_t dst, int64_t ready, int64_t duration) {
    if (src == dst) return ready;
    const int64_t next = src + 1 == pp_ ? 0 : src + 1;
    int64_t& free = free_[static_cast<size_t>(2 * src + (dst == next ? 0 : 1))];
    free = std::max(ready, free) + duration;
    return free;
  }

 private:
  int64_t pp_;
  std::vector<int64_t> free_;  // [2 * src + (dst is src + 1 mod pp ? 0 : 1)]
};

}  // namespace sluice
