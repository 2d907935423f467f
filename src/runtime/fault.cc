#include "runtime/fault.h"

#include <fmt/core.h>
#include <signal.h>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace sluice::runtime {

StatusOr<FaultSpec> ParseFault(std::string_view text) {
  const auto bad = [&] {
    return InvalidArgumentError(fmt::format(
        "--fault '{}': expected RANK:ITERATION:KIND with KIND one of exit, kill, stop, hang",
        text));
  };
  const size_t a = text.find(':');
  const size_t b = a == std::string_view::npos ? a : text.find(':', a + 1);
  if (b == std::string_view::npos) return bad();
  FaultSpec f;
  const std::string_view r = text.substr(0, a), it = text.substr(a + 1, b - a - 1);
  const std::string_view kind = text.substr(b + 1);
  if (std::from_chars(r.data(), r.data() + r.size(), f.rank).ptr != r.data() + r.size() ||
      std::from_chars(it.data(), it.data() + it.size(), f.iteration).ptr != it.data() + it.size() ||
      f.rank < 0 || f.iteration < 0 || r.empty() || it.empty()) {
    return bad();
  }
  if (kind == "exit") {
    f.kind = FaultSpec::Kind::kExit;
  } else if (kind == "kill") {
    f.kind = FaultSpec::Kind::kKill;
  } else if (kind == "stop") {
    f.kind = FaultSpec::Kind::kStop;
  } else if (kind == "hang") {
    f.kind = FaultSpec::Kind::kHang;
  } else {
    return bad();
  }
  return f;
}

void InjectFault(const FaultSpec& f, int64_t rank, int64_t iteration) {
  if (f.kind == FaultSpec::Kind::kNone || f.rank != rank || f.iteration != iteration) return;
  std::fprintf(stderr, "sluice: rank %ld: injecting fault at iteration %ld (--fault)\n",
               static_cast<long>(rank), static_cast<long>(iteration));
  std::fflush(stderr);
  switch (f.kind) {
    case FaultSpec::Kind::kExit:
      std::_Exit(3);
    case FaultSpec::Kind::kKill:
      raise(SIGKILL);
      break;
    case FaultSpec::Kind::kStop:
      raise(SIGSTOP);
      break;
    case FaultSpec::Kind::kHang:
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    case FaultSpec::Kind::kNone:
      break;
  }
}

}  // namespace sluice::runtime
