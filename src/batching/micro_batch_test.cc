#include "batching/micro_batch.h"

#include <gtest/gtest.h>

#include <vector>

#include "batching/stage_cost.h"
#include "batching/test_util.h"

namespace sluice {
namespace {

using testing::MakeTestSetup;
using testing::TestParallel;

TEST(MicroBatchTest, OutcomeNames) {
  EXPECT_EQ(PlanOutcomeName(PlanOutcome::kOk), "ok");
  EXPECT_EQ(PlanOutcomeName(PlanOutcome::kOutOfMemory), "out-of-memory");
}

TEST(MicroBatchTest, Accessors) {
  MicroBatch mb;
  mb.rows = {{1, 2}, {3}};
  mb.stages.resize(2);
  mb.stages[0].forward = Duration::Millis(3);
  mb.stages[1].forward = Duration::Millis(5);
  mb.stages[0].backward_input = Duration::Millis(6);
  mb.stages[1].backward_weight = Duration::Millis(2);
  mb.real_tokens = 30;
  mb.padded_tokens = 40;
  EXPECT_EQ(mb.num_samples(), 3);
  EXPECT_EQ(mb.Bottleneck(), Duration::Millis(9));
  EXPECT_DOUBLE_EQ(mb.PaddingFraction(), 0.25);
  mb.padded_tokens = 0;
  EXPECT_EQ(mb.PaddingFraction(), 0.0);
}

TEST(BatchIndexTest, FindsSparseIds) {
  const std::vector<Sample> batch = {
      {.id = 40, .input_len = 5}, {.id = 7, .input_len = 9}, {.id = 1000, .input_len = 1}};
  const BatchIndex index(batch);
  EXPECT_TRUE(index.Contains(7));
  EXPECT_FALSE(index.Contains(8));
  EXPECT_EQ(index(40).input_len, 5);
  EXPECT_EQ(index(1000).input_len, 1);
  EXPECT_EQ(index.samples().size(), 3u);
}

TEST(PriceMicroBatchTest, PaddedDecoderOnly) {
  auto setup = MakeTestSetup("gpt-6.7b", TestParallel(1, 4));
  const StageCostEvaluator& e = setup->evaluator();
  const std::vector<Sample> batch = {{.id = 0, .input_len = 300, .target_len = 5},
                                     {.id = 1, .input_len = 100},
                                     {.id = 2, .input_len = 17, .target_len = 3}};
  const BatchIndex index(batch);
  MicroBatch mb;
  mb.rows = {{0}, {1}, {2}};
  mb.recompute = Recompute::kSelective;
  ASSERT_TRUE(PriceMicroBatch(e, index, &mb));
  EXPECT_EQ(mb.shape, (LayerShape{3, 312, 0}));
  EXPECT_EQ(mb.real_tokens, 425);
  EXPECT_EQ(mb.padded_tokens, 3 * 312);
  std::vector<ChunkCost> stages;
  ASSERT_TRUE(e.EvaluateStages(mb.shape, Recompute::kSelective, &stages));
  ASSERT_EQ(mb.stages.size(), 4u);
  for (size_t s = 0; s < 4; ++s) {
    EXPECT_EQ(mb.stages[s].forward, stages[s].forward);
    EXPECT_EQ(mb.stages[s].backward(), stages[s].backward());
    EXPECT_EQ(mb.stages[s].backward_weight, stages[s].backward_weight);
    EXPECT_EQ(mb.stages[s].stored, stages[s].stored);
    EXPECT_EQ(mb.stages[s].peak, stages[s].peak);
  }
  EXPECT_EQ(mb.Bottleneck(), e.Summarize(mb.shape, Recompute::kSelective, 4).bottleneck);
  // Packed rows: a row is as long as its samples together.
  MicroBatch packed;
  packed.rows = {{0, 1}, {2}};
  ASSERT_TRUE(PriceMicroBatch(e, index, &packed));
  EXPECT_EQ(packed.shape, (LayerShape{2, 408, 0}));
  // Varlen: per-sample costs, cheaper than padding every row to the longest.
  MicroBatch varlen = packed;
  varlen.varlen = true;
  ASSERT_TRUE(PriceMicroBatch(e, index, &varlen));
  EXPECT_EQ(varlen.shape, packed.shape);
  EXPECT_LT(varlen.Bottleneck(), packed.Bottleneck());
}

TEST(PriceMicroBatchTest, EncoderDecoderAndInfeasible) {
  auto setup = MakeTestSetup("t5-11b", TestParallel(1, 2, 8));
  const StageCostEvaluator& e = setup->evaluator();
  const std::vector<Sample> batch = {{.id = 0, .input_len = 200, .target_len = 30},
                                     {.id = 1, .input_len = 90, .target_len = 41},
                                     {.id = 2, .input_len = 9000, .target_len = 1}};
  const BatchIndex index(batch);
  MicroBatch mb;
  mb.rows = {{0}, {1}};
  ASSERT_TRUE(PriceMicroBatch(e, index, &mb));
  EXPECT_EQ(mb.shape, (LayerShape{2, 200, 48}));
  EXPECT_EQ(mb.padded_tokens, 2 * (200 + 48));
  EXPECT_EQ(mb.real_tokens, 361);
  // Varlen: the same padded shape, priced per sample (at this size, tp 8, both are near the
  // table's per-call floor: within 2% of each other; varlen_cost_test compares larger ones).
  const Duration padded = mb.Bottleneck();
  mb.varlen = true;
  ASSERT_TRUE(PriceMicroBatch(e, index, &mb));
  EXPECT_EQ(mb.shape, (LayerShape{2, 200, 48}));
  EXPECT_GT(mb.Bottleneck(), Duration::Zero());
  EXPECT_LT(mb.Bottleneck(), padded.Scaled(1.02));
  // Longer than the model's positions: no answer, but the vectors have pp entries.
  MicroBatch too_long;
  too_long.rows = {{2}};
  EXPECT_FALSE(PriceMicroBatch(e, index, &too_long));
  EXPECT_EQ(too_long.stages.size(), 2u);
}

TEST(PredictReplicaTimeTest, SumPlusBubble) {
  std::vector<MicroBatch> mbs(3);
  const double ms[] = {4, 9, 2};
  for (int i = 0; i < 3; ++i) {
    mbs[i].stages.resize(2);
    mbs[i].stages[0].forward = Duration::Millis(ms[i] / 2);
    mbs[i].stages[1].forward = Duration::Millis(1);
    mbs[i].stages[0].backward_input = Duration::Millis(ms[i] / 2);
    mbs[i].stages[1].backward_input = Duration::Millis(1);
  }
  EXPECT_EQ(PredictReplicaTime(mbs, 4), Duration::Millis(15 + 3 * 9));
  EXPECT_EQ(PredictReplicaTime(mbs, 1), Duration::Millis(15));
  EXPECT_EQ(PredictReplicaTime({}, 4), Duration::Zero());
}

class ValidateBatchPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setup_ = MakeTestSetup("gpt-6.7b", TestParallel(2, 4));
    batch_ = {{.id = 5, .input_len = 100},
              {.id = 6, .input_len = 80},
              {.id = 7, .input_len = 300},
              {.id = 8, .input_len = 20}};
    const BatchIndex index(batch_);
    plan_.method = "test";
    plan_.replicas.resize(2);
    auto add = [&](int r, std::vector<std::vector<int64_t>> rows) {
      MicroBatch mb;
      mb.rows = std::move(rows);
      mb.recompute = Recompute::kSelective;
      ASSERT_TRUE(PriceMicroBatch(eval(), index, &mb));
      plan_.replicas[r].push_back(mb);
    };
    add(0, {{5}, {6}});
    add(1, {{7}});
    plan_.dropped.push_back({8, "too short to matter"});
  }
  const StageCostEvaluator& eval() const { return setup_->evaluator(); }

  std::unique_ptr<testing::TestSetup> setup_;
  std::vector<Sample> batch_;
  BatchPlan plan_;
};

TEST_F(ValidateBatchPlanTest, AcceptsAValidPlan) {
  EXPECT_TRUE(ValidateBatchPlan(plan_, batch_, eval()).ok());
}

TEST_F(ValidateBatchPlanTest, RejectsDuplicatesAndMissingSamples) {
  BatchPlan dup = plan_;
  dup.replicas[1][0].rows[0].push_back(5);
  Status st = ValidateBatchPlan(dup, batch_, eval());
  EXPECT_FALSE(st.ok());
  BatchPlan twice = plan_;
  twice.replicas[1].push_back(twice.replicas[0][0]);
  st = ValidateBatchPlan(twice, batch_, eval());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("sample id 5 appears twice"), std::string::npos) << st.message();
  BatchPlan missing = plan_;
  missing.dropped.clear();
  st = ValidateBatchPlan(missing, batch_, eval());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("sample id 8"), std::string::npos) << st.message();
  BatchPlan unknown = plan_;
  unknown.dropped[0].id = 99;
  EXPECT_FALSE(ValidateBatchPlan(unknown, batch_, eval()).ok());
  BatchPlan no_reason = plan_;
  no_reason.dropped[0].reason.clear();
  EXPECT_FALSE(ValidateBatchPlan(no_reason, batch_, eval()).ok());
}

TEST_F(ValidateBatchPlanTest, RejectsBadShapes) {
  BatchPlan mbs = plan_;
  mbs.replicas[0][0].shape.mbs = 3;
  EXPECT_FALSE(ValidateBatchPlan(mbs, batch_, eval()).ok());
  BatchPlan short_pad = plan_;
  short_pad.replicas[1][0].shape.seqlen = 296;
  Status st = ValidateBatchPlan(short_pad, batch_, eval());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("replica 1, micro-batch 0"), std::string::npos) << st.message();
  BatchPlan stages = plan_;
  stages.replicas[0][0].stages.pop_back();
  EXPECT_FALSE(ValidateBatchPlan(stages, batch_, eval()).ok());
  BatchPlan replicas = plan_;
  replicas.replicas.pop_back();
  replicas.dropped.push_back({7, "moved"});
  EXPECT_FALSE(ValidateBatchPlan(replicas, batch_, eval()).ok());
}

TEST_F(ValidateBatchPlanTest, RejectsMemoryOverTheLimit) {
  // A micro-batch alone on its replica: its stored activations do not stay behind another one,
  // so only its peak counts.
  BatchPlan big = plan_;
  big.replicas[1][0].stages[0].stored = eval().ActivationBudget(0);
  EXPECT_TRUE(ValidateBatchPlan(big, batch_, eval()).ok());
  big.replicas[1][0].stages[0].peak = eval().ActivationBudget(0) + Bytes::Of(1);
  const Status st = ValidateBatchPlan(big, batch_, eval());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("out of memory"), std::string::npos) << st.message();
}

TEST_F(ValidateBatchPlanTest, InfeasibleOutcomesNeedAReason) {
  BatchPlan oom;
  oom.outcome = PlanOutcome::kOutOfMemory;
  EXPECT_FALSE(ValidateBatchPlan(oom, batch_, eval()).ok());
  oom.infeasible_reason = "sample 7 does not fit";
  EXPECT_TRUE(ValidateBatchPlan(oom, batch_, eval()).ok());
}

TEST_F(ValidateBatchPlanTest, DuplicateIdsInTheBatchAreBadInput) {
  std::vector<Sample> batch = batch_;
  batch.push_back(batch[0]);
  const Status st = ValidateBatchPlan(plan_, batch, eval());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice
