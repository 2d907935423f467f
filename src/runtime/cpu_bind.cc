#include "runtime/cpu_bind.h"

#include <fmt/core.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace sluice::runtime {
namespace {

// "0-3,6" for ascending ids.
std::string DescribeCpus(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += j == i ? fmt::format("{}", cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace

StatusOr<CpuBind> ParseCpuBind(std::string_view text, std::string_view flag) {
  if (text == "none") return CpuBind::kNone;
  if (text == "cores") return CpuBind::kCores;
  return InvalidArgumentError(
      fmt::format("{}: '{}' is not a CPU binding (allowed: {})", flag, text, kCpuBindChoices));
}

std::vector<int> CpusOfLocalRank(const std::vector<int>& allowed, int64_t local_rank,
                                 int64_t local_world) {
  const auto n = static_cast<int64_t>(allowed.size());
  if (n < local_world) return {allowed[static_cast<size_t>(local_rank % n)]};
  const int64_t base = n / local_world, extra = n % local_world;
  const int64_t begin = local_rank * base + std::min(local_rank, extra);
  const int64_t size = base + (local_rank < extra ? 1 : 0);
  return {allowed.begin() + begin, allowed.begin() + begin + size};
}

StatusOr<std::string> BindCpus(CpuBind bind, int64_t local_rank, int64_t local_world) {
  if (bind == CpuBind::kNone) return std::string("none");
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) {
    return FailedPreconditionError(
        fmt::format("--cpu-bind cores: sched_getaffinity failed: {}", std::strerror(errno)));
  }
  std::vector<int> allowed;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) allowed.push_back(c);
  }
  if (allowed.empty()) {
    return FailedPreconditionError("--cpu-bind cores: this process may run on no CPU");
  }
  const std::vector<int> mine = CpusOfLocalRank(allowed, local_rank, local_world);
  cpu_set_t want;
  CPU_ZERO(&want);
  for (const int c : mine) CPU_SET(c, &want);
  if (sched_setaffinity(0, sizeof(want), &want) != 0) {
    return FailedPreconditionError(fmt::format("--cpu-bind cores: sched_setaffinity({}) failed: {}",
                                               DescribeCpus(mine), std::strerror(errno)));
  }
  return fmt::format("local rank {} of {} on CPU{} {} (of {}){}", local_rank, local_world,
                     mine.size() == 1 ? "" : "s", DescribeCpus(mine), DescribeCpus(allowed),
                     static_cast<int64_t>(allowed.size()) < local_world
                         ? "; fewer CPUs than local ranks: ranks share"
                         : "");
}

}  // namespace sluice::runtime
