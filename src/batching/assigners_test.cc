#include "batching/assigners.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "batching/baselines.h"
#include "batching/hydraulis.h"
#include "batching/micro_batch.h"
#include "batching/test_util.h"

namespace sluice {
namespace {

using testing::MakeTestSetup;
using testing::RandomBatch;
using testing::SampleIdsOf;
using testing::SortedIds;
using testing::TestParallel;

std::vector<int64_t> Ids(std::span<const Sample> samples) {
  std::vector<int64_t> ids;
  for (const Sample& s : samples) ids.push_back(s.id);
  return ids;
}

// Every sample on exactly one replica, dp replicas, and each replica in batch order.
void ExpectPartitionOfBatch(const std::vector<std::vector<Sample>>& replicas,
                            std::span<const Sample> batch, int64_t dp) {
  ASSERT_EQ(static_cast<int64_t>(replicas.size()), dp);
  std::vector<int64_t> all;
  for (const auto& r : replicas) {
    const std::vector<int64_t> ids = Ids(r);
    all.insert(all.end(), ids.begin(), ids.end());
    // Batch order kept: positions in the batch increase.
    int64_t last = -1;
    for (int64_t id : ids) {
      const int64_t pos =
          std::find_if(batch.begin(), batch.end(), [&](const Sample& s) { return s.id == id; }) -
          batch.begin();
      EXPECT_GT(pos, last);
      last = pos;
    }
  }
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, SortedIds(batch));
}

TEST(AssignerTest, ContiguousGivesConsecutiveSlicesDifferingByAtMostOne) {
  const auto setup = MakeTestSetup("gpt-6.7b", TestParallel(4, 2, 1));
  for (int64_t n : {0, 3, 4, 10, 101}) {
    const std::vector<Sample> batch = RandomBatch(static_cast<uint64_t>(n), n, 2048, false);
    const auto replicas =
        MakeContiguousAssigner()->Assign(batch, setup->evaluator(), BatchingOptions{});
    ExpectPartitionOfBatch(replicas, batch, 4);
    std::vector<int64_t> concat;
    size_t smallest = batch.size(), largest = 0;
    for (const auto& r : replicas) {
      for (const Sample& s : r) concat.push_back(s.id);
      smallest = std::min(smallest, r.size());
      largest = std::max(largest, r.size());
    }
    EXPECT_EQ(concat, Ids(batch));
    EXPECT_LE(largest - smallest, 1u);
  }
}

TEST(AssignerTest, BalancedMeetsTheListSchedulingBound) {
  for (bool encdec : {false, true}) {
    const auto setup = encdec ? MakeTestSetup("t5-11b", TestParallel(2, 2, 2))
                              : MakeTestSetup("gpt-6.7b", TestParallel(4, 2, 1));
    const StageCostEvaluator& eval = setup->evaluator();
    const int64_t dp = eval.parallel().dp;
    for (uint64_t seed = 0; seed < 5; ++seed) {
      const std::vector<Sample> batch = RandomBatch(seed, 90, 2048, encdec);
      const auto replicas = MakeBalancedAssigner()->Assign(batch, eval, BatchingOptions{});
      ExpectPartitionOfBatch(replicas, batch, dp);
      const std::vector<int64_t> cost = EstimateSampleCosts(batch, eval, BatchingOptions{});
      int64_t total = 0, biggest = 0;
      for (int64_t c : cost) {
        EXPECT_GT(c, 0);
        total += c;
        biggest = std::max(biggest, c);
      }
      int64_t worst = 0;
      for (const auto& r : replicas) {
        const std::vector<int64_t> rc = EstimateSampleCosts(r, eval, BatchingOptions{});
        int64_t load = 0;
        for (int64_t c : rc) load += c;
        worst = std::max(worst, load);
      }
      // Greedy list scheduling: the max load is at most the mean plus the largest item.
      EXPECT_LE(worst, total / dp + biggest);
      // Deterministic.
      EXPECT_EQ(replicas, MakeBalancedAssigner()->Assign(batch, eval, BatchingOptions{}));
    }
  }
}

TEST(AssignerTest, SampleCostsGrowWithLength) {
  for (bool encdec : {false, true}) {
    const auto setup = encdec ? MakeTestSetup("t5-11b", TestParallel(1, 2, 4))
                              : MakeTestSetup("gpt-6.7b", TestParallel(2, 4, 1));
    const std::vector<Sample> batch = {Sample{0, 64, encdec ? 8 : 0, 0},
                                       Sample{1, 512, encdec ? 8 : 0, 0},
                                       Sample{2, 2048, encdec ? 8 : 0, 0}};
    const std::vector<int64_t> cost =
        EstimateSampleCosts(batch, setup->evaluator(), BatchingOptions{});
    EXPECT_LT(cost[0], cost[1]);
    EXPECT_LT(cost[1], cost[2]);
    EXPECT_GT(cost[2], 4 * cost[0]);
  }
}

// Any assigner composed with any baseline (and Hydraulis' batcher for GPT): the whole plan
// validates.
TEST(AssignerTest, ComposesWithEveryBatcher) {
  for (bool encdec : {false, true}) {
    const auto setup = encdec ? MakeTestSetup("t5-11b", TestParallel(2, 2, 2))
                              : MakeTestSetup("gpt-6.7b", TestParallel(2, 4, 1));
    const StageCostEvaluator& eval = setup->evaluator();
    const std::vector<Sample> batch = RandomBatch(31, 160, 2048, encdec);
    BatchingOptions options;
    options.max_seqlen = 2048;
    std::vector<std::unique_ptr<Assigner>> assigners;
    assigners.push_back(MakeContiguousAssigner());
    assigners.push_back(MakeBalancedAssigner());
    assigners.push_back(MakeHydraulisAssigner());
    std::vector<std::unique_ptr<MicroBatcher>> batchers;
    batchers.push_back(MakePaddingBatcher());
    batchers.push_back(MakeSortedBatcher());
    batchers.push_back(MakeTokenBudgetBatcher());
    batchers.push_back(MakePackingBatcher());
    batchers.push_back(MakeMultipackBatcher());
    if (!encdec) batchers.push_back(MakeHydraulisBatcher());
    for (const auto& a : assigners) {
      const auto replicas = a->Assign(batch, eval, options);
      ExpectPartitionOfBatch(replicas, batch, eval.parallel().dp);
      for (const auto& b : batchers) {
        const std::string what = std::string(a->name()) + "+" + std::string(b->name());
        BatchPlan plan;
        plan.method = what;
        bool oom = false;
        for (const auto& r : replicas) {
          const auto rb = b->Build(r, eval, options);
          ASSERT_TRUE(rb.ok()) << what << ": " << rb.status().ToString();
          if (rb->outcome != PlanOutcome::kOk) oom = true;
          plan.replicas.push_back(rb->micro_batches);
        }
        if (oom) continue;
        const Status st = ValidateBatchPlan(plan, batch, eval);
        EXPECT_TRUE(st.ok()) << st.ToString();
        std::vector<int64_t> ids = SampleIdsOf(plan);
        std::sort(ids.begin(), ids.end());
        EXPECT_EQ(ids, SortedIds(batch)) << what;
      }
    }
  }
}

TEST(AssignerTest, Names) {
  EXPECT_EQ(MakeContiguousAssigner()->name(), "contiguous");
  EXPECT_EQ(MakeBalancedAssigner()->name(), "balanced");
  EXPECT_EQ(MakeHydraulisAssigner()->name(), "hydraulis");
}

}  // namespace
}  // namespace sluice
