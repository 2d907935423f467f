// The simulator on MoE plans: all-to-all times against the α-β closed form, exposed all-to-all
// time, the all-to-all stream in the timeline, contention between groups, and deadlocks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "cost/comm_model.h"
#include "plan/plan_test_util.h"
#include "plan/validate.h"
#include "sim/simulator.h"
#include "sim/summary.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using testing::MakePlanFixture;
using testing::PlanCase;

PlanCase MoeCase(int64_t dp, int64_t pp, int64_t ep) {
  PlanCase c;
  c.moe = true;
  c.dp = dp;
  c.pp = pp;
  c.ep = ep;
  c.microbatches = 4;
  c.seed = 5;
  return c;
}

int64_t CountAllToAlls(const ExecutionPlan& plan, int64_t rank) {
  const auto& list = plan.ranks[rank].instructions;
  return std::count_if(list.begin(), list.end(),
                       [](const Instruction& in) { return IsAllToAll(in.op); });
}

// ep = 2 in one node without pipeline: the two flows of each all-to-all use disjoint ports, so
// each lasts one latency plus the larger of the two members' remote bytes over the intra-node
// link, which is also the closed form of the larger member buffer; every all-to-all blocks the
// only stream that could hide it, so all of it is exposed.
TEST(MoeSimTest, AllToAllOfTwoMatchesTheClosedFormAndIsExposed) {
  const auto f = MakePlanFixture(MoeCase(2, 1, 2));
  const ExecutionPlan& plan = f->plan;
  ASSERT_TRUE(ValidatePlan(plan, {.check_memory = false}).ok());
  const LinkSpec link = plan.cluster.intra_node;
  const AlphaBetaCommModel comm(plan.cluster);
  for (const CollectiveMode mode : {CollectiveMode::kStepwise, CollectiveMode::kClosedForm}) {
    SCOPED_TRACE(static_cast<int>(mode));
    StatusOr<SimResult> r = Simulate(plan, {.collectives = mode});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->outcome, SimOutcome::kOk) << r->problem;
    int64_t intervals = 0;
    for (const SimInterval& iv : r->timeline) {
      if (iv.stream != StreamKind::kAllToAll) continue;
      ++intervals;
      const Instruction& in = plan.ranks[iv.rank].instructions[iv.instruction];
      ASSERT_TRUE(IsAllToAll(in.op));
      const Instruction& peer = plan.ranks[1 - iv.rank].instructions[iv.instruction];
      ASSERT_EQ(peer.layer, in.layer);  // same program positions on both ranks here
      const int64_t rows = std::max(in.send_splits[1 - iv.rank], peer.send_splits[iv.rank]);
      const double bytes = static_cast<double>(rows) * 2.0 * plan.model.hidden;
      const double want = static_cast<double>(link.latency.nanos()) + bytes / link.bandwidth * 1e9;
      EXPECT_NEAR(static_cast<double>((iv.end - iv.start).nanos()), want, 3.0);
      // The lowering's price of the busier member is the same closed form.
      const Instruction& busier = rows == in.send_splits[1 - iv.rank] ? in : peer;
      EXPECT_NEAR(static_cast<double>(busier.duration.nanos()), want, 3.0);
    }
    EXPECT_EQ(intervals, CountAllToAlls(plan, 0) + CountAllToAlls(plan, 1));
    for (const RankSimStats& s : r->ranks) {
      EXPECT_GT(s.all_to_all.nanos(), 0);
      EXPECT_EQ(s.exposed_all_to_all, s.all_to_all);
      EXPECT_LE(s.exposed_all_to_all, s.exposed_comm);
    }
    const std::string summary = FormatSimSummary(plan, *r);
    EXPECT_THAT(summary, HasSubstr("all-to-all (MoE dispatch and combine)"));
  }
}

// Removing the all-to-alls (the same plan at ep = 1) shortens the iteration by at least the time
// spent in them: pp = 1 runs them strictly in series with the compute, and each one also
// synchronises the two replicas.
TEST(MoeSimTest, AllToAllsLengthenTheIteration) {
  const auto f = MakePlanFixture(MoeCase(2, 1, 2));
  ExecutionPlan without = f->plan;
  without.parallel.ep = 1;
  for (RankProgram& p : without.ranks) {
    std::erase_if(p.instructions, [](const Instruction& in) { return IsAllToAll(in.op); });
  }
  StatusOr<SimResult> with_a2a = Simulate(f->plan);
  StatusOr<SimResult> plain = Simulate(without);
  ASSERT_TRUE(with_a2a.ok() && plain.ok());
  ASSERT_EQ(plain->outcome, SimOutcome::kOk);
  EXPECT_GT(with_a2a->iteration_time, plain->iteration_time);
  for (const RankSimStats& s : plain->ranks) EXPECT_EQ(s.all_to_all.nanos(), 0);
  const Duration extra = with_a2a->iteration_time - plain->iteration_time;
  Duration most;
  for (const RankSimStats& s : with_a2a->ranks) most = std::max(most, s.all_to_all);
  EXPECT_GT(most.nanos(), 0);
  EXPECT_GE(extra.nanos() + 10, most.nanos());
}

// Four members across two nodes: the inter-node link decides, and contention on each member's
// ports makes an all-to-all slower than a lone pair transfer of the same rows.
TEST(MoeSimTest, GroupsAcrossNodesUseTheInterNodeLink) {
  PlanCase c = MoeCase(4, 1, 4);
  const auto f = MakePlanFixture(c);
  ExecutionPlan plan = f->plan;
  plan.cluster.devices_per_node = 2;
  plan.cluster.nodes = 2;
  ASSERT_TRUE(ValidatePlan(plan, {.check_memory = false}).ok());
  StatusOr<SimResult> r = Simulate(plan);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->outcome, SimOutcome::kOk) << r->problem;
  const LinkSpec inter = plan.cluster.inter_node;
  int64_t seen = 0;
  for (const SimInterval& iv : r->timeline) {
    if (iv.stream != StreamKind::kAllToAll || iv.rank != 0) continue;
    ++seen;
    const Instruction& in = plan.ranks[0].instructions[iv.instruction];
    // At least 3 latencies and rank 0's two inter-node flows through its one inter egress port.
    const double inter_bytes =
        2.0 * plan.model.hidden * static_cast<double>(in.send_splits[2] + in.send_splits[3]);
    EXPECT_GE(static_cast<double>((iv.end - iv.start).nanos()),
              3.0 * static_cast<double>(inter.latency.nanos()) +
                  inter_bytes / inter.bandwidth * 1e9 - 3.0);
  }
  EXPECT_EQ(seen, CountAllToAlls(plan, 0));
}

TEST(MoeSimTest, AMissingAllToAllDeadlocksAndMismatchedSplitsStop) {
  const auto f = MakePlanFixture(MoeCase(2, 1, 2));
  ExecutionPlan missing = f->plan;
  auto& list = missing.ranks[1].instructions;
  list.erase(std::find_if(list.rbegin(), list.rend(),
                          [](const Instruction& in) { return IsAllToAll(in.op); })
                 .base() -
             1);
  StatusOr<SimResult> r = Simulate(missing);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->outcome, SimOutcome::kDeadlock);
  ASSERT_FALSE(r->blocked.empty());
  EXPECT_THAT(r->blocked[0].text, HasSubstr("expert-parallel group"));

  ExecutionPlan bad = f->plan;
  for (Instruction& in : bad.ranks[1].instructions) {
    if (IsAllToAll(in.op)) {
      in.send_splits[0] += 1;
      break;
    }
  }
  r = Simulate(bad);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->outcome, SimOutcome::kDeadlock);
  bool named = false;
  for (const BlockedRank& b : r->blocked)
    named = named || b.text.find("does not pair") != b.text.npos;
  EXPECT_TRUE(named);

  ExecutionPlan foreign = f->plan;
  for (Instruction& in : foreign.ranks[0].instructions) {
    if (IsAllToAll(in.op)) in.group = {0};
  }
  for (Instruction& in : foreign.ranks[0].instructions) {
    if (IsAllToAll(in.op)) {
      in.send_splits.resize(1);
      in.recv_splits.resize(1);
    }
  }
  r = Simulate(foreign);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("is not the rank's expert-parallel group"));
}

// With a pipeline, MoE stages overlap other stages' all-to-alls: the plan still runs, every
// all-to-all is on the timeline and exposed time stays within the all-to-all time.
TEST(MoeSimTest, PipelineWithExpertParallelismRuns) {
  const auto f = MakePlanFixture(MoeCase(2, 2, 2));
  StatusOr<SimResult> r = Simulate(f->plan);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->outcome, SimOutcome::kOk) << r->problem;
  for (size_t i = 0; i < r->ranks.size(); ++i) {
    EXPECT_GT(r->ranks[i].all_to_all.nanos(), 0);
    EXPECT_LE(r->ranks[i].exposed_all_to_all, r->ranks[i].all_to_all);
  }
}

}  // namespace
}  // namespace sluice
