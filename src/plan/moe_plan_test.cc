// MoE all-to-all instructions: lowering, the validator's checks and the plan formats.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <regex>

#include "plan/execution_plan.h"
#include "plan/lower.h"
#include "plan/plan_json.h"
#include "plan/plan_test_util.h"
#include "plan/validate.h"

namespace sluice {
namespace {

// A configuration of `pp` pipeline chunks (the even cut).
ParallelConfig Pipeline(int64_t pp) {
  ParallelConfig p;
  p.pp = pp;
  return p;
}

using ::testing::HasSubstr;
using testing::MakePlanFixture;
using ::testing::Not;
using testing::PlanCase;

PlanCase MoeCase(int64_t dp, int64_t pp, int64_t ep) {
  PlanCase c;
  c.moe = true;
  c.dp = dp;
  c.pp = pp;
  c.ep = ep;
  c.microbatches = 4;
  c.seed = 3;
  return c;
}

std::vector<const Instruction*> AllToAlls(const RankProgram& p) {
  std::vector<const Instruction*> out;
  for (const Instruction& in : p.instructions) {
    if (IsAllToAll(in.op)) out.push_back(&in);
  }
  return out;
}

TEST(MoePlanTest, MoeLayersAndCapacity) {
  ModelSpec m = testing::TestGptModel();  // 16 layers
  m.moe = MoeSpec{.experts = 4, .top_k = 2, .capacity_factor = 1.25, .layer_interval = 2};
  EXPECT_EQ(MoeLayersOfStage(m, 0, Pipeline(4)), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(MoeLayersOfStage(m, 3, Pipeline(4)), (std::vector<int64_t>{13, 15}));
  // 2 x 100 tokens, top-2 of 4 experts, factor 1.25: ceil(1.25 * 200 * 2 / 4) = 125.
  EXPECT_EQ(ExpertCapacity(m, LayerShape{.mbs = 2, .seqlen = 100}, 1), 125);
  EXPECT_EQ(ExpertCapacity(m, LayerShape{.mbs = 1, .seqlen = 3}, 1), 2);  // ceil(1.875)
  m.moe.reset();
  EXPECT_TRUE(MoeLayersOfStage(m, 0, Pipeline(4)).empty());
  ModelSpec t5 = testing::TestT5Model();  // 8 + 8 layers
  t5.moe = MoeSpec{.experts = 4, .top_k = 1, .capacity_factor = 1.0, .layer_interval = 4};
  EXPECT_EQ(MoeLayersOfStage(t5, 0, Pipeline(1)), (std::vector<int64_t>{3, 7, 11, 15}));
  // Decoder layers count dec_seqlen tokens.
  EXPECT_EQ(ExpertCapacity(t5, LayerShape{.mbs = 1, .seqlen = 64, .dec_seqlen = 8}, 11), 2);
  EXPECT_EQ(ExpertCapacity(t5, LayerShape{.mbs = 1, .seqlen = 64, .dec_seqlen = 8}, 3), 16);
}

TEST(MoePlanTest, LoweringEmitsDispatchAndCombineThatValidate) {
  for (const auto& [dp, pp, ep] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {2, 1, 2}, {2, 2, 2}, {4, 2, 2}, {4, 1, 4}}) {
    const PlanCase c = MoeCase(dp, pp, ep);
    SCOPED_TRACE(testing::Describe(c));
    const auto f = MakePlanFixture(c);
    const ExecutionPlan& plan = f->plan;
    ASSERT_TRUE(ValidatePlan(plan, {.check_memory = false}).ok())
        << ValidatePlan(plan, {.check_memory = false}).ToString();
    const int64_t moe_per_stage = 8 / pp;  // 16 layers, every 2nd MoE
    for (const RankProgram& p : plan.ranks) {
      const std::vector<const Instruction*> a2a = AllToAlls(p);
      // F and B of each of 4 micro-batches: dispatch + combine per MoE layer.
      ASSERT_EQ(static_cast<int64_t>(a2a.size()), 2 * 4 * 2 * moe_per_stage);
      const std::vector<int64_t> group = EpGroupOf(plan, p.rank);
      ASSERT_EQ(static_cast<int64_t>(group.size()), ep);
      for (const Instruction* in : a2a) {
        EXPECT_EQ(in->group, group);
        EXPECT_GT(in->duration.nanos(), 0);
        // Splits pair up: what this rank sends to member j, j receives from it.
        const int64_t me = std::find(group.begin(), group.end(), p.rank) - group.begin();
        for (size_t j = 0; j < group.size(); ++j) {
          const auto theirs = AllToAlls(plan.ranks[group[j]]);
          const Instruction& t = *theirs[std::find(a2a.begin(), a2a.end(), in) - a2a.begin()];
          EXPECT_EQ(t.op, in->op);
          EXPECT_EQ(t.layer, in->layer);
          EXPECT_EQ(t.microbatch, in->microbatch);
          EXPECT_EQ(in->send_splits[j], t.recv_splits[me]);
        }
      }
    }
  }
}

TEST(MoePlanTest, ForwardDispatchesThenCombinesAndBackwardReverses) {
  const auto f = MakePlanFixture(MoeCase(2, 1, 2));
  const ExecutionPlan& plan = f->plan;
  const auto& list = plan.ranks[0].instructions;
  const int64_t fwd = testing::FindInstruction(
      plan, 0, [](const Instruction& in) { return in.op == OpKind::kForward; });
  ASSERT_GE(fwd, 0);
  std::vector<const Instruction*> after;
  for (size_t i = fwd + 1; i < list.size() && after.size() < 4; ++i) {
    if (list[i].op == OpKind::kFreeBuffer) continue;
    after.push_back(&list[i]);
  }
  ASSERT_EQ(after.size(), 4u);
  EXPECT_EQ(after[0]->op, OpKind::kAllToAllDispatch);
  EXPECT_EQ(after[1]->op, OpKind::kAllToAllCombine);
  EXPECT_EQ(after[0]->layer, 1);
  EXPECT_EQ(after[2]->op, OpKind::kAllToAllDispatch);
  EXPECT_EQ(after[2]->layer, 3);
  // Forward dispatch: own capacity-padded tokens, 2 local experts x capacity, to each member.
  const LayerShape& own = plan.replicas[0].micro_batches[list[fwd].microbatch].shape;
  const LayerShape& peer = plan.replicas[1].micro_batches[list[fwd].microbatch].shape;
  const int64_t mine = 2 * ExpertCapacity(plan.model, own, 1);
  const int64_t theirs = 2 * ExpertCapacity(plan.model, peer, 1);
  EXPECT_EQ(after[0]->send_splits, (std::vector<int64_t>{mine, mine}));
  EXPECT_EQ(after[0]->recv_splits, (std::vector<int64_t>{mine, theirs}));
  EXPECT_EQ(after[1]->send_splits, (std::vector<int64_t>{mine, theirs}));
  EXPECT_EQ(after[0]->shapes, (std::vector<TensorShape>{{2 * mine, plan.model.hidden},
                                                        {mine + theirs, plan.model.hidden}}));
  EXPECT_EQ(after[0]->bytes, Bytes::Of(mine * plan.model.hidden * 2));
  // The backward of the last MoE layer first: the combine's gradient, then the dispatch's.
  const int64_t bwd = testing::FindInstruction(
      plan, 0, [](const Instruction& in) { return in.op == OpKind::kBackward; });
  ASSERT_GE(bwd, 0);
  const std::vector<Instruction> want =
      AllToAllsOf(plan, 0, OpKind::kBackward, list[bwd].microbatch, 0);
  ASSERT_EQ(want.size(), 16u);
  EXPECT_EQ(want[0].op, OpKind::kAllToAllCombine);
  EXPECT_EQ(want[0].layer, 15);
  EXPECT_EQ(want[1].op, OpKind::kAllToAllDispatch);
  // It moves gradients from the tokens' owner to the experts: the forward dispatch's splits.
  EXPECT_EQ(want[0].send_splits, after[0]->send_splits);
  EXPECT_EQ(want[1].send_splits, after[1]->send_splits);
}

TEST(MoePlanTest, DenseOrEpOnePlansHaveNoAllToAll) {
  PlanCase c = MoeCase(2, 2, 1);
  const auto f = MakePlanFixture(c);
  for (const RankProgram& p : f->plan.ranks) EXPECT_TRUE(AllToAlls(p).empty());
}

TEST(MoePlanTest, LoweringRejectsGroupsWhoseSchedulesDiffer) {
  const auto f = MakePlanFixture(MoeCase(2, 2, 2));
  std::vector<Schedule> s = f->schedules;
  std::swap(s[1].ranks[0][0], s[1].ranks[0][1]);  // F0 F1 -> F1 F0 on replica 1
  const StatusOr<ExecutionPlan> r =
      LowerPlan(f->batch_plan, f->batch, s, f->setup->evaluator(), f->setup->cluster);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("expert-parallel group"));
}

Instruction* FirstAllToAll(ExecutionPlan& plan, int64_t rank) {
  for (Instruction& in : plan.ranks[rank].instructions) {
    if (IsAllToAll(in.op)) return &in;
  }
  return nullptr;
}

TEST(MoePlanTest, ValidatorCatchesBrokenAllToAlls) {
  const auto f = MakePlanFixture(MoeCase(2, 2, 2));
  const ValidateOptions no_memory{.check_memory = false};
  auto fails_with = [&](auto edit, std::string_view what) {
    ExecutionPlan plan = f->plan;
    edit(plan);
    const Status s = ValidatePlan(plan, no_memory);
    EXPECT_FALSE(s.ok()) << what;
    EXPECT_THAT(s.message(), HasSubstr(what));
  };
  fails_with([](ExecutionPlan& p) { FirstAllToAll(p, 0)->send_splits[1] += 1; },
             "differs from the all-to-all");
  fails_with(
      [](ExecutionPlan& p) {
        FirstAllToAll(p, 0)->group = {0, 7};
      },
      "must list distinct ranks");
  fails_with(
      [](ExecutionPlan& p) {
        FirstAllToAll(p, 0)->group = {0, 1};
      },
      "is not this rank's expert-parallel group");
  fails_with([](ExecutionPlan& p) { FirstAllToAll(p, 0)->recv_splits.pop_back(); },
             "one send and one receive split per group member");
  fails_with([](ExecutionPlan& p) { FirstAllToAll(p, 0)->layer = 0; },
             "is not an MoE layer of stage 0");
  // One member drops the all-to-alls of its first forward (4 MoE layers per stage at pp = 2):
  // its group's all-to-alls no longer pair up.
  fails_with(
      [](ExecutionPlan& p) {
        auto& list = p.ranks[2].instructions;
        for (int k = 0; k < 8; ++k) {
          list.erase(std::find_if(list.begin(), list.end(),
                                  [](const Instruction& in) { return IsAllToAll(in.op); }));
        }
      },
      "collective 0 of its group does not match rank 0's collective 0");
  // Swapping two all-to-alls on one member: the group's order differs.
  fails_with(
      [](ExecutionPlan& p) {
        auto& list = p.ranks[0].instructions;
        auto a = std::find_if(list.begin(), list.end(),
                              [](const Instruction& in) { return IsAllToAll(in.op); });
        std::iter_swap(a, a + 1);
      },
      "does not match rank 0's collective 0: 0A2A_C0(L1)");
  // The same swap on every member passes the matching; the derivation check names it.
  fails_with(
      [](ExecutionPlan& p) {
        for (int64_t r : {0, 2}) {
          auto& list = p.ranks[r].instructions;
          auto a = std::find_if(list.begin(), list.end(),
                                [](const Instruction& in) { return IsAllToAll(in.op); });
          std::iter_swap(a, a + 1);
        }
      },
      "differs from the all-to-all the compute op before it performs here");
  // An all-to-all in a plan without expert parallelism.
  fails_with([](ExecutionPlan& p) { p.parallel.ep = 1; }, "all-to-alls need an MoE model");
}

TEST(MoePlanTest, JsonAndMsgpackRoundTrip) {
  const auto f = MakePlanFixture(MoeCase(2, 2, 2));
  const std::string json = PlanToJsonText(f->plan);
  EXPECT_THAT(json, HasSubstr("\"all-to-all-dispatch\""));
  EXPECT_THAT(json, HasSubstr("\"send\":["));
  StatusOr<ExecutionPlan> back = PlanFromJsonText(json, "test");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, f->plan);
  StatusOr<ExecutionPlan> packed = PlanFromMsgpack(PlanToMsgpack(f->plan), "test");
  ASSERT_TRUE(packed.ok()) << packed.status().ToString();
  EXPECT_EQ(*packed, f->plan);
  // The slice overhead a profiled cost model measured travels with the plan; absent, it is not
  // written.
  EXPECT_THAT(json, Not(HasSubstr("moe_slice_overhead_ns")));
  ExecutionPlan measured = f->plan;
  measured.moe_slice_overhead = Duration::Micros(812.5);
  const std::string with = PlanToJsonText(measured);
  EXPECT_THAT(with, HasSubstr("\"moe_slice_overhead_ns\":812500"));
  back = PlanFromJsonText(with, "test");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, measured);
  packed = PlanFromMsgpack(PlanToMsgpack(measured), "test");
  ASSERT_TRUE(packed.ok()) << packed.status().ToString();
  EXPECT_EQ(*packed, measured);
  const std::string negative = std::regex_replace(
      with, std::regex("\"moe_slice_overhead_ns\":812500"), "\"moe_slice_overhead_ns\":-1");
  StatusOr<ExecutionPlan> bad = PlanFromJsonText(negative, "bad.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("moe_slice_overhead_ns"));
}

}  // namespace
}  // namespace sluice
