#include "runtime/host_allocator.h"

#include <fmt/core.h>

#include <cstdlib>
#include <string>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace sluice::runtime {
namespace {

constexpr int kCacheThreshold = 1 << 30;  // 1 GiB

// The variable of the environment that already sets glibc's malloc policy, or "" when none.
std::string MallocEnvironment() {
  for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"}) {
    if (std::getenv(name) != nullptr) return name;
  }
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables != nullptr && std::string(tunables).find("glibc.malloc.") != std::string::npos) {
    return "GLIBC_TUNABLES";
  }
  return "";
}

}  // namespace

StatusOr<HostAllocator> ParseHostAllocator(std::string_view text, std::string_view flag) {
  if (text == "cache") return HostAllocator::kCache;
  if (text == "system") return HostAllocator::kSystem;
  return InvalidArgumentError(fmt::format("{}: '{}' is not a host allocator policy (allowed: {})",
                                          flag, text, kHostAllocatorChoices));
}

std::string HostAllocatorName(HostAllocator a) {
  return a == HostAllocator::kCache ? "cache" : "system";
}

std::string ConfigureHostAllocator(HostAllocator policy) {
  if (policy == HostAllocator::kSystem) return "system (the C library's own policy)";
  const std::string env = MallocEnvironment();
  if (!env.empty())
    return fmt::format("system ({} is set in the environment; left as it says)", env);
#if defined(__GLIBC__)
  // Setting either threshold also stops glibc from moving the mmap threshold itself.
  if (mallopt(M_MMAP_THRESHOLD, kCacheThreshold) == 1 &&
      mallopt(M_TRIM_THRESHOLD, kCacheThreshold) == 1) {
    return "cache (glibc mmap and trim thresholds 1 GiB: freed tensors stay for reuse)";
  }
  return "system (glibc refused the thresholds)";
#else
  return "system (not glibc: nothing to set)";
#endif
}

}  // namespace sluice::runtime
