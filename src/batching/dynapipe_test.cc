#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "base/rng.h"
#include "batching/dynapipe_batcher.h"
#include "batching/karmarkar_karp.h"
#include "batching/ordering.h"
#include "batching/test_util.h"

namespace sluice {
namespace {

using testing::MakeTestSetup;
using testing::RandomBatch;
using testing::RandomTokenBatch;
using testing::SampleIdsOf;
using testing::SortedIds;
using testing::TestParallel;

constexpr Recompute kLevels[] = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};

std::vector<Sample> Ordered(std::span<const Sample> batch, const StageCostEvaluator& eval) {
  std::vector<Sample> out;
  for (int64_t i : OrderSamples(batch, eval, SampleOrder::kAuto)) out.push_back(batch[i]);
  return out;
}

// (S-1) D t_max + C sum: the objective scaled to integers.
int64_t Scaled(const SplitObjective& o, int64_t t_max, int64_t sum) {
  return (o.stages - 1) * o.replicas * t_max + o.chunks * sum;
}

// Minimum scaled objective over all 2^(n-1) consecutive splits, or -1 when none is feasible.
int64_t BruteForce(const SplitCandidates& c, const SplitObjective& o) {
  const int64_t n = c.n;
  int64_t best = -1;
  for (uint64_t mask = 0; mask < (uint64_t{1} << (n - 1)); ++mask) {
    int64_t begin = 0, t_max = 0, sum = 0;
    bool ok = true;
    for (int64_t k = 0; k < n && ok; ++k) {
      const bool cut = k == n - 1 || (mask >> k & 1);
      if (!cut) continue;
      const int64_t d = k + 1 - begin;
      if (d > c.row_len[begin]) {
        ok = false;
        break;
      }
      t_max = std::max(t_max, c.Time(begin, d).nanos());
      sum += c.Time(begin, d).nanos();
      begin = k + 1;
    }
    if (!ok) continue;
    const int64_t v = Scaled(o, t_max, sum);
    if (best < 0 || v < best) best = v;
  }
  return best;
}

// Checks a solution against its candidates and returns its scaled objective.
int64_t CheckSolution(const SplitCandidates& c, const SplitObjective& o, const SplitSolution& s) {
  EXPECT_TRUE(s.feasible);
  int64_t begin = 0, t_max = 0, sum = 0;
  for (int64_t end : s.ends) {
    EXPECT_GT(end, begin);
    EXPECT_LE(end - begin, c.row_len[begin]);
    t_max = std::max(t_max, c.Time(begin, end - begin).nanos());
    sum += c.Time(begin, end - begin).nanos();
    begin = end;
  }
  EXPECT_EQ(begin, c.n);
  EXPECT_EQ(s.t_max.nanos(), t_max);
  EXPECT_EQ(s.sum.nanos(), sum);
  EXPECT_DOUBLE_EQ(s.objective_ms, o.Value(s.t_max, s.sum));
  return Scaled(o, t_max, sum);
}

TEST(SplitDpTest, OptimalAgainstBruteForce) {
  struct Case {
    const char* model;
    ParallelConfig par;
    int64_t max_len;
  };
  const Case cases[] = {
      {"gpt-6.7b", TestParallel(2, 8), 2048},
      {"gpt-6.7b", TestParallel(1, 4, 2, 24000), 4096},  // tight: long runs do not fit
      {"t5-11b", TestParallel(1, 2, 8), 1024},
  };
  const SplitObjective objectives[] = {{8, 1, 2}, {4, 1, 1}, {8, 2, 3}, {1, 1, 1}, {16, 1, 8}};
  int checked = 0;
  for (const Case& c : cases) {
    auto setup = MakeTestSetup(c.model, c.par);
    const bool t5 = setup->evaluator().model().is_encoder_decoder();
    for (uint64_t seed = 0; seed < 12; ++seed) {
      const int64_t n = 1 + static_cast<int64_t>(seed % 12);
      const std::vector<Sample> batch = RandomBatch(seed * 31 + 5, n, c.max_len, t5);
      const SplitCandidates cand =
          BuildSplitCandidates(Ordered(batch, setup->evaluator()), setup->evaluator(), {});
      for (const SplitObjective& o : objectives) {
        const int64_t brute = BruteForce(cand, o);
        const SplitSolution sol = SolveConsecutiveSplit(cand, o);
        if (brute < 0) {
          EXPECT_FALSE(sol.feasible);
          continue;
        }
        EXPECT_EQ(CheckSolution(cand, o, sol), brute) << c.model << " seed " << seed;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 100);
}

// Random run times with arbitrary (non-monotone) rows: the DP is exact for any costs.
TEST(SplitDpTest, OptimalForArbitraryCosts) {
  Rng rng(42);
  for (int trial = 0; trial < 200; ++trial) {
    SplitCandidates c;
    c.n = rng.UniformInt(1, 12);
    for (int64_t i = 0; i < c.n; ++i) {
      c.row_begin.push_back(static_cast<int64_t>(c.time_ns.size()));
      c.row_len.push_back(rng.UniformInt(1, c.n - i));
      for (int64_t d = 0; d < c.row_len.back(); ++d) {
        c.time_ns.push_back(rng.UniformInt(1, 40) * 1000);
        c.recompute.push_back(Recompute::kNone);
      }
      int64_t m = std::numeric_limits<int64_t>::max();
      c.suffix_min.resize(c.time_ns.size());
      for (int64_t k = static_cast<int64_t>(c.time_ns.size()) - 1; k >= c.row_begin.back(); --k) {
        m = std::min(m, c.time_ns[k]);
        c.suffix_min[k] = m;
      }
    }
    const SplitObjective o{rng.UniformInt(1, 9), rng.UniformInt(1, 3), rng.UniformInt(1, 4)};
    const SplitSolution sol = SolveConsecutiveSplit(c, o);
    EXPECT_EQ(CheckSolution(c, o, sol), BruteForce(c, o)) << "trial " << trial;
    EXPECT_EQ(sol.ends, SolveConsecutiveSplit(c, o).ends);
  }
}

class CandidatesTest : public ::testing::TestWithParam<const char*> {};

TEST_P(CandidatesTest, TakeTheFastestLevelThatFits) {
  const bool t5 = std::string(GetParam()) == "t5-11b";
  auto setup =
      MakeTestSetup(GetParam(), t5 ? TestParallel(2, 2, 8, 30000) : TestParallel(2, 4, 1, 30000));
  const StageCostEvaluator& e = setup->evaluator();
  const std::vector<Sample> ordered = Ordered(RandomBatch(9, 60, 2048, t5), e);
  const SplitCandidates c = BuildSplitCandidates(ordered, e, {});
  int64_t selective_or_full = 0;
  for (int64_t i = 0; i < c.n; ++i) {
    ASSERT_GE(c.row_len[i], 1);
    int64_t enc = 1, dec = 1;
    for (int64_t d = 1; d <= c.row_len[i] + 1 && i + d <= c.n; ++d) {
      enc = std::max(enc, e.SeqLen(ordered[i + d - 1]));
      dec = std::max(dec, e.DecLen(ordered[i + d - 1]));
      const LayerShape shape{d, e.Pad(enc), t5 ? e.Pad(dec) : 0};
      Duration best = Duration::Infinite();
      for (Recompute rc : kLevels) {
        const CostSummary s = e.Summarize(shape, rc, e.pp());
        if (s.feasible && s.bottleneck < best) best = s.bottleneck;
      }
      if (d <= c.row_len[i]) {
        EXPECT_EQ(c.Time(i, d), best) << i << "+" << d;
        const CostSummary chosen = e.Summarize(shape, c.RecomputeOf(i, d), e.pp());
        EXPECT_TRUE(chosen.feasible);
        EXPECT_EQ(chosen.bottleneck, best);
        if (c.RecomputeOf(i, d) != Recompute::kNone) ++selective_or_full;
      } else {
        EXPECT_TRUE(best.is_infinite()) << "row of " << i << " stops early at " << d;
      }
    }
  }
  EXPECT_GT(selective_or_full, 0);
  // A fixed level restricts every candidate to it.
  const SplitCandidates full = BuildSplitCandidates(ordered, e, Recompute::kFull);
  for (Recompute rc : full.recompute) EXPECT_EQ(rc, Recompute::kFull);
}

INSTANTIATE_TEST_SUITE_P(Models, CandidatesTest, ::testing::Values("gpt-6.7b", "t5-11b"));

TEST(SplitDpTest, ThinningIsNeverBetterAndTriesFewerValues) {
  auto setup = MakeTestSetup("gpt-6.7b", TestParallel(2, 8));
  const StageCostEvaluator& e = setup->evaluator();
  const std::vector<Sample> ordered = Ordered(RandomTokenBatch(3, 65536, 2048, false), e);
  const SplitCandidates c = BuildSplitCandidates(ordered, e, {});
  const SplitObjective o{8, 1, 2};
  const SplitSolution exact = SolveConsecutiveSplit(c, o);
  const SplitSolution thin = SolveConsecutiveSplit(c, o, Duration::Millis(5));
  ASSERT_TRUE(exact.feasible && thin.feasible);
  EXPECT_LE(exact.objective_ms, thin.objective_ms);
  EXPECT_LT(thin.tmax_values, exact.tmax_values);
  EXPECT_LT(exact.dp_runs, exact.tmax_values);  // the bound prunes most t_max values
}

class DynaPipeBuildTest : public ::testing::TestWithParam<const char*> {};

TEST_P(DynaPipeBuildTest, EverySampleOnceMemoryFitsDeterministic) {
  const bool t5 = std::string(GetParam()) == "t5-11b";
  auto setup = MakeTestSetup(GetParam(), t5 ? TestParallel(2, 2, 8) : TestParallel(2, 8));
  const StageCostEvaluator& e = setup->evaluator();
  auto batcher = MakeDynaPipeBatcher();
  EXPECT_EQ(batcher->name(), "dynapipe");
  for (uint64_t seed = 0; seed < 6; ++seed) {
    const std::vector<Sample> batch = RandomTokenBatch(seed, 8192 + 6000 * seed, 2048, t5);
    for (int64_t replicas : {1, 2}) {
      auto built = batcher->Build(batch, e, BatchingOptions{}, replicas);
      ASSERT_TRUE(built.ok()) << built.status().ToString();
      ASSERT_EQ(built->outcome, PlanOutcome::kOk) << built->infeasible_reason;
      std::vector<int64_t> ids = SampleIdsOf(built->micro_batches);
      std::sort(ids.begin(), ids.end());
      EXPECT_EQ(ids, SortedIds(batch));
      for (const MicroBatch& mb : built->micro_batches) {
        for (const auto& row : mb.rows) EXPECT_EQ(row.size(), 1u);
        EXPECT_FALSE(mb.varlen);
      }
      if (replicas == 1) EXPECT_EQ(CheckSequenceMemory(e, built->micro_batches), "");
      auto again = batcher->Build(batch, e, BatchingOptions{}, replicas);
      ASSERT_TRUE(again.ok());
      EXPECT_EQ(again->micro_batches, built->micro_batches);
      // The global form: Karmarkar-Karp over dp replicas gives a valid plan.
      auto plan = DistributeMicroBatches(*built, batch, e, BatchingOptions{});
      ASSERT_TRUE(plan.ok()) << plan.status().ToString();
      ASSERT_EQ(plan->outcome, PlanOutcome::kOk) << plan->infeasible_reason;
      EXPECT_TRUE(ValidateBatchPlan(*plan, batch, e).ok())
          << ValidateBatchPlan(*plan, batch, e).ToString();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, DynaPipeBuildTest, ::testing::Values("gpt-6.7b", "t5-11b"));

TEST(DynaPipeTest, RecomputeIsChosenPerMicroBatchByCost) {
  auto setup = MakeTestSetup("gpt-6.7b", TestParallel(2, 8));
  const StageCostEvaluator& e = setup->evaluator();
  const std::vector<Sample> batch = RandomTokenBatch(11, 65536, 2048, false);
  auto built = MakeDynaPipeBatcher()->Build(batch, e, BatchingOptions{}, 1);
  ASSERT_TRUE(built.ok());
  ASSERT_EQ(built->outcome, PlanOutcome::kOk);
  bool saw[3] = {false, false, false};
  for (const MicroBatch& mb : built->micro_batches) {
    saw[static_cast<int>(mb.recompute)] = true;
    for (Recompute rc : kLevels) {
      const CostSummary s = e.Summarize(mb.shape, rc, e.pp());
      if (s.feasible && rc != mb.recompute) EXPECT_LE(mb.Bottleneck(), s.bottleneck);
    }
  }
  EXPECT_TRUE(saw[0]);  // short samples run without recomputation
  // A fixed level is respected.
  BatchingOptions full;
  full.recompute = Recompute::kFull;
  auto fixed = MakeDynaPipeBatcher()->Build(batch, e, full, 1);
  ASSERT_TRUE(fixed.ok());
  for (const MicroBatch& mb : fixed->micro_batches) EXPECT_EQ(mb.recompute, Recompute::kFull);
}

TEST(DynaPipeTest, BeatsTheThinnedReferenceAndTheLexicographicOrder) {
  auto setup = MakeTestSetup("t5-11b", TestParallel(2, 2, 8));
  const StageCostEvaluator& e = setup->evaluator();
  const std::vector<Sample> batch = RandomTokenBatch(21, 32768, 1024, true);
  BatchingOptions thin;
  thin.tmax_thinning = Duration::Millis(5);
  auto exact = MakeDynaPipeBatcher()->Build(batch, e, BatchingOptions{}, 1);
  auto thinned = MakeDynaPipeBatcher()->Build(batch, e, thin, 1);
  auto lex = MakeDynaPipeBatcher(DynaPipeOptions{.order = SampleOrder::kLexicographic})
                 ->Build(batch, e, BatchingOptions{}, 1);
  ASSERT_TRUE(exact.ok() && thinned.ok() && lex.ok());
  const Duration t_exact = PredictReplicaTime(exact->micro_batches, e.pp());
  EXPECT_LE(t_exact, PredictReplicaTime(thinned->micro_batches, e.pp()));
  EXPECT_LE(t_exact, PredictReplicaTime(lex->micro_batches, e.pp()));
}

TEST(DynaPipeTest, OutOfMemoryAndBadInput) {
  auto setup = MakeTestSetup("gpt-6.7b", TestParallel(2, 8));
  const StageCostEvaluator& e = setup->evaluator();
  auto batcher = MakeDynaPipeBatcher();
  std::vector<Sample> batch = RandomBatch(1, 20, 1024, false);
  batch[7].input_len = 9000;  // longer than the model's 8192 positions
  auto built = batcher->Build(batch, e, BatchingOptions{}, 1);
  ASSERT_TRUE(built.ok());
  EXPECT_EQ(built->outcome, PlanOutcome::kOutOfMemory);
  EXPECT_NE(built->infeasible_reason.find("sample id 7"), std::string::npos)
      << built->infeasible_reason;
  EXPECT_TRUE(built->micro_batches.empty());
  auto global = DistributeMicroBatches(*built, batch, e, BatchingOptions{});
  ASSERT_TRUE(global.ok());
  EXPECT_EQ(global->outcome, PlanOutcome::kOutOfMemory);
  EXPECT_TRUE(ValidateBatchPlan(*global, batch, e).ok());
  // Without recomputation an 8192-token sample cannot fit 8 in flight.
  std::vector<Sample> long_one = {{.id = 3, .input_len = 8000}};
  BatchingOptions none;
  none.recompute = Recompute::kNone;
  auto oom = batcher->Build(long_one, e, none, 1);
  ASSERT_TRUE(oom.ok());
  EXPECT_EQ(oom->outcome, PlanOutcome::kOutOfMemory);
  EXPECT_NE(oom->infeasible_reason.find("activation budget"), std::string::npos)
      << oom->infeasible_reason;
  EXPECT_FALSE(batcher->Build(batch, e, BatchingOptions{}, 0).ok());
  auto empty = batcher->Build({}, e, BatchingOptions{}, 2);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->micro_batches.empty());
}

TEST(DynaPipeTest, RaiseRecomputeRepairsAnOverfullWindow) {
  auto setup = MakeTestSetup("gpt-6.7b", TestParallel(2, 4));
  const StageCostEvaluator& e = setup->evaluator();
  std::vector<Sample> batch;
  for (int64_t i = 0; i < 6; ++i) batch.push_back({.id = i, .input_len = 2048});
  const BatchIndex index(batch);
  std::vector<MicroBatch> mbs(6);
  for (int64_t i = 0; i < 6; ++i) {
    mbs[i].rows = {{i}};
    ASSERT_TRUE(PriceMicroBatch(e, index, &mbs[i]));
  }
  ASSERT_NE(CheckSequenceMemory(e, mbs), "");
  std::string reason;
  std::vector<MicroBatch> fixed = mbs;
  EXPECT_FALSE(RaiseRecomputeToFit(e, index, Recompute::kNone, &fixed, &reason));
  EXPECT_NE(reason.find("stage 0"), std::string::npos) << reason;
  ASSERT_TRUE(RaiseRecomputeToFit(e, index, std::nullopt, &mbs, &reason)) << reason;
  EXPECT_EQ(CheckSequenceMemory(e, mbs), "");
  int raised = 0;
  for (const MicroBatch& mb : mbs) raised += mb.recompute != Recompute::kNone;
  EXPECT_GT(raised, 0);
}

}  // namespace
}  // namespace sluice
