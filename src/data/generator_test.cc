#include "data/generator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "data/stats.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kN = 20000;

Dataset Generate(std::string_view preset, uint64_t seed = 0, int64_t n = kN) {
  StatusOr<Dataset> ds = GenerateDataset(preset, n, seed);
  EXPECT_TRUE(ds.ok()) << ds.status().ToString();
  return ds.ok() ? *std::move(ds) : Dataset();
}

// Mean and standard deviation of ln(length) over one side of the samples.
std::pair<double, double> LogMoments(const Dataset& ds, bool input) {
  double sum = 0, sum2 = 0;
  for (const Sample& s : ds.samples()) {
    const double l = std::log(static_cast<double>(input ? s.input_len : s.target_len));
    sum += l;
    sum2 += l * l;
  }
  const double n = static_cast<double>(ds.size());
  const double mean = sum / n;
  return {mean, std::sqrt(sum2 / n - mean * mean)};
}

double TaskShare(const Dataset& ds, std::string_view task) {
  const TaskId t = ds.FindTask(task);
  return static_cast<double>(std::count_if(ds.samples().begin(), ds.samples().end(),
                                           [t](const Sample& s) { return s.task == t; })) /
         static_cast<double>(ds.size());
}

TEST(GeneratorTest, EveryPresetIsDeterministicPerSeedAndValid) {
  for (const GeneratorPreset& p : GeneratorPresets()) {
    SCOPED_TRACE(p.name);
    const Dataset a = Generate(p.name, 42, 2000);
    EXPECT_EQ(a, Generate(p.name, 42, 2000));
    EXPECT_NE(a.samples(), Generate(p.name, 43, 2000).samples());
    EXPECT_TRUE(a.Validate().ok()) << a.Validate().ToString();
    EXPECT_EQ(a.source(), p.name);
    EXPECT_EQ(a.num_tasks(), static_cast<int>(p.tasks.size()));
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].id, static_cast<int64_t>(i));
  }
}

TEST(GeneratorTest, FirstSamplesArePinned) {
  // Pinned so that a change to the generator or to base/Rng (which changes every plan built on
  // generated data) is noticed. Draw order per sample: task, input, target.
  const Dataset web = Generate("web", 0, 3);
  const Dataset flan = Generate("flan-like", 0, 3);
  std::vector<std::array<int64_t, 3>> got;
  for (const Dataset* ds : {&web, &flan}) {
    for (const Sample& s : ds->samples()) got.push_back({s.input_len, s.target_len, s.task});
  }
  using L = std::array<int64_t, 3>;                                          // input, target, task
  EXPECT_THAT(got, ElementsAre(L{1470, 0, 0}, L{1267, 0, 0}, L{784, 0, 0},   // web
                               L{61, 74, 3}, L{347, 12, 1}, L{324, 6, 1}));  // flan-like
}

TEST(GeneratorTest, StreamAndTakeAgree) {
  auto gen = SampleGenerator::Create("sft", 9);
  ASSERT_TRUE(gen.ok());
  std::vector<Sample> stream;
  for (int i = 0; i < 50; ++i) stream.push_back(gen->Next());
  EXPECT_EQ(stream.back().id, 49);
  EXPECT_EQ(Generate("sft", 9, 50).samples(), stream);
  EXPECT_THAT(gen->task_names(), ElementsAre("sft"));
}

TEST(GeneratorTest, WebAndCodeMatchTheirLogNormals) {
  const auto [web_mu, web_sigma] = LogMoments(Generate("web"), true);
  EXPECT_NEAR(std::exp(web_mu), 800, 800 * 0.03);
  EXPECT_NEAR(web_sigma, 1.0, 0.03);
  const Dataset code = Generate("code");
  const auto [code_mu, code_sigma] = LogMoments(code, true);
  EXPECT_NEAR(std::exp(code_mu), 2300, 2300 * 0.03);
  EXPECT_NEAR(code_sigma, 1.2, 0.03);
  EXPECT_FALSE(code.has_targets());
}

TEST(GeneratorTest, WebCodeIsSeventyThirty) {
  const Dataset ds = Generate("web-code");
  EXPECT_THAT(ds.task_names(), ElementsAre("web", "code"));
  EXPECT_NEAR(TaskShare(ds, "web"), 0.7, 0.015);
  EXPECT_FALSE(ds.has_targets());
  const DataStats st = ComputeStats(ds);
  EXPECT_GT(st.input.p99, 10 * st.input.p50);  // long-tailed
}

TEST(GeneratorTest, SftMatchesAlpacaMoments) {
  const Dataset ds = Generate("sft");
  double in = 0, out = 0, total = 0, total2 = 0, in2 = 0, out2 = 0;
  for (const Sample& s : ds.samples()) {
    in += s.input_len;
    out += s.target_len;
    in2 += static_cast<double>(s.input_len) * s.input_len;
    out2 += static_cast<double>(s.target_len) * s.target_len;
    total += s.tokens();
    total2 += static_cast<double>(s.tokens()) * s.tokens();
  }
  const double n = static_cast<double>(ds.size());
  const auto sd = [n](double sum, double sum2) {
    return std::sqrt(sum2 / n - (sum / n) * (sum / n));
  };
  EXPECT_NEAR(in / n, 19.67, 19.67 * 0.03);
  EXPECT_NEAR(sd(in, in2), 15.19, 15.19 * 0.1);
  EXPECT_NEAR(out / n, 64.51, 64.51 * 0.03);
  EXPECT_NEAR(sd(out, out2), 64.85, 64.85 * 0.15);
  EXPECT_NEAR(total / n, 85, 85 * 0.03);
  EXPECT_NEAR(sd(total, total2) / (total / n), 0.8, 0.08);
}

TEST(GeneratorTest, LongContextIsUniformOverEightToSixtyFourK) {
  const Dataset ds = Generate("long-context");
  const DataStats st = ComputeStats(ds);
  EXPECT_GE(st.input.min, 8192);
  EXPECT_LE(st.input.max, 65536);
  EXPECT_NEAR(st.input.mean, (8192 + 65536) / 2.0, 600);
  EXPECT_NEAR(static_cast<double>(st.input.p50), (8192 + 65536) / 2.0, 1000);
  EXPECT_EQ(st.target.max, 0);
}

TEST(GeneratorTest, FlanLikeIsAMultiTaskEncoderDecoderMix) {
  const Dataset ds = Generate("flan-like");
  EXPECT_EQ(ds.num_tasks(), 8);
  EXPECT_NEAR(TaskShare(ds, "classify"), 0.30, 0.015);
  EXPECT_NEAR(TaskShare(ds, "few-shot"), 0.16, 0.015);
  const DataStats st = ComputeStats(ds);
  EXPECT_GE(st.target.min, 1);  // every task has a target
  EXPECT_NEAR(static_cast<double>(st.input.p50), 180, 25);
  EXPECT_NEAR(static_cast<double>(st.target.p50), 12, 2);
  const auto [in_mu, in_sigma] = LogMoments(ds, true);
  const auto [out_mu, out_sigma] = LogMoments(ds, false);
  EXPECT_NEAR(in_sigma, 1.0, 0.1);
  EXPECT_NEAR(out_sigma, 1.2, 0.15);
  // Translation targets follow their inputs.
  const TaskId tr = ds.FindTask("translate");
  for (const Sample& s : ds.samples()) {
    if (s.task != tr) continue;
    EXPECT_LT(s.target_len, 4 * s.input_len + 2);
    EXPECT_GT(4 * s.target_len + 2, s.input_len);
  }
}

TEST(GeneratorTest, UnknownPresetAndBadProfilesAreErrors) {
  const auto unknown = SampleGenerator::Create("webb", 0);
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr("'web', 'code', 'web-code'"));
  EXPECT_FALSE(GenerateDataset("web", 0, 0).ok());

  using Kind = LengthDistribution::Kind;
  const LengthDistribution ln{Kind::kLogNormal, 100, 1};
  const LengthDistribution zero{};
  EXPECT_THAT(SampleGenerator::FromProfile("g", {}, 0).status().message(),
              HasSubstr("at least one task"));
  EXPECT_THAT(SampleGenerator::FromProfile("g", {{"a", 0, ln, zero}}, 0).status().message(),
              HasSubstr("weight must be a positive number"));
  EXPECT_THAT(SampleGenerator::FromProfile("g", {{"a", 1, zero, zero}}, 0).status().message(),
              HasSubstr("input length cannot always be 0"));
  EXPECT_THAT(SampleGenerator::FromProfile("g", {{"a", 1, {Kind::kUniform, 5, 2}, zero}}, 0)
                  .status()
                  .message(),
              HasSubstr("uniform bounds"));
  EXPECT_THAT(SampleGenerator::FromProfile("g", {{"a", 1, ln, zero}, {"a", 1, ln, zero}}, 0)
                  .status()
                  .message(),
              HasSubstr("appears twice"));
  EXPECT_TRUE(SampleGenerator::FromProfile("g", {{"a", 2, ln, {Kind::kInputRatio, 1, 0}}}, 0).ok());
}

}  // namespace
}  // namespace sluice
