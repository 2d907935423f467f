#include "batching/megatron_gbp.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "batching/test_util.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using testing::MakeTestSetup;
using testing::RandomTokenBatch;
using testing::SampleIdsOf;
using testing::SortedIds;
using testing::TestCost;
using testing::TestParallel;

std::vector<Sample> Lengths(std::initializer_list<int64_t> lengths) {
  std::vector<Sample> out;
  for (int64_t len : lengths) {
    out.push_back(Sample{.id = static_cast<int64_t>(out.size()), .input_len = len});
  }
  return out;
}

TEST(MegatronGbpTest, PacksAreBalancedByWorkUnderTheCap) {
  auto setup = MakeTestSetup("gpt-6.7b", TestParallel(2, 4));
  const std::vector<Sample> batch = Lengths({900, 800, 300, 200, 100, 100});
  // 2,400 tokens under a 1,000-token cap: 3 packs, rounded up to 4 for 2 replicas.
  const auto packs = BalancedGlobalPacks(batch, setup->evaluator(), 1000, 2);
  ASSERT_EQ(packs.size(), 4u);
  EXPECT_EQ(packs[0], (std::vector<int64_t>{0}));
  EXPECT_EQ(packs[1], (std::vector<int64_t>{1}));
  // The 300 takes an empty pack, the 200 the other; the short ones go to the lightest pack with
  // room (the 200's), not into the 900's spare 100 tokens.
  EXPECT_EQ(packs[2], (std::vector<int64_t>{2}));
  EXPECT_EQ(packs[3], (std::vector<int64_t>{3, 4, 5}));
  // A sample that fits no pack opens `replicas` more.
  const auto more = BalancedGlobalPacks(Lengths({600, 600, 600}), setup->evaluator(), 1000, 2);
  EXPECT_EQ(more.size(), 3u);
}

// By cp class (gbpc, Megatron-Core's hybrid cp): at cp 4 under a 4,096-token cap (1,024 per
// rank), the classes are 4 (> 2,048 tokens), 2 (1,025-2,048) and 1 (<= 1,024); no pack mixes
// classes, every sample lands once, and at cp 1 the packs are gbp's.
TEST(MegatronGbpTest, PacksByCpClassHoldOneClassEach) {
  ParallelConfig par = TestParallel(1, 4);
  par.cp = 4;
  auto setup = MakeTestSetup("gpt-6.7b", par);
  const std::vector<Sample> batch = Lengths({3000, 1800, 1500, 900, 600, 500, 300, 200, 100});
  auto klass = [](int64_t len) { return len > 2048 ? 4 : len > 1024 ? 2 : 1; };
  const auto packs = BalancedGlobalPacks(batch, setup->evaluator(), 4096, 1, 4);
  std::vector<int64_t> ids;
  for (const auto& pack : packs) {
    ASSERT_FALSE(pack.empty());
    int64_t tokens = 0;
    for (int64_t id : pack) {
      EXPECT_EQ(klass(batch[id].input_len), klass(batch[pack[0]].input_len)) << id;
      tokens += batch[id].input_len;
      ids.push_back(id);
    }
    EXPECT_LE(tokens, 4096);
  }
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, SortedIds(batch));
  // The 3,000 alone; the 1,800 and 1,500 each in an empty pack (the least work, as gbp picks);
  // the class-1 samples find no pack of their class and open one more, which takes them all.
  EXPECT_EQ(packs.size(), 4u);
  // gbp's three packs mix classes.
  bool mixed = false;
  for (const auto& pack : BalancedGlobalPacks(batch, setup->evaluator(), 4096, 1)) {
    for (int64_t id : pack) mixed |= klass(batch[id].input_len) != klass(batch[pack[0]].input_len);
  }
  EXPECT_TRUE(mixed);
  EXPECT_EQ(BalancedGlobalPacks(batch, setup->evaluator(), 4096, 1, 1),
            BalancedGlobalPacks(batch, setup->evaluator(), 4096, 1));
  StatusOr<BatchPlan> plan = RunMethod("megatron-hybrid-cp", batch, setup->evaluator(), {});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->outcome, PlanOutcome::kOk) << plan->infeasible_reason;
}

TEST(MegatronGbpTest, EverySampleOnceInOneVarlenRowPerMicroBatch) {
  auto setup = MakeTestSetup("gpt-6.7b", TestParallel(2, 4));
  const std::vector<Sample> batch = RandomTokenBatch(7, 16384, 2048, false);
  StatusOr<BatchPlan> plan = RunMethod("megatron-gbp", batch, setup->evaluator(), {});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->outcome, PlanOutcome::kOk) << plan->infeasible_reason;
  std::vector<int64_t> ids = SampleIdsOf(*plan);
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, SortedIds(batch));
  for (const auto& replica : plan->replicas) {
    EXPECT_FALSE(replica.empty());
    for (const MicroBatch& mb : replica) {
      EXPECT_EQ(mb.rows.size(), 1u);
      EXPECT_TRUE(mb.varlen);
    }
  }
}

TEST(MegatronGbpTest, EncoderDecoderIsUnsupported) {
  auto setup = MakeTestSetup("t5-11b", TestParallel(1, 8));
  StatusOr<BatchPlan> plan =
      RunMethod("megatron-gbp", RandomTokenBatch(1, 4096, 512, true), setup->evaluator(), {});
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(), HasSubstr("encoder-decoder"));
}

TEST(ContextParallelStageCostTest, CpHalvesLongSequenceTimesAndActivations) {
  ParallelConfig one = TestParallel(1, 4, 2, 0);
  ParallelConfig two = one;
  two.cp = 2;
  auto a = MakeTestSetup("gpt-6.7b", one, TestCost::kAnalytic);
  auto b = MakeTestSetup("gpt-6.7b", two, TestCost::kAnalytic);
  const LayerShape shape{1, 8192, 0};
  std::vector<ChunkCost> ca, cb;
  ASSERT_TRUE(a->evaluator().EvaluateStages(shape, Recompute::kFull, &ca));
  ASSERT_TRUE(b->evaluator().EvaluateStages(shape, Recompute::kFull, &cb));
  const double t1 = (ca[0].forward + ca[0].backward()).seconds();
  const double t2 = (cb[0].forward + cb[0].backward()).seconds();
  EXPECT_LT(t2, 0.6 * t1);
  EXPECT_GT(t2, 0.45 * t1);
  EXPECT_NEAR(static_cast<double>(cb[0].stored.count()) / static_cast<double>(ca[0].stored.count()),
              0.5, 0.01);
  // Model states: ZeRO-1 shards the optimizer over dp x cp = 2.
  EXPECT_LT(b->evaluator().stage_states()[0].optimizer, a->evaluator().stage_states()[0].optimizer);
}

}  // namespace
}  // namespace sluice
