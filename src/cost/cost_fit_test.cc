#include "cost/cost_fit.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "cost/cost_test_util.h"
#include "cost/profile_table.h"

namespace sluice {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(NelderMeadTest, MinimisesRosenbrock) {
  auto rosenbrock = [](const std::vector<double>& x) {
    return 100 * std::pow(x[1] - x[0] * x[0], 2) + std::pow(1 - x[0], 2);
  };
  NelderMeadResult r = MinimizeNelderMead(rosenbrock, {-1.2, 1.0}, 0.5, 5000, 1e-14);
  EXPECT_NEAR(r.x[0], 1.0, 1e-3);
  EXPECT_NEAR(r.x[1], 1.0, 2e-3);
  EXPECT_LT(r.value, 1e-6);
  EXPECT_LE(r.evaluations, 5000);
  // Deterministic: the same call gives the same answer.
  EXPECT_EQ(MinimizeNelderMead(rosenbrock, {-1.2, 1.0}, 0.5, 5000, 1e-14).x, r.x);
}

// Error bounds are the measured results (docs/cost-models.md) plus a margin: GPT mean 3.5%,
// worst group mean 6.4%, worst point 40.5%; T5 mean 4.5%, worst group 5.8%, worst point 43.6%.
void ExpectFit(const std::string& path, const ModelSpec& spec, double mean_bound,
               double group_bound, double worst_bound) {
  StatusOr<LayerCostTable> t = ReadLayerCostTable(path);
  ASSERT_TRUE(t.ok());
  StatusOr<FitReport> r = FitAnalyticToTable(*t, spec, cost_test::A100());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_LT(r->mean_rel_error, mean_bound);
  EXPECT_LT(r->max_rel_error, worst_bound);
  EXPECT_EQ(r->infeasible_points, 0);
  int64_t points = 0;
  for (const FitGroup& g : r->groups) {
    EXPECT_LT(g.mean_rel_error, group_bound)
        << LayerKindName(g.kind) << " tp " << g.tp << " " << RecomputeName(g.recompute);
    points += g.points;
  }
  EXPECT_EQ(points, r->points);

  // The model built from the fitted factors answers what the report measured.
  AnalyticOptions options;
  options.factors = r->factors;
  StatusOr<std::unique_ptr<AnalyticCostModel>> m =
      AnalyticCostModel::Create(spec, cost_test::A100(), options);
  ASSERT_TRUE(m.ok());
  double sum = 0;
  int64_t n = 0;
  for (const TableConfig& c : t->configs) {
    const int e = static_cast<int>(TableStage::kEncoder);
    for (const CostRow& row : c.forward_ms[e]) {
      for (size_t i = 0; i < row.mbs.size(); ++i) {
        const LayerCost cost =
            (*m)->Layer(LayerKind::kEncoder, {row.mbs[i], row.seqlen, 0}, c.tp, c.recompute);
        ASSERT_TRUE(cost.feasible);
        sum += std::fabs(cost.forward.millis() - row.value[i]) / row.value[i];
        ++n;
      }
    }
  }
  EXPECT_LT(sum / static_cast<double>(n), group_bound);
}

TEST(CostFitTest, GptTableFitsWithinMeasuredBounds) {
  ExpectFit(cost_test::GptTablePath(), cost_test::Gpt67b(), 0.045, 0.08, 0.5);
}

TEST(CostFitTest, T5TableFitsWithinMeasuredBounds) {
  ExpectFit(cost_test::T5TablePath(), cost_test::T511b(), 0.055, 0.07, 0.5);
}

TEST(CostFitTest, ReportHasOneLinePerGroup) {
  StatusOr<LayerCostTable> t = ReadLayerCostTable(cost_test::GptTablePath());
  ASSERT_TRUE(t.ok());
  StatusOr<FitReport> r = FitAnalyticToTable(*t, cost_test::Gpt67b(), cost_test::A100());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->groups.size(), 48u);  // 4 tp x 3 recompute x (encoder, head) x (fwd, bwd)
  EXPECT_EQ(r->factors.entries().size(), 24u);
  const std::string text = FormatFitReport(*r);
  EXPECT_THAT(text, AllOf(HasSubstr("a100_gpt_6.7b.json"), HasSubstr("mean_err"),
                          HasSubstr("output-head"), HasSubstr("4096 points in 48 groups")));
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 48 + 6);
}

// Measured: time = overhead + work (p = 1) fits the GPT table to 10.0% mean error, a near-hard
// max (p = 60) to 5.8%, the fitted smooth max to 3.5%.
TEST(CostFitTest, SmoothMaxBeatsSumAndHardMax) {
  StatusOr<LayerCostTable> t = ReadLayerCostTable(cost_test::GptTablePath());
  ASSERT_TRUE(t.ok());
  auto fit = [&](double p) {
    FitOptions o;
    o.fixed_sharpness = p;
    StatusOr<FitReport> r = FitAnalyticToTable(*t, cost_test::Gpt67b(), cost_test::A100(), o);
    EXPECT_TRUE(r.ok());
    return r.ok() ? r->mean_rel_error : 1.0;
  };
  const double fitted = fit(0);
  EXPECT_GT(fit(1), 2 * fitted);
  EXPECT_GT(fit(60), 1.3 * fitted);
}

// An MoE table: the encoder factors are fitted to the stack's mean layer, built from the dense
// and the MoE layer's rows at the points both have (every point here: the MoE rows copy the
// dense ones, 1.5x slower).
TEST(CostFitTest, MoeTablesFitTheMeanLayer) {
  StatusOr<LayerCostTable> t = ReadLayerCostTable(cost_test::GptTablePath());
  ASSERT_TRUE(t.ok());
  const StatusOr<FitReport> dense = FitAnalyticToTable(*t, cost_test::Gpt67b(), cost_test::A100());
  ASSERT_TRUE(dense.ok());
  for (const int64_t interval : {2, 1}) {
    LayerCostTable moe = *t;
    moe.model.moe = MoeSpec{.experts = 8, .top_k = 2, .layer_interval = interval};
    const int e = static_cast<int>(TableStage::kEncoder);
    const int me = static_cast<int>(TableStage::kMoeEncoder);
    for (TableConfig& c : moe.configs) {
      for (auto* series : {&c.forward_ms, &c.backward_ms}) {
        (*series)[me] = (*series)[e];
        for (CostRow& row : (*series)[me]) {
          for (double& v : row.value) v *= 1.5;
        }
        if (interval == 1) (*series)[e].clear();
      }
    }
    ModelSpec model = cost_test::Gpt67b();
    model.moe = moe.model.moe;
    StatusOr<FitReport> r = FitAnalyticToTable(moe, model, cost_test::A100());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->groups.size(), dense->groups.size()) << interval;
    EXPECT_EQ(r->points, dense->points) << interval;
  }
}

TEST(CostFitTest, RejectsAMismatchedModel) {
  StatusOr<LayerCostTable> t = ReadLayerCostTable(cost_test::GptTablePath());
  ASSERT_TRUE(t.ok());
  StatusOr<FitReport> r = FitAnalyticToTable(*t, cost_test::T511b(), cost_test::A100());
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("field 'model.kind'"));
}

}  // namespace
}  // namespace sluice
