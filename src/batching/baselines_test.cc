#include "batching/baselines.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "base/rng.h"
#include "batching/baseline_search.h"
#include "batching/micro_batch.h"
#include "batching/test_util.h"

namespace sluice {
namespace {

using testing::MakeTestSetup;
using testing::RandomBatch;
using testing::SampleIdsOf;
using testing::SortedIds;
using testing::TestParallel;
using testing::TestSetup;

constexpr int64_t kMaxSeqlen = 2048;

std::unique_ptr<TestSetup> Gpt(const StageCostOptions& options = {}) {
  return MakeTestSetup("gpt-6.7b", TestParallel(2, 4, 1), testing::TestCost::kProfiled, options);
}
std::unique_ptr<TestSetup> T5() { return MakeTestSetup("t5-11b", TestParallel(1, 2, 4)); }

struct Baseline {
  std::string name;
  std::unique_ptr<MicroBatcher> batcher;
};
std::vector<Baseline> AllBaselines() {
  std::vector<Baseline> out;
  out.push_back({"padding", MakePaddingBatcher()});
  out.push_back({"sorted", MakeSortedBatcher()});
  out.push_back({"token-budget", MakeTokenBudgetBatcher()});
  out.push_back({"packing", MakePackingBatcher()});
  out.push_back({"multipack", MakeMultipackBatcher()});
  return out;
}

// Long-tailed decoder-only samples (median 700 tokens, sigma_log 1), ids 0..n-1.
std::vector<Sample> LongTailBatch(uint64_t seed, int64_t n, int64_t max_len) {
  Rng rng(seed);
  std::vector<Sample> out;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len =
        std::clamp<int64_t>(std::llround(rng.LogNormal(std::log(700.0), 1.0)), 1, max_len);
    out.push_back(Sample{i, len, 0, 0});
  }
  return out;
}

BatchingOptions Options(int64_t max_seqlen = kMaxSeqlen) {
  BatchingOptions o;
  o.max_seqlen = max_seqlen;
  return o;
}

// The invariants of one replica's micro-batches: every sample exactly once, the memory rule,
// and ValidateBatchPlan on a plan holding them as replica 0.
void ExpectValid(const ReplicaBatches& rb, std::span<const Sample> samples,
                 const StageCostEvaluator& eval, const std::string& what) {
  ASSERT_EQ(rb.outcome, PlanOutcome::kOk) << what << ": " << rb.infeasible_reason;
  std::vector<int64_t> ids = SampleIdsOf(rb.micro_batches);
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, SortedIds(samples)) << what;
  EXPECT_EQ(CheckSequenceMemory(eval, rb.micro_batches), "") << what;
  BatchPlan plan;
  plan.method = what;
  plan.replicas.resize(static_cast<size_t>(eval.parallel().dp));
  plan.replicas[0] = rb.micro_batches;
  const Status st = ValidateBatchPlan(plan, samples, eval);
  EXPECT_TRUE(st.ok()) << st.ToString();
}

int64_t PaddedTokens(const ReplicaBatches& rb) {
  int64_t t = 0;
  for (const MicroBatch& mb : rb.micro_batches) t += mb.padded_tokens;
  return t;
}

TEST(BaselineTest, EveryBatcherKeepsEverySampleOnceWithinMemoryGpt) {
  const auto setup = Gpt();
  const StageCostEvaluator& eval = setup->evaluator();
  for (uint64_t seed = 0; seed < 3; ++seed) {
    for (const auto& batch :
         {RandomBatch(seed, 150, kMaxSeqlen, false), LongTailBatch(seed, 40, kMaxSeqlen)}) {
      for (const Baseline& b : AllBaselines()) {
        const auto rb = b.batcher->Build(batch, eval, Options());
        ASSERT_TRUE(rb.ok()) << rb.status().ToString();
        ExpectValid(*rb, batch, eval, b.name + " seed " + std::to_string(seed));
      }
    }
  }
}

TEST(BaselineTest, EveryBatcherKeepsEverySampleOnceWithinMemoryT5) {
  const auto setup = T5();
  const StageCostEvaluator& eval = setup->evaluator();
  for (uint64_t seed = 0; seed < 3; ++seed) {
    const std::vector<Sample> batch = RandomBatch(seed, 120, kMaxSeqlen, true);
    for (const Baseline& b : AllBaselines()) {
      const auto rb = b.batcher->Build(batch, eval, Options());
      ASSERT_TRUE(rb.ok()) << rb.status().ToString();
      ExpectValid(*rb, batch, eval, b.name + " seed " + std::to_string(seed));
      // Multipack packs encoder and decoder rows varlen; the others pad.
      for (const MicroBatch& mb : rb->micro_batches) {
        EXPECT_EQ(mb.varlen, b.name == "multipack") << b.name;
      }
    }
  }
}

TEST(BaselineTest, EveryBatcherHoldsUnderGPipeInFlight) {
  const auto setup = Gpt(StageCostOptions{.pad_multiple = 8, .in_flight = InFlightPolicy::kGPipe});
  const std::vector<Sample> batch = RandomBatch(7, 100, kMaxSeqlen, false);
  for (const Baseline& b : AllBaselines()) {
    const auto rb = b.batcher->Build(batch, setup->evaluator(), Options());
    ASSERT_TRUE(rb.ok()) << rb.status().ToString();
    if (rb->outcome == PlanOutcome::kOk) {
      ExpectValid(*rb, batch, setup->evaluator(), b.name);
    } else {
      EXPECT_FALSE(rb->infeasible_reason.empty());
    }
  }
}

TEST(BaselineTest, DeterministicForTheSameInput) {
  const auto gpt = Gpt();
  const auto t5 = T5();
  for (const Baseline& b : AllBaselines()) {
    const std::vector<Sample> g = RandomBatch(11, 90, kMaxSeqlen, false);
    EXPECT_EQ(b.batcher->Build(g, gpt->evaluator(), Options())->micro_batches,
              b.batcher->Build(g, gpt->evaluator(), Options())->micro_batches)
        << b.name;
    const std::vector<Sample> t = RandomBatch(11, 90, kMaxSeqlen, true);
    EXPECT_EQ(b.batcher->Build(t, t5->evaluator(), Options())->micro_batches,
              b.batcher->Build(t, t5->evaluator(), Options())->micro_batches)
        << b.name;
  }
}

TEST(BaselineTest, PaddingPadsEveryRowToMaxSeqlenInDatasetOrder) {
  const auto setup = Gpt();
  const std::vector<Sample> batch = RandomBatch(3, 64, kMaxSeqlen, false);
  const auto rb = MakePaddingBatcher()->Build(batch, setup->evaluator(), Options());
  ASSERT_TRUE(rb.ok());
  ASSERT_EQ(rb->outcome, PlanOutcome::kOk) << rb->infeasible_reason;
  std::vector<int64_t> in_order;
  for (const Sample& s : batch) in_order.push_back(s.id);
  EXPECT_EQ(SampleIdsOf(rb->micro_batches), in_order);
  for (const MicroBatch& mb : rb->micro_batches) {
    EXPECT_EQ(mb.shape.seqlen, kMaxSeqlen);
    EXPECT_EQ(mb.padded_tokens, mb.shape.mbs * kMaxSeqlen);
    for (const auto& row : mb.rows) EXPECT_EQ(row.size(), 1u);
  }
  // All micro-batches but the last have the chosen size.
  const int64_t size = rb->micro_batches.front().shape.mbs;
  for (size_t j = 0; j + 1 < rb->micro_batches.size(); ++j) {
    EXPECT_EQ(rb->micro_batches[j].shape.mbs, size);
  }
}

TEST(BaselineTest, PaddingPadsTargetsToTheLongestTargetForEncoderDecoder) {
  const auto setup = T5();
  const std::vector<Sample> batch = RandomBatch(5, 50, kMaxSeqlen, true);
  int64_t longest = 0;
  for (const Sample& s : batch) longest = std::max(longest, s.target_len);
  const auto rb = MakePaddingBatcher()->Build(batch, setup->evaluator(), Options());
  ASSERT_TRUE(rb.ok());
  ASSERT_EQ(rb->outcome, PlanOutcome::kOk) << rb->infeasible_reason;
  for (const MicroBatch& mb : rb->micro_batches) {
    EXPECT_EQ(mb.shape.seqlen, kMaxSeqlen);
    EXPECT_EQ(mb.shape.dec_seqlen, setup->evaluator().Pad(longest));
  }
}

TEST(BaselineTest, SortedRunsLongestFirstAndPadsNoMoreThanPadding) {
  for (bool encdec : {false, true}) {
    const auto setup = encdec ? T5() : Gpt();
    const StageCostEvaluator& eval = setup->evaluator();
    for (uint64_t seed = 0; seed < 4; ++seed) {
      const std::vector<Sample> batch = RandomBatch(seed, 80, kMaxSeqlen, encdec);
      BatchingOptions o = Options();
      o.micro_batch_size = 2;
      o.recompute = Recompute::kFull;
      const auto sorted = MakeSortedBatcher()->Build(batch, eval, o);
      const auto padded = MakePaddingBatcher()->Build(batch, eval, o);
      ASSERT_TRUE(sorted.ok() && padded.ok());
      ASSERT_EQ(sorted->outcome, PlanOutcome::kOk) << sorted->infeasible_reason;
      ASSERT_EQ(padded->outcome, PlanOutcome::kOk) << padded->infeasible_reason;
      EXPECT_LE(PaddedTokens(*sorted), PaddedTokens(*padded));
      const BatchIndex index(batch);
      int64_t previous = std::numeric_limits<int64_t>::max();
      for (int64_t id : SampleIdsOf(sorted->micro_batches)) {
        EXPECT_LE(eval.SeqLen(index(id)), previous);
        previous = eval.SeqLen(index(id));
      }
    }
  }
}

TEST(BaselineTest, TokenBudgetGroupsUseRoundedLengthsOnBothSides) {
  const auto setup = Gpt();
  const StageCostEvaluator& eval = setup->evaluator();
  // Two samples of 17 tokens pad to 24 each: 2 x 24 = 48 > 40, so they must not share a
  // micro-batch (the reference's unrounded running total, 34 <= 40, would have admitted both).
  const std::vector<Sample> two = {Sample{0, 17, 0, 0}, Sample{1, 17, 0, 0}};
  EXPECT_EQ(TokenBudgetGroups(two, eval, 40).size(), 2u);
  EXPECT_EQ(TokenBudgetGroups(two, eval, 48).size(), 1u);
  // A sample longer than the cap stands alone.
  const std::vector<Sample> big = {Sample{0, 100, 0, 0}, Sample{1, 3, 0, 0}};
  const auto groups = TokenBudgetGroups(big, eval, 50);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0], std::vector<int64_t>{0});
}

TEST(BaselineTest, TokenBudgetMicroBatchesStayUnderTheCap) {
  for (bool encdec : {false, true}) {
    const auto setup = encdec ? T5() : Gpt();
    const StageCostEvaluator& eval = setup->evaluator();
    const std::vector<Sample> batch = RandomBatch(21, 120, kMaxSeqlen, encdec);
    BatchingOptions o = Options();
    o.tokens_per_micro_batch = 4096;
    o.recompute = Recompute::kFull;
    const auto rb = MakeTokenBudgetBatcher()->Build(batch, eval, o);
    ASSERT_TRUE(rb.ok());
    ExpectValid(*rb, batch, eval, "token-budget");
    for (const MicroBatch& mb : rb->micro_batches) {
      if (mb.shape.mbs > 1) {
        EXPECT_LE(mb.padded_tokens, 4096);
      }
    }
  }
}

TEST(BaselineTest, PackingIsNextFitInDatasetOrder) {
  const auto setup = Gpt();
  const StageCostEvaluator& eval = setup->evaluator();
  const std::vector<Sample> batch = LongTailBatch(4, 60, kMaxSeqlen);
  const PackCapacity cap = PackingCapacity(batch, eval, kMaxSeqlen);
  EXPECT_EQ(cap.enc, kMaxSeqlen);
  EXPECT_EQ(cap.dec, 0);
  const auto rows = NextFitRows(batch, eval, cap);
  std::vector<int64_t> flat, in_order;
  for (const auto& row : rows) flat.insert(flat.end(), row.begin(), row.end());
  for (const Sample& s : batch) in_order.push_back(s.id);
  EXPECT_EQ(flat, in_order);
  const BatchIndex index(batch);
  auto row_len = [&](const std::vector<int64_t>& row) {
    int64_t t = 0;
    for (int64_t id : row) t += eval.SeqLen(index(id));
    return t;
  };
  for (size_t r = 0; r < rows.size(); ++r) {
    EXPECT_LE(row_len(rows[r]), kMaxSeqlen);
    if (r + 1 < rows.size()) {
      EXPECT_GT(row_len(rows[r]) + eval.SeqLen(index(rows[r + 1].front())), kMaxSeqlen);
    }
  }
  const auto rb = MakePackingBatcher()->Build(batch, eval, Options());
  ASSERT_TRUE(rb.ok());
  ExpectValid(*rb, batch, eval, "packing");
  for (const MicroBatch& mb : rb->micro_batches) {
    EXPECT_FALSE(mb.varlen);
    EXPECT_EQ(mb.shape.seqlen, kMaxSeqlen);  // full attention across the whole row
  }
}

TEST(BaselineTest, MultipackIsFirstFitDecreasing) {
  const auto setup = Gpt();
  const StageCostEvaluator& eval = setup->evaluator();
  for (uint64_t seed = 0; seed < 5; ++seed) {
    const std::vector<Sample> batch = LongTailBatch(seed, 80, kMaxSeqlen);
    const PackCapacity cap = PackingCapacity(batch, eval, kMaxSeqlen);
    const auto rows = FirstFitDecreasingRows(batch, eval, cap);
    const BatchIndex index(batch);
    int64_t total = 0, half_empty = 0;
    for (const auto& row : rows) {
      int64_t t = 0;
      for (int64_t id : row) t += eval.SeqLen(index(id));
      EXPECT_LE(t, kMaxSeqlen);
      total += t;
      if (2 * t <= kMaxSeqlen) ++half_empty;
    }
    // First fit leaves at most one row at most half full, so rows < 2 x lower bound + 1.
    EXPECT_LE(half_empty, 1);
    EXPECT_GE(static_cast<int64_t>(rows.size()), (total + kMaxSeqlen - 1) / kMaxSeqlen);
    const auto rb = MakeMultipackBatcher()->Build(batch, eval, Options());
    ASSERT_TRUE(rb.ok());
    ExpectValid(*rb, batch, eval, "multipack");
    for (const MicroBatch& mb : rb->micro_batches) EXPECT_TRUE(mb.varlen);
  }
}

TEST(BaselineTest, EncoderDecoderPackingRespectsBothCapacities) {
  const auto setup = T5();
  const StageCostEvaluator& eval = setup->evaluator();
  const std::vector<Sample> batch = RandomBatch(8, 150, kMaxSeqlen, true);
  const PackCapacity cap = PackingCapacity(batch, eval, kMaxSeqlen);
  int64_t longest_target = 0;
  for (const Sample& s : batch) longest_target = std::max(longest_target, s.target_len);
  EXPECT_GE(cap.dec, longest_target);
  EXPECT_LE(cap.dec, kMaxSeqlen);
  const BatchIndex index(batch);
  for (const auto& rows :
       {NextFitRows(batch, eval, cap), FirstFitDecreasingRows(batch, eval, cap)}) {
    for (const auto& row : rows) {
      int64_t in = 0, out = 0;
      for (int64_t id : row) {
        in += index(id).input_len;
        out += index(id).target_len;
      }
      EXPECT_LE(in, cap.enc);
      EXPECT_LE(out, cap.dec);
    }
  }
  // Packing pads every row to the capacities; multipack's varlen rows are shaped by their
  // longest encoder and decoder rows, within them.
  for (auto make : {MakePackingBatcher, MakeMultipackBatcher}) {
    const auto rb = make()->Build(batch, eval, Options());
    ASSERT_TRUE(rb.ok());
    ExpectValid(*rb, batch, eval, "t5 packing");
    for (const MicroBatch& mb : rb->micro_batches) {
      if (mb.varlen) {
        EXPECT_LE(mb.shape.dec_seqlen, cap.dec);
      } else {
        EXPECT_EQ(mb.shape.dec_seqlen, cap.dec);
      }
    }
  }
}

TEST(BaselineTest, SearchedSizeAndRecomputeAreNoSlowerThanAnyFixedChoice) {
  const auto setup = Gpt();
  const StageCostEvaluator& eval = setup->evaluator();
  const std::vector<Sample> batch = RandomBatch(9, 100, kMaxSeqlen, false);
  for (auto make : {MakeSortedBatcher, MakePackingBatcher, MakePaddingBatcher}) {
    const auto best = make()->Build(batch, eval, Options());
    ASSERT_TRUE(best.ok());
    ASSERT_EQ(best->outcome, PlanOutcome::kOk) << best->infeasible_reason;
    const Duration best_time = PredictReplicaTime(best->micro_batches, eval.pp());
    for (int64_t size : {1, 2, 3, 4, 8, 16}) {
      for (Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
        BatchingOptions o = Options();
        o.micro_batch_size = size;
        o.recompute = rc;
        const auto fixed = make()->Build(batch, eval, o);
        ASSERT_TRUE(fixed.ok());
        if (fixed->outcome != PlanOutcome::kOk) continue;
        // Fixed choices are honoured ...
        for (size_t j = 0; j + 1 < fixed->micro_batches.size(); ++j) {
          EXPECT_EQ(fixed->micro_batches[j].shape.mbs, size);
        }
        for (const MicroBatch& mb : fixed->micro_batches) EXPECT_EQ(mb.recompute, rc);
        // ... and the search does at least as well as each of them it could have tried.
        if (size <= 4) {
          EXPECT_LE(best_time, PredictReplicaTime(fixed->micro_batches, eval.pp()))
              << "size " << size << " rc " << RecomputeName(rc);
        }
      }
    }
  }
}

TEST(BaselineTest, ImpossibleMemoryIsOutOfMemoryWithTheNeedAndBudget) {
  for (bool encdec : {false, true}) {
    const auto base = encdec ? T5() : Gpt();
    Bytes states;
    for (const ModelStateMemory& m : base->evaluator().stage_states()) {
      states = std::max(states, m.total());
    }
    ParallelConfig tight = base->parallel;
    tight.memory_limit = states + Bytes::MB(20);
    const auto setup = MakeTestSetup(encdec ? "t5-11b" : "gpt-6.7b", tight);
    const std::vector<Sample> batch = RandomBatch(1, 40, kMaxSeqlen, encdec);
    for (const Baseline& b : AllBaselines()) {
      const auto rb = b.batcher->Build(batch, setup->evaluator(), Options());
      ASSERT_TRUE(rb.ok()) << rb.status().ToString();
      EXPECT_EQ(rb->outcome, PlanOutcome::kOutOfMemory) << b.name;
      EXPECT_NE(rb->infeasible_reason.find(b.name), std::string::npos) << rb->infeasible_reason;
      EXPECT_NE(rb->infeasible_reason.find("budget"), std::string::npos) << rb->infeasible_reason;
      EXPECT_TRUE(rb->micro_batches.empty());
    }
  }
}

TEST(BaselineTest, SampleLongerThanMaxSeqlenIsAnErrorNamingIt) {
  const auto setup = Gpt();
  std::vector<Sample> batch = RandomBatch(2, 10, 1000, false);
  batch.push_back(Sample{77, 1500, 600, 0});
  for (const Baseline& b : AllBaselines()) {
    const auto rb = b.batcher->Build(batch, setup->evaluator(), Options());
    ASSERT_FALSE(rb.ok()) << b.name;
    EXPECT_EQ(rb.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(rb.status().message().find("sample id 77"), std::string::npos)
        << rb.status().message();
  }
  BatchingOptions too_long = Options(1 << 20);
  EXPECT_FALSE(MakePaddingBatcher()->Build(batch, setup->evaluator(), too_long).ok());
}

TEST(BaselineTest, EmptyInputGivesNoMicroBatches) {
  const auto setup = Gpt();
  for (const Baseline& b : AllBaselines()) {
    const auto rb = b.batcher->Build({}, setup->evaluator(), Options());
    ASSERT_TRUE(rb.ok());
    EXPECT_EQ(rb->outcome, PlanOutcome::kOk);
    EXPECT_TRUE(rb->micro_batches.empty());
  }
}

TEST(BaselineTest, BatcherNames) {
  EXPECT_EQ(MakePaddingBatcher()->name(), "padding");
  EXPECT_EQ(MakeSortedBatcher()->name(), "sorted");
  EXPECT_EQ(MakeTokenBudgetBatcher()->name(), "token-budget");
  EXPECT_EQ(MakePackingBatcher()->name(), "packing");
  EXPECT_EQ(MakeMultipackBatcher()->name(), "multipack");
}

TEST(BaselineTest, MicroBatchSizeCandidates) {
  EXPECT_EQ(MicroBatchSizeCandidates(1), (std::vector<int64_t>{1}));
  EXPECT_EQ(MicroBatchSizeCandidates(5), (std::vector<int64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(MicroBatchSizeCandidates(10), (std::vector<int64_t>{1, 2, 3, 4, 6, 8, 10}));
  EXPECT_EQ(MicroBatchSizeCandidates(16), (std::vector<int64_t>{1, 2, 3, 4, 6, 8, 12, 16}));
}

}  // namespace
}  // namespace sluice
