// EventQueue against a sorted reference: pops come in (time, push order) order, ties included,
// however pushes and pops interleave.
#include "sim/event_queue.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <tuple>
#include <vector>

namespace sluice::sim_internal {
namespace {

TEST(EventQueueTest, PopsByTimeThenPushOrder) {
  EventQueue q;
  q.Push({5, EventType::kFlowDone, 0, 0});
  q.Push({3, EventType::kCollDone, 1, 7});
  q.Push({5, EventType::kTransferData, 2, 0});
  q.Push({0, EventType::kCollStart, 3, 0});
  EXPECT_EQ(q.pushed(), 4u);
  std::vector<int32_t> order;
  while (!q.empty()) order.push_back(q.Pop().a);
  EXPECT_EQ(order, (std::vector<int32_t>{3, 1, 0, 2}));
}

TEST(EventQueueTest, KeepsEveryFieldAndLargeTimes) {
  EventQueue q;
  const int64_t big = int64_t{1} << 61;
  q.Push({big, EventType::kCollLatency, -5, 4000000000u});
  q.Push({0, EventType::kFlowDone, 9, 1});
  const Event first = q.Pop();
  EXPECT_EQ(first.time, 0);
  EXPECT_EQ(first.a, 9);
  const Event second = q.Pop();
  EXPECT_EQ(second.time, big);
  EXPECT_EQ(second.type, EventType::kCollLatency);
  EXPECT_EQ(second.a, -5);
  EXPECT_EQ(second.b, 4000000000u);
  EXPECT_TRUE(q.empty());
}

TEST(EventQueueTest, MatchesASortedReferenceUnderInterleavedUse) {
  std::mt19937_64 rng(7);
  EventQueue q;
  // (time, push index) of the events in the queue; the reference pops its minimum.
  std::vector<std::tuple<int64_t, int32_t>> ref;
  int32_t pushed = 0;
  int64_t now = 0;
  for (int step = 0; step < 20000; ++step) {
    if (ref.empty() || rng() % 3 != 0) {
      const int64_t t = now + static_cast<int64_t>(rng() % 50);  // many ties
      q.Push({t, EventType::kFlowDone, pushed, 0});
      ref.emplace_back(t, pushed++);
    } else {
      const auto it = std::min_element(ref.begin(), ref.end());
      const Event e = q.Pop();
      ASSERT_EQ(e.time, std::get<0>(*it));
      ASSERT_EQ(e.a, std::get<1>(*it));
      now = e.time;
      ref.erase(it);
    }
  }
  EXPECT_EQ(q.pushed(), static_cast<uint64_t>(pushed));
}

}  // namespace
}  // namespace sluice::sim_internal
