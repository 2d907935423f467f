#include "data/global_batcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "data/data_source.h"
#include "data/generator.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

Dataset Small(std::vector<std::pair<int64_t, int64_t>> lengths) {
  Dataset ds("small");
  const TaskId t = ds.InternTask("t");
  for (auto [in, out] : lengths) ds.Add(in, out, t);
  return ds;
}

std::vector<GlobalBatch> All(GlobalBatcher& b) {
  std::vector<GlobalBatch> out;
  GlobalBatch batch;
  while (b.Next(&batch)) out.push_back(batch);
  EXPECT_FALSE(b.Next(&batch));  // stays done
  return out;
}

std::vector<std::vector<int64_t>> Ids(const std::vector<GlobalBatch>& batches) {
  std::vector<std::vector<int64_t>> out;
  for (const GlobalBatch& b : batches) {
    out.emplace_back();
    for (const Sample& s : b.samples) out.back().push_back(s.id);
  }
  return out;
}

GlobalBatcher Make(const Dataset& ds, const BatcherOptions& o) {
  StatusOr<GlobalBatcher> b = GlobalBatcher::Create(ds, o);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return *std::move(b);
}

TEST(GlobalBatcherTest, GreedyNextFitInDatasetOrder) {
  const Dataset ds = Small({{4, 0}, {3, 2}, {1, 0}, {6, 0}, {2, 2}, {1, 0}});
  BatcherOptions o;
  o.tokens_per_batch = 10;
  o.shuffle = false;
  GlobalBatcher b = Make(ds, o);
  const std::vector<GlobalBatch> batches = All(b);
  EXPECT_THAT(Ids(batches), ElementsAre(ElementsAre(0, 1, 2), ElementsAre(3, 4), ElementsAre(5)));
  EXPECT_EQ(batches[0].tokens, 10);
  EXPECT_EQ(batches[1].tokens, 10);
  EXPECT_EQ(batches[2].tokens, 1);
  EXPECT_EQ(batches[2].index, 2);
  EXPECT_EQ(b.report().batches, 3);
  EXPECT_EQ(b.report().batched_samples, 6);
  EXPECT_EQ(b.report().batched_tokens, 21);
  EXPECT_TRUE(b.report().dropped.empty());
}

TEST(GlobalBatcherTest, ClipEachSideTruncatesBothSidesToMax) {
  const Dataset ds = Small({{3000, 3000}, {100, 10}, {5000, 0}});
  BatcherOptions o;
  o.max_seqlen = 2048;
  o.shuffle = false;
  GlobalBatcher b = Make(ds, o);
  const std::vector<GlobalBatch> batches = All(b);
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_THAT(batches[0].samples,
              ElementsAre(Sample{0, 2048, 2048, 0}, Sample{1, 100, 10, 0}, Sample{2, 2048, 0, 0}));
  EXPECT_THAT(b.report().clipped, ElementsAre(ClippedSample{0, 3000, 3000, 2048, 2048},
                                              ClippedSample{2, 5000, 0, 2048, 0}));
  EXPECT_EQ(b.report().clipped_tokens, 952 * 2 + 2952);
}

TEST(GlobalBatcherTest, ClipTotalCutsTargetFirst) {
  const Dataset ds = Small({{1500, 1000}, {3000, 100}, {1000, 1000}});
  BatcherOptions o;
  o.max_seqlen = 2048;
  o.limit = SeqlenLimit::kTotal;
  o.shuffle = false;
  GlobalBatcher b = Make(ds, o);
  const std::vector<GlobalBatch> batches = All(b);
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_THAT(batches[0].samples, ElementsAre(Sample{0, 1500, 548, 0}, Sample{1, 2048, 0, 0},
                                              Sample{2, 1000, 1000, 0}));
  EXPECT_EQ(b.report().clipped.size(), 2u);
}

// ClipSample is the batcher's clip: the same lengths as the batches above, unchanged under the
// limit or with max_seqlen 0.
TEST(GlobalBatcherTest, ClipSampleIsTheBatchersClip) {
  EXPECT_EQ(ClipSample({0, 3000, 3000, 1}, 2048, SeqlenLimit::kEachSide),
            (Sample{0, 2048, 2048, 1}));
  EXPECT_EQ(ClipSample({0, 1500, 1000, 0}, 2048, SeqlenLimit::kTotal), (Sample{0, 1500, 548, 0}));
  EXPECT_EQ(ClipSample({1, 3000, 100, 0}, 2048, SeqlenLimit::kTotal), (Sample{1, 2048, 0, 0}));
  EXPECT_EQ(ClipSample({2, 100, 10, 0}, 2048, SeqlenLimit::kTotal), (Sample{2, 100, 10, 0}));
  EXPECT_EQ(ClipSample({3, 9000, 0, 0}, 0, SeqlenLimit::kTotal), (Sample{3, 9000, 0, 0}));
}

TEST(GlobalBatcherTest, DropPolicyAndOversizedSamplesAreReportedWithReasons) {
  const Dataset ds = Small({{10, 0}, {3000, 0}, {20, 2100}, {30, 0}});
  BatcherOptions o;
  o.max_seqlen = 2048;
  o.long_samples = LongSamplePolicy::kDrop;
  o.tokens_per_batch = 1000;
  GlobalBatcher b = Make(ds, o);
  const std::vector<GlobalBatch> batches = All(b);
  EXPECT_THAT(
      b.report().dropped,
      ElementsAre(DroppedSample{1, DropReason::kLongerThanMaxSeqlen, kEveryEpoch, 3000, 0},
                  DroppedSample{2, DropReason::kLongerThanMaxSeqlen, kEveryEpoch, 20, 2100}));
  EXPECT_EQ(b.report().eligible_samples, 2);
  EXPECT_EQ(b.report().batched_samples, 2);

  // Clipping instead keeps them, but a clipped sample may still exceed the budget alone.
  o.long_samples = LongSamplePolicy::kClip;
  GlobalBatcher c = Make(ds, o);
  All(c);
  EXPECT_THAT(c.report().dropped,
              ElementsAre(DroppedSample{1, DropReason::kLargerThanBudget, kEveryEpoch, 3000, 0},
                          DroppedSample{2, DropReason::kLargerThanBudget, kEveryEpoch, 20, 2100}));
  EXPECT_EQ(c.report().DroppedCount(DropReason::kLargerThanBudget), 2);
  EXPECT_THAT(c.report().Summary(), HasSubstr("dropped, larger than the batch token budget: 2 "
                                              "samples (ids 1, 2)"));
}

TEST(GlobalBatcherTest, DropLastDropsThePartialBatchOfEachEpoch) {
  const Dataset ds = Small({{6, 0}, {6, 0}, {6, 0}});
  BatcherOptions o;
  o.tokens_per_batch = 12;
  o.shuffle = false;
  o.drop_last = true;
  o.epochs = 2;
  GlobalBatcher b = Make(ds, o);
  const std::vector<GlobalBatch> batches = All(b);
  EXPECT_THAT(Ids(batches), ElementsAre(ElementsAre(0, 1), ElementsAre(0, 1)));
  EXPECT_EQ(batches[1].epoch, 1);
  EXPECT_EQ(batches[1].index, 1);
  EXPECT_THAT(b.report().dropped,
              ElementsAre(DroppedSample{2, DropReason::kPartialLastBatch, 0, 6, 0},
                          DroppedSample{2, DropReason::kPartialLastBatch, 1, 6, 0}));
  EXPECT_EQ(b.report().epochs_started, 2);
}

TEST(GlobalBatcherTest, NothingLeftEndsEvenUnboundedEpochs) {
  BatcherOptions o;
  o.tokens_per_batch = 100;
  o.drop_last = true;
  o.epochs = 0;
  GlobalBatcher b = Make(Small({{5, 0}, {6, 0}}), o);
  EXPECT_TRUE(All(b).empty());
  EXPECT_EQ(b.report().DroppedCount(DropReason::kPartialLastBatch), 2);

  o.max_seqlen = 4;
  o.long_samples = LongSamplePolicy::kDrop;
  GlobalBatcher c = Make(Small({{5, 0}, {6, 0}}), o);
  EXPECT_TRUE(All(c).empty());
}

TEST(GlobalBatcherTest, UnboundedEpochsKeepGoing) {
  BatcherOptions o;
  o.tokens_per_batch = 10;
  o.epochs = 0;
  GlobalBatcher b = Make(Small({{6, 0}, {6, 0}}), o);
  GlobalBatch batch;
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(b.Next(&batch));
  EXPECT_EQ(batch.index, 99);
  EXPECT_EQ(batch.epoch, 49);
}

TEST(GlobalBatcherTest, ShuffleIsSeededAndDiffersPerEpoch) {
  const Dataset ds = *GenerateDataset("flan-like", 3000, 1);
  BatcherOptions o;
  o.tokens_per_batch = 16384;
  o.epochs = 2;
  o.seed = 11;
  GlobalBatcher a = Make(ds, o), a2 = Make(ds, o);
  const std::vector<GlobalBatch> ba = All(a);
  EXPECT_EQ(ba, All(a2));
  o.seed = 12;
  GlobalBatcher c = Make(ds, o);
  EXPECT_NE(Ids(ba), Ids(All(c)));
  // Epoch 1's order differs from epoch 0's.
  std::vector<int64_t> e0, e1;
  for (const GlobalBatch& g : ba) {
    for (const Sample& s : g.samples) (g.epoch == 0 ? e0 : e1).push_back(s.id);
  }
  EXPECT_EQ(e0.size(), ds.size());
  EXPECT_NE(e0, e1);
  // Without shuffling, dataset order.
  o.shuffle = false;
  o.epochs = 1;
  GlobalBatcher d = Make(ds, o);
  int64_t next = 0;
  for (const GlobalBatch& g : All(d)) {
    for (const Sample& s : g.samples) EXPECT_EQ(s.id, next++);
  }
}

// The invariants of the header, over several datasets and option combinations.
TEST(GlobalBatcherTest, EverySampleExactlyOnceAndBudgetRespected) {
  std::vector<Dataset> datasets = {*LoadData("mixture-4task"),
                                   *GenerateDataset("web-code", 5000, 3),
                                   *GenerateDataset("flan-like", 5000, 4)};
  for (const Dataset& ds : datasets) {
    // Readers and generators number samples 0..n-1, so ids index vectors here.
    const std::vector<Sample>& by_id = ds.samples();
    for (size_t i = 0; i < ds.size(); ++i) ASSERT_EQ(by_id[i].id, static_cast<int64_t>(i));
    for (int64_t budget : {4096, 65536}) {
      for (int64_t max_seqlen : {0, 2048}) {
        for (LongSamplePolicy policy : {LongSamplePolicy::kClip, LongSamplePolicy::kDrop}) {
          for (SeqlenLimit limit : {SeqlenLimit::kEachSide, SeqlenLimit::kTotal}) {
            for (bool drop_last : {false, true}) {
              SCOPED_TRACE(::testing::Message()
                           << ds.source() << " budget " << budget << " max " << max_seqlen << " "
                           << LongSamplePolicyName(policy) << " limit " << static_cast<int>(limit)
                           << " drop_last " << drop_last);
              BatcherOptions o{budget, max_seqlen, policy, limit, true, 7, 2, drop_last};
              GlobalBatcher b = Make(ds, o);
              const std::vector<GlobalBatch> batches = All(b);
              const BatcherReport& r = b.report();
              std::vector<const ClippedSample*> clipped(ds.size(), nullptr);
              for (const ClippedSample& c : r.clipped) clipped[static_cast<size_t>(c.id)] = &c;
              // seen[epoch][id]: how often the id was batched or dropped in that epoch.
              std::vector<std::vector<int>> seen(2, std::vector<int>(ds.size(), 0));
              const auto see = [&](int64_t epoch, int64_t id) {
                ++seen[static_cast<size_t>(epoch)][static_cast<size_t>(id)];
              };
              for (const DroppedSample& d : r.dropped) {
                if (d.epoch == kEveryEpoch) {
                  see(0, d.id);
                  see(1, d.id);
                  EXPECT_NE(d.reason, DropReason::kPartialLastBatch);
                } else {
                  see(d.epoch, d.id);
                  EXPECT_EQ(d.reason, DropReason::kPartialLastBatch);
                }
                EXPECT_EQ(by_id[static_cast<size_t>(d.id)].input_len, d.input_len);
                EXPECT_EQ(by_id[static_cast<size_t>(d.id)].target_len, d.target_len);
              }
              int64_t index = 0, tokens_total = 0;
              for (const GlobalBatch& g : batches) {
                EXPECT_EQ(g.index, index++);
                EXPECT_FALSE(g.samples.empty());
                EXPECT_LE(g.tokens, budget);
                int64_t tokens = 0;
                for (const Sample& s : g.samples) {
                  tokens += s.tokens();
                  see(g.epoch, s.id);
                  const Sample& orig = by_id[static_cast<size_t>(s.id)];
                  EXPECT_EQ(s.task, orig.task);
                  if (const ClippedSample* c = clipped[static_cast<size_t>(s.id)]; c != nullptr) {
                    EXPECT_EQ(s.input_len, c->clipped_input_len);
                    EXPECT_EQ(s.target_len, c->clipped_target_len);
                  } else {
                    EXPECT_EQ(s, orig);
                  }
                  if (max_seqlen > 0 && limit == SeqlenLimit::kEachSide) {
                    EXPECT_LE(std::max(s.input_len, s.target_len), max_seqlen);
                  } else if (max_seqlen > 0) {
                    EXPECT_LE(s.tokens(), max_seqlen);
                  }
                }
                EXPECT_EQ(tokens, g.tokens);
                tokens_total += tokens;
              }
              EXPECT_EQ(tokens_total, r.batched_tokens);
              for (const std::vector<int>& counts : seen) {
                EXPECT_EQ(std::count(counts.begin(), counts.end(), 1),
                          static_cast<std::ptrdiff_t>(ds.size()));
              }
              if (max_seqlen == 0 || policy == LongSamplePolicy::kDrop) {
                EXPECT_TRUE(r.clipped.empty());
              }
              if (!drop_last) {
                EXPECT_EQ(r.DroppedCount(DropReason::kPartialLastBatch), 0);
              }
            }
          }
        }
      }
    }
  }
}

TEST(GlobalBatcherTest, BadOptionsNameTheOption) {
  const Dataset ds = Small({{1, 0}});
  BatcherOptions o;
  o.tokens_per_batch = 0;
  EXPECT_THAT(GlobalBatcher::Create(ds, o).status().message(), HasSubstr("tokens_per_batch"));
  o = {};
  o.max_seqlen = -1;
  EXPECT_THAT(GlobalBatcher::Create(ds, o).status().message(), HasSubstr("max_seqlen"));
  o = {};
  o.epochs = -2;
  EXPECT_THAT(GlobalBatcher::Create(ds, o).status().message(), HasSubstr("epochs"));
  EXPECT_EQ(*ParseLongSamplePolicy("drop"), LongSamplePolicy::kDrop);
  EXPECT_THAT(ParseLongSamplePolicy("trim").status().message(), HasSubstr("'clip' or 'drop'"));
}

}  // namespace
}  // namespace sluice
