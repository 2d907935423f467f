// Interleaved 1F1B in padded (Megatron) and flexible (PyTorch ScheduleInterleaved1F1B) rounds:
// makespans with unit costs, chunks in flight, validity over a sweep, and kAuto's choice under a
// memory budget.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "schedule/generators.h"
#include "schedule/test_util.h"

namespace sluice {
namespace {

using testing::RandomCosts;
using testing::SetBudget;
using testing::UniformCosts;

ScheduleResult Must(const ScheduleCosts& costs, InterleavedRounds rounds) {
  ScheduleOptions o;
  o.rounds = rounds;
  StatusOr<ScheduleResult> r = GenerateSchedule(ScheduleKind::kInterleaved, costs, o);
  SLUICE_CHECK_MSG(r.ok(), r.status().ToString());
  return std::move(r).value();
}

int64_t MaxInFlight(const Schedule& s) {
  const std::vector<int64_t> c = ChunksInFlight(s);
  return *std::max_element(c.begin(), c.end());
}

std::string What(int64_t pp, int64_t vpp, int64_t m) {
  return "pp " + std::to_string(pp) + " vpp " + std::to_string(vpp) + " m " + std::to_string(m);
}

TEST(InterleavedRoundsTest, NamesRoundTrip) {
  for (InterleavedRounds r :
       {InterleavedRounds::kPadded, InterleavedRounds::kFlexible, InterleavedRounds::kAuto}) {
    StatusOr<InterleavedRounds> back = ParseInterleavedRounds(InterleavedRoundsName(r));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, r);
  }
  StatusOr<InterleavedRounds> bad = ParseInterleavedRounds("flex");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'flex'; allowed: padded, flexible, auto"),
            std::string::npos);
  EXPECT_EQ(*ParsePlanScheduleName("interleaved-flex"), ScheduleKind::kInterleaved);
  EXPECT_EQ(*ParsePlanScheduleName("zb-h1"), ScheduleKind::kZbH1);
  EXPECT_NE(ParsePlanScheduleName("flex").status().message().find("interleaved-flex"),
            std::string::npos);
}

// PyTorch's rule: max(1, m / pp) rounds; sluice pads the last one when they do not divide m
// (PyTorch refuses those m).
TEST(InterleavedRoundsTest, RoundSizes) {
  EXPECT_EQ(InterleavedRoundSize(4, 10, InterleavedRounds::kPadded), 4);
  EXPECT_EQ(InterleavedRoundSize(4, 10, InterleavedRounds::kFlexible), 5);  // 2 rounds of 5
  EXPECT_EQ(InterleavedRoundSize(4, 3, InterleavedRounds::kFlexible), 3);   // 1 round of 3
  EXPECT_EQ(InterleavedRoundSize(4, 11, InterleavedRounds::kFlexible), 6);  // 2 of 6, 1 phantom
  EXPECT_EQ(InterleavedRoundSize(8, 19, InterleavedRounds::kFlexible), 10);
  EXPECT_EQ(InterleavedRoundSize(4, 12, InterleavedRounds::kFlexible), 4);
}

// When pp divides m both rules make Megatron's order, named "interleaved".
TEST(InterleavedRoundsTest, SameOrderWhenPpDividesM) {
  for (int64_t pp : {1, 2, 4, 8}) {
    for (int64_t vpp : {2, 3}) {
      for (int64_t m : {pp, 2 * pp, 3 * pp}) {
        const Schedule pad = InterleavedOrder(pp, vpp, m, InterleavedRounds::kPadded);
        const Schedule flex = InterleavedOrder(pp, vpp, m, InterleavedRounds::kFlexible);
        EXPECT_EQ(pad, flex) << What(pp, vpp, m);
        EXPECT_EQ(flex.name, "interleaved");
      }
    }
  }
  EXPECT_EQ(InterleavedOrder(4, 2, 6, InterleavedRounds::kFlexible).name, "interleaved-flex");
}

// Unit costs (per chunk f = 1, b = i + w = 2, no transfer time). The flexible rounds reach
// Megatron's figure m v (f + b) + (p - 1)(f + b) for every m >= pp (no idle slot at a chunk
// switch); the padded ones only when pp divides m. The gains are the 5-9%, for 1-4 more
// chunks in flight (rank 0).
TEST(InterleavedRoundsTest, UnitCostMakespans) {
  struct Case {
    int64_t pp, vpp, m;
    int64_t padded_us, flexible_us;
    int64_t padded_chunks, flexible_chunks;
  };
  for (const Case& c : std::vector<Case>{{2, 2, 3, 23, 21, 5, 6},
                                         {4, 2, 6, 49, 45, 10, 12},
                                         {4, 2, 9, 69, 63, 11, 12},
                                         {4, 2, 10, 73, 69, 11, 12},
                                         {8, 2, 12, 101, 93, 20, 24},
                                         {8, 2, 18, 141, 129, 23, 24},
                                         {8, 2, 19, 145, 135, 23, 25},
                                         {4, 4, 10, 143, 129, 19, 22}}) {
    const ScheduleCosts costs = UniformCosts(c.pp, c.vpp, c.m, 1, 1, 1);
    const ScheduleResult pad = Must(costs, InterleavedRounds::kPadded);
    const ScheduleResult flex = Must(costs, InterleavedRounds::kFlexible);
    const std::string what = What(c.pp, c.vpp, c.m);
    EXPECT_EQ(pad.estimate.makespan, Duration::Micros(c.padded_us)) << what;
    EXPECT_EQ(flex.estimate.makespan, Duration::Micros(c.flexible_us)) << what;
    const double gain = 1.0 - flex.estimate.makespan.micros() / pad.estimate.makespan.micros();
    EXPECT_GE(gain, 0.05) << what;
    EXPECT_LE(gain, 0.10) << what;
    EXPECT_EQ(MaxInFlight(pad.schedule), c.padded_chunks) << what;
    EXPECT_EQ(MaxInFlight(flex.schedule), c.flexible_chunks) << what;
    EXPECT_GE(c.flexible_chunks - c.padded_chunks, 1) << what;
    EXPECT_LE(c.flexible_chunks - c.padded_chunks, 4) << what;
  }
  for (int64_t pp : {2, 3, 4, 8}) {
    for (int64_t vpp : {2, 3, 4}) {
      for (int64_t m = 1; m <= 3 * pp + 1; ++m) {
        const ScheduleCosts costs = UniformCosts(pp, vpp, m, 1, 1, 1);
        const ScheduleResult pad = Must(costs, InterleavedRounds::kPadded);
        const ScheduleResult flex = Must(costs, InterleavedRounds::kFlexible);
        const std::string what = What(pp, vpp, m);
        const Duration ideal = Duration::Micros(3) * (m * vpp + pp - 1);
        if (m >= pp) EXPECT_EQ(flex.estimate.makespan, ideal) << what;
        if (m % pp == 0) EXPECT_EQ(pad.estimate.makespan, ideal) << what;
        EXPECT_LE(flex.estimate.makespan, pad.estimate.makespan) << what;
        if (m < pp) EXPECT_EQ(flex.estimate.makespan, pad.estimate.makespan) << what;
      }
    }
  }
}

// Rank r holds at most min((v - 1) R + 2 (p - r - 1) + 1, m v) chunks, R the round size: the
// warm-up forwards and the first steady-state one (phantoms only lower it).
TEST(InterleavedRoundsTest, ChunksInFlightFollowTheWarmUp) {
  for (int64_t pp : {2, 4, 8}) {
    for (int64_t vpp : {2, 4}) {
      for (int64_t m = 1; m <= 3 * pp + 1; ++m) {
        for (InterleavedRounds rounds :
             {InterleavedRounds::kPadded, InterleavedRounds::kFlexible}) {
          const int64_t round = InterleavedRoundSize(pp, m, rounds);
          const std::vector<int64_t> got = ChunksInFlight(InterleavedOrder(pp, vpp, m, rounds));
          for (int64_t r = 0; r < pp; ++r) {
            const int64_t bound = std::min((vpp - 1) * round + 2 * (pp - r - 1) + 1, m * vpp);
            const std::string what = What(pp, vpp, m) + " rank " + std::to_string(r) + " " +
                                     std::string(InterleavedRoundsName(rounds));
            if (m % round == 0) {
              EXPECT_EQ(got[r], bound) << what;
            } else {
              EXPECT_LE(got[r], bound) << what;
            }
          }
        }
      }
    }
  }
  // 1F1B: rank r holds p - r.
  EXPECT_EQ(ChunksInFlight(OneFOneBOrder(4, 8)), (std::vector<int64_t>{4, 3, 2, 1}));
}

// Complete and deadlock-free for every m up to 5 pp + 3, random costs, both rules and kAuto;
// with a budget, an ok outcome fits it.
TEST(InterleavedRoundsTest, PropertyValidOverASweep) {
  int64_t cases = 0, flexible_chosen = 0;
  for (int64_t pp : {1, 2, 3, 4, 5, 8}) {
    for (int64_t vpp : {2, 3, 4}) {
      for (int64_t m = 1; m <= 5 * pp + 3; ++m) {
        ScheduleCosts costs = RandomCosts(pp * 1000 + vpp * 100 + m, pp, vpp, m);
        if (m % 3 == 0) SetBudget(&costs, 100.0 * (vpp + 2 * pp));
        for (InterleavedRounds rounds :
             {InterleavedRounds::kPadded, InterleavedRounds::kFlexible, InterleavedRounds::kAuto}) {
          const ScheduleResult r = Must(costs, rounds);
          const std::string what =
              What(pp, vpp, m) + " " + std::string(InterleavedRoundsName(rounds));
          ++cases;
          EXPECT_TRUE(CheckScheduleComplete(r.schedule).ok())
              << what << CheckScheduleComplete(r.schedule).ToString();
          EXPECT_TRUE(r.estimate.completed) << what << r.estimate.problem;
          if (r.outcome == PlanOutcome::kOk) {
            for (int64_t k = 0; k < pp && !costs.budget.empty(); ++k) {
              EXPECT_LE(r.estimate.peak_memory[k], costs.budget[k]) << what;
            }
          }
          if (rounds == InterleavedRounds::kAuto) {
            const ScheduleResult pad = Must(costs, InterleavedRounds::kPadded);
            if (pad.outcome == PlanOutcome::kOk) {
              EXPECT_EQ(r.outcome, PlanOutcome::kOk) << what;
              EXPECT_LE(r.estimate.makespan, pad.estimate.makespan) << what;
            }
            flexible_chosen += r.schedule.name == kInterleavedFlexName;
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 1000);
  EXPECT_GT(flexible_chosen, 100);
}

// kAuto takes the flexible rounds only where their extra chunks fit the budget.
TEST(InterleavedRoundsTest, AutoKeepsTheBudget) {
  ScheduleCosts costs = UniformCosts(4, 2, 6, 1, 1, 1, 100);  // 100 MB per chunk
  // Rank 0 holds 10 chunks padded, 12 flexible.
  SetBudget(&costs, 1000);
  const ScheduleResult tight = Must(costs, InterleavedRounds::kAuto);
  ASSERT_EQ(tight.outcome, PlanOutcome::kOk);
  EXPECT_EQ(tight.schedule.name, "interleaved");
  EXPECT_EQ(tight.estimate.makespan, Duration::Micros(49));
  const ScheduleResult forced = Must(costs, InterleavedRounds::kFlexible);
  EXPECT_EQ(forced.outcome, PlanOutcome::kOutOfMemory);
  EXPECT_NE(forced.infeasible_reason.find("interleaved-flex: rank 0"), std::string::npos)
      << forced.infeasible_reason;
  SetBudget(&costs, 1200);
  const ScheduleResult roomy = Must(costs, InterleavedRounds::kAuto);
  ASSERT_EQ(roomy.outcome, PlanOutcome::kOk);
  EXPECT_EQ(roomy.schedule.name, "interleaved-flex");
  EXPECT_EQ(roomy.estimate.makespan, Duration::Micros(45));
  EXPECT_EQ(roomy.estimate.peak_memory[0], Bytes::MB(1200));
  // A tie keeps the padded order (fewer chunks in flight): m < pp gains nothing.
  EXPECT_EQ(Must(UniformCosts(4, 2, 3, 1, 1, 1), InterleavedRounds::kAuto).schedule.name,
            "interleaved");
}

}  // namespace
}  // namespace sluice
