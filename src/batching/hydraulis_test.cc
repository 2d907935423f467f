#include "batching/hydraulis.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "base/rng.h"
#include "batching/assigners.h"
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

constexpr int64_t kMaxSeqlen = 4096;

std::unique_ptr<TestSetup> Gpt(int64_t dp = 2, int64_t pp = 4, int64_t tp = 1) {
  return MakeTestSetup("gpt-6.7b", TestParallel(dp, pp, tp));
}

// (dp, pp, tp) configurations of GPT-6.7B that fit 36 GB with ZeRO-1.
struct Layout {
  int64_t dp, pp, tp;
};
constexpr Layout kLayouts[] = {{2, 4, 1}, {4, 2, 1}, {2, 1, 4}};

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

BatchingOptions Options(uint64_t seed = 0) {
  BatchingOptions o;
  o.max_seqlen = kMaxSeqlen;
  o.seed = seed;
  return o;
}

std::vector<PartitionItem> RandomItems(Rng& rng, int64_t n) {
  std::vector<PartitionItem> items;
  for (int64_t i = 0; i < n; ++i) {
    items.push_back({rng.UniformInt(1, 1000), rng.UniformInt(1, 100)});
  }
  return items;
}

// Checks a partition's bins, caps and max load against the items.
void ExpectConsistent(std::span<const PartitionItem> items, int64_t bins, int64_t cap,
                      const Partition& p) {
  ASSERT_TRUE(p.feasible);
  ASSERT_EQ(p.bin.size(), items.size());
  std::vector<int64_t> load(bins, 0), used(bins, 0);
  for (size_t i = 0; i < items.size(); ++i) {
    ASSERT_GE(p.bin[i], 0);
    ASSERT_LT(p.bin[i], bins);
    load[p.bin[i]] += items[i].cost;
    used[p.bin[i]] += items[i].size;
  }
  for (int64_t b = 0; b < bins; ++b) EXPECT_LE(used[b], cap);
  EXPECT_EQ(p.max_load, *std::max_element(load.begin(), load.end()));
}

// Optimal max load by enumerating all bins^n assignments; kNone when none fits.
int64_t BruteForce(std::span<const PartitionItem> items, int64_t bins, int64_t cap) {
  const int64_t n = static_cast<int64_t>(items.size());
  int64_t best = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> a(n, 0);
  while (true) {
    std::vector<int64_t> load(bins, 0), used(bins, 0);
    for (int64_t i = 0; i < n; ++i) {
      load[a[i]] += items[i].cost;
      used[a[i]] += items[i].size;
    }
    if (*std::max_element(used.begin(), used.end()) <= cap) {
      best = std::min(best, *std::max_element(load.begin(), load.end()));
    }
    int64_t k = 0;
    while (k < n && ++a[k] == bins) a[k++] = 0;
    if (k == n) break;
  }
  return best;
}

TEST(HydraulisPartitionTest, LocalSearchNeverWorseThanLpt) {
  Rng rng(1);
  int64_t improved = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t n = rng.UniformInt(1, 60);
    const int64_t bins = rng.UniformInt(1, 8);
    const std::vector<PartitionItem> items = RandomItems(rng, n);
    int64_t total = 0;
    for (const auto& it : items) total += it.size;
    const int64_t cap = std::max<int64_t>(100, total / bins + rng.UniformInt(0, 200));
    const Partition lpt = LptPartition(items, bins, cap);
    if (!lpt.feasible) continue;
    ExpectConsistent(items, bins, cap, lpt);
    const Partition ls = LocalSearch(items, bins, cap, lpt);
    ExpectConsistent(items, bins, cap, ls);
    EXPECT_LE(ls.max_load, lpt.max_load);
    if (ls.max_load < lpt.max_load) ++improved;
    const Partition mm = MinMaxPartition(items, bins, cap);
    ExpectConsistent(items, bins, cap, mm);
    EXPECT_LE(mm.max_load, ls.max_load);
  }
  EXPECT_GT(improved, 0);  // the local search does something on random inputs
}

TEST(HydraulisPartitionTest, BranchAndBoundEqualsBruteForce) {
  Rng rng(2);
  for (int trial = 0; trial < 150; ++trial) {
    const int64_t n = rng.UniformInt(1, 7);
    const int64_t bins = rng.UniformInt(1, 3);
    const std::vector<PartitionItem> items = RandomItems(rng, n);
    const int64_t cap = rng.UniformInt(100, 300);
    const int64_t truth = BruteForce(items, bins, cap);
    const Partition exact = ExactPartition(items, bins, cap, Partition{});
    if (truth == std::numeric_limits<int64_t>::max()) {
      EXPECT_FALSE(exact.feasible);
      continue;
    }
    ExpectConsistent(items, bins, cap, exact);
    EXPECT_EQ(exact.max_load, truth);
    // Seeded with the heuristic's answer, it still finds the optimum.
    const Partition seeded = ExactPartition(
        items, bins, cap, LocalSearch(items, bins, cap, LptPartition(items, bins, cap)));
    EXPECT_EQ(seeded.max_load, truth);
    const Partition mm = MinMaxPartition(items, bins, cap);
    EXPECT_EQ(mm.max_load, truth);
  }
}

TEST(HydraulisPartitionTest, FillsEveryBinWhenThereAreEnoughItems) {
  const std::vector<PartitionItem> items = {{100, 1}, {1, 1}, {1, 1}, {1, 1}};
  const Partition p = MinMaxPartition(items, 3, 10);
  ExpectConsistent(items, 3, 10, p);
  std::vector<int64_t> count(3, 0);
  for (int64_t b : p.bin) ++count[b];
  for (int64_t c : count) EXPECT_GT(c, 0);
  EXPECT_EQ(p.max_load, 100);
}

TEST(HydraulisPartitionTest, MicroBatchCountsSpanTheRangeWithAtMostSixteenValues) {
  EXPECT_EQ(MicroBatchCounts(3, 3), (std::vector<int64_t>{3}));
  EXPECT_EQ(MicroBatchCounts(2, 17).size(), 16u);
  EXPECT_EQ(MicroBatchCounts(2, 17).back(), 17);
  for (int64_t lo : {1, 2, 7, 40}) {
    for (int64_t hi : {lo + 15, lo + 16, lo + 40, 20 * lo + 300}) {
      const std::vector<int64_t> v = MicroBatchCounts(lo, hi);
      EXPECT_EQ(static_cast<int64_t>(v.size()), kMaxMicroBatchCounts);
      EXPECT_EQ(v.front(), lo);
      EXPECT_EQ(v.back(), hi);
      for (size_t i = 1; i < v.size(); ++i) EXPECT_LT(v[i - 1], v[i]);
    }
  }
}

TEST(HydraulisDispatchTest, DeterministicPerSeedAndSeedsMayDiffer) {
  Rng rng(3);
  std::vector<int64_t> cost;
  for (int i = 0; i < 200; ++i) cost.push_back(rng.UniformInt(1, 1'000'000));
  const Dispatch a = HydraulisDispatch(cost, 4, 4, 16, 7);
  const Dispatch b = HydraulisDispatch(cost, 4, 4, 16, 7);
  EXPECT_EQ(a.replica_of, b.replica_of);
  EXPECT_EQ(a.max_time, b.max_time);
  EXPECT_TRUE(a.all_nonempty);
  EXPECT_EQ(a.max_time, DispatchMaxTime(cost, a.replica_of, 4, 4));
  bool differs = false;
  for (uint64_t seed = 0; seed < 8 && !differs; ++seed) {
    differs = HydraulisDispatch(cost, 4, 4, 16, seed).replica_of != a.replica_of;
  }
  EXPECT_TRUE(differs);
}

TEST(HydraulisDispatchTest, MoreShufflesNeverWorseAndBeatsContiguous) {
  Rng rng(4);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t n = rng.UniformInt(8, 120);
    const int64_t replicas = rng.UniformInt(2, 8);
    const int64_t pp = rng.UniformInt(1, 4);
    std::vector<int64_t> cost;
    for (int64_t i = 0; i < n; ++i) {
      const double len = std::exp(rng.Normal() + 6.5);
      cost.push_back(static_cast<int64_t>(len * len * 0.01 + len * 50));
    }
    const Dispatch few = HydraulisDispatch(cost, replicas, pp, 4, 99);
    const Dispatch many = HydraulisDispatch(cost, replicas, pp, 64, 99);
    EXPECT_LE(many.max_time, few.max_time);
    EXPECT_EQ(many.max_time, DispatchMaxTime(cost, many.replica_of, replicas, pp));
    // Greedy min-max: adding to the least-loaded replica is always an option, so the max stays
    // within the final mean of T_r (at most sum / R + (pp - 1) max f) plus pp max f.
    int64_t total = 0, biggest = 0;
    for (int64_t c : cost) {
      total += c;
      biggest = std::max(biggest, c);
    }
    EXPECT_LE(many.max_time, (total + replicas - 1) / replicas + (2 * pp - 1) * biggest);
  }
}

TEST(HydraulisDispatchTest, FewerSequencesThanReplicas) {
  const std::vector<int64_t> cost = {5, 3};
  const Dispatch d = HydraulisDispatch(cost, 4, 2, 8, 0);
  EXPECT_FALSE(d.all_nonempty);
  EXPECT_NE(d.replica_of[0], d.replica_of[1]);  // ties go to an empty replica
  EXPECT_EQ(d.max_time, 10);
}

TEST(HydraulisAssignerTest, EverySampleOnceDeterministicForASeed) {
  const auto setup = Gpt(4, 2);
  const StageCostEvaluator& eval = setup->evaluator();
  const std::vector<Sample> batch = LongTailBatch(5, 120, kMaxSeqlen);
  const auto assigner = MakeHydraulisAssigner();
  const auto a = assigner->Assign(batch, eval, Options(1));
  ASSERT_EQ(a.size(), 4u);
  std::vector<int64_t> ids;
  for (const auto& r : a) {
    EXPECT_FALSE(r.empty());
    for (const Sample& s : r) ids.push_back(s.id);
  }
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, SortedIds(batch));
  EXPECT_EQ(a, assigner->Assign(batch, eval, Options(1)));
  // Its objective is no worse than the contiguous split's.
  const std::vector<int64_t> cost = EstimateSampleCosts(batch, eval, Options());
  auto max_time = [&](const std::vector<std::vector<Sample>>& replicas) {
    std::vector<int64_t> replica_of(batch.size());
    for (size_t r = 0; r < replicas.size(); ++r) {
      for (const Sample& s : replicas[r]) replica_of[s.id] = static_cast<int64_t>(r);
    }
    return DispatchMaxTime(cost, replica_of, 4, eval.pp());
  };
  const auto contiguous = MakeContiguousAssigner()->Assign(batch, eval, Options());
  EXPECT_LE(max_time(a), max_time(contiguous));
}

// The invariants of a replica's Hydraulis micro-batches.
void ExpectValidPack(const ReplicaBatches& rb, std::span<const Sample> samples,
                     const StageCostEvaluator& eval) {
  ASSERT_EQ(rb.outcome, PlanOutcome::kOk) << rb.infeasible_reason;
  std::vector<int64_t> ids = SampleIdsOf(rb.micro_batches);
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, SortedIds(samples));
  EXPECT_EQ(CheckSequenceMemory(eval, rb.micro_batches), "");
  for (size_t j = 0; j < rb.micro_batches.size(); ++j) {
    const MicroBatch& mb = rb.micro_batches[j];
    EXPECT_TRUE(mb.varlen);
    if (j > 0) {
      EXPECT_LE(mb.real_tokens, rb.micro_batches[j - 1].real_tokens);
    }
  }
  BatchPlan plan;
  plan.method = "hydraulis";
  plan.replicas.resize(static_cast<size_t>(eval.parallel().dp));
  plan.replicas[0] = rb.micro_batches;
  const Status st = ValidateBatchPlan(plan, samples, eval);
  EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST(HydraulisBatcherTest, EverySampleOnceWithinMemoryAndDeterministic) {
  for (const Layout& l : kLayouts) {
    const auto setup = Gpt(l.dp, l.pp, l.tp);
    const StageCostEvaluator& eval = setup->evaluator();
    for (uint64_t seed = 0; seed < 4; ++seed) {
      for (const auto& batch :
           {LongTailBatch(seed, 60, kMaxSeqlen), RandomBatch(seed, 200, kMaxSeqlen, false),
            LongTailBatch(seed, 5, kMaxSeqlen)}) {
        const auto rb = MakeHydraulisBatcher()->Build(batch, eval, Options(seed));
        ASSERT_TRUE(rb.ok()) << rb.status().ToString();
        ExpectValidPack(*rb, batch, eval);
        EXPECT_EQ(rb->micro_batches,
                  MakeHydraulisBatcher()->Build(batch, eval, Options(seed))->micro_batches);
      }
    }
  }
}

TEST(HydraulisBatcherTest, HoldsUnderGPipeInFlight) {
  // Every micro-batch stays in flight, so the token cap shrinks as v grows.
  const auto setup =
      MakeTestSetup("gpt-6.7b", TestParallel(2, 4, 1), testing::TestCost::kProfiled,
                    StageCostOptions{.pad_multiple = 8, .in_flight = InFlightPolicy::kGPipe});
  const StageCostEvaluator& eval = setup->evaluator();
  int ok = 0;
  for (uint64_t seed = 0; seed < 4; ++seed) {
    const std::vector<Sample> batch = LongTailBatch(seed, 40, 2048);
    HydraulisPackDetail d;
    const auto rb = HydraulisPackReplica(batch, eval, Options(seed), &d);
    ASSERT_TRUE(rb.ok()) << rb.status().ToString();
    if (rb->outcome == PlanOutcome::kOk) {
      ExpectValidPack(*rb, batch, eval);
      ++ok;
    } else {
      EXPECT_NE(rb->infeasible_reason.find("hydraulis"), std::string::npos);
    }
  }
  EXPECT_GT(ok, 0);
}

TEST(HydraulisBatcherTest, ChosenVMinimisesTheFormula) {
  for (const Layout& l : kLayouts) {
    const auto setup = Gpt(l.dp, l.pp, l.tp);
    const StageCostEvaluator& eval = setup->evaluator();
    const int64_t pp = l.pp;
    for (uint64_t seed = 0; seed < 4; ++seed) {
      const std::vector<Sample> batch = LongTailBatch(seed + 10, 80, kMaxSeqlen);
      HydraulisPackDetail d;
      const auto rb = HydraulisPackReplica(batch, eval, Options(), &d);
      ASSERT_TRUE(rb.ok());
      ExpectValidPack(*rb, batch, eval);
      ASSERT_FALSE(d.tried_v.empty());
      EXPECT_GE(d.v_min, 1);
      EXPECT_LE(d.v_min, d.v_max);
      EXPECT_EQ(d.tried_v.front(), d.v_min);
      EXPECT_GE(d.token_cap.front() * d.v_min, d.total_tokens);  // v_min can hold the replica
      EXPECT_LE(static_cast<int64_t>(d.tried_v.size()), 16);
      const auto best = std::min_element(d.objective.begin(), d.objective.end());
      EXPECT_EQ(d.chosen_v, d.tried_v[best - d.objective.begin()]);
      EXPECT_EQ(static_cast<int64_t>(rb->micro_batches.size()), d.chosen_v);
      // The objective is (C* + c)(pp - 1 + v) of the returned micro-batches.
      Duration worst;
      for (const MicroBatch& mb : rb->micro_batches) worst = std::max(worst, mb.Bottleneck());
      EXPECT_EQ(*best, worst * (pp - 1 + d.chosen_v));
      // Each micro-batch stays under its token cap.
      const int64_t cap = d.token_cap[best - d.objective.begin()];
      for (const MicroBatch& mb : rb->micro_batches) EXPECT_LE(mb.real_tokens, cap);
    }
  }
}

// Options are built best bound first and bounded (hydraulis.h): the same micro-batches, v and
// per-v caps as building every option, and the bounds stay below the objectives they stand for.
TEST(HydraulisBatcherTest, BoundingChoosesAsBuildingEveryOption) {
  struct Case {
    std::string model;
    Layout layout;
    bool encdec;
  };
  const Case cases[] = {{"gpt-6.7b", {2, 4, 1}, false}, {"gpt-6.7b", {4, 2, 1}, false},
                        {"gpt-6.7b", {2, 1, 4}, false}, {"gpt-6.7b", {1, 8, 1}, false},
                        {"t5-11b", {1, 2, 4}, true}};
  int64_t bounded = 0;
  for (const Case& c : cases) {
    const auto setup =
        MakeTestSetup(c.model, TestParallel(c.layout.dp, c.layout.pp, c.layout.tp));
    const StageCostEvaluator& eval = setup->evaluator();
    for (uint64_t seed = 0; seed < 6; ++seed) {
      const std::vector<Sample> batch = c.encdec ? RandomBatch(seed, 40 + 10 * seed, 1024, true)
                                                 : LongTailBatch(seed + 30, 30 + 20 * seed,
                                                                 kMaxSeqlen);
      for (const std::optional<Recompute> rc :
           {std::optional<Recompute>(), std::optional<Recompute>(Recompute::kSelective)}) {
        BatchingOptions o = Options(seed);
        o.recompute = rc;
        HydraulisPackDetail fast, every;
        every.exhaustive = true;
        const auto a = HydraulisPackReplica(batch, eval, o, &fast);
        const auto b = HydraulisPackReplica(batch, eval, o, &every);
        ASSERT_TRUE(a.ok() && b.ok());
        SCOPED_TRACE(fmt::format("{} pp {} seed {} {}", c.model, c.layout.pp, seed,
                                 rc ? RecomputeName(*rc) : "any level"));
        EXPECT_EQ(a->outcome, b->outcome);
        EXPECT_EQ(a->micro_batches, b->micro_batches);
        EXPECT_EQ(fast.chosen_v, every.chosen_v);
        EXPECT_EQ(fast.tried_v, every.tried_v);
        ASSERT_EQ(fast.objective.size(), every.objective.size());
        for (size_t k = 0; k < fast.objective.size(); ++k) {
          EXPECT_FALSE(every.bounded[k]);
          if (fast.bounded[k]) {
            ++bounded;
            EXPECT_LE(fast.objective[k], every.objective[k]);
            EXPECT_GE(fast.objective[k], every.objective[std::min_element(every.objective.begin(),
                                                                          every.objective.end()) -
                                                          every.objective.begin()]);
          } else {
            EXPECT_EQ(fast.objective[k], every.objective[k]);
            EXPECT_EQ(fast.token_cap[k], every.token_cap[k]);
          }
        }
      }
    }
  }
  EXPECT_GT(bounded, 0);  // the bound did prune here
}

TEST(HydraulisBatcherTest, RespectsAFixedRecomputeLevel) {
  const auto setup = Gpt(2, 4);
  const StageCostEvaluator& eval = setup->evaluator();
  const std::vector<Sample> batch = LongTailBatch(6, 50, 2048);
  for (Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    BatchingOptions o = Options();
    o.recompute = rc;
    const auto rb = MakeHydraulisBatcher()->Build(batch, eval, o);
    ASSERT_TRUE(rb.ok());
    // Without recompute three 2048-token micro-batches in flight overflow stage 0 on pp = 4.
    if (rc != Recompute::kFull && rb->outcome == PlanOutcome::kOutOfMemory) {
      EXPECT_NE(rb->infeasible_reason.find("S_cap"), std::string::npos);
      continue;
    }
    ExpectValidPack(*rb, batch, eval);
    for (const MicroBatch& mb : rb->micro_batches) EXPECT_EQ(mb.recompute, rc);
  }
}

TEST(HydraulisBatcherTest, ChoosesTheCheapestLevelThatFitsPerMicroBatch) {
  const auto setup = Gpt(2, 4);
  const StageCostEvaluator& eval = setup->evaluator();
  // A 4096-token sequence needs recompute on pp = 4; the rest may run without.
  const std::vector<Sample> batch = LongTailBatch(6, 50, kMaxSeqlen);
  BatchingOptions none_only = Options();
  none_only.recompute = Recompute::kNone;
  const auto strict = MakeHydraulisBatcher()->Build(batch, eval, none_only);
  ASSERT_TRUE(strict.ok());
  EXPECT_EQ(strict->outcome, PlanOutcome::kOutOfMemory);
  EXPECT_NE(strict->infeasible_reason.find("budget"), std::string::npos)
      << strict->infeasible_reason;
  const auto rb = MakeHydraulisBatcher()->Build(batch, eval, Options());
  ASSERT_TRUE(rb.ok());
  ExpectValidPack(*rb, batch, eval);
  // Local optimality: lowering any micro-batch's level is slower or breaks the memory rule.
  const BatchIndex index(batch);
  bool some_recompute = false, some_none = false;
  for (size_t j = 0; j < rb->micro_batches.size(); ++j) {
    const MicroBatch& mb = rb->micro_batches[j];
    (mb.recompute == Recompute::kNone ? some_none : some_recompute) = true;
    for (Recompute lighter : {Recompute::kNone, Recompute::kSelective}) {
      if (static_cast<int>(lighter) >= static_cast<int>(mb.recompute)) break;
      std::vector<MicroBatch> changed = rb->micro_batches;
      changed[j].recompute = lighter;
      ASSERT_TRUE(PriceMicroBatch(eval, index, &changed[j]));
      EXPECT_TRUE(changed[j].Bottleneck() >= mb.Bottleneck() ||
                  !CheckSequenceMemory(eval, changed).empty())
          << "micro-batch " << j << " could run at " << RecomputeName(lighter);
    }
  }
  EXPECT_TRUE(some_recompute);
}

TEST(HydraulisBatcherTest, EncoderDecoderPacksVarlenRows) {
  const auto setup = MakeTestSetup("t5-11b", TestParallel(1, 2, 4));
  const StageCostEvaluator& eval = setup->evaluator();
  const std::vector<Sample> batch = RandomBatch(1, 60, 1024, true);
  HydraulisPackDetail detail;
  const auto rb = HydraulisPackReplica(batch, eval, Options(), &detail);
  ASSERT_TRUE(rb.ok()) << rb.status().ToString();
  ASSERT_EQ(rb->outcome, PlanOutcome::kOk) << rb->infeasible_reason;
  int64_t tokens = 0;
  for (const Sample& s : batch) tokens += s.input_len + s.target_len;
  EXPECT_EQ(detail.total_tokens, tokens);
  // Fewer micro-batches than samples: sequences really are packed, one varlen row each.
  EXPECT_LT(rb->micro_batches.size(), batch.size());
  for (const MicroBatch& mb : rb->micro_batches) {
    EXPECT_TRUE(mb.varlen);
    EXPECT_EQ(mb.rows.size(), 1u);
    EXPECT_LT(mb.PaddingFraction(), 0.02);
  }
  std::vector<int64_t> ids = SampleIdsOf(rb->micro_batches);
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, SortedIds(batch));
  EXPECT_EQ(CheckSequenceMemory(eval, rb->micro_batches), "");
  // Stage 1 still works for encoder-decoder models (with padded per-sample costs).
  const auto replicas = MakeHydraulisAssigner()->Assign(batch, setup->evaluator(), Options());
  ASSERT_EQ(replicas.size(), 1u);
  EXPECT_EQ(replicas[0].size(), batch.size());
}

TEST(HydraulisBatcherTest, ImpossibleMemoryIsOutOfMemory) {
  const auto base = Gpt(2, 4);
  Bytes states;
  for (const ModelStateMemory& m : base->evaluator().stage_states()) {
    states = std::max(states, m.total());
  }
  ParallelConfig tight = base->parallel;
  tight.memory_limit = states + Bytes::MB(20);
  const auto setup = MakeTestSetup("gpt-6.7b", tight);
  const std::vector<Sample> batch = LongTailBatch(1, 30, kMaxSeqlen);
  const auto rb = MakeHydraulisBatcher()->Build(batch, setup->evaluator(), Options());
  ASSERT_TRUE(rb.ok()) << rb.status().ToString();
  EXPECT_EQ(rb->outcome, PlanOutcome::kOutOfMemory);
  EXPECT_NE(rb->infeasible_reason.find("budget"), std::string::npos) << rb->infeasible_reason;
}

TEST(HydraulisBatcherTest, EmptyAndOverlongInputs) {
  const auto setup = Gpt();
  const auto empty = MakeHydraulisBatcher()->Build({}, setup->evaluator(), Options());
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->micro_batches.empty());
  const std::vector<Sample> batch = {Sample{3, 5000, 0, 0}};
  const auto rb = MakeHydraulisBatcher()->Build(batch, setup->evaluator(), Options());
  ASSERT_FALSE(rb.ok());
  EXPECT_NE(rb.status().message().find("sample id 3"), std::string::npos);
}

}  // namespace
}  // namespace sluice
