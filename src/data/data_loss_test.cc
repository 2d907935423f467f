// DataLoss: the counts of clipped and dropped samples and tokens add up, and the messages say
// how many and why.
#include "data/data_loss.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sluice {
namespace {

using ::testing::HasSubstr;

Dataset Lengths(std::vector<int64_t> lens) {
  Dataset d("test");
  const TaskId task = d.InternTask("t");
  for (int64_t len : lens) d.Add(len, 0, task);
  return d;
}

DataLoss LossOf(const Dataset& d, int64_t max_seqlen, LongSamplePolicy policy, int64_t budget) {
  BatcherOptions o;
  o.max_seqlen = max_seqlen;
  o.long_samples = policy;
  o.tokens_per_batch = budget;
  auto b = GlobalBatcher::Create(d, o);
  EXPECT_TRUE(b.ok());
  return DataLossOf(*b);
}

TEST(DataLossTest, ClippingCountsSamplesAndRemovedTokens) {
  const Dataset d = Lengths({100, 3000, 5000, 200});
  const DataLoss l = LossOf(d, 1000, LongSamplePolicy::kClip, 65536);
  EXPECT_EQ(l.samples, 4);
  EXPECT_EQ(l.tokens, 8300);
  EXPECT_EQ(l.clipped_samples, 2);
  EXPECT_EQ(l.clipped_tokens, 2000 + 4000);
  EXPECT_EQ(l.dropped_samples(), 0);
  EXPECT_EQ(l.kept_samples, 4);
  EXPECT_EQ(l.kept_tokens, 2300);
  EXPECT_EQ(l.lost_tokens(), 6000);
  EXPECT_EQ(l.Describe(),
            "2 of 4 samples (50.0%) longer than max seqlen 1000 were clipped, removing 6,000 of "
            "8,300 tokens (72.3%)");
  EXPECT_EQ(l.WhyNoBatch(), "");
}

TEST(DataLossTest, DroppingAndBudgetDropsAddUp) {
  const Dataset d = Lengths({100, 3000, 5000, 200});
  const DataLoss drop = LossOf(d, 1000, LongSamplePolicy::kDrop, 65536);
  EXPECT_EQ(drop.dropped_long_samples, 2);
  EXPECT_EQ(drop.dropped_long_tokens, 8000);
  EXPECT_EQ(drop.lost_tokens(), 8000);
  EXPECT_THAT(drop.Describe(), HasSubstr("2 of 4 samples (50.0%) longer than max seqlen 1000 were "
                                         "dropped with their 8,000 of 8,300 tokens (96.4%)"));
  // Clipped to 1000, two samples are still larger than a 500-token budget: dropped with the
  // tokens left after clipping, and the total says what was lost in all.
  const DataLoss budget = LossOf(d, 1000, LongSamplePolicy::kClip, 500);
  EXPECT_EQ(budget.clipped_samples, 2);
  EXPECT_EQ(budget.dropped_budget_samples, 2);
  EXPECT_EQ(budget.dropped_budget_tokens, 2000);
  EXPECT_EQ(budget.kept_tokens, 300);
  EXPECT_EQ(budget.clipped_tokens + budget.dropped_budget_tokens, budget.lost_tokens());
  EXPECT_THAT(budget.Describe(), HasSubstr("8,000 of 8,300 tokens (96.4%) lost in all"));
  // Nothing long: said so.
  EXPECT_THAT(LossOf(d, 8192, LongSamplePolicy::kClip, 65536).Describe(),
              HasSubstr("no sample was clipped or dropped"));
}

TEST(DataLossTest, WhyNoBatchSaysEverySampleWasDroppedAndWhy) {
  const DataLoss all = LossOf(Lengths({3000, 5000}), 1000, LongSamplePolicy::kDrop, 65536);
  EXPECT_EQ(all.WhyNoBatch(),
            "all 2 samples were dropped: 2 longer than max seqlen 1000 (long samples are dropped)");
  const DataLoss big = LossOf(Lengths({3000}), 0, LongSamplePolicy::kClip, 100);
  EXPECT_EQ(big.WhyNoBatch(),
            "all 1 samples were dropped: 1 larger than the batch budget of 100 tokens");
}

}  // namespace
}  // namespace sluice
