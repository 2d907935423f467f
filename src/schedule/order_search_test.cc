#include "schedule/order_search.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "schedule/schedule_costs.h"
#include "schedule/test_util.h"

namespace sluice {
namespace {

using testing::RandomCosts;
using testing::SetBudget;
using testing::UniformCosts;

OrderSearchResult Must(ScheduleKind kind, const ScheduleCosts& costs,
                       const OrderSearchOptions& options = {}) {
  StatusOr<OrderSearchResult> r = SearchMicroBatchOrder(kind, costs, options);
  SLUICE_CHECK_MSG(r.ok(), r.status().ToString());
  return std::move(r).value();
}

OrderSearchOptions WithSeed(uint64_t seed) {
  OrderSearchOptions o;
  o.seed = seed;
  return o;
}

bool IsPermutation(std::vector<int64_t> order, int64_t m) {
  std::sort(order.begin(), order.end());
  std::vector<int64_t> want(static_cast<size_t>(m));
  std::iota(want.begin(), want.end(), 0);
  return order == want;
}

TEST(OrderSearchTest, NeverWorseThanTheGivenOrder) {
  for (uint64_t seed = 0; seed < 8; ++seed) {
    for (ScheduleKind k : {ScheduleKind::k1F1B, ScheduleKind::kAdaptive, ScheduleKind::kZbH1}) {
      const ScheduleCosts c = RandomCosts(seed, 4, 1, 4 + 3 * static_cast<int64_t>(seed));
      const OrderSearchResult r = Must(k, c, WithSeed(seed));
      ASSERT_EQ(r.outcome, PlanOutcome::kOk);
      EXPECT_TRUE(IsPermutation(r.order, c.num_microbatches()));
      EXPECT_LE(r.result.estimate.makespan, r.given_makespan);
      EXPECT_GE(r.candidates, 2);
      // The result is the schedule of the reordered costs.
      ScheduleCosts permuted;
      PermuteMicroBatches(c, r.order, &permuted);
      EXPECT_EQ(EstimateSchedule(r.result.schedule, permuted).makespan, r.result.estimate.makespan);
    }
  }
}

TEST(OrderSearchTest, FindsABetterOrderForAMixedBatch) {
  // Ten micro-batches in three sizes (1x, 2x, 3x, 4x), given smallest first: the long ones last
  // leave a long cool-down; the clusters let the search move them.
  ScheduleCosts c = UniformCosts(4, 1, 10, 10, 12, 8);
  for (int64_t i = 0; i < 10; ++i) {
    const double size = static_cast<double>(1 + i / 3);
    for (ChunkCost& cc : c.chunks[i]) {
      cc.forward = cc.forward.Scaled(size);
      cc.backward_input = cc.backward_input.Scaled(size);
      cc.backward_weight = cc.backward_weight.Scaled(size);
    }
  }
  for (ScheduleKind k : {ScheduleKind::k1F1B, ScheduleKind::kZbH1, ScheduleKind::kAdaptive}) {
    const OrderSearchResult r = Must(k, c);
    EXPECT_LT(r.result.estimate.makespan.micros(), 0.97 * r.given_makespan.micros())
        << ScheduleKindName(k);
    EXPECT_EQ(r.candidates, 48) << ScheduleKindName(k);  // 4! x 2 (+ given, longest first)
  }
}

TEST(OrderSearchTest, DeterministicForASeed) {
  const ScheduleCosts c = RandomCosts(3, 8, 1, 24);
  const OrderSearchResult a = Must(ScheduleKind::kAdaptive, c, WithSeed(11));
  const OrderSearchResult b = Must(ScheduleKind::kAdaptive, c, WithSeed(11));
  EXPECT_EQ(a.order, b.order);
  EXPECT_EQ(a.result.schedule, b.result.schedule);
  EXPECT_EQ(a.candidates, b.candidates);
  // 3 clusters above 20 micro-batches: 3! permutations x (ordered + 1 shuffle) + 2, at most.
  EXPECT_LE(a.candidates, 14);
  EXPECT_GE(a.candidates, 8);
}

TEST(OrderSearchTest, SmallBatchesTryEveryOrder) {
  const ScheduleCosts c = RandomCosts(9, 2, 1, 4);
  const OrderSearchResult r = Must(ScheduleKind::k1F1B, c);
  EXPECT_EQ(r.candidates, 24);
  // Exhaustive: nothing beats it.
  std::vector<int64_t> perm = {0, 1, 2, 3};
  ScheduleCosts permuted;
  do {
    PermuteMicroBatches(c, perm, &permuted);
    EXPECT_GE(GenerateSchedule(ScheduleKind::k1F1B, permuted)->estimate.makespan,
              r.result.estimate.makespan);
  } while (std::next_permutation(perm.begin(), perm.end()));
}

TEST(OrderSearchTest, ClustersGroupSimilarMicroBatches) {
  ScheduleCosts c = UniformCosts(2, 1, 9, 10, 10, 10);
  for (int64_t mb : {2, 5, 8}) {
    for (ChunkCost& cc : c.chunks[mb]) cc.forward = Duration::Micros(100);
  }
  for (int64_t mb : {1, 4}) {
    for (ChunkCost& cc : c.chunks[mb]) cc.forward = Duration::Micros(50);
  }
  const std::vector<int64_t> cl = ClusterMicroBatches(c, 3);
  EXPECT_EQ(cl, (std::vector<int64_t>{2, 1, 0, 2, 1, 0, 2, 2, 0}));
  // Fewer distinct points than clusters: as many clusters as points.
  const std::vector<int64_t> same = ClusterMicroBatches(UniformCosts(2, 1, 5, 1, 1, 1), 4);
  EXPECT_EQ(same, (std::vector<int64_t>(5, 0)));
}

TEST(OrderSearchTest, DropsOrdersThatDoNotFit) {
  // Two big micro-batches must not be in flight together on rank 0 under 1F1B (pp = 2: two in
  // flight): the given order 0, 1 (both big) fails; an order that separates them fits (5
  // micro-batches: every order is tried).
  ScheduleCosts c = UniformCosts(2, 1, 5, 10, 10, 10, 100);
  for (int64_t mb : {0, 1}) {
    for (ChunkCost& cc : c.chunks[mb]) cc.stored = cc.peak = Bytes::MB(300);
  }
  SetBudget(&c, 450);
  const OrderSearchResult r = Must(ScheduleKind::k1F1B, c);
  ASSERT_EQ(r.outcome, PlanOutcome::kOk);
  EXPECT_EQ(r.given_makespan, Duration::Infinite());
  EXPECT_LT(r.feasible, r.candidates);
  EXPECT_TRUE(r.result.estimate.fits_memory);
  SetBudget(&c, 250);
  const OrderSearchResult none = Must(ScheduleKind::k1F1B, c);
  EXPECT_EQ(none.outcome, PlanOutcome::kOutOfMemory);
  EXPECT_NE(none.infeasible_reason.find("no order of the 5 micro-batches fits"), std::string::npos)
      << none.infeasible_reason;
}

TEST(OrderSearchTest, OptionsAreChecked) {
  const ScheduleCosts c = RandomCosts(1, 2, 1, 4);
  OrderSearchOptions wide;
  wide.exhaustive_up_to = 9;
  EXPECT_FALSE(SearchMicroBatchOrder(ScheduleKind::k1F1B, c, wide).ok());
  OrderSearchOptions negative;
  negative.shuffles = -1;
  EXPECT_FALSE(SearchMicroBatchOrder(ScheduleKind::k1F1B, c, negative).ok());
  EXPECT_FALSE(SearchMicroBatchOrder(ScheduleKind::kZbH1, RandomCosts(1, 2, 2, 4)).ok());
}

}  // namespace
}  // namespace sluice
