// CpuMemoryCounter: counts the bytes libtorch allocates on the CPU while it is installed, with a
// running peak and an optional limit (what `sluice profile` measures activation memory with).
//
// Install() puts a counting allocator in front of the process's current CPU allocator
// (c10::SetCPUAllocator, priority 0) and the destructor puts the previous one back: the hook is
// process-wide, so counters must be destroyed in the reverse order of installation (checked),
// and installing or removing one must not race with torch ops on other threads. While installed,
// every CPU tensor allocation (at::empty and everything built on it) is counted; memory that
// BLAS/oneDNN allocate internally, and pinned or non-CPU memory, are not. A block allocated
// while installed is subtracted when it is freed, even after the counter is gone; the counting
// allocator object stays alive until the counter and every block it handed out are gone (storages
// keep a pointer to the allocator that made them and use it to resize). The counting allocator
// allocates through the previous allocator's raw interface, 64 bytes more per block (not
// counted); Install() fails when the current allocator has none (libtorch's default has one).
//
// current() is the live bytes allocated through this counter; peak() the highest current() since
// Install() or the last ResetPeak(). With a limit set, an allocation that would take current()
// above it throws AllocationLimitError (a std::bad_alloc, so libtorch propagates it to the
// caller like an out-of-memory) and sets limit_hit().
//
// Thread safety: the counters are atomics; allocations from any thread are counted. Install,
// destruction, SetLimit and ResetPeak are for the thread driving the measurement.
#pragma once

#include <cstdint>
#include <memory>
#include <new>
#include <optional>

#include "base/status.h"
#include "base/units.h"

namespace c10 {
struct Allocator;
}  // namespace c10

namespace sluice::runtime {

// Thrown by the counting allocator when an allocation would exceed the counter's limit.
class AllocationLimitError : public std::bad_alloc {
 public:
  const char* what() const noexcept override {
    return "sluice CpuMemoryCounter: allocation above the limit";
  }
};

class CpuMemoryCounter {
 public:
  // Installs the counting allocator. FailedPrecondition when libtorch keeps its current CPU
  // allocator (one installed with a priority above 0 refuses the swap).
  static StatusOr<std::unique_ptr<CpuMemoryCounter>> Install();
  // Restores the allocator that was current at Install(). REQUIRES: this counter's allocator is
  // still the current one (counters are destroyed in reverse order of installation).
  ~CpuMemoryCounter();
  CpuMemoryCounter(const CpuMemoryCounter&) = delete;
  CpuMemoryCounter& operator=(const CpuMemoryCounter&) = delete;

  Bytes current() const;
  Bytes peak() const;
  // Allocations counted since Install() (blocks of 0 bytes are not counted).
  int64_t allocations() const;
  // Sets peak() to current() and clears limit_hit().
  void ResetPeak();
  // Allocations that would take current() above `limit` fail; nullopt: no limit.
  void SetLimit(std::optional<Bytes> limit);
  // An allocation failed on the limit since Install() or the last ResetPeak().
  bool limit_hit() const;

 private:
  class CountingAllocator;
  CpuMemoryCounter() = default;

  CountingAllocator* allocator_ = nullptr;  // reference-counted (memory_stats.cc)
  c10::Allocator* previous_ = nullptr;
};

}  // namespace sluice::runtime
