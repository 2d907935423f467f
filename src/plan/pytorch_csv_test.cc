#include "plan/pytorch_csv.h"

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "plan/plan_test_util.h"
#include "plan/validate.h"
#include "schedule/schedule_csv.h"

namespace sluice {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::MakePlanFixture;
using testing::PlanCase;

struct GoldenCase {
  ScheduleKind kind;
  int64_t vpp;
};
constexpr GoldenCase kGolden[] = {
    {ScheduleKind::kGPipe, 1}, {ScheduleKind::k1F1B, 1},     {ScheduleKind::kInterleaved, 2},
    {ScheduleKind::kZbH1, 1},  {ScheduleKind::kAdaptive, 1}, {ScheduleKind::kAdaptive, 2},
};

PlanCase GoldenPlan(const GoldenCase& g) {
  PlanCase c;
  c.pp = 4;
  c.vpp = g.vpp;
  c.kind = g.kind;
  c.microbatches = 6;
  c.fixed_shapes = true;
  return c;
}

// Every schedule's lowered plan, as PyTorch compute_comms CSV, matches its checked-in golden file
// (tests/golden/plans/; regenerate with SLUICE_UPDATE_GOLDEN=1 after checking the change; the
// compute-only order alone is schedule/'s golden, tests/golden/schedules/).
TEST(PyTorchCsvTest, ComputeCommsMatchesGolden) {
  for (const GoldenCase& g : kGolden) {
    const auto f = MakePlanFixture(GoldenPlan(g));
    ASSERT_TRUE(ValidatePlan(f->plan).ok());
    const std::string name = fmt::format("{}_pp4_vpp{}_m6", ScheduleKindName(g.kind), g.vpp);
    const std::string comms = PipelineOrderToCsv(PipelineOrderOf(f->plan, 0));
    EXPECT_EQ(testing::CheckGolden(name + "_comms.csv", comms), "");
  }
}

TEST(PyTorchCsvTest, ComputeCommsRoundTripsAndValidates) {
  for (const GoldenCase& g : kGolden) {
    for (int64_t dp : {1, 2}) {
      PlanCase c = GoldenPlan(g);
      c.fixed_shapes = false;
      c.dp = dp;
      c.seed = 5;
      const auto f = MakePlanFixture(c);
      for (int64_t d = 0; d < dp; ++d) {
        const PipelineOrder order = PipelineOrderOf(f->plan, d);
        StatusOr<PipelineOrder> back = PipelineOrderFromCsv(PipelineOrderToCsv(order), "x.csv");
        ASSERT_TRUE(back.ok()) << testing::Describe(c) << "\n" << back.status().message();
        EXPECT_EQ(*back, order);
        // Without REDUCE_GRAD too (older PyTorch runtimes).
        const PipelineOrder bare = PipelineOrderOf(f->plan, d, false);
        EXPECT_TRUE(ValidatePipelineOrder(bare, "bare").ok());
      }
      // The compute-only form of the same schedule round-trips through schedule_csv.h.
      StatusOr<Schedule> s =
          ScheduleFromCsv(ScheduleToCsv(f->schedules[0]), "s.csv", f->schedules[0].name);
      ASSERT_TRUE(s.ok());
      EXPECT_EQ(*s, f->schedules[0]);
    }
  }
}

TEST(PyTorchCsvTest, ExportsTheTransfersInPlanOrder) {
  PlanCase c;
  c.pp = 2;
  c.microbatches = 2;
  c.fixed_shapes = true;
  c.kind = ScheduleKind::kGPipe;
  const auto f = MakePlanFixture(c);
  const PipelineOrder order = PipelineOrderOf(f->plan, 0);
  EXPECT_EQ(PipelineOrderToCsv(order),
            "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1,0REDUCE_GRAD\n"
            "1RECV_F0,1F0,1RECV_F1,1F1,1B0,1SEND_B0,1B1,1SEND_B1,1REDUCE_GRAD\n");
}

TEST(PyTorchCsvTest, ReadsPyTorchStyleFiles) {
  // CRLF line ends, blanks, quotes and idle (empty) cells.
  const std::string text =
      "0F0, 0SEND_F0,,\"0F1\",0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\r\n"
      "1RECV_F0,1RECV_F1,1F0,1B0,1SEND_B0,1F1,1B1,1SEND_B1\r\n";
  StatusOr<PipelineOrder> order = PipelineOrderFromCsv(text, "torch.csv");
  ASSERT_TRUE(order.ok()) << order.status().message();
  EXPECT_EQ(order->pp, 2);
  EXPECT_EQ(order->vpp, 1);
  EXPECT_EQ(order->num_microbatches, 2);
  EXPECT_EQ(order->ranks[0][2], (PipeAction{0, PipeOp::kForward, 1}));
}

std::string ReadError(const std::string& text) {
  return PipelineOrderFromCsv(text, "s.csv").status().message();
}

TEST(PyTorchCsvTest, ReportsFileLineColumn) {
  EXPECT_THAT(ReadError("0F0,0SEND_F0\n1RECV_F0,1X0\n"),
              AllOf(HasSubstr("s.csv:2:10: invalid action '1X0'"), HasSubstr("e.g. 2F0")));
  EXPECT_THAT(ReadError("0F0,1F0\n1F0\n"), HasSubstr("s.csv:1:5: action '1F0' is on rank 0"));
  EXPECT_THAT(ReadError("0UNSHARD\n"), HasSubstr("FSDP"));
  EXPECT_THAT(ReadError("(0F0;1B0)OVERLAP_F_B\n"), HasSubstr("OVERLAP_F_B"));
  EXPECT_THAT(ReadError("0REDUCE_GRAD3\n"), HasSubstr("REDUCE_GRAD takes no micro-batch"));
  EXPECT_THAT(ReadError(""), HasSubstr("s.csv: no rows"));
  EXPECT_THAT(ReadError("0F1234567890\n"), HasSubstr("at most 9 digits"));
}

TEST(PyTorchCsvTest, RejectsOrdersThatCannotRun) {
  // Rank 1 runs F0 without receiving it.
  EXPECT_THAT(ReadError("0F0,0SEND_F0,0RECV_B0,0B0\n1F0,1B0,1SEND_B0\n"),
              AllOf(HasSubstr("s.csv:2:1: rank 1 step 0 (1F0): runs before its RECV_F"),
                    HasSubstr("<-- ERROR HERE (rank 1)")));
  // Rank 0 never sends what rank 1 receives.
  EXPECT_THAT(ReadError("0F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n"),
              HasSubstr("no matching send on rank 0"));
  // Sends before the compute that produces them.
  EXPECT_THAT(ReadError("0SEND_F0,0F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n"),
              HasSubstr("sends before the compute"));
  // Rank 0 posts its receive of the gradient before its send of the activation; rank 1 the
  // other way round: the pair's messages are in different orders.
  EXPECT_THAT(ReadError("0F0,0RECV_B0,0SEND_F0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n"),
              HasSubstr("different order"));
  // Incomplete compute.
  EXPECT_THAT(ReadError("0F0,0SEND_F0\n1RECV_F0,1F0,1B0,1SEND_B0\n"), HasSubstr("s.csv"));
  EXPECT_THAT(ReadError("0F0,0SEND_F0,0RECV_B0,0REDUCE_GRAD,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n"),
              HasSubstr("reduces before the stage's last backward"));
}

}  // namespace
}  // namespace sluice
