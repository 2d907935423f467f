#include "schedule/action.h"

#include <gtest/gtest.h>

#include <string>

#include "schedule/generators.h"
#include "schedule/schedule_csv.h"

namespace sluice {
namespace {

TEST(ActionTest, TextRoundTrips) {
  const ActionKind kinds[] = {ActionKind::kForward, ActionKind::kBackward,
                              ActionKind::kBackwardInput, ActionKind::kBackwardWeight};
  for (ActionKind k : kinds) {
    for (int64_t stage : {0, 3, 17}) {
      for (int64_t mb : {0, 2, 123456}) {
        const Action a{stage, k, mb};
        StatusOr<Action> back = ParseAction(a.ToString(), "test");
        ASSERT_TRUE(back.ok()) << back.status().ToString();
        EXPECT_EQ(*back, a);
      }
    }
  }
  EXPECT_EQ((Action{2, ActionKind::kForward, 0}).ToString(), "2F0");
  EXPECT_EQ((Action{1, ActionKind::kBackwardInput, 3}).ToString(), "1I3");
  EXPECT_EQ((Action{0, ActionKind::kBackwardWeight, 2}).ToString(), "0W2");
  EXPECT_EQ((Action{4, ActionKind::kBackward, 11}).ToString(), "4B11");
  EXPECT_EQ(ActionKindLetter(ActionKind::kBackwardInput), 'I');
}

TEST(ActionTest, ParseIsStrictAndQuotesTheText) {
  for (const char* bad : {"", "F0", "2F", "2X0", "2f0", " 2F0", "2F0 ", "2F0x", "-1F0", "2+F0",
                          "2SEND_F0", "1234567890123456789F0", "2F1234567890123456789"}) {
    StatusOr<Action> a = ParseAction(bad, "plan.csv:3:7");
    ASSERT_FALSE(a.ok()) << bad;
    EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(a.status().message().find(std::string("'") + bad + "'"), std::string::npos)
        << a.status().message();
    EXPECT_EQ(a.status().message().rfind("plan.csv:3:7: ", 0), 0u) << a.status().message();
  }
  EXPECT_NE(ParseAction("2SEND_F0", "").status().message().find("compute kind"), std::string::npos);
  // Leading zeros are accepted, as PyTorch's regex does; ToString writes the canonical form.
  EXPECT_EQ(ParseAction("02F01", "")->ToString(), "2F1");
}

Schedule Tiny() {
  // pp = 2, 2 micro-batches, 1F1B.
  return OneFOneBOrder(2, 2);
}

TEST(CheckScheduleCompleteTest, AcceptsGeneratedOrders) {
  EXPECT_TRUE(CheckScheduleComplete(Tiny()).ok());
  EXPECT_TRUE(CheckScheduleComplete(GPipeOrder(3, 5)).ok());
  EXPECT_TRUE(CheckScheduleComplete(InterleavedOrder(4, 2, 6)).ok());
  EXPECT_TRUE(CheckScheduleComplete(InterleavedOrder(2, 3, 1)).ok());
}

TEST(CheckScheduleCompleteTest, AcceptsSplitBackward) {
  Schedule s = Tiny();
  s.ranks[1] = {{1, ActionKind::kForward, 0},        {1, ActionKind::kBackwardInput, 0},
                {1, ActionKind::kForward, 1},        {1, ActionKind::kBackwardInput, 1},
                {1, ActionKind::kBackwardWeight, 1}, {1, ActionKind::kBackwardWeight, 0}};
  EXPECT_TRUE(CheckScheduleComplete(s).ok()) << CheckScheduleComplete(s).ToString();
}

// Each broken schedule names the rank, the step and the action, and prints the grid.
void ExpectError(const Schedule& s, const std::string& part) {
  const Status st = CheckScheduleComplete(s);
  ASSERT_FALSE(st.ok()) << part;
  EXPECT_NE(st.message().find(part), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("Rank 0"), std::string::npos) << st.message();
}

TEST(CheckScheduleCompleteTest, ReportsTheFirstBadActionWithAGrid) {
  Schedule s = Tiny();
  std::swap(s.ranks[0][0], s.ranks[0][2]);  // 0B0 before 0F0
  ExpectError(s, "rank 0 step 0: action '0B0' comes before the forward of its stage");
  EXPECT_NE(CheckScheduleComplete(s).message().find("Step 0: 0B0"), std::string::npos);
  EXPECT_NE(CheckScheduleComplete(s).message().find("<-- ERROR HERE"), std::string::npos);

  s = Tiny();
  s.ranks[1][0].stage = 0;
  ExpectError(s, "rank 1 step 0: action '0F0' runs stage 0, which lives on rank 0");
  s = Tiny();
  s.ranks[1].push_back({1, ActionKind::kForward, 0});
  ExpectError(s, "action '1F0' appears twice");
  s = Tiny();
  s.ranks[0].push_back({0, ActionKind::kBackwardWeight, 0});
  ExpectError(s, "follows a full backward B");
  s = Tiny();
  s.ranks[1].back().microbatch = 7;
  ExpectError(s, "names micro-batch 7, outside 0..1");
  s = Tiny();
  s.ranks[0][0].stage = 9;
  ExpectError(s, "names stage 9, outside 0..1");
  s = Tiny();
  s.ranks[0].pop_back();
  ExpectError(s, "rank 0 never runs 0B1");
  s = Tiny();
  s.ranks[1].back().kind = ActionKind::kBackwardInput;
  ExpectError(s, "rank 1 never runs 1W1");
  s = Tiny();
  s.ranks.pop_back();
  EXPECT_NE(CheckScheduleComplete(s).message().find("1 rank lists for pp = 2"), std::string::npos);
}

TEST(CheckScheduleCompleteTest, GridMatchesPyTorchsLayout) {
  Schedule s = Tiny();
  std::swap(s.ranks[1][0], s.ranks[1][1]);  // 1B0 before 1F0
  const std::string msg = CheckScheduleComplete(s).message();
  const std::string grid =
      "        Rank 0 Rank 1\n"
      "Step 0: 0F0    1B0    <-- ERROR HERE\n"
      "Step 1: 0F1    1F0   \n"
      "Step 2: 0B0    1F1   \n"
      "Step 3: 0B1    1B1   \n";
  EXPECT_NE(msg.find(grid), std::string::npos) << msg;
}

TEST(CheckScheduleCompleteTest, LongSchedulesPrintAWindow) {
  Schedule s = OneFOneBOrder(2, 40);
  std::swap(s.ranks[1][50], s.ranks[1][51]);  // a B before its F in the steady state
  const std::string msg = CheckScheduleComplete(s).message();
  EXPECT_NE(msg.find("<-- ERROR HERE"), std::string::npos) << msg;
  EXPECT_NE(msg.find("earlier steps"), std::string::npos) << msg;
  EXPECT_NE(msg.find("later steps"), std::string::npos) << msg;
  EXPECT_LT(msg.size(), 2000u);
}

TEST(ScheduleCsvTest, RoundTripsAndReadsPyTorchLineEnds) {
  const Schedule s = InterleavedOrder(4, 2, 6);
  const std::string csv = ScheduleToCsv(s);
  StatusOr<Schedule> back = ScheduleFromCsv(csv, "x.csv", "interleaved");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, s);
  // Python's csv module ends lines in \r\n and PyTorch leaves idle steps empty.
  StatusOr<Schedule> py = ScheduleFromCsv("0F0,,0B0\r\n,1F0,1B0\r\n", "py.csv", "1f1b");
  ASSERT_TRUE(py.ok()) << py.status().ToString();
  EXPECT_EQ(py->ranks[0].size(), 2u);
  EXPECT_EQ(py->pp, 2);
  EXPECT_EQ(py->vpp, 1);
  EXPECT_EQ(py->num_microbatches, 1);
  EXPECT_TRUE(CheckScheduleComplete(*py).ok());
}

TEST(ScheduleCsvTest, ErrorsNameLineAndColumn) {
  StatusOr<Schedule> bad = ScheduleFromCsv("0F0,0B0\n1F0,1Q0\n", "s.csv", "x");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("s.csv:2:5: action '1Q0'"), std::string::npos)
      << bad.status().message();
  EXPECT_FALSE(ScheduleFromCsv("", "e.csv", "x").ok());
  StatusOr<Schedule> stages = ScheduleFromCsv("0F0,3F0\n1F0\n2F0\n", "v.csv", "x");
  EXPECT_FALSE(stages.ok());
}

}  // namespace
}  // namespace sluice
