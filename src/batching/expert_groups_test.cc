#include "batching/expert_groups.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "batching/test_util.h"

namespace sluice {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::MakeTestSetup;
using testing::SampleIdsOf;
using testing::SortedIds;
using testing::TestCost;
using testing::TestParallel;

std::vector<Sample> Samples(int64_t n) {
  std::vector<Sample> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(Sample{.id = i, .input_len = 40 + 8 * i});
  return out;
}

MicroBatch Priced(const StageCostEvaluator& eval, const BatchIndex& index,
                  std::vector<std::vector<int64_t>> rows, bool varlen = false) {
  MicroBatch mb;
  mb.rows = std::move(rows);
  mb.varlen = varlen;
  EXPECT_TRUE(PriceMicroBatch(eval, index, &mb));
  return mb;
}

class ExpertGroupsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ParallelConfig par = TestParallel(/*dp=*/4, /*pp=*/2);
    par.ep = 2;
    setup_ = MakeTestSetup("gpt-tiny-moe", par, TestCost::kAnalytic);
  }
  const StageCostEvaluator& eval() const { return setup_->evaluator(); }
  std::unique_ptr<testing::TestSetup> setup_;
};

TEST_F(ExpertGroupsTest, SplitsTheLargestMicroBatchesUntilTheGroupAgrees) {
  const std::vector<Sample> batch = Samples(12);
  const BatchIndex index(batch);
  BatchPlan plan;
  // Group 0 (replicas 0, 1): 3 against 1 micro-batch of 4 rows. Group 1 (2, 3): 2 against 1
  // packed row of 3 samples.
  plan.replicas = {
      {Priced(eval(), index, {{0}}), Priced(eval(), index, {{1}}), Priced(eval(), index, {{2}})},
      {Priced(eval(), index, {{3}, {4}, {5}, {6}})},
      {Priced(eval(), index, {{7}}), Priced(eval(), index, {{8}})},
      {Priced(eval(), index, {{9, 10, 11}}, /*varlen=*/true)}};
  const BatchPlan before = plan;
  StatusOr<int64_t> splits = EqualizeExpertGroups(&plan, batch, eval(), 2);
  ASSERT_TRUE(splits.ok()) << splits.status().ToString();
  EXPECT_EQ(*splits, 3);
  for (size_t d = 0; d < 4; ++d) EXPECT_EQ(plan.replicas[d].size(), d < 2 ? 3u : 2u) << d;
  // Replica 1: {3, 4} and {5, 6} first, then of those two rows each the one with the longer
  // bottleneck (longer samples): {3, 4}, {5}, {6}.
  EXPECT_EQ(plan.replicas[1][0].rows, (std::vector<std::vector<int64_t>>{{3}, {4}}));
  EXPECT_EQ(plan.replicas[1][1].rows, (std::vector<std::vector<int64_t>>{{5}}));
  EXPECT_EQ(plan.replicas[1][2].rows, (std::vector<std::vector<int64_t>>{{6}}));
  // Replica 3: the packed row splits into two rows of its samples, still varlen.
  EXPECT_EQ(plan.replicas[3][0].rows, (std::vector<std::vector<int64_t>>{{9, 10}}));
  EXPECT_EQ(plan.replicas[3][1].rows, (std::vector<std::vector<int64_t>>{{11}}));
  EXPECT_TRUE(plan.replicas[3][1].varlen);
  // Every sample once, every half priced, no half costlier in memory than its whole.
  std::vector<int64_t> ids = SampleIdsOf(plan);
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, SortedIds(batch));
  EXPECT_TRUE(ValidateBatchPlan(plan, batch, eval()).ok());
  for (const MicroBatch& half : plan.replicas[1]) {
    ASSERT_EQ(half.stages.size(), 2u);
    for (size_t s = 0; s < 2; ++s) {
      EXPECT_LE(half.stages[s].stored, before.replicas[1][0].stages[s].stored);
      EXPECT_LE(half.stages[s].forward, before.replicas[1][0].stages[s].forward);
    }
  }
  // Agreeing groups and ep 1 are left alone.
  const BatchPlan agreed = plan;
  EXPECT_EQ(*EqualizeExpertGroups(&plan, batch, eval(), 2), 0);
  EXPECT_EQ(plan.replicas, agreed.replicas);
  EXPECT_EQ(*EqualizeExpertGroups(&plan, batch, eval(), 1), 0);
}

TEST_F(ExpertGroupsTest, WhereAMemberHasTooFewSamplesTheOthersMerge) {
  // Replica 1 holds 2 samples, so group 0 runs 2 micro-batches: replica 0 merges the pair that
  // costs the least (the two shortest samples, 0 and 1). Group 1 agrees already.
  const std::vector<Sample> batch = Samples(7);
  const BatchIndex index(batch);
  BatchPlan plan;
  plan.replicas = {
      {Priced(eval(), index, {{4}}), Priced(eval(), index, {{0}}), Priced(eval(), index, {{1}})},
      {Priced(eval(), index, {{2}}), Priced(eval(), index, {{3}})},
      {Priced(eval(), index, {{5}})},
      {Priced(eval(), index, {{6}})}};
  StatusOr<int64_t> r = EqualizeExpertGroups(&plan, batch, eval(), 2);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, 1);
  ASSERT_EQ(plan.replicas[0].size(), 2u);
  EXPECT_EQ(plan.replicas[0][0].rows, (std::vector<std::vector<int64_t>>{{4}}));
  EXPECT_EQ(plan.replicas[0][1].rows, (std::vector<std::vector<int64_t>>{{0}, {1}}));
  EXPECT_EQ(plan.replicas[0][1].shape.mbs, 2);
  EXPECT_TRUE(ValidateBatchPlan(plan, batch, eval()).ok());
}

TEST(ExpertGroupsMemoryTest, NoMergeWithinTheMemoryLimitSaysWhy) {
  ParallelConfig par = TestParallel(/*dp=*/2, /*pp=*/1, 1, /*memory_limit_mb=*/100);
  par.ep = 2;
  auto setup = MakeTestSetup("gpt-tiny-moe", par, TestCost::kAnalytic);
  const StageCostEvaluator& eval = setup->evaluator();
  // The longest length of which one sequence fits the budget and two (one micro-batch) do not.
  int64_t len = 0;
  for (int64_t l = 64; l <= 4096 && len == 0; l += 64) {
    const std::vector<Sample> two = {Sample{.id = 0, .input_len = l},
                                     Sample{.id = 1, .input_len = l}};
    const BatchIndex index(two);
    MicroBatch one_mb = Priced(eval, index, {{0}});
    MicroBatch two_mb;
    two_mb.rows = {{0}, {1}};
    const bool two_fit = PriceMicroBatch(eval, index, &two_mb) &&
                         SequenceFitsMemory(eval, std::vector<MicroBatch>{two_mb});
    if (SequenceFitsMemory(eval, std::vector<MicroBatch>{one_mb}) && !two_fit) len = l;
  }
  ASSERT_GT(len, 0) << "no length fits alone but not in pairs at 100 MB";
  std::vector<Sample> batch;
  for (int64_t i = 0; i < 4; ++i) batch.push_back(Sample{.id = i, .input_len = len});
  const BatchIndex index(batch);
  // Counts 3 and 1 of one long sequence each: one moves, 2 and 2, nothing merged.
  {
    BatchPlan moved;
    moved.replicas = {
        {Priced(eval, index, {{0}}), Priced(eval, index, {{1}}), Priced(eval, index, {{2}})},
        {Priced(eval, index, {{3}})}};
    StatusOr<int64_t> r = EqualizeExpertGroups(&moved, batch, eval, 2);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(*r, 1);
    ASSERT_EQ(moved.replicas[0].size(), 2u);
    ASSERT_EQ(moved.replicas[1].size(), 2u);
    for (const auto& replica : moved.replicas) {
      for (const MicroBatch& mb : replica) EXPECT_EQ(mb.rows.size(), 1u);
    }
    EXPECT_TRUE(ValidateBatchPlan(moved, batch, eval).ok());
  }
  // Counts 2 and 1: no two long sequences share a micro-batch, so they cannot agree.
  BatchPlan plan;
  plan.replicas = {{Priced(eval, index, {{0}}), Priced(eval, index, {{1}})},
                   {Priced(eval, index, {{3}})}};
  // Where two long sequences do not fit together but a short one fits beside another short one
  // on the other replica, the short one moves there.
  {
    std::vector<Sample> mixed = {Sample{.id = 0, .input_len = len},
                                 Sample{.id = 1, .input_len = len},
                                 Sample{.id = 2, .input_len = 16}, Sample{.id = 3, .input_len = 16},
                                 Sample{.id = 4, .input_len = len}};
    const BatchIndex mixed_index(mixed);
    BatchPlan moved;
    moved.replicas = {{Priced(eval, mixed_index, {{0}}), Priced(eval, mixed_index, {{1}}),
                       Priced(eval, mixed_index, {{2}})},
                      {Priced(eval, mixed_index, {{3}}), Priced(eval, mixed_index, {{4}})}};
    StatusOr<int64_t> r = EqualizeExpertGroups(&moved, mixed, eval, 2);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(moved.replicas[0].size(), 2u);
    ASSERT_EQ(moved.replicas[1].size(), 2u);
    EXPECT_EQ(moved.replicas[1][0].rows, (std::vector<std::vector<int64_t>>{{3}, {2}}));
    EXPECT_TRUE(ValidateBatchPlan(moved, mixed, eval).ok());
  }
  StatusOr<int64_t> r = EqualizeExpertGroups(&plan, batch, eval, 2);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(),
              AllOf(HasSubstr("replicas 0-1"), HasSubstr("ep = 2"),
                    HasSubstr("replica 0 has 2 micro-batches and replica 1 only 1 of one sample"),
                    HasSubstr("merges with another of the group (within the memory limit")));
}

}  // namespace
}  // namespace sluice
