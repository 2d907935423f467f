#include "schedule/dependencies.h"

namespace sluice {

std::optional<BoundaryTransfer> ConsumedBoundary(ActionKind kind, int64_t stage,
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

std::optional<BoundaryTransfer> ProducedBoundary(ActionKind kind, int64_t stage,
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

std::optional<ActionKind> LocalPrerequisite(ActionKind kind) {
  switch (kind) {
    case ActionKind::kForward:
      return std::nullopt;
    case ActionKind::kBackward:
    case ActionKind::kBackwardInput:
      return ActionKind::kForward;
    case ActionKind::kBackwardWeight:
      return ActionKind::kBackwardInput;
  }
  return std::nullopt;
}

}  // namespace sluice
