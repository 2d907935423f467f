// The configuration search: the candidates it enumerates fit the model and the cluster, the
// chosen configuration's plans fit memory, and a method that fits nowhere is reported (out of
// memory or unsupported) rather than dropped.
#include "planner/config_search.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "batching/test_util.h"
#include "cost/cost_factory.h"
#include "data/global_batcher.h"
#include "plan/validate.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

std::vector<GlobalBatch> Batches(int n, int64_t tokens, int64_t max_len, bool enc_dec) {
  std::vector<GlobalBatch> out;
  for (int i = 0; i < n; ++i) {
    GlobalBatch b;
    b.index = i;
    b.samples = testing::RandomTokenBatch(100 + i, tokens, max_len, enc_dec);
    for (const Sample& s : b.samples) b.tokens += s.input_len + s.target_len;
    out.push_back(std::move(b));
  }
  return out;
}

TEST(RunTallyTest, FailedBatchesCountAsUntrainedAndChargedAndRankLast) {
  RunTally complete;
  complete.AddRan(1000, 1.0);
  complete.AddRan(1000, 1.0);
  EXPECT_TRUE(complete.complete());
  EXPECT_DOUBLE_EQ(complete.TokensPerSecond(), 1000.0);
  EXPECT_DOUBLE_EQ(complete.charged_seconds(), 0.0);
  // Twice as fast on the batch it ran, but one of two batches failed: it is charged the mean
  // time of the batches that ran, so the headline is (1/2) x 2000 tokens/s.
  RunTally failing;
  failing.AddRan(1000, 0.5);
  failing.AddFailed();
  EXPECT_FALSE(failing.complete());
  EXPECT_EQ(failing.ran(), 1);
  EXPECT_DOUBLE_EQ(failing.RanTokensPerSecond(), 2000.0);
  EXPECT_DOUBLE_EQ(failing.charged_seconds(), 0.5);
  EXPECT_DOUBLE_EQ(failing.TokensPerSecond(), 1000.0);
  // A complete run ranks first whatever the throughputs.
  RunTally slow;
  slow.AddRan(10, 1.0);
  EXPECT_TRUE(RanksBefore(slow, failing));
  EXPECT_FALSE(RanksBefore(failing, slow));
  EXPECT_TRUE(RanksBefore(complete, slow));
  RunTally none;
  none.AddFailed();
  EXPECT_DOUBLE_EQ(none.TokensPerSecond(), 0.0);
  EXPECT_TRUE(RanksBefore(failing, none));
  EXPECT_FALSE(RanksBefore(RunTally{}, RunTally{}));
}

TEST(ConfigSearchTest, ScoreBatchesAreTheFirstPlusTheLongestAndDensest) {
  auto batch = [](int64_t index, std::vector<int64_t> lens) {
    GlobalBatch b;
    b.index = index;
    for (int64_t l : lens) {
      b.samples.push_back(Sample{.id = index * 100 + static_cast<int64_t>(b.samples.size()),
                                 .input_len = l});
      b.tokens += l;
    }
    return b;
  };
  const std::vector<GlobalBatch> batches = {
      batch(0, {100, 100}), batch(1, {100}), batch(2, {900, 100}),  // 2: the longest sample
      batch(3, {600, 600}),                                          // 3: most tokens
      batch(4, {800, 100}), batch(5, {10})};
  // Attention work: 2 has 900^2 + 100^2 = 820,000 > 3's 720,000, so 2 is also the densest.
  EXPECT_EQ(PickScoreBatches(batches, 2, true), (std::vector<size_t>{0, 1, 2, 3}));
  EXPECT_EQ(PickScoreBatches(batches, 2, false), (std::vector<size_t>{0, 1}));
  EXPECT_EQ(PickScoreBatches(batches, 0, false).size(), batches.size());
  EXPECT_EQ(PickScoreBatches(batches, 10, true).size(), batches.size());
  EXPECT_EQ(PickScoreBatches(batches, 1, true), (std::vector<size_t>{0, 2, 3}));
  EXPECT_TRUE(PickScoreBatches({}, 2, true).empty());
}

TEST(ConfigSearchTest, EnumeratedConfigurationsFitTheModelAndUseEveryDevice) {
  auto cost = testing::LoadTestCostModel("gpt-6.7b", testing::TestCost::kProfiled);
  auto cluster = ClusterPreset("a100-40g", 16);
  ASSERT_TRUE(cluster.ok());
  SearchSpace space;
  const ParallelSpace ps =
      EnumerateParallelConfigs(cost->model(), *cluster, *cost, space, Bytes::MB(36000));
  ASSERT_FALSE(ps.configs.empty());
  std::set<std::tuple<int64_t, int64_t, int64_t, int64_t>> seen;
  int64_t both = 0;
  for (const ParallelConfig& p : ps.configs) {
    // Both device orders where they place the configuration differently (two nodes here).
    if (p.order == RankOrder::kPipelineInner) {
      EXPECT_TRUE(SearchesOrder(*cluster, p));
      ++both;
      continue;
    }
    EXPECT_TRUE(CheckParallelFits(p, cost->model(), &*cluster, "test").ok());
    EXPECT_EQ(p.devices(), 16);
    EXPECT_LE(p.tp, 8) << "tensor parallelism stays within a node";
    EXPECT_TRUE(cost->SupportsTp(p.tp));
    ASSERT_TRUE(p.memory_limit.has_value());
    EXPECT_EQ(*p.memory_limit, Bytes::MB(36000));
    EXPECT_TRUE(seen.insert({p.dp, p.pp, p.tp, p.zero}).second) << "listed twice";
    if (p.dp == 1) EXPECT_EQ(p.zero, space.zero.front()) << "ZeRO is moot without dp";
  }
  int64_t differ = 0;
  for (const ParallelConfig& p : ps.configs) {
    differ += p.order == RankOrder::kDataInner && SearchesOrder(*cluster, p);
  }
  EXPECT_GT(both, 0);
  EXPECT_EQ(both, differ) << "one tp-cp-pp-dp twin per configuration the orders place apart";
  for (RankOrder order : {RankOrder::kDataInner, RankOrder::kPipelineInner}) {
    SearchSpace one_order;
    one_order.only_order = order;
    const ParallelSpace only = EnumerateParallelConfigs(cost->model(), *cluster, *cost,
                                                        one_order, Bytes::MB(36000));
    EXPECT_EQ(only.configs.size() + static_cast<size_t>(both), ps.configs.size());
    for (const ParallelConfig& p : only.configs) {
      EXPECT_EQ(p.order, SearchesOrder(*cluster, p) ? order : RankOrder::kDataInner);
    }
  }
  // A few a careful user would certainly try.
  EXPECT_TRUE(seen.contains({2, 8, 1, 1}));
  EXPECT_TRUE(seen.contains({4, 4, 1, 2}));
  EXPECT_TRUE(seen.contains({1, 2, 8, 1}));
  // tp 16 exceeds a node; pp 32 needs dp*tp = 1/2: neither appears.
  for (const ParallelConfig& p : ps.configs) EXPECT_NE(p.tp, 16);

  SearchSpace narrow;
  narrow.tp = {3};  // not supported by the table, nor dividing the heads
  const ParallelSpace none =
      EnumerateParallelConfigs(cost->model(), *cluster, *cost, narrow, std::nullopt);
  EXPECT_TRUE(none.configs.empty());
  ASSERT_FALSE(none.skipped.empty());
  EXPECT_THAT(none.skipped[0], HasSubstr("tp 3"));
}

TEST(ConfigSearchTest, InterleavedCandidatesOnlyWhereVirtualStagesFit) {
  auto t5 = ModelPreset("t5-11b");
  ASSERT_TRUE(t5.ok());
  ParallelConfig pp4;
  pp4.dp = 2;
  pp4.pp = 4;
  ParallelConfig pp1;
  pp1.dp = 8;
  MethodSpec m = *MethodSpecFor("packing", "test");
  SearchSpace space;
  space.vpp = {2, 5};
  const std::vector<ParallelConfig> configs = {pp4, pp1};
  const std::vector<Candidate> cs = ExpandCandidates(configs, m, *t5, space);
  int interleaved = 0;
  for (const Candidate& c : cs) {
    if (c.schedule != ScheduleKind::kInterleaved) {
      EXPECT_EQ(c.parallel.vpp, 1);
      continue;
    }
    ++interleaved;
    EXPECT_EQ(c.parallel.pp, 4);
    EXPECT_EQ(c.parallel.vpp, 2) << "pp 4 x vpp 5 does not cut 24 + 24 layers";
    EXPECT_TRUE(CheckParallelFits(c.parallel, *t5, nullptr, "test").ok());
  }
  EXPECT_EQ(interleaved, 1);
  // gpipe and 1f1b on both configurations, plus the one interleaved.
  EXPECT_EQ(cs.size(), 5u);
}

TEST(ConfigSearchTest, GradientSyncIsZeroWithoutDataParallelismAndSlowerAcrossNodes) {
  auto cost = testing::LoadTestCostModel("gpt-6.7b", testing::TestCost::kProfiled);
  auto one = ClusterPreset("a100-40g", 8);
  ASSERT_TRUE(one.ok());
  ClusterSpec two = *one;  // the same 8 devices as two nodes of 4
  two.nodes = 2;
  two.devices_per_node = 4;
  auto sync = [&](const ClusterSpec& cluster, int64_t dp, int64_t pp, int64_t zero,
                  RankOrder order = RankOrder::kPipelineInner) {
    ParallelConfig p = testing::TestParallel(dp, pp, 1, 36000, zero);
    p.order = order;
    auto eval = StageCostEvaluator::Create(*cost, p, cluster);
    EXPECT_TRUE(eval.ok()) << eval.status().ToString();
    return eval.ok() ? EstimateGradientSync(*eval, cluster) : Duration::Zero();
  };
  EXPECT_EQ(sync(*one, 1, 8, 1), Duration::Zero());
  const Duration in_node = sync(*one, 2, 4, 1);
  // tp-cp-pp-dp: replica 1's devices are on the second node.
  const Duration across = sync(two, 2, 4, 1);
  EXPECT_GT(in_node, Duration::Zero());
  EXPECT_GT(across, in_node);
  // In Megatron-Core's order the two replicas of a stage are neighbours: one node again.
  EXPECT_EQ(sync(two, 2, 4, 1, RankOrder::kDataInner), in_node);
  // ZeRO-2's reduce-scatter + all-gather moves as much as ZeRO-1's all-reduce.
  const Duration zero2 = sync(*one, 2, 4, 2);
  EXPECT_NEAR(zero2.seconds(), in_node.seconds(), 0.05 * in_node.seconds());
}

TEST(ConfigSearchTest, BestCandidateFitsMemoryAndItsPlansValidate) {
  auto cost = testing::LoadTestCostModel("gpt-6.7b", testing::TestCost::kProfiled);
  auto cluster = ClusterPreset("a100-40g", 8);
  ASSERT_TRUE(cluster.ok());
  const std::vector<GlobalBatch> batches = Batches(2, 16384, 1024, false);
  BatchingOptions batching;
  batching.max_seqlen = 1024;
  SimOptions sim;
  sim.collectives = CollectiveMode::kClosedForm;
  CandidateScorer scorer(*cost, *cluster, batches, batching, sim);
  SearchSpace space;
  space.pp = {2, 4};
  const ParallelSpace ps =
      EnumerateParallelConfigs(cost->model(), *cluster, *cost, space, Bytes::MB(36000));
  for (const char* name : {"packing", "dynapipe"}) {
    const MethodSpec m = *MethodSpecFor(name, "test");
    const std::vector<Candidate> cs = ExpandCandidates(ps.configs, m, cost->model(), space);
    int calls = 0;
    auto s = SearchMethod(
        scorer, name, cs, 2, [&] { ++calls; }, nullptr);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(calls, static_cast<int>(cs.size()));
    ASSERT_TRUE(s->best.has_value()) << name << ": " << s->reason;
    EXPECT_TRUE(s->best->simulated);
    EXPECT_GT(s->best->simulated_tokens_per_s, 0);
    for (const CandidateScore& c : s->ranked) {
      if (c.simulated && c.state == CandidateScore::State::kOk) {
        EXPECT_GE(s->best->simulated_tokens_per_s, c.simulated_tokens_per_s);
      }
    }
    // The winner's plans validate, fit the memory limit in simulation, and its estimate was
    // the one a planner reproduces.
    const Candidate& best = s->best->candidate;
    StatusOr<Planner> planner = scorer.PlannerFor(best);
    ASSERT_TRUE(planner.ok()) << planner.status().ToString();
    for (const GlobalBatch& b : batches) {
      auto r = planner->Plan(b.samples);
      ASSERT_TRUE(r.ok());
      ASSERT_EQ(r->outcome, PlanOutcome::kOk);
      EXPECT_TRUE(ValidatePlan(r->plan).ok());
      auto simulated = Simulate(r->plan, sim);
      ASSERT_TRUE(simulated.ok());
      EXPECT_EQ(simulated->outcome, SimOutcome::kOk);
      EXPECT_FALSE(simulated->memory_exceeded);
    }
  }
}

TEST(ConfigSearchTest, MethodThatFitsNowhereIsReportedOutOfMemoryWithTheReason) {
  auto cost = testing::LoadTestCostModel("gpt-6.7b", testing::TestCost::kProfiled);
  auto cluster = ClusterPreset("a100-40g", 8);
  ASSERT_TRUE(cluster.ok());
  const std::vector<GlobalBatch> batches = Batches(1, 32768, 8192, false);
  BatchingOptions batching;
  batching.max_seqlen = 8192;
  CandidateScorer scorer(*cost, *cluster, batches, batching, SimOptions{});
  SearchSpace space;
  space.tp = {1};
  space.pp = {1, 2};  // 6.7B on one or two stages without tp: the model states alone overflow
  const ParallelSpace ps =
      EnumerateParallelConfigs(cost->model(), *cluster, *cost, space, Bytes::MB(20000));
  ASSERT_FALSE(ps.configs.empty());
  const MethodSpec m = *MethodSpecFor("packing", "test");
  auto s = SearchMethod(scorer, "packing", ExpandCandidates(ps.configs, m, cost->model(), space), 2,
                        nullptr, nullptr);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_FALSE(s->best.has_value());
  EXPECT_FALSE(s->unsupported);
  EXPECT_THAT(s->reason, HasSubstr("memory"));
  for (const CandidateScore& c : s->ranked) {
    EXPECT_EQ(c.state, CandidateScore::State::kOutOfMemory);
    EXPECT_FALSE(c.reason.empty());
  }
}

TEST(ConfigSearchTest, VarlenMethodOnEncoderDecoderIsUnsupported) {
  auto cost = testing::LoadTestCostModel("t5-11b", testing::TestCost::kProfiled);
  auto cluster = ClusterPreset("a100-40g", 8);
  ASSERT_TRUE(cluster.ok());
  const std::vector<GlobalBatch> batches = Batches(1, 8192, 512, true);
  BatchingOptions batching;
  batching.max_seqlen = 512;
  CandidateScorer scorer(*cost, *cluster, batches, batching, SimOptions{});
  ParallelConfig p = testing::TestParallel(1, 8, 1, 36000, 1);
  const MethodSpec m = *MethodSpecFor("megatron-gbp", "test");
  const std::vector<ParallelConfig> configs = {p};
  auto s =
      SearchMethod(scorer, "megatron-gbp", ExpandCandidates(configs, m, cost->model(), SearchSpace{}),
                   1, nullptr, nullptr);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_FALSE(s->best.has_value());
  EXPECT_TRUE(s->unsupported);
  EXPECT_THAT(s->reason, HasSubstr("decoder-only"));
}

}  // namespace
}  // namespace sluice
