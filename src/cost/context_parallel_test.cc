#include "cost/context_parallel.h"

#include <gtest/gtest.h>

#include <memory>

#include "cost/analytic_cost_model.h"
#include "cost/cost_test_util.h"
#include "cost/layer_work.h"

namespace sluice {
namespace {

constexpr LayerKind kEnc = LayerKind::kEncoder;
constexpr Recompute kNone = Recompute::kNone;

ModelSpec LongGpt() {
  ModelSpec m = cost_test::Gpt67b();
  m.max_position = 131072;
  return m;
}

std::unique_ptr<AnalyticCostModel> Flash(const ModelSpec& spec) {
  AnalyticOptions options;
  options.work.flash_attention = true;
  StatusOr<std::unique_ptr<AnalyticCostModel>> m =
      AnalyticCostModel::Create(spec, cost_test::A100(), options);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return std::move(m).value();
}

CpRing FastRing(int64_t cp) { return CpRing{cp, LinkSpec{1e15, Duration::Zero()}}; }

TEST(ContextParallelTest, CpOneIsTheCostModelItself) {
  auto cost = Flash(LongGpt());
  for (LayerKind kind : {kEnc, LayerKind::kEmbedding, LayerKind::kOutputHead}) {
    const LayerShape shape{2, 4096, 0};
    EXPECT_EQ(ContextParallelLayer(*cost, kind, shape, 2, kNone, CpRing{1, {}}),
              cost->Layer(kind, shape, 2, kNone));
  }
}

TEST(ContextParallelTest, LoadBalancedChunksSplitLinearAndAttentionWorkEvenly) {
  // The model behind the price: s/cp tokens per device and cp causal triangles of s/cp.
  const ModelSpec m = LongGpt();
  WorkOptions flash;
  flash.flash_attention = true;
  for (int64_t cp : {2, 4, 8}) {
    const int64_t s = 32768;
    const LayerShape full{1, s, 0};
    const LayerShape local{1, CpLocalLength(s, cp), 0};
    EXPECT_EQ(local.seqlen * cp, s);
    const LayerWork w_full = ComputeLayerWork(m, kEnc, full, 1, kNone, flash);
    const LayerWork w_local = ComputeLayerWork(m, kEnc, local, 1, kNone, flash);
    EXPECT_DOUBLE_EQ(w_local.forward.gemm_flops * static_cast<double>(cp),
                     w_full.forward.gemm_flops);
    EXPECT_DOUBLE_EQ(w_local.forward.attention_flops * static_cast<double>(cp * cp),
                     w_full.forward.attention_flops);
  }
  EXPECT_EQ(CpLocalLength(1001, 4), 252);  // padded to 1,008, a multiple of 2cp
}

TEST(ContextParallelTest, CpTwoHalvesPerDeviceAttentionTimeAndMemory) {
  auto cost = Flash(LongGpt());
  const LayerShape full{1, 32768, 0};
  const LayerCost one = cost->Layer(kEnc, full, 1, kNone);
  ASSERT_TRUE(one.feasible);
  const LayerCost half_probe = cost->Layer(kEnc, LayerShape{2, 16384, 0}, 1, kNone);
  const double attention_full =
      2 * (one.forward.seconds() - half_probe.forward.seconds());  // A(full)
  const CpLayerBreakdown two = ContextParallelBreakdown(*cost, kEnc, full, 1, kNone, FastRing(2));
  ASSERT_TRUE(two.cost.feasible);
  EXPECT_EQ(two.local.seqlen, 16384);
  // Per device: cp triangles of the local length = A(full) / cp.
  const double attention_device = 2 * two.attention_forward.seconds();
  EXPECT_NEAR(attention_device / (attention_full / 2), 1.0, 0.02);
  // The whole layer halves (linear work halves too), within the per-call floor's blur.
  EXPECT_NEAR(two.cost.forward.seconds() / one.forward.seconds(), 0.5, 0.02);
  EXPECT_NEAR(two.cost.backward.seconds() / one.backward.seconds(), 0.5, 0.02);
  EXPECT_EQ(two.cost.backward_weight, cost->Layer(kEnc, two.local, 1, kNone).backward_weight);
  // Flash attention stores activations linear in tokens: half per device.
  EXPECT_NEAR(static_cast<double>(two.cost.stored_activation.count()) /
                  static_cast<double>(one.stored_activation.count()),
              0.5, 1e-3);
  EXPECT_LT(two.cost.peak_activation, one.peak_activation);
  EXPECT_EQ(two.exposed_forward, Duration::Zero());
}

TEST(ContextParallelTest, SlowRingIsExposedBeyondTheAttentionItOverlaps) {
  auto cost = Flash(LongGpt());
  const LayerShape shape{1, 8192, 0};
  const CpLayerBreakdown fast = ContextParallelBreakdown(*cost, kEnc, shape, 1, kNone, FastRing(4));
  const CpLayerBreakdown slow = ContextParallelBreakdown(
      *cost, kEnc, shape, 1, kNone, CpRing{4, LinkSpec{1e9, Duration::Micros(10)}});
  ASSERT_TRUE(fast.cost.feasible && slow.cost.feasible);
  // K and V of 2,048 tokens x 4,096 wide, fp16.
  EXPECT_EQ(slow.kv_block, Bytes::Of(2 * 2 * 2048 * 4096));
  EXPECT_GT(slow.ring_step_forward, slow.attention_forward);
  EXPECT_EQ(slow.exposed_forward, (slow.ring_step_forward - slow.attention_forward) * 3);
  EXPECT_EQ(slow.cost.forward - fast.cost.forward, slow.exposed_forward);
  EXPECT_EQ(slow.cost.backward - fast.cost.backward, slow.exposed_backward);
  EXPECT_GT(slow.exposed_backward, slow.exposed_forward);
}

TEST(ContextParallelTest, PerTokenLayersRunTheLocalShape) {
  auto cost = Flash(LongGpt());
  const LayerShape shape{1, 8192, 0};
  for (LayerKind kind : {LayerKind::kEmbedding, LayerKind::kOutputHead}) {
    EXPECT_EQ(ContextParallelLayer(*cost, kind, shape, 1, kNone, FastRing(4)),
              cost->Layer(kind, LayerShape{1, 2048, 0}, 1, kNone));
  }
}

TEST(ContextParallelTest, RingLinkIsIntraNodeWhenTheGroupFitsANode) {
  const ClusterSpec c = *ClusterPreset("a100-40g", 16);
  ParallelConfig par;
  par.tp = 2;
  par.cp = 4;
  EXPECT_EQ(CpRingLink(c, par), c.intra_node);
  par.tp = 4;
  EXPECT_EQ(CpRingLink(c, par), c.inter_node);
}

}  // namespace
}  // namespace sluice
