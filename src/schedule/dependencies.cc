#include "schedule/dependencies.h"

namespace sluice {

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
