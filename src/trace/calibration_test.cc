// Tests of the calibration's fit (FitOpLine), its file format ("/2", and "/1" still read) and how
// ApplyCalibration prices a plan. The end-to-end fit on real traces is tests/trace_cli_test.sh.
#include "trace/calibration.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "plan/plan_test_util.h"

namespace sluice::trace {
namespace {

using ::testing::HasSubstr;

// An op whose real cost has an attention term the cost model lacks: the plan predicts
// 20 ns/token (a pure linear model), the machine takes 5 us + 30 ns/token + 0.2 ns/token pair.
OpSample WrongShape(int64_t rows, int64_t seqlen, double noise) {
  OpSample s;
  const double r = static_cast<double>(rows), l = static_cast<double>(seqlen);
  s.features = {20.0 * r * l, r * l, r * l * l, r};
  s.measured_ns = (5000 + 30 * r * l + 0.2 * r * l * l) * noise;
  return s;
}

double RelativeError(const OpCorrection& c, const OpSample& s) {
  return std::abs(c.Predict(s.features) / s.measured_ns - 1);
}

TEST(CalibrationFit, FeaturesFixAShapeAScaleCannot) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> noise(0.97, 1.03);
  std::vector<OpSample> fit;
  for (int64_t len = 32; len <= 256; len += 16) {
    fit.push_back(WrongShape(256 / len, len, noise(rng)));  // packed to 256 tokens a row
  }
  const OpCorrection features = FitOpLine(fit, OpLine::kFeatures);
  const OpCorrection scale = FitOpLine(fit, OpLine::kScale);
  // Held out: shapes the fit did not see, one long row and many short ones.
  for (const OpSample& s : {WrongShape(1, 200, 1.0), WrongShape(6, 40, 1.0)}) {
    EXPECT_LT(RelativeError(features, s), 0.04) << features.Describe();
  }
  // The scale line sees one prediction for every 256-token micro-batch: it cannot tell them
  // apart, and misses the long rows and the short ones by the attention term.
  EXPECT_GT(RelativeError(scale, WrongShape(1, 256, 1.0)), 0.15) << scale.Describe();
  EXPECT_GT(RelativeError(scale, WrongShape(6, 40, 1.0)), 0.15) << scale.Describe();
  EXPECT_GT(features.per_attention_ns, 0);
  EXPECT_LT(features.mean_abs_error_after, features.mean_abs_error_before);
}

TEST(CalibrationFit, RobustToPreemptedInstructions) {
  // 40 instructions of one shape family; every 10th was preempted by another process (3x).
  std::vector<OpSample> fit;
  for (int k = 0; k < 40; ++k) {
    OpSample s;
    const double tokens = 64.0 * (1 + k % 4);
    s.features = {10.0 * tokens, tokens, 0, 1};
    s.measured_ns = 2000 + 50 * tokens;
    if (k % 10 == 3) s.measured_ns *= 3;
    fit.push_back(s);
  }
  const OpCorrection robust = FitOpLine(fit, OpLine::kFeatures);
  const OpCorrection plain = FitOpLine(fit, OpLine::kScale);
  OpSample typical;
  typical.features = {10.0 * 128, 128, 0, 1};
  typical.measured_ns = 2000 + 50 * 128;
  EXPECT_LT(RelativeError(robust, typical), 0.02) << robust.Describe();
  EXPECT_GT(RelativeError(plain, typical), 0.15) << plain.Describe();
}

TEST(CalibrationFit, CoefficientsNeverNegative) {
  // Cost falling with tokens (an artefact of noise) must not give a negative coefficient: the
  // line keeps the constant only.
  std::vector<OpSample> fit;
  for (int k = 0; k < 12; ++k) {
    OpSample s;
    s.features = {100.0 * (k + 1), 10.0 * (k + 1), 0, 1};
    s.measured_ns = 10000 - 10 * k;
    fit.push_back(s);
  }
  const OpCorrection c = FitOpLine(fit, OpLine::kFeatures);
  for (double v : {c.scale, c.offset_us, c.per_token_ns, c.per_attention_ns, c.per_row_us}) {
    EXPECT_GE(v, 0);
  }
  EXPECT_NEAR(c.offset_us, 9.945, 0.1);
}

TEST(CalibrationFit, OneInstructionIsFittedExactly) {
  // An optimizer step fitted on one iteration: no features but the constant.
  OpSample s;
  s.measured_ns = 12345;
  for (OpLine line : {OpLine::kFeatures, OpLine::kPredictionOnly}) {
    const OpCorrection c = FitOpLine({s}, line);
    EXPECT_NEAR(c.Predict(s.features), 12345, 1e-6) << c.Describe();
  }
}

ExecutionPlan OneStagePlan() {
  ExecutionPlan plan;
  plan.replicas.resize(1);
  PlanMicroBatch mb;
  mb.shape = {2, 100, 0};
  plan.replicas[0].micro_batches = {mb};
  plan.ranks.resize(1);
  Instruction f;
  f.op = OpKind::kForward;
  f.stage = 0;
  f.microbatch = 0;
  f.duration = Duration::Micros(100);
  Instruction step;
  step.op = OpKind::kOptimizerStep;
  step.duration = Duration::Micros(30);
  plan.ranks[0].instructions = {f, step};
  return plan;
}

TEST(CalibrationFormat, Version2RoundTripAndFeatures) {
  Calibration c;
  c.source = "t";
  OpCorrection o;
  o.stage = 0;
  o.op = "forward";
  o.scale = 0.5;
  o.offset_us = 10;
  o.per_token_ns = 100;
  o.per_attention_ns = 1;
  o.per_row_us = 3;
  o.samples = 9;
  c.ops = {o};
  c.iteration = {-50, 4};
  c.memory = {{.pp_rank = 1, .offset_bytes = -3e6, .activation_scale = 1.5, .samples = 8}};
  const std::string text = CalibrationToJson(c);
  EXPECT_THAT(text, HasSubstr("sluice-calibration/2"));
  auto back = CalibrationFromJson(text, "c.json");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(*back, c);
  ExecutionPlan plan = OneStagePlan();
  ApplyCalibration(c, &plan);
  // 10 us + 0.5 x 100 us + 100 ns x 200 tokens + 1 ns x 2 x 100^2 pairs + 3 us x 2 rows.
  EXPECT_EQ(plan.ranks[0].instructions[0].duration, Duration::Micros(10 + 50 + 20 + 20 + 6));
  // The iteration offset (-50 us) shortens the optimizer step, never below 0.
  EXPECT_EQ(plan.ranks[0].instructions[1].duration, Duration::Zero());
}

TEST(CalibrationFormat, Version1IsStillRead) {
  auto v1 = CalibrationFromJson(
      R"({"format":"sluice-calibration/1","ops":[{"stage":0,"op":"forward","scale":2,"offset_us":5}],
          "link":{"latency_us":3,"bandwidth_gb_per_s":1}})",
      "v1.json");
  ASSERT_TRUE(v1.ok()) << v1.status().message();
  ExecutionPlan plan = OneStagePlan();
  ApplyCalibration(*v1, &plan);
  EXPECT_EQ(plan.ranks[0].instructions[0].duration, Duration::Micros(205));
  EXPECT_EQ(plan.ranks[0].instructions[1].duration, Duration::Micros(30));
  // "/1" has no feature terms and no iteration offset: such a file is refused, naming them.
  auto mixed = CalibrationFromJson(
      R"({"format":"sluice-calibration/1","ops":[{"stage":0,"op":"forward","scale":2,"offset_us":5,"per_token_ns":1}]})",
      "m.json");
  ASSERT_FALSE(mixed.ok());
  EXPECT_THAT(mixed.status().message(), HasSubstr("m.json: field 'ops[0].per_token_ns'"));
  auto it1 = CalibrationFromJson(
      R"({"format":"sluice-calibration/1","ops":[],"iteration":{"offset_us":1,"samples":1}})",
      "i.json");
  ASSERT_FALSE(it1.ok());
  EXPECT_THAT(it1.status().message(), HasSubstr("i.json: field 'iteration'"));
}

TEST(CalibrationFormat, BadFieldsAreNamed) {
  auto neg = CalibrationFromJson(
      R"({"format":"sluice-calibration/2","ops":[{"stage":0,"op":"forward","scale":1,"offset_us":0,"per_attention_ns":-1}]})",
      "n.json");
  ASSERT_FALSE(neg.ok());
  EXPECT_THAT(neg.status().message(), HasSubstr("n.json: field 'ops[0].per_attention_ns'"));
  auto samples = CalibrationFromJson(
      R"({"format":"sluice-calibration/2","ops":[],"iteration":{"offset_us":1,"samples":0}})",
      "s.json");
  ASSERT_FALSE(samples.ok());
  EXPECT_THAT(samples.status().message(), HasSubstr("s.json: field 'iteration.samples'"));
  auto scale = CalibrationFromJson(
      R"({"format":"sluice-calibration/2","ops":[],"memory":[{"pp_rank":0,"offset_bytes":0,"activation_scale":0}]})",
      "m.json");
  ASSERT_FALSE(scale.ok());
  EXPECT_THAT(scale.status().message(), HasSubstr("m.json: field 'memory[0].activation_scale'"));
  auto format = CalibrationFromJson(R"({"format":"sluice-calibration/3","ops":[]})", "f.json");
  ASSERT_FALSE(format.ok());
  EXPECT_THAT(format.status().message(), HasSubstr("sluice-calibration/2"));
}

// Peaks "measured" on a machine whose framework holds 8 MB (rank 0) and 2 MB (rank 1) beyond the
// model states and whose activations take 1.25x what the cost model says: the fit on six plans
// of different shapes recovers both and prices a seventh, held-out plan's peaks.
TEST(MemoryFit, RecoversAConstantAndAnActivationScale) {
  const std::vector<MemoryCorrection> truth = {
      {.pp_rank = 0, .offset_bytes = 8e6, .activation_scale = 1.25},
      {.pp_rank = 1, .offset_bytes = 2e6, .activation_scale = 1.25}};
  std::vector<ExecutionPlan> plans;
  std::vector<std::vector<int64_t>> peaks;
  for (uint64_t seed = 0; seed < 7; ++seed) {
    testing::PlanCase pc;
    pc.seed = seed;
    pc.microbatches = 3 + static_cast<int64_t>(seed % 4);
    auto fixture = testing::MakePlanFixture(pc);
    ASSERT_TRUE(fixture->no_schedule.empty()) << fixture->no_schedule;
    ExecutionPlan real = fixture->plan;
    for (const MemoryCorrection& m : truth) ApplyMemoryCorrection(m, &real);
    auto peak = SimulatedPeakBytes(real);
    ASSERT_TRUE(peak.ok()) << peak.status().message();
    plans.push_back(fixture->plan);
    peaks.push_back(*peak);
  }
  auto fit = FitMemory(plans, {0, 1, 2, 3, 4, 5}, peaks);
  ASSERT_TRUE(fit.ok()) << fit.status().message();
  ASSERT_EQ(fit->size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const MemoryCorrection& m = (*fit)[r];
    EXPECT_EQ(m.pp_rank, r);
    EXPECT_EQ(m.samples, 6);
    EXPECT_NEAR(m.activation_scale, 1.25, 0.05) << "rank " << r;
    EXPECT_NEAR(m.offset_bytes, truth[r].offset_bytes, 1e6) << "rank " << r;
    EXPECT_GT(m.mean_abs_error_before, 0.02) << "rank " << r;
    EXPECT_LT(m.mean_abs_error_after, 0.01) << "rank " << r;
  }
  // The held-out plan, priced through ApplyCalibration.
  Calibration c;
  c.memory = *fit;
  ExecutionPlan held_out = plans[6];
  ApplyCalibration(c, &held_out);
  auto predicted = SimulatedPeakBytes(held_out);
  ASSERT_TRUE(predicted.ok());
  auto plain = SimulatedPeakBytes(plans[6]);
  ASSERT_TRUE(plain.ok());
  for (int r = 0; r < 2; ++r) {
    const double want = static_cast<double>(peaks[6][r]);
    EXPECT_NEAR(static_cast<double>((*predicted)[r]), want, 0.01 * want) << "rank " << r;
    EXPECT_GT(std::abs(static_cast<double>((*plain)[r]) - want), 0.02 * want) << "rank " << r;
  }
}

// Without varying activations the scale stays 1 and the constant is the median difference.
TEST(MemoryFit, OneSampleFitsTheConstantOnly) {
  testing::PlanCase pc;
  auto fixture = testing::MakePlanFixture(pc);
  ASSERT_TRUE(fixture->no_schedule.empty());
  auto peak = SimulatedPeakBytes(fixture->plan);
  ASSERT_TRUE(peak.ok());
  std::vector<std::vector<int64_t>> measured = {{(*peak)[0] + 5'000'000, -1}};
  auto fit = FitMemory({fixture->plan}, {0}, measured);
  ASSERT_TRUE(fit.ok());
  ASSERT_EQ(fit->size(), 1u);  // rank 1 was not measured
  EXPECT_EQ((*fit)[0].activation_scale, 1.0);
  EXPECT_NEAR((*fit)[0].offset_bytes, 5e6, 1);
}

}  // namespace
}  // namespace sluice::trace
