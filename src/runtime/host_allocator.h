// The host allocator's policy for a training or profiling process (`--host-allocator`).
//
// libtorch allocates CPU tensors with the C library's malloc. glibc serves a block above its mmap
// threshold (128 KiB at start, raised as blocks are freed, up to 32 MiB) with a fresh mmap and
// returns it to the system on free; the top of its heap is given back past the trim threshold.
// A training iteration allocates and frees the same large activations again and again, so under
// the default policy every iteration maps pages, faults them in and unmaps them, and when the
// threshold moves (a larger block freed) the next iterations change behaviour: a warm-up of
// several iterations and an extra source of per-iteration jitter (docs/benchmarks.md, "A
// steadier host allocator").
//
//   cache   (default) mmap and trim thresholds of 1 GiB: blocks up to 1 GiB come from the heap
//           and stay there when freed, reused by the next iteration (what a caching allocator,
//           jemalloc or tcmalloc give PyTorch CPU users). The process keeps its high-water mark
//           of freed memory (resident memory a few percent higher on the tiny models).
//   system  glibc's own policy, untouched.
//
// The environment wins: when MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_ or a glibc.malloc
// tunable in GLIBC_TUNABLES is set, ConfigureHostAllocator changes nothing and says so. On C
// libraries other than glibc it changes nothing either.
//
// Thread safety: call ConfigureHostAllocator early, before other threads allocate.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"

namespace sluice::runtime {

enum class HostAllocator { kCache, kSystem };

inline constexpr const char* kHostAllocatorChoices = "cache, system";

// "cache" or "system"; anything else is an error naming `flag` and the allowed values.
StatusOr<HostAllocator> ParseHostAllocator(std::string_view text, std::string_view flag);
std::string HostAllocatorName(HostAllocator a);

// Applies `policy` to this process. Returns a one-line description of what is in effect, e.g.
// "cache (glibc mmap and trim thresholds 1 GiB)" or "system (MALLOC_TRIM_THRESHOLD_ is set)".
std::string ConfigureHostAllocator(HostAllocator policy);

}  // namespace sluice::runtime
