// Heterogeneous replicas: the configuration's checks and text forms, the per-layer-range
// reduction groups on a sweep of mixes, stage 1 across shapes (long sequences only where they
// fit), and whole iterations planned, validated and simulated without deadlock.
#include "planner/hetero.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "batching/test_util.h"
#include "cost/comm_model.h"
#include "cost/layer_work.h"
#include "model/chunk_cut.h"
#include "plan/validate.h"
#include "planner/config_search.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using testing::MakeTestSetup;
using testing::RandomTokenBatch;
using testing::TestCost;
using testing::TestParallel;

ParallelConfig Group(int64_t dp, int64_t tp, int64_t pp = 1, int64_t cp = 1,
                     double limit_mb = 36000) {
  ParallelConfig p = TestParallel(dp, pp, tp, limit_mb, /*zero=*/1);
  p.cp = cp;
  return p;
}

ParallelConfig Zero2(ParallelConfig p) {
  p.zero = 2;
  return p;
}

// gpt-6.7b on 16 a100-40g (two nodes), analytic costs.
std::unique_ptr<testing::TestSetup> Setup16() {
  return MakeTestSetup("gpt-6.7b", TestParallel(2, 8, 1, 36000), TestCost::kAnalytic);
}

TEST(HeteroConfigTest, ParsesTextAndJsonAndRoundTrips) {
  StatusOr<HeteroConfig> h = ResolveHetero("dp=4,tp=2;dp=1,tp=8,memory_limit_mb=30000", "--r");
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_EQ(h->groups.size(), 2u);
  EXPECT_EQ(h->groups[0].dp, 4);
  EXPECT_EQ(h->groups[0].tp, 2);
  EXPECT_EQ(h->groups[1].tp, 8);
  EXPECT_EQ(h->devices(), 16);
  EXPECT_EQ(h->replicas(), 5);
  EXPECT_EQ(h->DeviceOffsets(), (std::vector<int64_t>{0, 8}));
  EXPECT_EQ(DescribeHetero(*h), "4 x tp 2 + 1 x tp 8 (30000 MB)");
  StatusOr<HeteroConfig> back = HeteroConfigFromJson(HeteroConfigToJson(*h), "j");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, *h);
}

TEST(HeteroConfigTest, BadSpecsNameTheGroupFieldAndAllowedValues) {
  auto error = [](std::string_view spec) {
    StatusOr<HeteroConfig> h = ResolveHetero(spec, "--replicas");
    EXPECT_FALSE(h.ok()) << spec;
    return h.ok() ? std::string() : std::string(h.status().message());
  };
  EXPECT_THAT(error("dp=4,tq=2"), HasSubstr("group 1"));
  EXPECT_THAT(error("dp=4,tq=2"), HasSubstr("allowed keys"));
  EXPECT_THAT(error("dp=4;dp=0,tp=8"), HasSubstr("group 2"));
  EXPECT_THAT(error("nonexistent-file"), HasSubstr("no such file"));
  EXPECT_FALSE(HeteroConfigFromJson(nlohmann::json{{"groups", 1}}, "f.json").ok());

  auto setup = Setup16();
  const ModelSpec& model = setup->cost->model();
  auto fits = [&](const HeteroConfig& h) {
    Status s = CheckHeteroFits(h, model, setup->cluster, "--replicas");
    EXPECT_FALSE(s.ok());
    return std::string(s.message());
  };
  // Does not cover the 16 devices.
  const std::string cover = fits(HeteroConfig{.groups = {Group(2, 2), Group(1, 8)}});
  EXPECT_THAT(cover, HasSubstr("use 12 devices"));
  EXPECT_THAT(cover, HasSubstr("has 16"));
  EXPECT_THAT(cover, HasSubstr("allowed: groups summing to 16"));
  ParallelConfig vpp = Group(4, 2);
  vpp.vpp = 2;
  EXPECT_THAT(fits(HeteroConfig{.groups = {vpp, Group(1, 8)}}), HasSubstr("field 'vpp'"));
  ParallelConfig zero2 = Group(4, 2);
  zero2.zero = 2;
  EXPECT_THAT(fits(HeteroConfig{.groups = {Group(1, 8), zero2}}),
              HasSubstr("group 2: field 'zero' is 2 but group 1's is 1"));
  ParallelConfig zero3 = zero2;
  zero3.zero = 3;
  EXPECT_THAT(fits(HeteroConfig{.groups = {zero3, zero3}}), HasSubstr("allowed: 0, 1, 2"));
  EXPECT_THAT(fits(HeteroConfig{.groups = {Group(1, 3), Group(13, 1)}}), HasSubstr("group 1"));
  EXPECT_THAT(fits(HeteroConfig{}), HasSubstr("no replica group"));
  EXPECT_TRUE(CheckHeteroFits(HeteroConfig{.groups = {Group(4, 2), Group(1, 8)}}, model,
                              setup->cluster, "--replicas")
                  .ok());
}

// Every range lies inside exactly one stage of every group, the ranges partition the layers, the
// cuts are the union of the groups' cuts, and the parameters add up to the model's.
TEST(ReductionGroupsTest, SweepOfMixes) {
  auto setup = Setup16();
  const ModelSpec& model = setup->cost->model();
  const int64_t total = model.layers * AnalyticLayerParams(model, LayerKind::kEncoder, 1) +
                        AnalyticLayerParams(model, LayerKind::kEmbedding, 1) +
                        AnalyticLayerParams(model, LayerKind::kOutputHead, 1);
  const std::vector<std::vector<int64_t>> pps = {{1},    {1, 2},    {2, 4},    {4, 8}, {1, 8},
                                                 {2, 8}, {1, 2, 4}, {8, 4, 2}, {4, 4}, {16, 2}};
  for (const std::vector<int64_t>& pp : pps) {
    HeteroConfig h;
    std::set<int64_t> cuts = {0, model.layers};
    for (int64_t p : pp) {
      h.groups.push_back(Group(1, 1, p));
      for (int64_t s = 1; s < p; ++s) cuts.insert(s * model.layers / p);
    }
    const std::vector<ReductionGroup> groups = ReductionGroupsOf(model, h);
    ASSERT_EQ(groups.size() + 1, cuts.size());
    int64_t next = 0, params = 0;
    for (size_t i = 0; i < groups.size(); ++i) {
      const ReductionGroup& r = groups[i];
      EXPECT_EQ(r.first_layer, next);
      EXPECT_GT(r.layers, 0);
      EXPECT_TRUE(cuts.contains(r.first_layer));
      EXPECT_EQ(r.embedding, i == 0);
      EXPECT_EQ(r.output_head, i + 1 == groups.size());
      next += r.layers;
      params += r.params;
      ASSERT_EQ(r.members.size(), pp.size());
      for (size_t g = 0; g < pp.size(); ++g) {
        EXPECT_EQ(r.members[g].group, static_cast<int64_t>(g));
        const std::vector<ChunkCut> chunks = CutIntoChunks(model, pp[g], {});
        const ChunkCut& c = chunks[r.members[g].stage];
        EXPECT_LE(c.first_encoder_layer, r.first_layer);
        EXPECT_GE(c.first_encoder_layer + c.encoder_layers, r.first_layer + r.layers);
      }
    }
    EXPECT_EQ(next, model.layers);
    EXPECT_EQ(params, total);
    // One group: nothing crosses groups.
    if (pp.size() == 1) {
      for (const ReductionGroup& r : groups) {
        EXPECT_EQ(PriceReduction(r, h, setup->cluster), Duration::Zero());
      }
    } else {
      for (const ReductionGroup& r : groups) {
        EXPECT_GT(PriceReduction(r, h, setup->cluster), Duration::Zero());
      }
    }
  }
}

// Cross-group traffic is priced like the collective model's all-reduce of the largest shard.
TEST(ReductionGroupsTest, PriceIsTheAllReduceOfTheLargestShard) {
  auto setup = Setup16();
  const ModelSpec& model = setup->cost->model();
  const HeteroConfig h{.groups = {Group(1, 8), Group(1, 4, 2)}};  // 8 + 8 devices, dp 1 each
  const std::vector<ReductionGroup> groups = ReductionGroupsOf(model, h);
  ASSERT_EQ(groups.size(), 2u);
  const AlphaBetaCommModel comm(setup->cluster);
  for (const ReductionGroup& r : groups) {
    EXPECT_EQ(PriceReduction(r, h, setup->cluster),
              comm.Collective(CollectiveKind::kAllReduce, Bytes::Of(2 * r.params / 4),
                              CollectiveRing{.members = 2, .spans_nodes = true}));
  }
}

// With copies of a shard (cp x dp > 1) each copy carries its share across groups; ZeRO-1 then
// gathers the shard in the group, ZeRO-2 leaves that to the plan's parameter all-gather.
TEST(ReductionGroupsTest, CopiesShareTheCrossTrafficAndZero1Gathers) {
  auto setup = Setup16();
  const ModelSpec& model = setup->cost->model();
  const HeteroConfig z1{.groups = {Group(1, 2, 1, 4), Group(4, 2)}};  // 8 + 8 devices
  const HeteroConfig z2{.groups = {Zero2(Group(1, 2, 1, 4)), Zero2(Group(4, 2))}};
  const ReductionGroup r = ReductionGroupsOf(model, z1)[0];
  const AlphaBetaCommModel comm(setup->cluster);
  const Duration cross =
      comm.Collective(CollectiveKind::kAllReduce, Bytes::Of(2 * r.params / (2 * 4)),
                      CollectiveRing{.members = 2, .spans_nodes = true});
  EXPECT_EQ(PriceReduction(r, z2, setup->cluster), cross);
  const Duration gather = comm.Collective(CollectiveKind::kAllGather, Bytes::Of(2 * r.params / 2),
                                          CollectiveRing{.members = 4});
  EXPECT_EQ(PriceReduction(r, z1, setup->cluster), cross + gather);
}

std::vector<Sample> MixedBatch(int64_t long_len, int64_t longs) {
  std::vector<Sample> batch = RandomTokenBatch(7, 24000, 2048, false);
  for (int64_t i = 0; i < longs; ++i) {
    batch.push_back(Sample{.id = static_cast<int64_t>(batch.size()), .input_len = long_len});
  }
  return batch;
}

HeteroPlannerOptions Options(const std::string& method = "hydraulis") {
  HeteroPlannerOptions o;
  o.planner.method = method;
  o.planner.batching.max_seqlen = 8192;
  return o;
}

// The narrow group cannot hold the long sequences: they all go to the wide one, every sample
// lands exactly once, each group's plan is valid, and the iteration simulates without deadlock
// or running out of memory; its time lies between the slowest group's and that plus the whole
// cross-group reduction (overlapped with what is still running).
TEST(HeteroPlannerTest, LongSequencesGoWideAndTheIterationSimulates) {
  auto setup = Setup16();
  const HeteroConfig h{.groups = {Group(1, 8), Group(4, 2, 1, 1, 30000)}};
  StatusOr<HeteroPlanner> planner =
      HeteroPlanner::Create(*setup->cost, h, setup->cluster, Options());
  ASSERT_TRUE(planner.ok()) << planner.status().ToString();
  const std::vector<int64_t>& caps = planner->capacities();
  ASSERT_LT(caps[1], 8192);
  ASSERT_GE(caps[0], 8192);
  const std::vector<Sample> batch = MixedBatch(8192, 3);
  StatusOr<HeteroPlanResult> r = planner->Plan(batch);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->outcome, PlanOutcome::kOk) << r->infeasible_reason;
  std::vector<int64_t> ids;
  for (size_t g = 0; g < r->groups.size(); ++g) {
    const ExecutionPlan& plan = r->groups[g].plan;
    EXPECT_TRUE(ValidatePlan(plan).ok()) << ValidatePlan(plan).ToString();
    EXPECT_EQ(plan.parallel, h.groups[g]);
    ids.insert(ids.end(), plan.sample_ids.begin(), plan.sample_ids.end());
    for (const Sample& s : r->samples[g]) EXPECT_LE(s.input_len + s.target_len, caps[g]);
  }
  for (const Sample& s : r->samples[1]) EXPECT_LT(s.input_len, 8192);
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, testing::SortedIds(batch));
  EXPECT_GT(r->cross_sync, Duration::Zero());
  StatusOr<HeteroSimResult> sim = SimulateHetero(*r, SimOptions{});
  ASSERT_TRUE(sim.ok()) << sim.status().ToString();
  EXPECT_EQ(sim->outcome, SimOutcome::kOk) << sim->problem;
  EXPECT_FALSE(sim->memory_exceeded) << sim->problem;
  Duration slowest;
  for (const SimResult& g : sim->groups) slowest = std::max(slowest, g.iteration_time);
  EXPECT_EQ(sim->slowest_group, slowest);
  EXPECT_GE(sim->iteration_time, slowest);
  EXPECT_LE(sim->iteration_time, slowest + r->cross_sync);
  EXPECT_EQ(sim->cross_exposed, sim->iteration_time - slowest);
  int64_t tokens = 0;
  for (const Sample& s : batch) tokens += s.input_len + s.target_len;
  EXPECT_EQ(sim->real_tokens, tokens);
}

// A 4-layer model on two groups: group 0 is pp 2 (stage 0 holds layers 0-1, stage 1 layers
// 2-3), group 1 pp 1; one piece per range (layers 0-1 and 2-3).
struct OverlapCase {
  std::vector<ReductionGroup> pieces;
  std::vector<ParallelConfig> groups;
};
OverlapCase TwoRanges(Duration price0, Duration price1) {
  OverlapCase c;
  ParallelConfig a, b;
  a.pp = 2;
  c.groups = {a, b};
  c.pieces.resize(2);
  c.pieces[0].first_layer = 0;
  c.pieces[0].layers = 2;
  c.pieces[0].members = {{0, 0}, {1, 0}};
  c.pieces[0].cross_group_time = price0;
  c.pieces[1].first_layer = 2;
  c.pieces[1].layers = 2;
  c.pieces[1].members = {{0, 1}, {1, 0}};
  c.pieces[1].cross_group_time = price1;
  return c;
}

Duration Ms(int64_t ms) { return Duration::Millis(static_cast<double>(ms)); }

// A rank whose last backward runs [b0, b1], reduced at `reduced`, finished at `finish`.
RankTiming Rank(int64_t b0, int64_t b1, int64_t reduced, int64_t finish) {
  return {.backward_start = Ms(b0), .backward_end = Ms(b1), .reduced = Ms(reduced),
          .finish = Ms(finish)};
}

TEST(OverlapCrossSyncTest, APieceReadyEarlyIsReducedWhileOthersStillCompute) {
  const OverlapCase c = TwoRanges(Ms(10), Ms(10));
  // Group 0: stage 0's backward ends at 100, stage 1's at 60; group 1's single stage runs its
  // last backward 60-100 (layers 3..0: layers 2-3 are done by 80). No reduction lag, no tails.
  const std::vector<std::vector<RankTiming>> t = {
      {Rank(90, 100, 100, 100), Rank(50, 60, 60, 60)}, {Rank(60, 100, 100, 100)}};
  const OverlappedSync o = OverlapCrossSync(c.pieces, 4, t, c.groups);
  // Piece 1 (layers 2-3) is ready at 80 and done at 90, hidden; piece 0 ready at 100, done 110.
  EXPECT_EQ(o.slowest_group, Ms(100));
  EXPECT_EQ(o.iteration_time, Ms(110));
  EXPECT_EQ(o.exposed, Ms(10));  // fully serial: 20
}

TEST(OverlapCrossSyncTest, PiecesShareOneChannelAndTailsWait) {
  const OverlapCase c = TwoRanges(Ms(30), Ms(30));
  // Group 0 stage 1 reduces by 95 and then has a 5 ms tail (a ZeRO-2 gather).
  const std::vector<std::vector<RankTiming>> t = {
      {Rank(90, 100, 100, 100), Rank(85, 90, 95, 100)}, {Rank(80, 90, 90, 90)}};
  const OverlappedSync o = OverlapCrossSync(c.pieces, 4, t, c.groups);
  // Piece 1: stage 1 of group 0 is ready at 95 (its lag 5 after the backward), group 1's
  // layers 2-3 at 85; done 95-125 (+5 tail = 130). Piece 0 waits for the channel: 125-155.
  EXPECT_EQ(o.iteration_time, Ms(155));
  EXPECT_EQ(o.exposed, Ms(55));
  EXPECT_LE(o.iteration_time, o.slowest_group + Ms(60) + Ms(5));
}

TEST(OverlapCrossSyncTest, ATailAfterTheLastPieceCounts) {
  const OverlapCase c = TwoRanges(Ms(10), Ms(0));
  const std::vector<std::vector<RankTiming>> t = {
      {Rank(40, 50, 50, 58), Rank(40, 50, 50, 50)}, {Rank(40, 50, 50, 50)}};
  const OverlappedSync o = OverlapCrossSync(c.pieces, 4, t, c.groups);
  EXPECT_EQ(o.slowest_group, Ms(58));
  EXPECT_EQ(o.iteration_time, Ms(68));  // piece 0 done at 60, then stage 0's 8 ms tail
}

TEST(OverlapCrossSyncTest, SplitPiecesPartitionEachRangeAndKeepItsParams) {
  auto setup = Setup16();
  const HeteroConfig h{.groups = {Group(1, 4, 2), Group(2, 2, 2)}};
  const std::vector<ReductionGroup> ranges = ReductionGroupsOf(setup->cost->model(), h);
  for (int64_t n : {1, 3, 4, 100}) {
    const std::vector<ReductionGroup> pieces =
        SplitReductions(ranges, setup->cost->model(), h, setup->cluster, n);
    int64_t next = 0, params = 0;
    for (const ReductionGroup& p : pieces) {
      EXPECT_EQ(p.first_layer, next);
      EXPECT_GT(p.layers, 0);
      EXPECT_GT(p.cross_group_time, Duration::Zero());
      next += p.layers;
      params += p.params;
    }
    EXPECT_EQ(next, setup->cost->model().layers);
    int64_t want = 0;
    for (const ReductionGroup& r : ranges) want += r.params;
    EXPECT_EQ(params, want);
    EXPECT_TRUE(pieces.front().embedding);
    EXPECT_TRUE(pieces.back().output_head);
  }
}

// Valid, deadlock-free iterations over a sweep of mixes and methods.
TEST(HeteroPlannerTest, SweepOfMixesPlansValidAndSimulates) {
  auto setup = Setup16();
  const std::vector<HeteroConfig> mixes = {
      {.groups = {Group(1, 8), Group(4, 2)}},
      {.groups = {Group(1, 4, 2), Group(2, 2, 2)}},
      {.groups = {Group(1, 2, 1, 4), Group(2, 4)}},
      {.groups = {Group(1, 8), Group(1, 4), Group(2, 2)}},
      {.groups = {Zero2(Group(1, 2, 1, 4)), Zero2(Group(4, 1, 1, 2))}},
  };
  const std::vector<Sample> batch = MixedBatch(4096, 2);
  for (const std::string method : {"hydraulis", "dynapipe"}) {
    for (const HeteroConfig& h : mixes) {
      StatusOr<HeteroPlanner> planner =
          HeteroPlanner::Create(*setup->cost, h, setup->cluster, Options(method));
      ASSERT_TRUE(planner.ok()) << DescribeHetero(h) << ": " << planner.status().ToString();
      StatusOr<HeteroPlanResult> r = planner->Plan(batch);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      ASSERT_EQ(r->outcome, PlanOutcome::kOk) << DescribeHetero(h) << ": " << r->infeasible_reason;
      for (const PlanResult& g : r->groups) EXPECT_TRUE(ValidatePlan(g.plan).ok());
      // The refinement rounds keep the best round: never worse than stage 1 once.
      HeteroPlannerOptions once = Options(method);
      once.refine_rounds = 0;
      StatusOr<HeteroPlanner> single = HeteroPlanner::Create(*setup->cost, h, setup->cluster, once);
      ASSERT_TRUE(single.ok());
      StatusOr<HeteroPlanResult> r0 = single->Plan(batch);
      ASSERT_TRUE(r0.ok());
      if (r0->outcome == PlanOutcome::kOk) {
        EXPECT_LE(r->makespan, r0->makespan);
      }
      StatusOr<HeteroSimResult> sim = SimulateHetero(*r, SimOptions{});
      ASSERT_TRUE(sim.ok()) << sim.status().ToString();
      EXPECT_EQ(sim->outcome, SimOutcome::kOk) << DescribeHetero(h) << ": " << sim->problem;
      EXPECT_GT(sim->iteration_time, Duration::Zero());
    }
  }
}

// One group is the homogeneous planner: same plan, nothing across groups.
TEST(HeteroPlannerTest, OneGroupIsTheHomogeneousPlanner) {
  auto setup = Setup16();
  const ParallelConfig par = Group(4, 2, 2);
  const HeteroConfig h{.groups = {par}};
  const HeteroPlannerOptions o = Options();
  StatusOr<HeteroPlanner> hetero = HeteroPlanner::Create(*setup->cost, h, setup->cluster, o);
  ASSERT_TRUE(hetero.ok()) << hetero.status().ToString();
  StatusOr<Planner> homo = Planner::Create(*setup->cost, par, setup->cluster, o.planner);
  ASSERT_TRUE(homo.ok()) << homo.status().ToString();
  const std::vector<Sample> batch = MixedBatch(2048, 0);
  StatusOr<HeteroPlanResult> a = hetero->Plan(batch);
  StatusOr<PlanResult> b = homo->Plan(batch);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->outcome, PlanOutcome::kOk);
  EXPECT_EQ(a->groups[0].plan, b->plan);
  EXPECT_EQ(a->cross_sync, Duration::Zero());
}

// Mixes of two and three groups (ZeRO-2 among them) that the scale tests run on.
std::vector<HeteroConfig> ScaleMixes() {
  return {
      {.groups = {Group(1, 8), Group(4, 2)}},
      {.groups = {Group(1, 4, 2), Group(2, 2, 2)}},
      {.groups = {Group(1, 8), Group(1, 4), Group(2, 2)}},
      {.groups = {Zero2(Group(1, 2, 1, 4)), Zero2(Group(4, 1, 1, 2))}},
  };
}

// HeteroPlanResult::scale is what the kept round's groups planned over stage 1's time for them,
// and Screen prices a batch as stage 1 with those scales plus the syncs, without planning it.
TEST(HeteroPlannerTest, ScreenIsStageOneWithTheScalesOfAFullPlan) {
  auto setup = Setup16();
  const std::vector<Sample> batch = MixedBatch(4096, 2);
  const std::vector<Sample> next = MixedBatch(4096, 3);
  for (const HeteroConfig& h : ScaleMixes()) {
    SCOPED_TRACE(DescribeHetero(h));
    StatusOr<HeteroPlanner> planner =
        HeteroPlanner::Create(*setup->cost, h, setup->cluster, Options());
    ASSERT_TRUE(planner.ok()) << planner.status().ToString();
    StatusOr<HeteroPlanResult> r = planner->Plan(batch);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->outcome, PlanOutcome::kOk) << r->infeasible_reason;
    ASSERT_EQ(r->scale.size(), h.groups.size());
    for (size_t g = 0; g < h.groups.size(); ++g) {
      ASSERT_GT(r->dispatch.group_time[g], 0);
      EXPECT_NEAR(r->scale[g] * static_cast<double>(r->dispatch.group_time[g]),
                  static_cast<double>(r->groups[g].makespan.nanos()), 1.0);
    }
    for (const std::vector<Sample>* b : {&batch, &next}) {
      const HeteroDispatch d = planner->Dispatch(*b, r->scale);
      ASSERT_TRUE(d.ok);
      Duration expected;
      for (size_t g = 0; g < h.groups.size(); ++g) {
        expected = std::max(
            expected,
            Duration::Nanos(
                static_cast<int64_t>(r->scale[g] * static_cast<double>(d.group_time[g]))) +
                EstimateGradientSync(planner->group_planner(static_cast<int64_t>(g)).evaluator(),
                                     setup->cluster));
      }
      for (const ReductionGroup& red : planner->reductions()) expected += red.cross_group_time;
      EXPECT_EQ(planner->Screen(*b, r->scale), expected);
    }
    // On the batch its scales came from, the screen lands near the plan: what the dynamic
    // strategy choice's margin relies on (compare_dynamic.h).
    const std::optional<Duration> again = planner->Screen(batch, r->scale);
    ASSERT_TRUE(again.has_value());
    EXPECT_NEAR(again->millis() / r->makespan.millis(), 1.0, 0.15);
  }
}

// PlanFrom (sluice-dynamic's quick refresh): stage 1 once with the given scales, so its sequences
// go where Dispatch with those scales sends them; its plans are valid; its scale is its own plan
// over stage 1's time, as Plan's; without scales (or with another count) it is Plan with no
// refine rounds; and Plan, which refines, is never worse than PlanFrom without scales.
TEST(HeteroPlannerTest, PlanFromIsStageOneOnceWithTheGivenScales) {
  auto setup = Setup16();
  const std::vector<Sample> batch = MixedBatch(4096, 2);
  const std::vector<Sample> next = MixedBatch(4096, 3);
  for (const HeteroConfig& h : ScaleMixes()) {
    SCOPED_TRACE(DescribeHetero(h));
    StatusOr<HeteroPlanner> planner =
        HeteroPlanner::Create(*setup->cost, h, setup->cluster, Options());
    ASSERT_TRUE(planner.ok()) << planner.status().ToString();
    StatusOr<HeteroPlanResult> full = planner->Plan(batch);
    ASSERT_TRUE(full.ok() && full->outcome == PlanOutcome::kOk);
    StatusOr<HeteroPlanResult> quick = planner->PlanFrom(next, full->scale);
    ASSERT_TRUE(quick.ok()) << quick.status().ToString();
    ASSERT_EQ(quick->outcome, PlanOutcome::kOk) << quick->infeasible_reason;
    EXPECT_EQ(quick->dispatch.replica_of, planner->Dispatch(next, full->scale).replica_of);
    ASSERT_EQ(quick->scale.size(), h.groups.size());
    for (size_t g = 0; g < h.groups.size(); ++g) {
      EXPECT_TRUE(ValidatePlan(quick->groups[g].plan).ok());
      EXPECT_NEAR(quick->scale[g] * static_cast<double>(quick->dispatch.group_time[g]),
                  static_cast<double>(quick->groups[g].makespan.nanos()), 1.0);
    }
    HeteroPlannerOptions once = Options();
    once.refine_rounds = 0;
    StatusOr<HeteroPlanner> single = HeteroPlanner::Create(*setup->cost, h, setup->cluster, once);
    ASSERT_TRUE(single.ok());
    StatusOr<HeteroPlanResult> r0 = single->Plan(next);
    StatusOr<HeteroPlanResult> unscaled = planner->PlanFrom(next, {});
    StatusOr<HeteroPlanResult> other_count = planner->PlanFrom(next, std::vector<double>{2.0});
    StatusOr<HeteroPlanResult> refined = planner->Plan(next);
    ASSERT_TRUE(r0.ok() && unscaled.ok() && other_count.ok() && refined.ok());
    EXPECT_EQ(unscaled->makespan, r0->makespan);
    EXPECT_EQ(unscaled->dispatch.replica_of, r0->dispatch.replica_of);
    EXPECT_EQ(other_count->dispatch.replica_of, r0->dispatch.replica_of);
    EXPECT_LE(refined->makespan, unscaled->makespan);
  }
}

TEST(HeteroPlannerTest, ASampleNoGroupHoldsIsInfeasibleWithTheReason) {
  auto setup = Setup16();
  const HeteroConfig h{.groups = {Group(4, 2, 1, 1, 30000), Group(4, 2, 1, 1, 30000)}};
  StatusOr<HeteroPlanner> planner =
      HeteroPlanner::Create(*setup->cost, h, setup->cluster, Options());
  ASSERT_TRUE(planner.ok()) << planner.status().ToString();
  ASSERT_LT(planner->capacities()[0], 8192);
  StatusOr<HeteroPlanResult> r = planner->Plan(MixedBatch(8192, 1));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->outcome, PlanOutcome::kOutOfMemory);
  EXPECT_THAT(r->infeasible_reason, HasSubstr("fits no replica group"));
  EXPECT_THAT(r->infeasible_reason, HasSubstr("8192 tokens"));
  EXPECT_EQ(planner->Screen(MixedBatch(8192, 1), std::vector<double>{1.0, 1.0}), std::nullopt);
}

TEST(HeteroSearchTest, MixesCoverTheClusterAndTheSearchRanksThem) {
  auto setup = Setup16();
  const ModelSpec& model = setup->cost->model();
  const std::vector<HeteroConfig> mixes =
      EnumerateHeteroMixes(model, setup->cluster, 1, Bytes::MB(36000), std::nullopt);
  ASSERT_FALSE(mixes.empty());
  for (const HeteroConfig& h : mixes) {
    ASSERT_EQ(h.groups.size(), 2u);
    EXPECT_EQ(h.devices(), 16);
    EXPECT_GT(h.groups[0].tp * h.groups[0].cp, h.groups[1].tp * h.groups[1].cp);
  }
  // A few of them on one batch: the best is simulated and feasible.
  std::vector<HeteroConfig> some(mixes.begin(), mixes.begin() + std::min<size_t>(6, mixes.size()));
  GlobalBatch b;
  b.samples = MixedBatch(4096, 2);
  for (const Sample& s : b.samples) b.tokens += s.input_len + s.target_len;
  const std::vector<GlobalBatch> score = {b};
  StatusOr<HeteroSearch> s =
      SearchHetero(*setup->cost, setup->cluster, some, score, Options(), SimOptions{}, 2);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(s->ranked.size(), some.size());
  ASSERT_TRUE(s->best.has_value());
  EXPECT_TRUE(s->best->simulated);
  EXPECT_GT(s->best->simulated_tokens_per_s, 0);
  for (size_t i = 1; i < s->ranked.size(); ++i) {
    if (s->ranked[i].feasible && s->ranked[i - 1].feasible && !s->ranked[i].simulated) {
      EXPECT_GE(s->ranked[i - 1].estimated_tokens_per_s, s->ranked[i].estimated_tokens_per_s);
    }
  }
}

}  // namespace
}  // namespace sluice
