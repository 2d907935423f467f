// `sluice compare` end to end on small scenarios (seconds): every method's plan validates, no
// method ever exceeds the ideal bound, the time breakdown adds up, methods that cannot run are
// shown with their reason, results round-trip through JSON, and an interrupted run is partial.
#include "compare/compare.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "base/json_util.h"
#include "compare/compare_json.h"
#include "cost/cost_factory.h"
#include "plan/validate.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

CompareScenario SmallGpt() {
  CompareScenario s;
  s.name = "small-gpt";
  s.tokens_per_batch = 16384;
  s.max_seqlen = 1024;
  s.iterations = 3;
  s.memory_limit_mb = 36000;
  s.search.score_batches = 1;
  s.search.simulate_top = 2;
  s.search.pp = {1, 2, 4};
  return s;
}

CompareOptions Quiet() {
  CompareOptions o;
  o.progress = nullptr;
  return o;
}

double Sum(const Breakdown& b) {
  return b.useful + b.padding + b.recompute + b.kernel + b.comm + b.imbalance + b.bubble;
}

void ExpectBreakdown(const Breakdown& b, const std::string& what) {
  EXPECT_NEAR(Sum(b), 1.0, 1e-9) << what;
  for (double part : {b.useful, b.padding, b.recompute, b.kernel, b.comm, b.imbalance, b.bubble}) {
    EXPECT_GE(part, 0.0) << what;
  }
}

// The checks every comparison must pass.
void ExpectSound(const CompareResult& r) {
  EXPECT_GT(r.rate.flops_per_s, 0);
  EXPECT_GE(r.rate.flops_per_s, r.sweep_rate.flops_per_s);
  EXPECT_GT(r.ideal_tokens_per_s, 0);
  // The length-aware bound: R(L) <= the sweep's R, so it is never above the ideal.
  ASSERT_FALSE(r.length_rates.lengths.empty());
  for (double rate : r.length_rates.flops_per_s) EXPECT_LE(rate, r.sweep_rate.flops_per_s);
  EXPECT_GT(r.length_aware_tokens_per_s, 0);
  EXPECT_LE(r.length_aware_tokens_per_s, r.ideal_tokens_per_s * (1 + 1e-9));
  for (const std::vector<MethodRun>* runs : {&r.own, &r.controlled}) {
    for (const MethodRun& m : *runs) {
      SCOPED_TRACE(m.method);
      if (m.state != RunState::kOk) {
        EXPECT_FALSE(m.reason.empty()) << "a method that did not run says why";
        continue;
      }
      ASSERT_TRUE(m.config.has_value() || m.hetero.has_value() || !m.strategies.empty());
      ASSERT_GT(m.ok_batches, 0);
      // The ideal bound is never exceeded: per batch, per method, and against the batch-level
      // ideal (every sample of these scenarios is placed).
      for (const BatchRecord& b : m.batches) {
        if (b.outcome != BatchOutcome::kOk) continue;
        EXPECT_GT(b.ideal_ms, 0);
        EXPECT_GE(b.iteration_ms, b.ideal_ms) << "batch " << b.batch;
        EXPECT_LE(b.real_tokens, b.padded_tokens);
        ExpectBreakdown(b.breakdown, m.method);
        EXPECT_NEAR(b.breakdown.useful, b.ideal_ms / b.iteration_ms, 1e-6);
        EXPECT_GE(b.length_aware_ms, b.ideal_ms * (1 - 1e-9));
      }
      EXPECT_GE(m.fraction_of_length_aware, m.fraction_of_ideal * (1 - 1e-9));
      EXPECT_GT(m.tokens_per_s, 0);
      EXPECT_LE(m.tokens_per_s, m.ideal_tokens_per_s);
      EXPECT_LE(m.fraction_of_ideal, 1.0);
      EXPECT_LE(m.tokens_per_s, r.ideal_tokens_per_s * (1 + 1e-9));
      EXPECT_LE(m.peak_memory_mb, r.memory_limit_mb);
      ExpectBreakdown(m.breakdown, m.method);
      // The example run's plan is a valid plan that ran within memory.
      if (m.example.has_value()) {
        EXPECT_TRUE(ValidatePlan(m.example->plan).ok());
        EXPECT_EQ(m.example->sim.outcome, SimOutcome::kOk);
        EXPECT_FALSE(m.example->sim.timeline.empty());
      }
    }
  }
}

const MethodRun* Find(const std::vector<MethodRun>& runs, const std::string& name) {
  for (const MethodRun& m : runs) {
    if (m.method == name) return &m;
  }
  return nullptr;
}

TEST(CompareTest, SmallScenarioEndToEnd) {
  auto r = RunCompare(SmallGpt(), Quiet());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->partial);
  EXPECT_EQ(r->batches, 3);
  EXPECT_EQ(r->devices, 8);
  ASSERT_EQ(r->own.size(), 6u);
  ExpectSound(*r);
  for (const MethodRun& m : r->own) {
    EXPECT_EQ(m.state, RunState::kOk) << m.method << ": " << m.reason;
    EXPECT_TRUE(m.example.has_value()) << m.method;
    EXPECT_EQ(static_cast<int64_t>(m.batches.size()), r->batches);
    EXPECT_GT(m.candidates, 0);
    EXPECT_GE(m.simulated, 1);
  }
  // Ratios are against packing; sluice's best searches a superset of every other default
  // method's space, so it is at least as fast as each on the batches they were scored on.
  const MethodRun* packing = Find(r->own, "packing");
  const MethodRun* best = Find(r->own, "sluice");
  ASSERT_NE(packing, nullptr);
  ASSERT_NE(best, nullptr);
  EXPECT_DOUBLE_EQ(packing->ratio_to_reference, 1.0);
  EXPECT_GT(best->ratio_to_reference, 1.0);
  // The controlled comparison runs every method on sluice's (dp, pp, tp, ZeRO).
  ASSERT_TRUE(r->controlled_config.has_value());
  ASSERT_TRUE(best->config.has_value());
  const ParallelConfig& shared = *r->controlled_config;
  EXPECT_EQ(shared.dp, best->config->parallel.dp);
  EXPECT_EQ(shared.pp, best->config->parallel.pp);
  EXPECT_EQ(shared.tp, best->config->parallel.tp);
  EXPECT_EQ(shared.zero, best->config->parallel.zero);
  for (const MethodRun& m : r->controlled) {
    if (!m.config.has_value()) continue;
    EXPECT_EQ(m.config->parallel.dp, shared.dp) << m.method;
    EXPECT_EQ(m.config->parallel.pp, shared.pp) << m.method;
    EXPECT_EQ(m.config->parallel.tp, shared.tp) << m.method;
  }

  // JSON round trip (everything but the example runs).
  auto back = CompareResultFromJson(CompareResultToJson(*r), "results.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, *r);
}

// CompareOptions::optimize_budget_ms: a "METHOD (optimized)" row per method whose plans the
// optimizer changed, under the same configuration, no batch slower than the method's own.
TEST(CompareTest, OptimizedRows) {
  CompareScenario s = SmallGpt();
  s.search.pp = {4};
  CompareOptions o = Quiet();
  o.optimize_budget_ms = 20;
  auto r = RunCompare(s, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ExpectSound(*r);
  int64_t optimized = 0;
  for (const MethodRun& m : r->own) {
    const size_t cut = m.method.find(" (optimized)");
    if (cut == std::string::npos) continue;
    ++optimized;
    const MethodRun* base = Find(r->own, m.method.substr(0, cut));
    ASSERT_NE(base, nullptr) << m.method;
    EXPECT_EQ(m.config, base->config);
    ASSERT_EQ(m.batches.size(), base->batches.size());
    for (size_t i = 0; i < m.batches.size(); ++i) {
      if (base->batches[i].outcome != BatchOutcome::kOk) continue;
      EXPECT_EQ(m.batches[i].outcome, BatchOutcome::kOk);
      EXPECT_LE(m.batches[i].iteration_ms, base->batches[i].iteration_ms) << m.method << " " << i;
    }
  }
  EXPECT_GT(optimized, 0);
  auto back = CompareResultFromJson(CompareResultToJson(*r), "results.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, *r);
}

TEST(CompareTest, ContextParallelSearchAndMegatronGbp) {
  CompareScenario s = SmallGpt();
  s.methods = {*MethodSpecFor("packing", "test"), *MethodSpecFor("megatron-gbp", "test"),
               *MethodSpecFor("sluice", "test")};
  s.search.cp = {1, 2};
  auto r = RunCompare(s, Quiet());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ExpectSound(*r);
  const MethodRun* gbp = Find(r->own, "megatron-gbp");
  ASSERT_NE(gbp, nullptr);
  EXPECT_EQ(gbp->state, RunState::kOk) << gbp->reason;
  ASSERT_TRUE(gbp->config.has_value());
  EXPECT_EQ(gbp->config->batching, "megatron-gbp");
  // cp doubles the search space of this scenario (every cp 1 configuration has a cp 2 twin with
  // half the dp, where dp is even).
  CompareScenario plain = SmallGpt();
  plain.methods = s.methods;
  auto p = RunCompare(plain, Quiet());
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_GT(r->candidates_scored, p->candidates_scored);
  auto back = CompareResultFromJson(CompareResultToJson(*r), "results.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, *r);
  EXPECT_EQ(back->scenario.search.cp, (std::vector<int64_t>{1, 2}));
}

// sluice-hetero: the heterogeneous search runs inside compare beside the other methods, reports
// like them (bounds, failed batches, breakdown) and takes no part in the controlled comparison.
TEST(CompareTest, HeterogeneousRow) {
  CompareScenario s = SmallGpt();
  s.methods = {*MethodSpecFor("packing", "test"), *MethodSpecFor("sluice", "test"),
               *MethodSpecFor("sluice-hetero", "test")};
  s.search.cp = {1, 2};
  auto r = RunCompare(s, Quiet());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ExpectSound(*r);
  const MethodRun* h = Find(r->own, "sluice-hetero");
  ASSERT_NE(h, nullptr);
  ASSERT_EQ(h->state, RunState::kOk) << h->reason;
  ASSERT_TRUE(h->hetero.has_value());
  EXPECT_FALSE(h->config.has_value());
  EXPECT_GE(h->hetero->groups.size(), 2u);
  EXPECT_EQ(h->hetero->devices(), 8);
  for (const ParallelConfig& g : h->hetero->groups) {
    EXPECT_LE(g.cp, 2) << "the mixes lie in the search space";
  }
  EXPECT_GT(h->candidates, 0);
  EXPECT_GE(h->simulated, 1);
  EXPECT_EQ(static_cast<int64_t>(h->batches.size()), r->batches);
  for (const BatchRecord& b : h->batches) {
    EXPECT_EQ(b.outcome, BatchOutcome::kOk) << b.reason;
    EXPECT_GT(b.planning_ms, 0);
    EXPECT_GT(b.micro_batches, 0);
  }
  EXPECT_GT(h->ratio_to_reference, 0);
  // Not part of the controlled comparison, which still runs on sluice's configuration.
  ASSERT_TRUE(r->controlled_config.has_value());
  const MethodRun* hc = Find(r->controlled, "sluice-hetero");
  ASSERT_NE(hc, nullptr);
  EXPECT_EQ(hc->state, RunState::kNotRun);
  EXPECT_THAT(hc->reason, HasSubstr("no single configuration"));
  auto back = CompareResultFromJson(CompareResultToJson(*r), "results.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, *r);
  // The method list with its kind round-trips through a scenario file.
  auto sc = CompareScenarioFromJson(CompareScenarioToJson(s), "scenario.json");
  ASSERT_TRUE(sc.ok()) << sc.status().ToString();
  EXPECT_EQ(sc->methods, s.methods);
}

TEST(CompareTest, AHeterogeneousSearchOutsideTheSpaceSaysWhy) {
  CompareScenario s = SmallGpt();
  s.methods = {*MethodSpecFor("packing", "test"), *MethodSpecFor("sluice-hetero", "test")};
  s.controlled_method = "packing";
  s.search.tp = {8};  // no narrow shape of tp 1 or 2
  auto r = RunCompare(s, Quiet());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const MethodRun* h = Find(r->own, "sluice-hetero");
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->state, RunState::kOutOfMemory);
  EXPECT_THAT(h->reason, HasSubstr("no 2-shape mix"));
}

TEST(LengthRatesTest, RateOfTakesTheHigherOfTheSweptLengthsAround) {
  LengthRates rates;
  rates.lengths = {64, 128, 256};
  rates.flops_per_s = {1.0, 3.0, 2.0};
  EXPECT_EQ(rates.RateOf(64), 1.0);
  EXPECT_EQ(rates.RateOf(10), 1.0);
  EXPECT_EQ(rates.RateOf(100), 3.0);
  EXPECT_EQ(rates.RateOf(200), 3.0);
  EXPECT_EQ(rates.RateOf(256), 2.0);
  EXPECT_EQ(rates.RateOf(9999), 2.0);
  EXPECT_EQ(LengthRates{}.RateOf(100), 0.0);
}

TEST(CompareTest, UnsupportedAndOutOfMemoryMethodsAreShownNotDropped) {
  CompareScenario s;
  s.name = "small-t5";
  s.model = "t5-11b";
  s.data = "flan-like";
  s.samples = 2000;
  s.tokens_per_batch = 8192;
  s.max_seqlen = 512;
  s.iterations = 2;
  s.memory_limit_mb = 36000;
  s.search.score_batches = 1;
  s.search.simulate_top = 1;
  s.search.pp = {2, 4};
  s.methods = {*MethodSpecFor("packing", "t"), *MethodSpecFor("megatron-gbp", "t"),
               *MethodSpecFor("hydraulis", "t"), *MethodSpecFor("dynapipe", "t")};
  s.controlled_method = "dynapipe";
  auto r = RunCompare(s, Quiet());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ExpectSound(*r);
  ASSERT_EQ(r->own.size(), 4u);
  const MethodRun* gbp = Find(r->own, "megatron-gbp");
  ASSERT_NE(gbp, nullptr);
  EXPECT_EQ(gbp->state, RunState::kUnsupported);
  EXPECT_THAT(gbp->reason, HasSubstr("decoder-only"));
  EXPECT_EQ(Find(r->own, "dynapipe")->state, RunState::kOk);
  // Encoder-decoder varlen packing: Hydraulis runs on T5, without padding.
  const MethodRun* hydraulis = Find(r->own, "hydraulis");
  ASSERT_NE(hydraulis, nullptr);
  EXPECT_EQ(hydraulis->state, RunState::kOk) << hydraulis->reason;
  EXPECT_LT(hydraulis->padding, 0.01);

  // A memory limit that no configuration meets: every method is out of memory, with a reason.
  s.memory_limit_mb = 2000;
  auto oom = RunCompare(s, Quiet());
  ASSERT_TRUE(oom.ok()) << oom.status().ToString();
  EXPECT_FALSE(oom->controlled_config.has_value());
  for (const MethodRun& m : oom->own) {
    if (m.method == "hydraulis") continue;
    EXPECT_EQ(m.state, RunState::kOutOfMemory) << m.method;
    EXPECT_THAT(m.reason, HasSubstr("model states")) << m.method;
    EXPECT_EQ(m.ok_batches, 0);
  }
  auto back = CompareResultFromJson(CompareResultToJson(*oom), "results.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, *oom);
}

int64_t BatchesRun(const CompareResult& r) {
  int64_t n = 0;
  for (const std::vector<MethodRun>* runs : {&r.own, &r.controlled}) {
    for (const MethodRun& m : *runs) n += static_cast<int64_t>(m.batches.size());
  }
  return n;
}

TEST(CompareTest, InterruptedRunIsPartialAndConsistent) {
  CompareScenario s = SmallGpt();
  s.methods = {*MethodSpecFor("packing", "t"), *MethodSpecFor("dynapipe", "t")};
  s.controlled_method = "dynapipe";
  // A full run polls `cancelled` N times; the last polls come before the last run's batches.
  int64_t polls = 0;
  CompareOptions count = Quiet();
  count.cancelled = [&] {
    ++polls;
    return false;
  };
  auto full = RunCompare(s, count);
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  EXPECT_FALSE(full->partial);
  const int64_t n = polls;
  // Interrupted during the last run: partial, fewer batches, still sound.
  polls = 0;
  CompareOptions late = Quiet();
  late.cancelled = [&] { return ++polls > n - 3; };
  auto r = RunCompare(s, late);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->partial);
  EXPECT_LT(BatchesRun(*r), BatchesRun(*full));
  EXPECT_GT(BatchesRun(*r), 0);
  ExpectSound(*r);
  auto back = CompareResultFromJson(CompareResultToJson(*r), "results.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(back->partial);
  EXPECT_EQ(*back, *r);
  // Interrupted at once: nothing ran, every method says so.
  CompareOptions early = Quiet();
  early.cancelled = [] { return true; };
  auto none = RunCompare(s, early);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_TRUE(none->partial);
  EXPECT_EQ(BatchesRun(*none), 0);
  for (const MethodRun& m : none->own) EXPECT_EQ(m.state, RunState::kNotRun) << m.method;
}

// Web text clipped at 8192 tokens on 36 GB: dp 8 x tp 1 runs the short batches fastest but cannot
// hold an 8K sample, so it fails the batches that have one; dp 2 x tp 4 runs them all. Scored on
// the first two batches only (both short), DynaPipe's search picks dp 8.
// examples/compare-failing-batches.json: web text clipped at 8192 tokens on 30 GB, scored on the
// first two batches only. Multipack's dp 4 x tp 2 cannot hold an 8K sample per device and fails
// the batches holding one; "both" (multipack or token-budget) keeps its own complete run.
CompareScenario FailsLongBatches() {
  CompareScenario s;
  s.name = "failing-batches";
  s.data = "web";
  s.max_seqlen = 8192;
  s.memory_limit_mb = 30000;
  s.iterations = 20;
  MethodSpec multipack;
  multipack.name = "multipack";
  multipack.batching = {"multipack"};
  multipack.schedules = {ScheduleKind::k1F1B};
  MethodSpec both = multipack;
  both.name = "both";
  both.batching = {"multipack", "token-budget"};
  s.methods = {multipack, both};
  s.reference = "multipack";
  s.controlled_method = "both";
  s.search.tp = {1, 2, 4};
  s.search.pp = {1};
  s.search.zero = {2};
  s.search.score_batches = 2;
  s.search.score_extremes = false;
  s.search.simulate_top = 2;
  s.stepwise_collectives = false;
  return s;
}

TEST(CompareTest, FailedBatchesCountAndARunThatFailsOneIsNeitherRankedFirstNorAdopted) {
  auto r = RunCompare(FailsLongBatches(), Quiet());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ExpectSound(*r);
  EXPECT_EQ(r->score_batches, (std::vector<int64_t>{0, 1}));
  const MethodRun* multipack = Find(r->own, "multipack");
  const MethodRun* both = Find(r->own, "both");
  ASSERT_NE(multipack, nullptr);
  ASSERT_NE(both, nullptr);
  ASSERT_TRUE(multipack->config.has_value());
  ASSERT_TRUE(both->config.has_value());
  // Multipack fails some batches (and runs others): failures are counted, not dropped.
  ASSERT_GT(multipack->ok_batches, 0);
  ASSERT_LT(multipack->ok_batches, 20);
  EXPECT_EQ(multipack->state, RunState::kOk);
  int64_t untrained = 0;
  for (const BatchRecord& b : multipack->batches) {
    EXPECT_GT(b.tokens, 0);
    if (b.outcome != BatchOutcome::kOk) {
      EXPECT_FALSE(b.reason.empty());
      untrained += b.tokens;
    }
  }
  EXPECT_EQ(multipack->untrained_tokens, untrained);
  // The headline counts every batch: (k / n) x the throughput of the batches that ran, which on
  // these batches is higher than the complete run's headline.
  const double k_over_n = static_cast<double>(multipack->ok_batches) / 20.0;
  EXPECT_NEAR(multipack->tokens_per_s, k_over_n * multipack->ran_tokens_per_s,
              1e-6 * multipack->tokens_per_s);
  EXPECT_GT(multipack->charged_ms, 0);
  EXPECT_GT(multipack->ran_tokens_per_s, both->tokens_per_s)
      << "the case of the issue: faster on the batches it ran";
  // `both` holds multipack's configuration in its space but does not adopt it: it ran all 20.
  EXPECT_NE(*both->config, *multipack->config);
  EXPECT_EQ(both->ok_batches, 20);
  EXPECT_TRUE(both->adopted_from.empty()) << both->config->Describe();
  EXPECT_TRUE(RunRanksBefore(*both, *multipack));
  EXPECT_FALSE(RunRanksBefore(*multipack, *both));
  EXPECT_GT(both->ratio_to_reference, 1.0);
  auto back = CompareResultFromJson(CompareResultToJson(*r), "results.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, *r);

  // Scored on the longest and densest batches as well (the default), multipack's search sees the
  // failure and picks a configuration that runs every batch.
  CompareScenario s = FailsLongBatches();
  s.search.score_extremes = true;
  auto extremes = RunCompare(s, Quiet());
  ASSERT_TRUE(extremes.ok()) << extremes.status().ToString();
  EXPECT_GT(extremes->score_batches.size(), 2u);
  const MethodRun* fixed = Find(extremes->own, "multipack");
  ASSERT_NE(fixed, nullptr);
  EXPECT_EQ(fixed->ok_batches, 20) << fixed->config->Describe();
  EXPECT_NE(*fixed->config, *multipack->config);
}

TEST(CompareTest, LostDataAndTooSmallInputsAreReported) {
  // mixture-4task at 1024 tokens: many samples are clipped; the result counts them.
  CompareScenario s = SmallGpt();
  s.methods = {*MethodSpecFor("packing", "t")};
  s.reference = "packing";
  s.controlled_method = "packing";
  auto r = RunCompare(s, Quiet());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->data_loss.samples, 30000);
  EXPECT_GT(r->data_loss.clipped_samples, 0);
  EXPECT_GT(r->data_loss.clipped_tokens, r->data_loss.tokens / 2) << "the issue: most tokens lost";
  EXPECT_EQ(r->data_loss.lost_tokens(), r->data_loss.clipped_tokens);
  EXPECT_THAT(r->description, HasSubstr("lost:     "));
  EXPECT_TRUE(r->warnings.empty());
  auto back = CompareResultFromJson(CompareResultToJson(*r), "results.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, *r);

  // One sample: it runs, with warnings (fewer batches than asked, fewer samples than devices).
  const std::string one = ::testing::TempDir() + "/compare-one-sample.txt";
  ASSERT_TRUE(WriteStringToFile(one, "100\n").ok());
  s.data = one;
  auto tiny = RunCompare(s, Quiet());
  ASSERT_TRUE(tiny.ok()) << tiny.status().ToString();
  ASSERT_EQ(tiny->warnings.size(), 2u);
  EXPECT_THAT(tiny->warnings[0], HasSubstr("fewer than the 3 asked for"));
  EXPECT_THAT(tiny->warnings[1], HasSubstr("fewer than the 8 devices"));
  back = CompareResultFromJson(CompareResultToJson(*tiny), "results.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->warnings, tiny->warnings);

  // Every sample too long and dropped: the error says why there is no batch.
  const std::string long_file = ::testing::TempDir() + "/compare-long-samples.txt";
  ASSERT_TRUE(WriteStringToFile(long_file, "5000\n6000\n").ok());
  s.data = long_file;
  s.long_samples = "drop";
  auto none = RunCompare(s, Quiet(), "grid.json");
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(),
              HasSubstr("grid.json: field 'data': '" + long_file +
                        "' yields no global batch of 16384 tokens: all 2 samples were dropped: 2 "
                        "longer than max seqlen 1024 (long samples are dropped)"));
}

TEST(CompareTest, WithoutAMemoryLimitPlansKeepTheReserveFree) {
  // No explicit limit: the budget is the device's memory less the default reserve (2 GiB + 5%),
  // and every simulated peak stays under it (ExpectSound checks peak <= memory_limit_mb).
  CompareScenario s = SmallGpt();
  s.memory_limit_mb = 0;
  s.methods = {*MethodSpecFor("packing", "t"), *MethodSpecFor("dynapipe", "t")};
  s.controlled_method = "dynapipe";
  auto r = RunCompare(s, Quiet());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ExpectSound(*r);
  const double device_mb = Bytes::GiB(40).mb();
  EXPECT_DOUBLE_EQ(r->memory_limit_mb, Bytes::GiB(36).mb());
  EXPECT_DOUBLE_EQ(r->memory_reserve_mb, Bytes::GiB(4).mb());
  double peak = 0;
  for (const MethodRun& m : r->own) peak = std::max(peak, m.peak_memory_mb);
  EXPECT_GT(peak, 0);
  EXPECT_LE(peak, device_mb - Bytes::GiB(4).mb());
  // The reserve overridden to 0: the whole device is the budget, and plans use what it frees.
  s.memory_reserve_mb = 0;
  auto full = RunCompare(s, Quiet());
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  ExpectSound(*full);
  EXPECT_DOUBLE_EQ(full->memory_limit_mb, device_mb);
  double full_peak = 0;
  for (const MethodRun& m : full->own) full_peak = std::max(full_peak, m.peak_memory_mb);
  EXPECT_GT(full_peak, device_mb - Bytes::GiB(4).mb()) << "the reserve is what kept it free";
  auto back = CompareResultFromJson(CompareResultToJson(*full), "results.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, *full);
  // An explicit limit is the budget as given; a reserve beside it is an error naming both.
  s.memory_limit_mb = 36000;
  auto both = RunCompare(s, Quiet(), "grid.json");
  ASSERT_FALSE(both.ok());
  EXPECT_THAT(both.status().message(),
              HasSubstr("grid.json: field 'memory_reserve_mb': applies only without grid.json: "
                        "field 'memory_limit_mb'"));
}

TEST(CompareTest, ScenarioErrorsNameTheField) {
  CompareScenario s = SmallGpt();
  s.max_seqlen = 100000;
  auto r = RunCompare(s, Quiet(), "grid.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("grid.json: field 'max_seqlen'"));
  s = SmallGpt();
  s.model = "gpt-7b";
  r = RunCompare(s, Quiet());
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("--model"));
  EXPECT_THAT(r.status().message(), HasSubstr("gpt-6.7b"));
  s = SmallGpt();
  s.memory_limit_mb = 90000;
  r = RunCompare(s, Quiet(), "grid.json");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("memory_limit_mb"));
}

TEST(CompareTest, OutcomeAndStateNamesAreTheResultsFilesWords) {
  EXPECT_EQ(BatchOutcomeName(BatchOutcome::kOk), "ok");
  EXPECT_EQ(BatchOutcomeName(BatchOutcome::kOutOfMemory), "out-of-memory");
  EXPECT_EQ(BatchOutcomeName(BatchOutcome::kSimOutOfMemory), "sim-out-of-memory");
  EXPECT_EQ(BatchOutcomeName(BatchOutcome::kDeadlock), "deadlock");
  EXPECT_EQ(RunStateName(RunState::kOk), "ok");
  EXPECT_EQ(RunStateName(RunState::kOutOfMemory), "out-of-memory");
  EXPECT_EQ(RunStateName(RunState::kUnsupported), "unsupported");
  EXPECT_EQ(RunStateName(RunState::kNotRun), "not-run");
}

TEST(IdealBoundTest, FlopsAddUpAndTheSweepRateIsBelowPeak) {
  auto model = ModelPreset("gpt-6.7b");
  auto cluster = ClusterPreset("a100-40g", 8);
  ASSERT_TRUE(model.ok() && cluster.ok());
  auto cost = MakeCostModel(*model, *cluster, CostModelOptions{});
  ASSERT_TRUE(cost.ok());
  const FlopCounter flops(*model);
  const Sample s{.id = 0, .input_len = 700, .target_len = 300, .task = 0};
  // Stages of a 4-way pipeline add up to the whole model.
  ParallelConfig p;
  p.pp = 4;
  auto eval = StageCostEvaluator::Create(**cost, p, *cluster);
  ASSERT_TRUE(eval.ok());
  double stages = 0;
  for (const StageLayers& l : eval->stage_layers()) stages += flops.SampleStage(l, s);
  EXPECT_NEAR(stages, flops.SampleTotal(s), 1e-6 * stages);
  // About 6 x parameters x tokens (dense GPT), plus attention.
  EXPECT_GT(flops.SampleTotal(s), 6 * 6.5e9 * 1000);
  EXPECT_LT(flops.SampleTotal(s), 6 * 7.5e9 * 1000 * 1.5);
  const std::vector<int64_t> tps = {1, 2, 4, 8};
  const AchievableRate rate = SweepAchievableRate(**cost, flops, tps);
  EXPECT_GT(rate.flops_per_s, 0.3 * cluster->device.peak_flops);
  EXPECT_LT(rate.flops_per_s, cluster->device.peak_flops);
  EXPECT_THAT(rate.where, HasSubstr("sweep"));
}

}  // namespace
}  // namespace sluice
