#include "runtime/memory_stats.h"

#include <atomic>

#include "runtime/torch_pch.h"

namespace sluice::runtime {

// Wraps the previous CPU allocator. Each block it hands out carries a Block context that owns the
// inner block and a reference to this allocator, so frees are counted (and the allocator stays
// alive) however long the tensor outlives the counter.
class CpuMemoryCounter::CountingAllocator final
    : public c10::Allocator,
      public std::enable_shared_from_this<CountingAllocator> {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(size_t n) const override {
    if (n == 0) return inner_->allocate(0);
    const int64_t bytes = static_cast<int64_t>(n);
    const int64_t limit = limit_.load(std::memory_order_relaxed);
    if (limit >= 0 && current_.load(std::memory_order_relaxed) + bytes > limit) {
      limit_hit_.store(true, std::memory_order_relaxed);
      throw AllocationLimitError();
    }
    c10::DataPtr inner = inner_->allocate(n);
    void* data = inner.get();
    const c10::Device device = inner.device();
    auto* block = new Block{shared_from_this(), std::move(inner), bytes};
    const int64_t now = current_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    allocations_.fetch_add(1, std::memory_order_relaxed);
    int64_t seen = peak_.load(std::memory_order_relaxed);
    while (now > seen && !peak_.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
    }
    return c10::DataPtr(data, block, &Free, device);
  }

  int64_t current() const { return current_.load(std::memory_order_relaxed); }
  int64_t peak() const { return peak_.load(std::memory_order_relaxed); }
  int64_t allocations() const { return allocations_.load(std::memory_order_relaxed); }
  bool limit_hit() const { return limit_hit_.load(std::memory_order_relaxed); }
  void ResetPeak() {
    peak_.store(current(), std::memory_order_relaxed);
    limit_hit_.store(false, std::memory_order_relaxed);
  }
  void SetLimit(int64_t limit) { limit_.store(limit, std::memory_order_relaxed); }

 private:
  struct Block {
    std::shared_ptr<const CountingAllocator> owner;  // declared first: destroyed last
    c10::DataPtr inner;
    int64_t bytes;
  };
  static void Free(void* context) {
    auto* block = static_cast<Block*>(context);
    block->owner->current_.fetch_sub(block->bytes, std::memory_order_relaxed);
    delete block;  // frees the inner block, then may drop the last reference to the allocator
  }

  c10::Allocator* inner_;
  mutable std::atomic<int64_t> current_{0};
  mutable std::atomic<int64_t> peak_{0};
  mutable std::atomic<int64_t> allocations_{0};
  mutable std::atomic<bool> limit_hit_{false};
  std::atomic<int64_t> limit_{-1};
};

StatusOr<std::unique_ptr<CpuMemoryCounter>> CpuMemoryCounter::Install() {
  std::unique_ptr<CpuMemoryCounter> counter(new CpuMemoryCounter());
  counter->previous_ = c10::GetCPUAllocator();
  counter->allocator_ = std::make_shared<CountingAllocator>(counter->previous_);
  c10::SetCPUAllocator(counter->allocator_.get(), /*priority=*/0);
  if (c10::GetCPUAllocator() != counter->allocator_.get()) {
    counter->previous_ = nullptr;  // nothing to restore
    return FailedPreconditionError(
        "memory counter: libtorch refused to replace its CPU allocator (an allocator was "
        "installed with a priority above 0), so CPU memory cannot be counted in this process");
  }
  return counter;
}

CpuMemoryCounter::~CpuMemoryCounter() {
  if (previous_ == nullptr) return;
  SLUICE_CHECK_MSG(c10::GetCPUAllocator() == allocator_.get(),
                   "CpuMemoryCounter destroyed while another allocator was installed after it");
  c10::SetCPUAllocator(previous_, /*priority=*/0);
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
