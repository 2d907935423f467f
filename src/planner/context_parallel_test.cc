// Context parallelism through the whole chain: a cp configuration plans, validates, round-trips
// through the plan file, simulates, and its per-device costs and time are those of 1/cp of the
// sequences; the configuration search lists cp only where asked.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "batching/test_util.h"
#include "cost/comm_model.h"
#include "plan/plan_json.h"
#include "plan/validate.h"
#include "planner/config_search.h"
#include "planner/planner.h"
#include "sim/simulator.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using testing::MakeTestSetup;
using testing::RandomTokenBatch;
using testing::TestParallel;

// Eight 4,096-token sequences: attention-heavy enough for cp to matter.
std::vector<Sample> LongBatch() {
  std::vector<Sample> batch;
  for (int64_t i = 0; i < 8; ++i) batch.push_back(Sample{.id = i, .input_len = 4096});
  return batch;
}

struct Planned {
  PlanResult plan;
  SimResult sim;
};

Planned PlanAndSimulate(const ParallelConfig& par, std::span<const Sample> batch) {
  auto setup = MakeTestSetup("gpt-6.7b", par);
  PlannerOptions options;
  options.method = "multipack";
  options.schedule = ScheduleKind::k1F1B;
  options.batching.max_seqlen = 4096;
  StatusOr<Planner> planner =
      Planner::Create(*setup->cost, setup->parallel, setup->cluster, options);
  EXPECT_TRUE(planner.ok()) << planner.status().ToString();
  StatusOr<PlanResult> r = planner->Plan(batch);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->outcome, PlanOutcome::kOk) << r->infeasible_reason;
  StatusOr<SimResult> sim = Simulate(r->plan);
  EXPECT_TRUE(sim.ok()) << sim.status().ToString();
  return Planned{*r, *sim};
}

TEST(ContextParallelPlanTest, PlansValidateRoundTripAndSimulateFaster) {
  const std::vector<Sample> batch = LongBatch();
  ParallelConfig cp1 = TestParallel(1, 2, 2, 0);
  ParallelConfig cp2 = cp1;
  cp2.cp = 2;
  const Planned a = PlanAndSimulate(cp1, batch);
  const Planned b = PlanAndSimulate(cp2, batch);
  EXPECT_TRUE(ValidatePlan(b.plan.plan).ok()) << ValidatePlan(b.plan.plan).ToString();
  EXPECT_EQ(b.plan.plan.parallel.cp, 2);
  // Positions hold tp x cp = 4 devices: the plan's second pipeline rank is on devices 4..7.
  EXPECT_EQ(b.plan.plan.parallel.devices(), 8);
  StatusOr<ExecutionPlan> back =
      PlanFromJsonText(PlanToJsonText(b.plan.plan), "cp.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, b.plan.plan);
  EXPECT_NE(PlanToJsonText(b.plan.plan).find("\"cp\":2"), std::string::npos);
  // Same micro-batches, each device computing half of every sequence: the per-stage forward of
  // the first micro-batch is about half, and the simulated iteration clearly shorter.
  const ChunkCost& fa = a.plan.plan.replicas[0].micro_batches[0].stages[0];
  const ChunkCost& fb = b.plan.plan.replicas[0].micro_batches[0].stages[0];
  EXPECT_LT(fb.forward.seconds(), 0.6 * fa.forward.seconds());
  // Half the tokens per device: the same recompute level stores less, or cp frees enough memory
  // for a lighter level.
  const Recompute ra = a.plan.plan.replicas[0].micro_batches[0].recompute;
  const Recompute rb = b.plan.plan.replicas[0].micro_batches[0].recompute;
  EXPECT_LE(static_cast<int>(rb), static_cast<int>(ra));
  if (ra == rb) EXPECT_LT(fb.stored, fa.stored);
  // dp = 1: only cp = 2 reduces gradients (over the position's two cp ranks).
  auto reductions = [](const ExecutionPlan& plan) {
    int64_t n = 0;
    for (const RankProgram& p : plan.ranks) {
      for (const Instruction& in : p.instructions) n += IsCollective(in.op);
    }
    return n;
  };
  EXPECT_EQ(reductions(a.plan.plan), 0);
  EXPECT_GT(reductions(b.plan.plan), 0);
  ASSERT_EQ(a.sim.outcome, SimOutcome::kOk);
  ASSERT_EQ(b.sim.outcome, SimOutcome::kOk);
  EXPECT_LT(b.sim.iteration_time.seconds(), 0.7 * a.sim.iteration_time.seconds());
}

// Gradients are reduced over dp x cp: the simulator's collective of a dp 2 x cp 2 plan is a ring
// of 4 (closed form: exactly the alpha-beta all-reduce of 4 ranks; stepwise: within 2% of it).
TEST(ContextParallelSimTest, GradientRingSpansDpTimesCp) {
  ParallelConfig par = TestParallel(2, 1, 2, 0);
  par.cp = 2;
  const Planned p = PlanAndSimulate(par, LongBatch());
  const ExecutionPlan& plan = p.plan.plan;
  const AlphaBetaCommModel comm(plan.cluster);
  for (CollectiveMode mode : {CollectiveMode::kClosedForm, CollectiveMode::kStepwise}) {
    SimOptions options;
    options.collectives = mode;
    StatusOr<SimResult> sim = Simulate(plan, options);
    ASSERT_TRUE(sim.ok()) << sim.status().ToString();
    ASSERT_EQ(sim->outcome, SimOutcome::kOk);
    int64_t checked = 0;
    for (const SimInterval& iv : sim->timeline) {
      if (iv.stream != StreamKind::kCollective) continue;
      const Instruction& in = plan.ranks[iv.rank].instructions[iv.instruction];
      const CollectiveKind kind = in.op == OpKind::kAllReduceGrad ? CollectiveKind::kAllReduce
                                  : in.op == OpKind::kReduceScatterGrad
                                      ? CollectiveKind::kReduceScatter
                                      : CollectiveKind::kAllGather;
      const double want = comm.Collective(kind, in.bytes, CollectiveRing{.members = 4}).seconds();
      const double got = (iv.end - iv.start).seconds();
      if (mode == CollectiveMode::kClosedForm) {
        EXPECT_NEAR(got, want, 1e-9);
      } else if (checked == 0) {
        EXPECT_NEAR(got / want, 1.0, 0.02);  // the first one runs uncontended
      }
      ++checked;
    }
    EXPECT_GT(checked, 0);
  }
}

TEST(ContextParallelPlanTest, ValidatorRejectsAClusterWithoutTheDevices) {
  ParallelConfig par = TestParallel(1, 2, 2, 0);
  par.cp = 2;
  Planned p = PlanAndSimulate(par, LongBatch());
  ExecutionPlan plan = p.plan.plan;
  plan.parallel.cp = 4;  // 16 devices on an 8-device cluster
  const Status s = ValidatePlan(plan);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("dp*pp*tp*cp = 1*2*2*4 = 16 devices"));
  StatusOr<SimResult> sim = Simulate(plan);
  EXPECT_FALSE(sim.ok() && sim->outcome == SimOutcome::kOk);
}

TEST(ContextParallelSearchTest, CpIsSearchedOnlyWhereAsked) {
  auto setup = MakeTestSetup("gpt-6.7b", TestParallel(1, 1, 8, 0));
  SearchSpace space;
  space.tp = {2};
  const ParallelSpace plain =
      EnumerateParallelConfigs(setup->cost->model(), setup->cluster, *setup->cost, space, {}, {});
  for (const ParallelConfig& p : plain.configs) EXPECT_EQ(p.cp, 1);
  space.cp = {1, 2, 4};
  const ParallelSpace with_cp =
      EnumerateParallelConfigs(setup->cost->model(), setup->cluster, *setup->cost, space, {}, {});
  int64_t cp4 = 0;
  for (const ParallelConfig& p : with_cp.configs) {
    EXPECT_EQ(p.devices(), 8);
    cp4 += p.cp == 4;
  }
  EXPECT_GT(cp4, 0);
  EXPECT_GT(with_cp.configs.size(), plain.configs.size());
  // Encoder-decoder models are never split by cp (the default list is empty = every power).
  auto t5 = MakeTestSetup("t5-11b", TestParallel(1, 8, 1, 0));
  space.cp = {};
  for (const ParallelConfig& p :
       EnumerateParallelConfigs(t5->cost->model(), t5->cluster, *t5->cost, space, {}, {}).configs) {
    EXPECT_EQ(p.cp, 1);
  }
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

// Per-micro-batch cp (batching/dynamic_cp.h): on a batch of short sequences at cp 4, a micro-batch
// either keeps its costs or runs its samples in sub-groups of a smaller cp, strictly faster; the
// replicas still fit memory in any order; the plan validates and simulates within memory; cp 1 is
// left as it was.
TEST(DynamicCpTest, ShortMicroBatchesRunAtASmallerCpAndNothingGetsWorse) {
  ParallelConfig par = TestParallel(1, 1, 2, 36000, /*zero=*/2);
  par.cp = 4;
  auto setup = MakeTestSetup("gpt-6.7b", par, testing::TestCost::kAnalytic);
  const std::vector<Sample> batch = RandomTokenBatch(7, 32768, 1024, false);
  PlannerOptions options;
  options.method = "hydraulis";
  options.batching.max_seqlen = 1024;
  StatusOr<Planner> fixed = Planner::Create(*setup->cost, setup->parallel, setup->cluster, options);
  options.dynamic_cp = true;
  StatusOr<Planner> dynamic =
      Planner::Create(*setup->cost, setup->parallel, setup->cluster, options);
  ASSERT_TRUE(fixed.ok() && dynamic.ok()) << dynamic.status().ToString();
  StatusOr<PlanResult> a = fixed->Plan(batch);
  StatusOr<PlanResult> b = dynamic->Plan(batch);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_EQ(a->outcome, PlanOutcome::kOk);
  ASSERT_EQ(b->outcome, PlanOutcome::kOk) << b->infeasible_reason;
  EXPECT_TRUE(ValidatePlan(b->plan).ok()) << ValidatePlan(b->plan).ToString();
  // The same micro-batches (by rows), each no slower.
  std::map<std::vector<std::vector<int64_t>>, const MicroBatch*> before;
  for (const auto& rep : a->batch_plan.replicas) {
    for (const MicroBatch& mb : rep) before[mb.rows] = &mb;
  }
  int64_t split = 0;
  for (const auto& rep : b->batch_plan.replicas) {
    EXPECT_TRUE(CheckSequenceMemory(dynamic->evaluator(), rep).empty());
    for (const MicroBatch& mb : rep) {
      ASSERT_TRUE(before.contains(mb.rows));
      const MicroBatch& old = *before[mb.rows];
      EXPECT_EQ(old.cp_split, 1);
      EXPECT_LE(mb.Bottleneck(), old.Bottleneck());
      if (mb.cp_split > 1) {
        ++split;
        EXPECT_LT(mb.Bottleneck(), old.Bottleneck());
        EXPECT_LE(mb.cp_split, 4);
        EXPECT_GE(mb.num_samples(), mb.cp_split);
      } else {
        EXPECT_EQ(mb.stages, old.stages);
      }
    }
  }
  EXPECT_EQ(b->cp_splits, split);
  // 1K-token samples at cp 4 (256 tokens per device and sample): running them at cp 1 or 2 is
  // faster, and a sub-group holding a few more tokens than 1/k still fits the memory rule (the
  // rule before this guard, "no stage stores more", split none on this batch).
  EXPECT_GT(split, 0);
  EXPECT_LT(b->makespan, a->makespan);
  RecordProperty("split", static_cast<int>(split));
  StatusOr<SimResult> sa = Simulate(a->plan);
  StatusOr<SimResult> sb = Simulate(b->plan);
  ASSERT_TRUE(sa.ok() && sb.ok());
  EXPECT_EQ(sb->outcome, SimOutcome::kOk);
  EXPECT_FALSE(sb->memory_exceeded);
  // cp 1: nothing to split, the option changes nothing.
  ParallelConfig one = TestParallel(4, 1, 2, 36000, 2);
  auto s1 = MakeTestSetup("gpt-6.7b", one, testing::TestCost::kAnalytic);
  StatusOr<Planner> p1 = Planner::Create(*s1->cost, s1->parallel, s1->cluster, options);
  options.dynamic_cp = false;
  StatusOr<Planner> p0 = Planner::Create(*s1->cost, s1->parallel, s1->cluster, options);
  ASSERT_TRUE(p1.ok() && p0.ok());
  EXPECT_EQ(p1->Plan(batch)->plan, p0->Plan(batch)->plan);
}

}  // namespace
}  // namespace sluice
