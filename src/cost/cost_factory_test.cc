#include "cost/cost_factory.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cost/cost_test_util.h"

namespace sluice {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

ClusterSpec Cluster(DeviceSpec device) {
  ClusterSpec c;
  c.name = device.name + ":8";
  c.device = std::move(device);
  c.intra_node = {300e9, Duration::Micros(3)};
  c.inter_node = {6.25e9, Duration::Micros(15)};
  return c;
}

DeviceSpec H100() { return DeviceSpec{"h100-80g", 989e12, Bytes::GiB(80), 3350e9}; }

std::string Describe(const ModelSpec& model, const ClusterSpec& cluster, std::string kind) {
  CostModelOptions o;
  o.kind = std::move(kind);
  StatusOr<std::unique_ptr<CostModel>> m = MakeCostModel(model, cluster, o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? (*m)->Describe() : "";
}

TEST(MakeCostModelTest, AutoUsesTheShippedTableOnA100) {
  EXPECT_THAT(Describe(cost_test::Gpt67b(), Cluster(cost_test::A100()), "auto"),
              AllOf(StartsWith("profiled: "), HasSubstr("profiles/a100_gpt_6.7b.json")));
  EXPECT_THAT(Describe(cost_test::T511b(), Cluster(cost_test::A100()), "auto"),
              AllOf(StartsWith("profiled: "), HasSubstr("profiles/a100_t5_11b.json")));
}

TEST(MakeCostModelTest, AutoFallsBackToFittedAnalytic) {
  // Another device: the table does not describe it.
  EXPECT_THAT(Describe(cost_test::Gpt67b(), Cluster(H100()), "auto"),
              AllOf(StartsWith("analytic: h100-80g"), HasSubstr("fitted to"),
                    HasSubstr("a100_gpt_6.7b.json")));
  // A model without a table.
  ModelSpec llama = cost_test::Gpt67b();
  llama.name = "llama-7b";
  llama.mlp = MlpKind::kSwiGlu;
  llama.ffn_hidden = 11008;
  EXPECT_THAT(Describe(llama, Cluster(cost_test::A100()), "auto"),
              AllOf(StartsWith("analytic: a100-40g"), HasSubstr("fitted to")));
  // Same name as a table but another shape: not profiled.
  ModelSpec renamed = cost_test::Gpt67b();
  renamed.hidden = 2048;
  renamed.heads = 16;
  renamed.kv_heads = 16;
  EXPECT_THAT(Describe(renamed, Cluster(cost_test::A100()), "auto"), StartsWith("analytic: "));
}

TEST(MakeCostModelTest, ExplicitKinds) {
  EXPECT_THAT(Describe(cost_test::Gpt67b(), Cluster(cost_test::A100()), "analytic"),
              StartsWith("analytic: a100-40g"));
  EXPECT_THAT(Describe(cost_test::T511b(), Cluster(H100()), "profiled:" + cost_test::T5TablePath()),
              StartsWith("profiled: "));
  EXPECT_THAT(Describe(cost_test::T511b(), Cluster(cost_test::A100()),
                       "analytic:" + cost_test::T5TablePath()),
              AllOf(StartsWith("analytic: "), HasSubstr("a100_t5_11b.json")));
}

TEST(MakeCostModelTest, Errors) {
  CostModelOptions o;
  o.kind = "profiled:/nonexistent/t.json";
  StatusOr<std::unique_ptr<CostModel>> m =
      MakeCostModel(cost_test::Gpt67b(), Cluster(cost_test::A100()), o);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(m.status().message(), HasSubstr("/nonexistent/t.json"));
  o.kind = "profiled:" + cost_test::GptTablePath();
  m = MakeCostModel(cost_test::T511b(), Cluster(cost_test::A100()), o);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("field 'model.kind'"));
  o.kind = "roofline";
  m = MakeCostModel(cost_test::Gpt67b(), Cluster(cost_test::A100()), o);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(),
              AllOf(HasSubstr("'roofline'"), HasSubstr("'auto', 'analytic', 'analytic:PATH' or "
                                                       "'profiled:PATH'")));
}

TEST(MakeCostModelTest, ProfiledAndAnalyticAgreeRoughlyOnTheTable) {
  const ClusterSpec a100 = Cluster(cost_test::A100());
  CostModelOptions p, a;
  p.kind = "auto";
  a.kind = "analytic";
  StatusOr<std::unique_ptr<CostModel>> prof = MakeCostModel(cost_test::Gpt67b(), a100, p);
  StatusOr<std::unique_ptr<CostModel>> ana = MakeCostModel(cost_test::Gpt67b(), a100, a);
  ASSERT_TRUE(prof.ok() && ana.ok());
  const LayerCost x = (*prof)->Layer(LayerKind::kEncoder, {4, 1024, 0}, 2, Recompute::kNone);
  const LayerCost y = (*ana)->Layer(LayerKind::kEncoder, {4, 1024, 0}, 2, Recompute::kNone);
  ASSERT_TRUE(x.feasible && y.feasible);
  EXPECT_NEAR(y.forward.millis() / x.forward.millis(), 1.0, 0.15);
  EXPECT_NEAR(y.backward.millis() / x.backward.millis(), 1.0, 0.15);
}

}  // namespace
}  // namespace sluice
