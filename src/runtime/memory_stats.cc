#include "runtime/memory_stats.h"

#include <c10/core/CPUAllocator.h>

#include <atomic>

#include "runtime/torch_pch.h"

namespace sluice::runtime {

// Wraps the previous CPU allocator through its raw interface (libtorch frees some buffers with
// raw_deallocate, which requires a fixed deleter and the data pointer as the context). Each block
// is preceded by a header naming its size and this allocator, which is reference-counted: the
// counter holds one reference and every live block another.
class CpuMemoryCounter::CountingAllocator final : public c10::Allocator {
 public:
  // 64: keeps the inner allocator's alignment (c10 aligns CPU blocks to 64 bytes).
  static constexpr size_t kHeader = 64;

  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(size_t n) const override {
    const c10::Device cpu(c10::DeviceType::CPU);
    if (n == 0) return c10::DataPtr(nullptr, nullptr, &Free, cpu);
    const int64_t bytes = static_cast<int64_t>(n);
    const int64_t limit = limit_.load(std::memory_order_relaxed);
    if (limit >= 0 && current_.load(std::memory_order_relaxed) + bytes > limit) {
      limit_hit_.store(true, std::memory_order_relaxed);
      throw AllocationLimitError();
    }
    void* base = inner_->raw_allocate(n + kHeader);
    auto* header = static_cast<Header*>(base);
    header->owner = const_cast<CountingAllocator*>(this);
    header->bytes = bytes;
    refs_.fetch_add(1, std::memory_order_relaxed);
    const int64_t now = current_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    allocations_.fetch_add(1, std::memory_order_relaxed);
    int64_t seen = peak_.load(std::memory_order_relaxed);
    while (now > seen && !peak_.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
    }
    void* data = static_cast<char*>(base) + kHeader;
    return c10::DataPtr(data, data, &Free, cpu);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &Free; }

  int64_t current() const { return current_.load(std::memory_order_relaxed); }
  int64_t peak() const { return peak_.load(std::memory_order_relaxed); }
  int64_t allocations() const { return allocations_.load(std::memory_order_relaxed); }
  bool limit_hit() const { return limit_hit_.load(std::memory_order_relaxed); }
  void ResetPeak() {
    peak_.store(current(), std::memory_order_relaxed);
    limit_hit_.store(false, std::memory_order_relaxed);
  }
  void SetLimit(int64_t limit) { limit_.store(limit, std::memory_order_relaxed); }
  // Drops one reference; the last one deletes the allocator.
  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

 private:
  struct Header {
    CountingAllocator* owner;
    int64_t bytes;
  };
  static_assert(sizeof(Header) <= kHeader);

  static void Free(void* data) {
    if (data == nullptr) return;
    void* base = static_cast<char*>(data) - kHeader;
    const Header header = *static_cast<Header*>(base);
    header.owner->current_.fetch_sub(header.bytes, std::memory_order_relaxed);
    header.owner->inner_->raw_deallocate(base);
    header.owner->Unref();
  }

  c10::Allocator* inner_;
  mutable std::atomic<int64_t> refs_{1};  // the counter's
  mutable std::atomic<int64_t> current_{0};
  mutable std::atomic<int64_t> peak_{0};
  mutable std::atomic<int64_t> allocations_{0};
  mutable std::atomic<bool> limit_hit_{false};
  std::atomic<int64_t> limit_{-1};
};

StatusOr<std::unique_ptr<CpuMemoryCounter>> CpuMemoryCounter::Install() {
  c10::Allocator* previous = c10::GetCPUAllocator();
  if (previous->raw_deleter() == nullptr) {
    return FailedPreconditionError(
        "memory counter: libtorch's current CPU allocator has no raw interface to wrap, so CPU "
        "memory cannot be counted in this process");
  }
  std::unique_ptr<CpuMemoryCounter> counter(new CpuMemoryCounter());
  counter->allocator_ = new CountingAllocator(previous);
  c10::SetCPUAllocator(counter->allocator_, /*priority=*/0);
  if (c10::GetCPUAllocator() == counter->allocator_) counter->previous_ = previous;
  if (counter->previous_ == nullptr) {
    return FailedPreconditionError(
        "memory counter: libtorch refused to replace its CPU allocator (an allocator was "
        "installed with a priority above 0), so CPU memory cannot be counted in this process");
  }
  return counter;
}

CpuMemoryCounter::~CpuMemoryCounter() {
  if (previous_ != nullptr) {
    SLUICE_CHECK_MSG(c10::GetCPUAllocator() == allocator_,
                     "CpuMemoryCounter destroyed while another allocator was installed after it");
    c10::SetCPUAllocator(previous_, /*priority=*/0);
  }
  allocator_->Unref();
}

Bytes CpuMemoryCounter::current() const { return Bytes::Of(allocator_->current()); }
Bytes CpuMemoryCounter::peak() const { return Bytes::Of(allocator_->peak()); }
int64_t CpuMemoryCounter::allocations() const { return allocator_->allocations(); }
void CpuMemoryCounter::ResetPeak() { allocator_->ResetPeak(); }
bool CpuMemoryCounter::limit_hit() const { return allocator_->limit_hit(); }

void CpuMemoryCounter::SetLimit(std::optional<Bytes> limit) {
  allocator_->SetLimit(limit.has_value() ? limit->count() : -1);
}

}  // namespace sluice::runtime
