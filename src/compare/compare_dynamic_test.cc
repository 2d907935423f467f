// Per-iteration strategies (compare_dynamic.h): the switching cost, the choice of strategies from
// the searches, and the `sluice-dynamic` row of a comparison.
#include "compare/compare_dynamic.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>

#include "compare/compare.h"
#include "compare/compare_json.h"
#include "model/model_spec.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

ParallelConfig Par(int64_t dp, int64_t tp, int64_t pp = 1, int64_t cp = 1, int64_t zero = 1) {
  ParallelConfig p;
  p.dp = dp;
  p.tp = tp;
  p.pp = pp;
  p.cp = cp;
  p.zero = zero;
  return p;
}

HeteroConfig One(const ParallelConfig& p) { return HeteroConfig{.groups = {p}}; }

TEST(SwitchCostTest, FreeForTheFirstBatchAndTheSameLayout) {
  const ModelSpec model = *ModelPreset("gpt-6.7b");
  const ClusterSpec cluster = *ResolveCluster("a100-40g:8");
  EXPECT_EQ(SwitchCost(std::nullopt, One(Par(4, 2)), model, cluster), Duration::Zero());
  ParallelConfig limited = Par(4, 2);
  limited.memory_limit = Bytes::Of(int64_t{30} << 30);
  // A memory limit, a schedule or a batching method is not a layout.
  EXPECT_EQ(SwitchCost(One(Par(4, 2)), One(limited), model, cluster), Duration::Zero());
}

TEST(SwitchCostTest, AChangeOfLayoutMovesTheStatesAndCostsMoreWhenTheyAreLarger) {
  const ModelSpec model = *ModelPreset("gpt-6.7b");
  const ClusterSpec one_node = *ResolveCluster("a100-40g:8");
  const Duration to_tp2 = SwitchCost(One(Par(8, 1, 1, 1, 2)), One(Par(4, 2)), model, one_node);
  EXPECT_GT(to_tp2, Duration::Zero());
  // tp 8 holds an eighth of the weights per device; tp 2 a half: moving to tp 2 moves more.
  const Duration to_tp8 = SwitchCost(One(Par(4, 2)), One(Par(1, 8)), model, one_node);
  EXPECT_GT(to_tp2, to_tp8);
  // The same move across two nodes goes over the slower inter-node link.
  const ClusterSpec two_nodes = *ResolveCluster("a100-40g:16");
  EXPECT_GT(SwitchCost(One(Par(2, 8)), One(Par(8, 2)), model, two_nodes),
            SwitchCost(One(Par(1, 8)), One(Par(4, 2)), model, one_node));
  // A heterogeneous layout: its largest group's state sets the time.
  const HeteroConfig mix{.groups = {Par(1, 4), Par(2, 2)}};
  EXPECT_EQ(SwitchCost(One(Par(8, 1, 1, 1, 2)), mix, model, one_node),
            SwitchCost(One(Par(8, 1, 1, 1, 2)), One(Par(2, 2)), model, one_node));
}

TEST(PickStrategiesTest, SimulatedFirstWithinTheLimitsAndCalibrated) {
  MethodSearch search;
  auto add = [&](int64_t dp, bool complete, bool simulated, double est, double sim) {
    CandidateScore c;
    c.candidate.parallel = Par(dp, 8 / dp);
    c.candidate.batching = "hydraulis";
    c.failed_batches = complete ? 0 : 1;
    c.simulated = simulated;
    c.estimated_tokens_per_s = est;
    c.simulated_tokens_per_s = sim;
    search.ranked.push_back(c);
  };
  add(1, true, true, 100, 80);   // simulated, slower
  add(2, true, true, 100, 120);  // simulated, faster
  add(4, false, false, 300, 0);  // failed a score batch: never a strategy
  add(8, true, false, 90, 0);    // by estimate
  const std::vector<Strategy> s = PickStrategies(search, std::nullopt, {.homogeneous = 3});
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].candidate->parallel.dp, 2);
  EXPECT_EQ(s[1].candidate->parallel.dp, 1);
  EXPECT_EQ(s[2].candidate->parallel.dp, 8);
  EXPECT_NEAR(s[0].calibration, 100.0 / 120.0, 1e-12);
  EXPECT_NEAR(s[1].calibration, 100.0 / 80.0, 1e-12);
  EXPECT_EQ(s[2].calibration, 1.0);
  EXPECT_EQ(PickStrategies(search, std::nullopt, {.homogeneous = 1}).size(), 1u);
  HeteroChoice h;
  HeteroCandidate mix;
  mix.config = HeteroConfig{.groups = {Par(1, 4), Par(2, 2)}};
  mix.feasible = true;
  mix.scale = {1.25, 0.8};
  h.search.ranked = {mix};
  const std::vector<Strategy> both = PickStrategies(search, h, {.homogeneous = 1, .hetero = 2});
  ASSERT_EQ(both.size(), 2u);
  ASSERT_TRUE(both[1].hetero.has_value());
  EXPECT_THAT(both[1].Describe(), HasSubstr("heterogeneous"));
  EXPECT_EQ(both[1].screen_scale, mix.scale);
}

const MethodRun* Find(const std::vector<MethodRun>& runs, const std::string& name) {
  for (const MethodRun& m : runs) {
    if (m.method == name) return &m;
  }
  return nullptr;
}

CompareScenario SmallDynamic(int64_t iterations) {
  CompareScenario s;
  s.name = "small-dynamic";
  s.tokens_per_batch = 16384;
  s.max_seqlen = 1024;
  s.iterations = iterations;
  s.memory_limit_mb = 36000;
  s.search.score_batches = 1;
  s.search.simulate_top = 2;
  s.search.pp = {1, 2, 4};
  s.search.cp = {1, 2};
  s.methods = {*MethodSpecFor("sluice", "test"), *MethodSpecFor("sluice-dynamic", "test")};
  s.reference = "sluice";
  return s;
}

// The screen (DynamicOptions::screen_margin): off, every strategy plans every batch; at margin 0
// (the most it can skip) it skips only heterogeneous strategies, never the one chosen, never on
// kScreenRefresh batches in a row (the first batch may be screened: the search gave every mix its
// scales); a batch whose choice and history are those of the unscreened run is the unscreened
// run's batch, planning time aside.
TEST(DynamicCompareTest, TheScreenSkipsOnlyLosingHeterogeneousStrategiesAndRefreshesThem) {
  const CompareScenario s = SmallDynamic(2 * kScreenRefresh);
  CompareOptions off;
  off.progress = nullptr;
  off.dynamic_screen = std::nullopt;
  CompareOptions on = off;
  on.dynamic_screen = 0.0;
  auto a = RunCompare(s, off);
  auto b = RunCompare(s, on);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  const MethodRun* u = Find(a->own, "sluice-dynamic");
  const MethodRun* d = Find(b->own, "sluice-dynamic");
  ASSERT_NE(u, nullptr);
  ASSERT_NE(d, nullptr);
  ASSERT_EQ(u->state, RunState::kOk) << u->reason;
  ASSERT_EQ(d->strategies, u->strategies);
  ASSERT_EQ(d->batches.size(), u->batches.size());
  std::vector<int64_t> in_a_row(d->strategies.size(), 0);
  int64_t screened = 0;
  bool same_so_far = true;
  for (size_t i = 0; i < d->batches.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_TRUE(u->batches[i].screened.empty());
    const BatchRecord& r = d->batches[i];
    std::vector<int64_t> now(d->strategies.size(), 0);
    for (int64_t k : r.screened) {
      ASSERT_GE(k, 0);
      ASSERT_LT(k, static_cast<int64_t>(d->strategies.size()));
      EXPECT_EQ(d->strategies[k].find("heterogeneous"), 0u) << d->strategies[k];
      EXPECT_NE(k, r.strategy);
      now[k] = in_a_row[k] + 1;
      EXPECT_LT(now[k], kScreenRefresh);
    }
    in_a_row = now;
    screened += static_cast<int64_t>(r.screened.size());
    same_so_far = same_so_far && r.strategy == u->batches[i].strategy;
    if (same_so_far) {
      BatchRecord x = r, y = u->batches[i];
      x.planning_ms = y.planning_ms = 0;
      x.screened.clear();
      EXPECT_EQ(x, y);
    }
  }
  // This scenario's mixes lose to the homogeneous strategies by more than the screen's error.
  EXPECT_GT(screened, 0);
  EXPECT_EQ(u->screen_margin, std::nullopt);
  EXPECT_EQ(d->screen_margin, 0.0);
  for (const CompareResult* result : {&*a, &*b}) {
    auto back = CompareResultFromJson(CompareResultToJson(*result), "results.json");
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, *result);
  }
  // What the reader refuses in a dynamic run: a screened strategy that is not one of the run's
  // or is the batch's own, a screened list without a strategy, a margin out of range.
  nlohmann::json j = CompareResultToJson(*b);
  nlohmann::json* run = nullptr;
  for (nlohmann::json& m : j["own"]) {
    if (m["method"] == "sluice-dynamic") run = &m;
  }
  ASSERT_NE(run, nullptr);
  auto refused = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& what) {
    nlohmann::json bad = j;
    for (nlohmann::json& m : bad["own"]) {
      if (m["method"] == "sluice-dynamic") edit(m);
    }
    auto r = CompareResultFromJson(bad, "results.json");
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_THAT(r.status().message(), HasSubstr(what));
  };
  const int64_t n = static_cast<int64_t>(d->strategies.size());
  refused([&](nlohmann::json& m) { m["batches"][0]["screened"] = {n}; }, "screened");
  refused([&](nlohmann::json& m) { m["batches"][0]["screened"] = {m["batches"][0]["strategy"]}; },
          "screened");
  refused(
      [&](nlohmann::json& m) {
        m["batches"][0].erase("strategy");
        m["batches"][0]["screened"] = {0};
      },
      "written only with 'strategy'");
  refused([&](nlohmann::json& m) { m["screen_margin"] = 1.0; }, "screen_margin");
  refused([&](nlohmann::json& m) { m["screen_margin"] = "on"; }, "screen_margin");
}

// The row: every batch ran one of the strategies, the first strategy is the homogeneous search's
// choice, a batch's iteration includes its switch, and the run round-trips through JSON.
TEST(DynamicCompareTest, EveryBatchRunsOneStrategyAndSwitchesAreCharged) {
  CompareScenario s = SmallDynamic(4);
  s.methods.insert(s.methods.begin(), *MethodSpecFor("packing", "test"));
  s.reference = "packing";
  CompareOptions o;
  o.progress = nullptr;
  auto r = RunCompare(s, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const MethodRun* d = Find(r->own, "sluice-dynamic");
  const MethodRun* best = Find(r->own, "sluice");
  ASSERT_NE(d, nullptr);
  ASSERT_NE(best, nullptr);
  ASSERT_EQ(d->state, RunState::kOk) << d->reason;
  EXPECT_FALSE(d->config.has_value());
  ASSERT_GE(d->strategies.size(), 2u);
  EXPECT_EQ(d->strategies[0], best->config->Describe());
  bool any_hetero = false;
  for (const std::string& st : d->strategies) any_hetero |= st.find("heterogeneous") == 0;
  EXPECT_TRUE(any_hetero);
  ASSERT_EQ(d->batches.size(), 4u);
  int64_t changes = 0;
  for (size_t i = 0; i < d->batches.size(); ++i) {
    const BatchRecord& b = d->batches[i];
    ASSERT_EQ(b.outcome, BatchOutcome::kOk) << b.reason;
    ASSERT_GE(b.strategy, 0);
    ASSERT_LT(b.strategy, static_cast<int64_t>(d->strategies.size()));
    EXPECT_GE(b.switch_ms, 0);
    EXPECT_GT(b.iteration_ms, b.switch_ms);
    if (i == 0) EXPECT_EQ(b.switch_ms, 0);
    if (i > 0 && b.strategy != d->batches[i - 1].strategy) ++changes;
    if (i > 0 && b.strategy == d->batches[i - 1].strategy) EXPECT_EQ(b.switch_ms, 0);
  }
  EXPECT_EQ(d->switches, changes);
  EXPECT_GT(d->fraction_of_ideal, 0);
  EXPECT_LE(d->fraction_of_ideal, d->fraction_of_length_aware);
  const MethodRun* dc = Find(r->controlled, "sluice-dynamic");
  ASSERT_NE(dc, nullptr);
  EXPECT_EQ(dc->state, RunState::kNotRun);
  auto back = CompareResultFromJson(CompareResultToJson(*r), "results.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, *r);
}

}  // namespace
}  // namespace sluice
