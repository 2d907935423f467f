// Binding a rank to its own CPUs (`sluice train --cpu-bind`), as torchrun's and numactl's core
// binding do: the CPUs this process may run on (sched_getaffinity: what taskset, cgroups or the
// launcher allow) are cut into `local_world` contiguous, equal parts (the first parts one larger
// when they do not divide), and local rank r is bound to part r. Threads created afterwards
// (libtorch's intra-op team, Gloo's) inherit the binding. With fewer CPUs than local ranks, rank r
// gets CPU r mod count, and the note says that ranks share.
//
// Thread safety: call before the process starts other threads.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace sluice::runtime {

enum class CpuBind { kNone, kCores };

inline constexpr const char* kCpuBindChoices = "none, cores";

// "none" or "cores"; anything else is an error naming `flag` and the allowed values.
StatusOr<CpuBind> ParseCpuBind(std::string_view text, std::string_view flag);

// The CPUs (ids, ascending) local rank `local_rank` of `local_world` gets out of `allowed`.
// REQUIRES: allowed is not empty, 0 <= local_rank < local_world.
std::vector<int> CpusOfLocalRank(const std::vector<int>& allowed, int64_t local_rank,
                                 int64_t local_world);

// Applies `bind` to this process. Returns a one-line description ("none", or "local rank 1 of 2
// on CPU 1 (of 0-1)"); errors when the CPUs cannot be read or set (naming the system call).
StatusOr<std::string> BindCpus(CpuBind bind, int64_t local_rank, int64_t local_world);

}  // namespace sluice::runtime
