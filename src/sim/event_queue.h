// EventQueue: the simulator's pending events, earliest first (internal to src/sim/).
//
// Events are ordered by (time, sequence number), the sequence number being the order in which
// they were pushed, so ties break the same way on every run. A 4-ary heap of 24-byte events:
// half the levels of a binary heap, and a node's children share one or two cache lines (the
// queue holds about one event per rank; the 1,024-rank simulations pop millions).
//
// Thread safety: one simulation's object; not shared.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace sluice::sim_internal {

enum class EventType : uint8_t {
  kTransferData,
  kFlowDone,
  kCollStart,
  kCollLatency,
  kCollDone,
  kA2aStart,  // an all-to-all's latency has passed: its flows start (a = its group)
  kA2aDone,   // closed form: an all-to-all ends (a = its group)
};

struct Event {
  int64_t time = 0;  // ns
  EventType type = EventType::kFlowDone;
  int32_t a = 0;   // transfer, flow or group
  uint32_t b = 0;  // flow version
};

class EventQueue {
 public:
  bool empty() const { return heap_.empty(); }
  // Events pushed so far.
  uint64_t pushed() const { return next_seq_; }

  void Push(const Event& e) {
    Node node{static_cast<uint64_t>(e.time) ^ kSignBit,
              next_seq_++ << 8 | static_cast<uint64_t>(e.type), e.a, e.b};
    size_t i = heap_.size();
    heap_.push_back(node);
    while (i > 0) {
      const size_t parent = (i - 1) / 4;
      if (!Before(node, heap_[parent])) break;
      heap_[i] = heap_[parent];
      i = parent;
    }
    heap_[i] = node;
  }

  // The earliest event, removed. REQUIRES: !empty().
  Event Pop() {
    const Node top = heap_.front();
    const Node last = heap_.back();
    heap_.pop_back();
    const size_t n = heap_.size();
    if (n > 0) {
      size_t i = 0;
      for (;;) {
        const size_t first = 4 * i + 1;
        if (first >= n) break;
        const size_t end = first + 4 < n ? first + 4 : n;
        size_t best = first;
        for (size_t c = first + 1; c < end; ++c) {
          if (Before(heap_[c], heap_[best])) best = c;
        }
        if (!Before(heap_[best], last)) break;
        heap_[i] = heap_[best];
        i = best;
      }
      heap_[i] = last;
    }
    return {static_cast<int64_t>(top.time ^ kSignBit), static_cast<EventType>(top.key & 0xff),
            top.a, top.b};
  }

 private:
  static constexpr uint64_t kSignBit = uint64_t{1} << 63;
  struct Node {
    uint64_t time;  // the event's time with the sign bit flipped: unsigned order = signed order
    uint64_t key;   // sequence number << 8 | type: unique, so the order is total
    int32_t a;
    uint32_t b;
  };
  // (time, key) as one 128-bit number: one branch-free compare.
  static bool Before(const Node& x, const Node& y) {
    using U128 = unsigned __int128;
    return (U128{x.time} << 64 | x.key) < (U128{y.time} << 64 | y.key);
  }

  std::vector<Node> heap_;
  uint64_t next_seq_ = 0;
};

}  // namespace sluice::sim_internal
