#include "plan/lower.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <map>

#include "plan/plan_test_util.h"
#include "plan/validate.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using testing::MakePlanFixture;
using testing::PlanCase;

int64_t Count(const ExecutionPlan& plan, OpKind op) {
  int64_t n = 0;
  for (const RankProgram& p : plan.ranks) {
    for (const Instruction& in : p.instructions) n += in.op == op ? 1 : 0;
  }
  return n;
}

// Property: every schedule x pp x vpp x dp x model, random micro-batch costs -> valid plans.
TEST(LowerPlanTest, EverySchedulePpVppDpValidates) {
  int64_t plans = 0, fitting = 0, skipped = 0;
  for (bool encdec : {false, true}) {
    for (int64_t dp : {1, 2}) {
      for (int64_t pp : {1, 2, 4, 8}) {
        for (int64_t vpp : {1, 2}) {
          for (ScheduleKind kind : AllScheduleKinds()) {
            if (!SupportsVpp(kind, vpp)) continue;
            for (uint64_t seed : {1u, 2u}) {
              PlanCase c;
              c.encoder_decoder = encdec;
              c.dp = dp;
              c.pp = pp;
              c.vpp = vpp;
              c.kind = kind;
              c.seed = seed + 10 * pp + 100 * vpp;
              c.microbatches = 3 + static_cast<int64_t>(seed) * pp % 7;
              c.zero = seed == 1 ? 1 : 2;
              const auto f = MakePlanFixture(c);
              if (!f->no_schedule.empty()) {
                // Known: the zb-h1 generator gives up on a few cases (its bound leaves out the
                // backward transient at pp = 1); every other generator must always produce.
                EXPECT_EQ(kind, ScheduleKind::kZbH1) << f->no_schedule;
                std::printf("skipped: %s\n", f->no_schedule.c_str());
                ++skipped;
                continue;
              }
              const ExecutionPlan& plan = f->plan;
              // The generators and the validator apply the same memory rule: plans the
              // generators say fit must pass check 7 too.
              ValidateOptions options;
              options.check_memory = f->fits;
              fitting += f->fits ? 1 : 0;
              Status s = ValidatePlan(plan, options);
              ASSERT_TRUE(s.ok()) << testing::Describe(c) << "\n" << s.message();
              const int64_t S = pp * vpp;
              EXPECT_EQ(Count(plan, OpKind::kForward), dp * c.microbatches * S);
              EXPECT_EQ(Count(plan, OpKind::kBackward) + Count(plan, OpKind::kBackwardInput),
                        dp * c.microbatches * S);
              EXPECT_EQ(Count(plan, OpKind::kSendActStart), Count(plan, OpKind::kRecvActStart));
              EXPECT_EQ(Count(plan, OpKind::kOptimizerStep), dp * pp);
              EXPECT_EQ(Count(plan, OpKind::kSendGradStart) > 0, pp > 1);
              EXPECT_EQ(Count(plan, OpKind::kAllReduceGrad) > 0, dp > 1 && c.zero < 2);
              EXPECT_EQ(Count(plan, OpKind::kReduceScatterGrad),
                        Count(plan, OpKind::kAllGatherParams));
              ++plans;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(plans + skipped, 2 * 2 * 4 * (5 + 2) * 2);
  EXPECT_EQ(skipped, 0);  // every generator schedules every case of this grid
  EXPECT_GT(fitting, plans / 2);
}

TEST(LowerPlanTest, PlansThatFitPassTheMemoryCheck) {
  for (ScheduleKind kind : {ScheduleKind::k1F1B, ScheduleKind::kZbH1, ScheduleKind::kAdaptive}) {
    PlanCase c;
    c.pp = 4;
    c.dp = 2;
    c.kind = kind;
    c.microbatches = 8;
    c.memory_limit_mb = 36000;
    const auto f = MakePlanFixture(c);
    Status s = ValidatePlan(f->plan);
    EXPECT_TRUE(s.ok()) << testing::Describe(c) << "\n" << s.message();
    const std::vector<Bytes> peaks = PredictPeakMemory(f->plan);
    ASSERT_EQ(peaks.size(), 8u);
    for (int64_t r = 0; r < 8; ++r) {
      EXPECT_GT(peaks[r], f->plan.model_states[r % 4]);
      EXPECT_LE(peaks[r], f->plan.memory_limit());
    }
  }
}

TEST(LowerPlanTest, IsDeterministic) {
  PlanCase c;
  c.pp = 4;
  c.vpp = 2;
  c.dp = 2;
  c.kind = ScheduleKind::kInterleaved;
  c.seed = 7;
  EXPECT_EQ(MakePlanFixture(c)->plan, MakePlanFixture(c)->plan);
}

TEST(LowerPlanTest, RecordsTheInputs) {
  PlanCase c;
  c.pp = 2;
  c.dp = 2;
  const auto f = MakePlanFixture(c);
  const ExecutionPlan& plan = f->plan;
  EXPECT_EQ(plan.model.name, "test-gpt");
  EXPECT_EQ(plan.parallel, f->setup->parallel);
  EXPECT_EQ(plan.cluster, f->setup->cluster);
  EXPECT_EQ(plan.cost_model, f->setup->cost->Describe());
  EXPECT_EQ(plan.method, "test");
  EXPECT_EQ(plan.sample_ids.size(), f->batch.size());
  EXPECT_EQ(plan.dropped, f->batch_plan.dropped);
  ASSERT_EQ(plan.replicas.size(), 2u);
  EXPECT_EQ(plan.replicas[0].schedule, "1f1b");
  EXPECT_EQ(plan.replicas[1].micro_batches[2].rows, f->batch_plan.replicas[1][2].rows);
  EXPECT_EQ(plan.replicas[1].micro_batches[2].shape, f->batch_plan.replicas[1][2].shape);
  ASSERT_EQ(plan.replicas[0].micro_batches[0].stages.size(), 2u);
  EXPECT_EQ(plan.replicas[0].micro_batches[0].stages[1].forward,
            f->batch_plan.replicas[0][0].stages[1].forward);
  ASSERT_EQ(plan.model_states.size(), 2u);
  EXPECT_EQ(plan.model_states[0], f->setup->evaluator().stage_states()[0].total());
  for (int64_t r = 0; r < 4; ++r) {
    EXPECT_EQ(plan.ranks[r].rank, r);
    EXPECT_EQ(plan.ranks[r].dp_index, r / 2);
    EXPECT_EQ(plan.ranks[r].pp_index, r % 2);
  }
}

// On a two-stage 1F1B pipeline, the first stage's program starts by loading and running the
// first micro-batch and sending it on, and every receive finishes right before its consumer.
TEST(LowerPlanTest, PlacesFinishesAndFrees) {
  PlanCase c;
  c.pp = 2;
  c.microbatches = 4;
  const auto f = MakePlanFixture(c);
  const auto& r0 = f->plan.ranks[0].instructions;
  ASSERT_GE(r0.size(), 3u);
  EXPECT_EQ(InstructionText(r0[0]), "0LOAD0");
  EXPECT_EQ(InstructionText(r0[1]), "0F0");
  EXPECT_EQ(InstructionText(r0[2]), "0SEND_F0");
  EXPECT_EQ(r0[2].peer, 1);
  EXPECT_EQ(r0[2].shapes,
            BoundaryShapes(f->plan.model, f->plan.replicas[0].micro_batches[0].shape, 0, f->plan.parallel));
  EXPECT_EQ(r0[2].bytes, Fp16Bytes(r0[2].shapes));
  for (const RankProgram& p : f->plan.ranks) {
    const auto& list = p.instructions;
    for (size_t i = 0; i < list.size(); ++i) {
      if (list[i].op == OpKind::kRecvActFinish) {
        ASSERT_LT(i + 1, list.size());
        EXPECT_EQ(list[i + 1].op, OpKind::kForward);
        EXPECT_EQ(list[i + 1].microbatch, list[i].microbatch);
      }
      if (list[i].op == OpKind::kSendActFinish) {
        // Before the backward of the same micro-batch (after the gradient's receive-finish).
        ASSERT_LT(i + 2, list.size());
        EXPECT_EQ(list[i + 1].op, OpKind::kRecvGradFinish);
        EXPECT_EQ(list[i + 2].op, OpKind::kBackward);
        EXPECT_EQ(list[i + 2].microbatch, list[i].microbatch);
      }
    }
    EXPECT_EQ(list.back().op, OpKind::kOptimizerStep);
    EXPECT_LE(p.buffer_slots, 3 * 4);
  }
}

TEST(LowerPlanTest, BucketsGradientsPerStage) {
  PlanCase c;
  c.pp = 2;
  c.dp = 2;
  c.vpp = 2;
  c.kind = ScheduleKind::kInterleaved;
  c.lower.bucket_bytes = Bytes::MB(8);
  const auto f = MakePlanFixture(c);
  // Each rank reduces 2 bytes per parameter of its two chunks, in buckets of at most 8 MB, the
  // later chunk first.
  for (const RankProgram& p : f->plan.ranks) {
    Bytes total;
    std::vector<int64_t> stages;
    int64_t bucket = 0;
    for (const Instruction& in : p.instructions) {
      if (in.op != OpKind::kAllReduceGrad) continue;
      EXPECT_LE(in.bytes, Bytes::MB(8));
      EXPECT_EQ(in.bucket, bucket++);
      total += in.bytes;
      if (stages.empty() || stages.back() != in.stage) stages.push_back(in.stage);
    }
    EXPECT_EQ(total.count(), 2 * f->setup->evaluator().stage_states()[p.pp_index].params);
    EXPECT_EQ(stages, (std::vector<int64_t>{p.pp_index + 2, p.pp_index}));
  }
}

TEST(LowerPlanTest, ZeroTwoReduceScattersAndGathersAfterTheStep) {
  PlanCase c;
  c.pp = 2;
  c.dp = 2;
  c.zero = 2;
  const auto f = MakePlanFixture(c);
  const auto& list = f->plan.ranks[1].instructions;
  const int64_t step = testing::FindInstruction(
      f->plan, 1, [](const Instruction& in) { return in.op == OpKind::kOptimizerStep; });
  ASSERT_GT(step, 0);
  int64_t scatters = 0, gathers = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].op == OpKind::kReduceScatterGrad) {
      EXPECT_LT(static_cast<int64_t>(i), step);
      ++scatters;
    }
    if (list[i].op == OpKind::kAllGatherParams) {
      EXPECT_GT(static_cast<int64_t>(i), step);
      ++gathers;
    }
  }
  EXPECT_GT(scatters, 0);
  EXPECT_EQ(scatters, gathers);
}

TEST(LowerPlanTest, RejectsMismatchedInputs) {
  PlanCase c;
  c.pp = 2;
  c.microbatches = 2;
  const auto f = MakePlanFixture(c);
  const StageCostEvaluator& eval = f->setup->evaluator();
  const ClusterSpec& cluster = f->setup->cluster;
  StatusOr<ExecutionPlan> r = LowerPlan(f->batch_plan, f->batch, {}, eval, cluster);
  EXPECT_THAT(r.status().message(), HasSubstr("1 replicas and 0 schedules"));
  std::vector<Schedule> s = f->schedules;
  s[0].num_microbatches = 3;
  r = LowerPlan(f->batch_plan, f->batch, s, eval, cluster);
  EXPECT_THAT(r.status().message(), HasSubstr("3 micro-batches"));
  s = f->schedules;
  s[0].ranks[1].pop_back();
  r = LowerPlan(f->batch_plan, f->batch, s, eval, cluster);
  EXPECT_FALSE(r.ok());
  BatchPlan oom = f->batch_plan;
  oom.outcome = PlanOutcome::kOutOfMemory;
  oom.infeasible_reason = "too long";
  r = LowerPlan(oom, f->batch, f->schedules, eval, cluster);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("too long"));
}

// Rank 0 wants micro-batch 0's gradient before it sends micro-batch 1; rank 1 runs micro-batch 1
// first: a complete schedule that cannot run.
TEST(LowerPlanTest, RejectsAScheduleThatCannotRun) {
  PlanCase c;
  c.pp = 2;
  c.microbatches = 2;
  const auto f = MakePlanFixture(c);
  Schedule s = f->schedules[0];
  s.ranks[0] = {{0, ActionKind::kForward, 0},
                {0, ActionKind::kBackward, 0},
                {0, ActionKind::kForward, 1},
                {0, ActionKind::kBackward, 1}};
  s.ranks[1] = {{1, ActionKind::kForward, 1},
                {1, ActionKind::kBackward, 1},
                {1, ActionKind::kForward, 0},
                {1, ActionKind::kBackward, 0}};
  ASSERT_TRUE(CheckScheduleComplete(s).ok());
  const std::vector<Schedule> schedules = {s};
  StatusOr<ExecutionPlan> r =
      LowerPlan(f->batch_plan, f->batch, schedules, f->setup->evaluator(), f->setup->cluster);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("cannot run"));
  // The estimator's deadlock description (one replay, schedule/estimator.h).
  EXPECT_THAT(r.status().message(), HasSubstr("rank 0 step 1 (0B0) waits for 1B0"));
  EXPECT_THAT(r.status().message(), HasSubstr("rank 1 step 0 (1F1) waits for 0F1"));
}

}  // namespace
}  // namespace sluice
