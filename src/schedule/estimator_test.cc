#include "schedule/estimator.h"

#include <gtest/gtest.h>

#include "schedule/generators.h"
#include "schedule/test_util.h"

namespace sluice {
namespace {

using testing::UniformCosts;

Action F(int64_t s, int64_t mb) { return {s, ActionKind::kForward, mb}; }
Action B(int64_t s, int64_t mb) { return {s, ActionKind::kBackward, mb}; }
Action I(int64_t s, int64_t mb) { return {s, ActionKind::kBackwardInput, mb}; }
Action W(int64_t s, int64_t mb) { return {s, ActionKind::kBackwardWeight, mb}; }

Schedule Make(int64_t pp, int64_t vpp, int64_t m, std::vector<std::vector<Action>> ranks) {
  Schedule s;
  s.name = "test";
  s.pp = pp;
  s.vpp = vpp;
  s.num_microbatches = m;
  s.ranks = std::move(ranks);
  return s;
}

TEST(EstimatorTest, OneRankRunsBackToBack) {
  const ScheduleCosts c = UniformCosts(1, 1, 3, 10, 15, 5);
  const ScheduleEstimate e = EstimateSchedule(GPipeOrder(1, 3), c);
  ASSERT_TRUE(e.completed) << e.problem;
  EXPECT_EQ(e.makespan, Duration::Micros(90));
  EXPECT_EQ(e.busy[0], Duration::Micros(90));
  EXPECT_EQ(e.bubble_fraction, 0);
  EXPECT_EQ(e.RankBubbleFraction(0), 0);
}

TEST(EstimatorTest, TransfersAddToTheCriticalPath) {
  // One micro-batch through two ranks: f + d + f + b + d + b.
  const ScheduleCosts c = UniformCosts(2, 1, 1, 10, 12, 8, 100, 3);
  const ScheduleEstimate e = EstimateSchedule(OneFOneBOrder(2, 1), c);
  ASSERT_TRUE(e.completed) << e.problem;
  EXPECT_EQ(e.makespan, Duration::Micros(10 + 3 + 10 + 20 + 3 + 20));
  EXPECT_EQ(e.finish[1], Duration::Micros(43));
  EXPECT_EQ(e.RankIdle(0), Duration::Micros(66 - 30));
  EXPECT_NEAR(e.bubble_fraction, 1.0 - 60.0 / 132.0, 1e-12);
}

TEST(EstimatorTest, TransfersOnOneChannelSerialize) {
  // Two forwards of 10 us each send 30 us messages over the same 0 -> 1 channel: the second
  // starts when the first is through (40), arriving at 70, not at 50.
  const ScheduleCosts c = UniformCosts(2, 1, 2, 10, 10, 10, 100, 30);
  const Schedule s = Make(2, 1, 2, {{F(0, 0), F(0, 1)}, {F(1, 0), F(1, 1)}});
  const ScheduleEstimate e = EstimateSchedule(s, c);
  ASSERT_TRUE(e.completed) << e.problem;
  EXPECT_EQ(e.finish[1], Duration::Micros(80));
}

TEST(EstimatorTest, InterleavedWrapUsesTheReverseChannel) {
  // pp = 2, vpp = 2: stage 1 (rank 1) -> stage 2 (rank 0) is the wrap; one micro-batch goes
  // 0 -> 1 -> 0 -> 1 forward and back, four transfers each way.
  const ScheduleCosts c = UniformCosts(2, 2, 1, 10, 5, 5, 100, 2);
  const Schedule s =
      Make(2, 2, 1, {{F(0, 0), F(2, 0), B(2, 0), B(0, 0)}, {F(1, 0), F(3, 0), B(3, 0), B(1, 0)}});
  const ScheduleEstimate e = EstimateSchedule(s, c);
  ASSERT_TRUE(e.completed) << e.problem;
  EXPECT_EQ(e.makespan, Duration::Micros(4 * 10 + 4 * 10 + 6 * 2));
}

TEST(EstimatorTest, SameRankStagesHandOverForFree) {
  const ScheduleCosts c = UniformCosts(1, 3, 2, 10, 5, 5, 100, 1000);
  const ScheduleEstimate e = EstimateSchedule(InterleavedOrder(1, 3, 2), c);
  ASSERT_TRUE(e.completed) << e.problem;
  EXPECT_EQ(e.makespan, Duration::Micros(2 * 3 * 20));
}

TEST(EstimatorTest, MemoryFollowsTheListOrder) {
  ScheduleCosts c = UniformCosts(1, 1, 3, 10, 10, 10);
  for (auto& row : c.chunks) {
    row[0].stored = Bytes::MB(100);
    row[0].peak = Bytes::MB(130);  // 30 MB transient
    row[0].stored_until_w = Bytes::MB(60);
  }
  // GPipe: two stored + the third's peak = 330; the first B runs with 300 + 30.
  EXPECT_EQ(EstimateSchedule(GPipeOrder(1, 3), c).peak_memory[0], Bytes::MB(330));
  // F0 I0 F1 I1 F2 W0 W1 I2 W2: after I0 60 is held; F1 peaks at 60 + 130; F2 at 120 + 130.
  const Schedule split = Make(
      1, 1, 3, {{F(0, 0), I(0, 0), F(0, 1), I(0, 1), F(0, 2), W(0, 0), W(0, 1), I(0, 2), W(0, 2)}});
  const ScheduleEstimate e = EstimateSchedule(split, c);
  ASSERT_TRUE(e.completed) << e.problem;
  EXPECT_EQ(e.peak_memory[0], Bytes::MB(250));
  EXPECT_TRUE(e.fits_memory);
  c.budget = {Bytes::MB(249)};
  const ScheduleEstimate over = EstimateSchedule(split, c);
  EXPECT_FALSE(over.fits_memory);
  EXPECT_NE(over.memory_problem.find("rank 0 needs 238.4 MiB"), std::string::npos)
      << over.memory_problem;
}

TEST(EstimatorTest, DeadlockIsReportedNotHung) {
  // Rank 0 waits for the gradient of micro-batch 0 before sending micro-batch 1; rank 1 wants
  // micro-batch 1's forward before micro-batch 0's backward.
  const ScheduleCosts c = UniformCosts(2, 1, 2, 10, 10, 10);
  const Schedule s =
      Make(2, 1, 2, {{F(0, 0), B(0, 0), F(0, 1), B(0, 1)}, {F(1, 0), F(1, 1), B(1, 0), B(1, 1)}});
  ASSERT_TRUE(CheckScheduleComplete(s).ok());
  const ScheduleEstimate e = EstimateSchedule(s, c);
  EXPECT_FALSE(e.completed);
  EXPECT_NE(e.problem.find("rank 0 step 1 (0B0) waits for 1B0 (rank 1 step 2; rank 1 is stuck "
                           "at step 1)"),
            std::string::npos)
      << e.problem;
  EXPECT_NE(e.problem.find("rank 1 step 1 (1F1) waits for 0F1 (rank 0 step 2"), std::string::npos)
      << e.problem;
}

TEST(EstimatorTest, MissingActionsAreADeadlockToo) {
  const ScheduleCosts c = UniformCosts(2, 1, 1, 10, 10, 10);
  const Schedule s = Make(2, 1, 1, {{F(0, 0), B(0, 0)}, {B(1, 0)}});
  const ScheduleEstimate e = EstimateSchedule(s, c);
  EXPECT_FALSE(e.completed);
  EXPECT_NE(e.problem.find("1F0, which rank 1 never runs"), std::string::npos) << e.problem;
}

TEST(EstimatorTest, MalformedInputIsAProblemNotACrash) {
  const ScheduleCosts c = UniformCosts(2, 1, 1, 10, 10, 10);
  Schedule s = OneFOneBOrder(2, 2);  // micro-batch 1 has no costs
  ScheduleEstimate e = EstimateSchedule(s, c);
  EXPECT_FALSE(e.completed);
  EXPECT_NE(e.problem.find("outside the costs"), std::string::npos) << e.problem;
  e = EstimateSchedule(OneFOneBOrder(3, 1), c);
  EXPECT_FALSE(e.completed);
  EXPECT_NE(e.problem.find("pp = 2"), std::string::npos) << e.problem;
  ScheduleCosts ragged = c;
  ragged.p2p[0].clear();
  EXPECT_FALSE(EstimateSchedule(OneFOneBOrder(2, 1), ragged).completed);
}

TEST(EstimatorTest, EmptyScheduleTakesNoTime) {
  ScheduleCosts c;
  c.pp = 2;
  const ScheduleEstimate e = EstimateSchedule(Make(2, 1, 0, {{}, {}}), c);
  EXPECT_TRUE(e.completed);
  EXPECT_EQ(e.makespan, Duration::Zero());
  EXPECT_EQ(e.bubble_fraction, 0);
}

}  // namespace
}  // namespace sluice
