// Every plan the planner produces in a sweep of methods, schedules and configurations (and every
// lowered plan fixture) simulates to completion with outcome ok, in both collective modes.
#include <fmt/core.h>
#include <gtest/gtest.h>

#include "batching/test_util.h"
#include "plan/plan_test_util.h"
#include "plan/validate.h"
#include "planner/planner.h"
#include "sim/simulator.h"

namespace sluice {
namespace {

using testing::MakePlanFixture;
using testing::PlanCase;

// Every plan the planner makes in a sweep runs to the end with outcome ok; its memory is the
// validator's prediction, with and without buffers; a second run is identical.
struct SweepCase {
  const char* model;
  int64_t dp, pp, vpp;
  ScheduleKind schedule;
  const char* method;
  int64_t zero = 1;
  int64_t tp = 1;
};

class SimulatorSweepTest : public ::testing::TestWithParam<SweepCase> {};

TEST_P(SimulatorSweepTest, PlannerPlansSimulateToCompletion) {
  const SweepCase c = GetParam();
  auto setup = testing::MakeTestSetup(
      c.model, testing::TestParallel(c.dp, c.pp, c.tp, 36000, c.zero, c.vpp));
  PlannerOptions options;
  options.method = c.method;
  options.schedule = c.schedule;
  options.batching.max_seqlen = 1024;
  StatusOr<Planner> planner =
      Planner::Create(*setup->cost, setup->parallel, setup->cluster, options);
  ASSERT_TRUE(planner.ok()) << planner.status().ToString();
  const bool enc_dec = planner->evaluator().model().is_encoder_decoder();
  const std::vector<Sample> batch = testing::RandomTokenBatch(3, 32768, 1024, enc_dec);
  StatusOr<PlanResult> plan = planner->Plan(batch);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->outcome, PlanOutcome::kOk) << plan->infeasible_reason;
  int64_t instructions = 0;
  for (const RankProgram& p : plan->plan.ranks) instructions += p.instructions.size();
  for (CollectiveMode mode : {CollectiveMode::kStepwise, CollectiveMode::kClosedForm}) {
    SimOptions sim;
    sim.collectives = mode;
    sim.samples = batch;
    StatusOr<SimResult> r = Simulate(plan->plan, sim);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->outcome, SimOutcome::kOk) << r->problem;
    EXPECT_EQ(r->instructions, instructions);
    EXPECT_TRUE(r->tokens_from_samples);
    int64_t tokens = 0;
    for (const Sample& s : batch) tokens += s.tokens();
    EXPECT_GT(r->real_tokens, 0);
    EXPECT_LE(r->real_tokens, tokens);
    EXPECT_LE(r->real_tokens, r->padded_tokens);
    EXPECT_GT(r->mfu, 0.0);
    EXPECT_LT(r->mfu, 1.0);
    // The estimator's makespan leaves out gradient reduction and contention, never compute.
    EXPECT_GE(r->iteration_time.nanos(), plan->makespan.nanos() * 0.99);
    for (const RankSimStats& s : r->ranks) {
      EXPECT_GE(s.bubble, Duration::Zero());
      EXPECT_LE(s.compute + s.exposed_comm, r->iteration_time);
    }
    EXPECT_EQ(r->critical_path.back().end, r->iteration_time);
    StatusOr<SimResult> again = Simulate(plan->plan, sim);
    ASSERT_TRUE(again.ok());
    EXPECT_TRUE(*again == *r) << "not deterministic";
  }
  SimOptions rule;
  rule.count_buffers = false;
  StatusOr<SimResult> r = Simulate(plan->plan, rule);
  ASSERT_TRUE(r.ok());
  const std::vector<Bytes> predicted = PredictPeakMemory(plan->plan, {.count_buffers = false});
  for (size_t i = 0; i < predicted.size(); ++i) {
    EXPECT_EQ(r->ranks[i].peak_memory, predicted[i]) << "rank " << i;
  }
  // With buffers: the plan's memory rule, within the limit.
  StatusOr<SimResult> full = Simulate(plan->plan, SimOptions{});
  ASSERT_TRUE(full.ok());
  const std::vector<Bytes> with_buffers = PredictPeakMemory(plan->plan);
  for (size_t i = 0; i < with_buffers.size(); ++i) {
    EXPECT_EQ(full->ranks[i].peak_memory, with_buffers[i]) << "rank " << i;
    EXPECT_LE(with_buffers[i], plan->plan.memory_limit()) << "rank " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Plans, SimulatorSweepTest,
    ::testing::Values(SweepCase{"gpt-6.7b", 2, 4, 1, ScheduleKind::k1F1B, "dynapipe"},
                      SweepCase{"gpt-6.7b", 2, 4, 1, ScheduleKind::kGPipe, "token-budget"},
                      SweepCase{"gpt-6.7b", 1, 8, 1, ScheduleKind::kZbH1, "dynapipe"},
                      SweepCase{"gpt-6.7b", 2, 4, 1, ScheduleKind::kAdaptive, "hydraulis"},
                      SweepCase{"gpt-6.7b", 1, 4, 2, ScheduleKind::kInterleaved, "dynapipe"},
                      SweepCase{"gpt-6.7b", 2, 4, 1, ScheduleKind::k1F1B, "packing"},
                      SweepCase{"gpt-6.7b", 4, 2, 1, ScheduleKind::k1F1B, "padding", 2},
                      SweepCase{"gpt-6.7b", 2, 4, 1, ScheduleKind::kZbH1, "multipack", 3},
                      SweepCase{"gpt-6.7b", 2, 4, 1, ScheduleKind::k1F1B, "dynapipe", 1, 2},
                      SweepCase{"t5-11b", 2, 8, 1, ScheduleKind::k1F1B, "dynapipe"},
                      SweepCase{"t5-11b", 1, 8, 1, ScheduleKind::kAdaptive, "sorted"},
                      // 3 chunks: the middle one ends the encoder and starts the decoder.
                      SweepCase{"t5-11b", 1, 3, 1, ScheduleKind::kZbH1, "dynapipe", 1, 4}),
    [](const ::testing::TestParamInfo<SweepCase>& info) {
      std::string name = fmt::format("{}_{}_{}_dp{}_pp{}_vpp{}_zero{}_tp{}",
                                     info.param.model[0] == 'g' ? "gpt" : "t5", info.param.method,
                                     ScheduleKindName(info.param.schedule), info.param.dp,
                                     info.param.pp, info.param.vpp, info.param.zero, info.param.tp);
      for (char& ch : name) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return name;
    });

// The lowering's fixtures over shapes the planner sweep does not reach: two ranks exchanging
// activations and gradients with vpp 2 (both directions to one peer), encoder-decoder models,
// ZeRO-2/3 reduce-scatter + all-gather, zero-bubble I/W splits.
TEST(SimulatorFixtureSweepTest, LoweredFixturesSimulateToCompletion) {
  int ran = 0;
  for (bool enc_dec : {false, true}) {
    for (auto [kind, pp, vpp] :
         {std::tuple{ScheduleKind::kInterleaved, 2, 2},
          std::tuple{ScheduleKind::kInterleaved, 4, 2}, std::tuple{ScheduleKind::kZbH1, 4, 1},
          std::tuple{ScheduleKind::kAdaptive, 2, 1}, std::tuple{ScheduleKind::kGPipe, 4, 1}}) {
      for (int64_t zero : {1, 3}) {
        PlanCase c;
        c.encoder_decoder = enc_dec;
        c.dp = 2;
        c.pp = pp;
        c.vpp = vpp;
        c.kind = kind;
        c.zero = zero;
        c.microbatches = 6;
        auto fixture = MakePlanFixture(c);
        if (!fixture->no_schedule.empty()) continue;
        ++ran;
        ASSERT_TRUE(ValidatePlan(fixture->plan).ok()) << testing::Describe(c);
        SimOptions options;
        options.samples = fixture->batch;
        StatusOr<SimResult> r = Simulate(fixture->plan, options);
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        EXPECT_EQ(r->outcome, SimOutcome::kOk) << testing::Describe(c) << ": " << r->problem;
        const std::vector<Bytes> predicted = PredictPeakMemory(fixture->plan);
        for (size_t i = 0; i < predicted.size(); ++i) {
          EXPECT_EQ(r->ranks[i].peak_memory, predicted[i]) << testing::Describe(c);
        }
        options.count_buffers = false;
        StatusOr<SimResult> rule = Simulate(fixture->plan, options);
        ASSERT_TRUE(rule.ok());
        const std::vector<Bytes> activations =
            PredictPeakMemory(fixture->plan, {.count_buffers = false});
        for (size_t i = 0; i < activations.size(); ++i) {
          EXPECT_EQ(rule->ranks[i].peak_memory, activations[i]) << testing::Describe(c);
        }
      }
    }
  }
  EXPECT_GE(ran, 16);  // the generators find schedules for (nearly) all of the 20 cases
}

}  // namespace
}  // namespace sluice
