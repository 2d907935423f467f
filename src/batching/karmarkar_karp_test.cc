#include "batching/karmarkar_karp.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "base/rng.h"
#include "batching/dynapipe_batcher.h"
#include "batching/test_util.h"

namespace sluice {
namespace {

using testing::MakeTestSetup;
using testing::RandomTokenBatch;
using testing::TestParallel;

// Every item in exactly one bin, bins ascending.
void ExpectPartition(const std::vector<std::vector<int64_t>>& p, size_t items, int64_t bins) {
  ASSERT_EQ(static_cast<int64_t>(p.size()), bins);
  std::vector<int64_t> all;
  for (const auto& bin : p) {
    EXPECT_TRUE(std::is_sorted(bin.begin(), bin.end()));
    all.insert(all.end(), bin.begin(), bin.end());
  }
  std::sort(all.begin(), all.end());
  ASSERT_EQ(all.size(), items);
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i], static_cast<int64_t>(i));
}

TEST(KarmarkarKarpTest, ClassicExample) {
  const std::vector<int64_t> w = {8, 7, 6, 5, 4};
  const auto kk = KarmarkarKarpPartition(w, 2);
  ExpectPartition(kk, w.size(), 2);
  EXPECT_EQ(MaxBinSum(w, kk), 15);  // differencing alone gives 16; the refinement finds 15
  EXPECT_EQ(MaxBinSum(w, GreedyLptPartition(w, 2)), 17);
  // Bins ordered by first item; empty bins last.
  const auto wide = KarmarkarKarpPartition(w, 8);
  ExpectPartition(wide, w.size(), 8);
  EXPECT_EQ(MaxBinSum(w, wide), 8);
  EXPECT_TRUE(wide.back().empty());
  EXPECT_EQ(wide.front(), (std::vector<int64_t>{0}));
  const auto none = KarmarkarKarpPartition({}, 3);
  ExpectPartition(none, 0, 3);
}

// Karmarkar-Karp is usually better than LPT but not always (it is no dominating algorithm):
// count both, and check that BalancedPartition is never worse than either.
TEST(KarmarkarKarpTest, BeatsOrTiesLptOnRandomInputs) {
  Rng rng(7);
  int trials = 0, kk_wins = 0, kk_losses = 0;
  for (int trial = 0; trial < 5000; ++trial) {
    const int64_t bins = std::vector<int64_t>{2, 3, 4, 8}[trial % 4];
    const int64_t n = rng.UniformInt(1, 60);
    std::vector<int64_t> w;
    for (int64_t i = 0; i < n; ++i) {
      // Micro-batch-like times: lognormal around 40 ms, in ns.
      w.push_back(std::llround(rng.LogNormal(std::log(40e6), 0.6)));
    }
    const auto kk = KarmarkarKarpPartition(w, bins);
    const auto lpt = GreedyLptPartition(w, bins);
    const auto balanced = BalancedPartition(w, bins);
    ExpectPartition(kk, w.size(), bins);
    ExpectPartition(lpt, w.size(), bins);
    ExpectPartition(balanced, w.size(), bins);
    const int64_t k = MaxBinSum(w, kk), l = MaxBinSum(w, lpt);
    EXPECT_EQ(MaxBinSum(w, balanced), std::min(k, l));
    ++trials;
    kk_wins += k < l;
    kk_losses += k > l;
    if (k > l) EXPECT_LT(k, l + l / 100) << "trial " << trial << ": KK lost by more than 1%";
    EXPECT_EQ(kk, KarmarkarKarpPartition(w, bins));
  }
  EXPECT_GT(kk_wins, trials / 2);
  EXPECT_LT(kk_losses, trials / 100);
  std::printf("Karmarkar-Karp vs LPT on %d random inputs: %d better, %d worse\n", trials, kk_wins,
              kk_losses);
}

TEST(DistributeMicroBatchesTest, BalancedValidPlan) {
  auto setup = MakeTestSetup("gpt-6.7b", TestParallel(4, 4, 2));
  const StageCostEvaluator& e = setup->evaluator();
  const std::vector<Sample> batch = RandomTokenBatch(5, 65536, 2048, false);
  auto global = MakeDynaPipeBatcher()->Build(batch, e, BatchingOptions{}, 4);
  ASSERT_TRUE(global.ok());
  ASSERT_EQ(global->outcome, PlanOutcome::kOk);
  auto plan = DistributeMicroBatches(*global, batch, e, BatchingOptions{});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->outcome, PlanOutcome::kOk) << plan->infeasible_reason;
  ASSERT_EQ(plan->replicas.size(), 4u);
  EXPECT_TRUE(ValidateBatchPlan(*plan, batch, e).ok());
  std::vector<int64_t> w;
  for (const MicroBatch& mb : global->micro_batches) w.push_back(mb.Bottleneck().nanos());
  Duration most;
  for (const auto& replica : plan->replicas) {
    Duration sum;
    for (const MicroBatch& mb : replica) sum += mb.Bottleneck();
    most = std::max(most, sum);
    // Each replica keeps the global order (longest first).
    for (size_t i = 1; i < replica.size(); ++i) {
      EXPECT_GE(replica[i - 1].shape.seqlen, replica[i].shape.seqlen);
    }
  }
  EXPECT_LE(most.nanos(), MaxBinSum(w, GreedyLptPartition(w, 4)));
  // A sample that is not in the batch is bad input.
  ReplicaBatches stray = *global;
  stray.micro_batches[0].rows[0][0] = 123456;
  EXPECT_FALSE(DistributeMicroBatches(stray, batch, e, BatchingOptions{}).ok());
}

// A batch small enough for one micro-batch still gives every replica samples: the documented
// `train --parallel dp=2,pp=2` case, where DynaPipe's DP picks one micro-batch for the whole batch.
TEST(DistributeMicroBatchesTest, NoReplicaEmptyWhenTheBatchFitsOneMicroBatch) {
  for (const int64_t dp : {2, 4}) {
    auto setup = MakeTestSetup("gpt-6.7b", TestParallel(dp, 2));
    const StageCostEvaluator& e = setup->evaluator();
    std::vector<Sample> batch;
    for (int64_t i = 0; i < 5; ++i) batch.push_back(Sample{.id = i, .input_len = 16 + i});
    auto global = MakeDynaPipeBatcher()->Build(batch, e, BatchingOptions{}, dp);
    ASSERT_TRUE(global.ok());
    ASSERT_EQ(global->outcome, PlanOutcome::kOk);
    // The precondition of the bug: DynaPipe packs these few short samples into fewer
    // micro-batches than replicas.
    ASSERT_LT(static_cast<int64_t>(global->micro_batches.size()), dp);
    auto plan = DistributeMicroBatches(*global, batch, e, BatchingOptions{});
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    ASSERT_EQ(plan->outcome, PlanOutcome::kOk) << plan->infeasible_reason;
    ASSERT_EQ(static_cast<int64_t>(plan->replicas.size()), dp);
    for (const auto& replica : plan->replicas) EXPECT_FALSE(replica.empty());
    EXPECT_TRUE(ValidateBatchPlan(*plan, batch, e).ok());
    EXPECT_EQ(testing::SampleIdsOf(*plan).size(), batch.size());
  }
  // Fewer samples than replicas: as many replicas get one as there are samples.
  auto setup = MakeTestSetup("gpt-6.7b", TestParallel(4, 2));
  const StageCostEvaluator& e = setup->evaluator();
  const std::vector<Sample> two = {Sample{.id = 0, .input_len = 20},
                                   Sample{.id = 1, .input_len = 30}};
  auto global = MakeDynaPipeBatcher()->Build(two, e, BatchingOptions{}, 4);
  ASSERT_TRUE(global.ok());
  auto plan = DistributeMicroBatches(*global, two, e, BatchingOptions{});
  ASSERT_TRUE(plan.ok());
  int64_t filled = 0;
  for (const auto& replica : plan->replicas) filled += replica.empty() ? 0 : 1;
  EXPECT_EQ(filled, 2);
}

}  // namespace
}  // namespace sluice
