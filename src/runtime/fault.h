// Faults injected for the failure-handling tests (`sluice train --fault RANK:ITERATION:KIND`):
// at the start of `iteration`, `rank` exits with status 3 ("exit"), kills itself with SIGKILL
// ("kill"), stops itself with SIGSTOP ("stop": a hung process, heartbeats included) or blocks
// its main thread forever ("hang": heartbeats go on, its peers time out waiting for it).
//
// Thread safety: pure functions, but InjectFault ends or stops the process when it applies.
#pragma once

#include <cstdint>
#include <string_view>

#include "base/status.h"

namespace sluice::runtime {

struct FaultSpec {
  enum class Kind { kNone, kExit, kKill, kStop, kHang };
  Kind kind = Kind::kNone;
  int64_t rank = -1;
  int64_t iteration = -1;
};
// "RANK:ITERATION:KIND", e.g. "1:2:kill". Errors name --fault and the allowed kinds.
StatusOr<FaultSpec> ParseFault(std::string_view text);
// Applies `f` when it names this rank and iteration; otherwise does nothing.
void InjectFault(const FaultSpec& f, int64_t rank, int64_t iteration);

}  // namespace sluice::runtime
