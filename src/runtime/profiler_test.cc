// Tests of `sluice profile`'s pieces: the counting CPU allocator (memory_stats.h) and the
// profiler (profiler.h) on tiny models. Timings are only checked for sanity (positive, bigger
// shapes not far cheaper); speed figures belong in bench/.
#include "runtime/profiler.h"

#include <c10/core/CPUAllocator.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>

#include "cost/profile_table.h"
#include "cost/profiled_cost_model.h"
#include "runtime/memory_stats.h"
#include "runtime/torch_pch.h"

namespace sluice::runtime {
namespace {

using ::testing::HasSubstr;

ModelSpec TinyGpt() {
  ModelSpec m = *ModelPreset("gpt-tiny");
  m.name = "gpt-profile-test";
  m.layers = 2;
  m.hidden = 32;
  m.heads = 2;
  m.kv_heads = 2;
  m.ffn_hidden = 64;
  m.vocab = 2048;  // the head must stand out of the timing noise of the layer it is paired with
  m.max_position = 128;
  return m;
}

ModelSpec TinyT5() {
  ModelSpec m = TinyGpt();
  m.name = "t5-profile-test";
  m.kind = ModelKind::kEncoderDecoder;
  m.decoder_layers = 2;
  return m;
}

ProfileOptions SmallGrid() {
  ProfileOptions o;
  o.mbs = {1, 2, 4};
  o.seqlens = {16, 64};
  o.recompute = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
  o.repeats = 3;
  o.warmup = 1;
  return o;
}

// The value of `series` at (seqlen, mbs), or -1 when absent.
double At(const CostSeries& series, int64_t seqlen, int64_t mbs, int64_t dec_seqlen = 0) {
  for (const CostRow& row : series) {
    if (row.seqlen != seqlen || row.dec_seqlen != dec_seqlen) continue;
    for (size_t i = 0; i < row.mbs.size(); ++i) {
      if (row.mbs[i] == mbs) return row.value[i];
    }
  }
  return -1;
}

constexpr int kEnc = static_cast<int>(TableStage::kEncoder);
constexpr int kDec = static_cast<int>(TableStage::kDecoder);
constexpr int kPost = static_cast<int>(TableStage::kPostprocess);

TEST(CpuMemoryCounterTest, CountsLiveBytesPeakAndLimit) {
  c10::Allocator* before = c10::GetCPUAllocator();
  at::Tensor outlives;
  {
    auto counter = CpuMemoryCounter::Install();
    ASSERT_TRUE(counter.ok()) << counter.status().message();
    EXPECT_NE(c10::GetCPUAllocator(), before);
    const Bytes base = (*counter)->current();
    {
      at::Tensor a = torch::empty({1000}, torch::kFloat32);
      EXPECT_EQ((*counter)->current() - base, Bytes::Of(4000));
      at::Tensor b = torch::empty({500}, torch::kFloat64);
      EXPECT_EQ((*counter)->current() - base, Bytes::Of(8000));
    }
    EXPECT_EQ((*counter)->current(), base);
    EXPECT_EQ((*counter)->peak() - base, Bytes::Of(8000));
    (*counter)->ResetPeak();
    EXPECT_EQ((*counter)->peak(), base);

    (*counter)->SetLimit((*counter)->current() + Bytes::Of(1000));
    EXPECT_THROW(torch::empty({1000}, torch::kFloat32), std::bad_alloc);
    EXPECT_TRUE((*counter)->limit_hit());
    at::Tensor small = torch::empty({100}, torch::kFloat32);  // 400 bytes: under the limit
    (*counter)->SetLimit(std::nullopt);
    (*counter)->ResetPeak();
    EXPECT_FALSE((*counter)->limit_hit());
    outlives = torch::ones({256}, torch::kFloat32);
  }
  // The previous allocator is back, and a block made while counting is still usable and freed.
  EXPECT_EQ(c10::GetCPUAllocator(), before);
  EXPECT_FLOAT_EQ(outlives.sum().item<float>(), 256.0f);
  outlives = at::Tensor();
}

TEST(CpuMemoryCounterTest, SeesWhatAutogradSaves) {
  auto counter = CpuMemoryCounter::Install();
  ASSERT_TRUE(counter.ok());
  at::Tensor w = torch::randn({64, 64}).requires_grad_(true);
  at::Tensor x = torch::randn({32, 64});
  const Bytes base = (*counter)->current();
  at::Tensor y = at::gelu(at::matmul(x, w));  // keeps x @ w for gelu's backward, plus y
  const Bytes with_graph = (*counter)->current() - base;
  EXPECT_GE(with_graph, Bytes::Of(2 * 32 * 64 * 4));
  {
    torch::NoGradGuard no_grad;
    at::Tensor z = at::gelu(at::matmul(x, w));
    EXPECT_LT((*counter)->current() - base, with_graph + Bytes::Of(32 * 64 * 4 + 1));
  }
}

TEST(ProfilerTest, ValidatesOptionsNamingTheFlag) {
  const ModelSpec m = TinyGpt();
  ProfileOptions o = SmallGrid();
  EXPECT_TRUE(ValidateProfileOptions(m, o).ok());
  o.mbs = {1, 0};
  EXPECT_THAT(ValidateProfileOptions(m, o).message(), HasSubstr("--mbs"));
  o = SmallGrid();
  o.mbs = {2, 2};
  EXPECT_THAT(ValidateProfileOptions(m, o).message(), HasSubstr("given twice"));
  o = SmallGrid();
  o.seqlens = {16, 129};
  EXPECT_THAT(ValidateProfileOptions(m, o).message(),
              AllOf(HasSubstr("--seqlen"), HasSubstr("1 to 128, the model's max_position")));
  o = SmallGrid();
  o.recompute = {Recompute::kFull, Recompute::kFull};
  EXPECT_THAT(ValidateProfileOptions(m, o).message(), HasSubstr("--recompute"));
  o = SmallGrid();
  o.repeats = 0;
  EXPECT_THAT(ValidateProfileOptions(m, o).message(), HasSubstr("--repeats"));
  o = SmallGrid();
  o.threads = 0;
  EXPECT_THAT(ValidateProfileOptions(m, o).message(), HasSubstr("--threads"));
  o = SmallGrid();
  o.dec_seqlens = {16};
  EXPECT_THAT(ValidateProfileOptions(m, o).message(),
              AllOf(HasSubstr("--dec-seqlen"), HasSubstr("decoder-only")));
  ModelSpec swiglu = m;
  swiglu.mlp = MlpKind::kSwiGlu;
  EXPECT_THAT(ValidateProfileOptions(swiglu, SmallGrid()).message(), HasSubstr("SwiGLU"));
  ModelSpec gqa = m;
  gqa.kv_heads = 1;
  EXPECT_THAT(ValidateProfileOptions(gqa, SmallGrid()).message(), HasSubstr("grouped-query"));
  // ProfileModel refuses the same options before measuring anything.
  o = SmallGrid();
  o.mbs = {};
  EXPECT_EQ(ProfileModel(m, o, nullptr).status().code(), StatusCode::kInvalidArgument);
}

class GptProfile : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Another thread count than ProfileOptions::threads (1), so restoring it is visible.
    const int threads_outside = at::get_num_threads();
    at::set_num_threads(2);
    c10::Allocator* allocator_before = c10::GetCPUAllocator();
    ProfileOptions o = SmallGrid();
    o.repeats = 5;
    StatusOr<LayerCostTable> t = ProfileModel(TinyGpt(), o, nullptr);
    threads_restored_ = at::get_num_threads() == 2;
    allocator_restored_ = c10::GetCPUAllocator() == allocator_before;
    at::set_num_threads(threads_outside);
    ASSERT_TRUE(t.ok()) << t.status().message();
    table_ = new LayerCostTable(*t);
  }
  static void TearDownTestSuite() {
    delete table_;
    table_ = nullptr;
  }
  static const TableConfig& Config(Recompute rc) {
    const TableConfig* c = table_->Find(1, rc);
    SLUICE_CHECK(c != nullptr);
    return *c;
  }
  static LayerCostTable* table_;
  static bool threads_restored_, allocator_restored_;
};
LayerCostTable* GptProfile::table_ = nullptr;
bool GptProfile::threads_restored_ = false;
bool GptProfile::allocator_restored_ = false;

TEST_F(GptProfile, RestoresThreadsAndAllocator) {
  EXPECT_TRUE(threads_restored_);
  EXPECT_TRUE(allocator_restored_);
}

TEST_F(GptProfile, WritesATableProfiledCostModelLoads) {
  ASSERT_EQ(table_->configs.size(), 3u);
  // Through the file format, as `sluice profile` writes it.
  StatusOr<LayerCostTable> back =
      LayerCostTableFromJson(LayerCostTableToJson(*table_), "profile.json");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->path, "profile.json");
  back->path = table_->path;
  EXPECT_EQ(*back, *table_);
  auto cost = ProfiledCostModel::Create(*back, TinyGpt());
  ASSERT_TRUE(cost.ok()) << cost.status().message();
  // Every grid point was measured (no limit) and answers the measured value.
  for (const Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    for (const int64_t len : {16, 64}) {
      for (const int64_t mbs : {1, 2, 4}) {
        const LayerCost c = (*cost)->Layer(LayerKind::kEncoder, LayerShape{mbs, len, 0}, 1, rc);
        ASSERT_TRUE(c.feasible) << RecomputeName(rc) << " " << len << " " << mbs;
        EXPECT_NEAR(c.forward.millis(), At(Config(rc).forward_ms[kEnc], len, mbs), 1e-6);
        EXPECT_NEAR(c.stored_activation.mb(), At(Config(rc).stored_activation_mb[kEnc], len, mbs),
                    1e-6);
        EXPECT_GT(c.backward.millis(), 0);
      }
    }
    const LayerCost head = (*cost)->Layer(LayerKind::kOutputHead, LayerShape{2, 64, 0}, 1, rc);
    EXPECT_TRUE(head.feasible);
    EXPECT_GT(head.forward.millis(), 0);
  }
  // Outside the grid: infeasible, never extrapolated.
  EXPECT_FALSE(
      (*cost)->Layer(LayerKind::kEncoder, LayerShape{8, 64, 0}, 1, Recompute::kNone).feasible);
  // Parameters: one layer of the runtime's model, 12h^2 + 13h, at 2 bytes.
  const int64_t h = 32;
  EXPECT_EQ((*cost)->LayerParams(LayerKind::kEncoder, 1),
            4 * h * h + 4 * h + 2 * h * 64 + 64 + h + 4 * h);
}

TEST_F(GptProfile, StoredActivationsGrowWithShapeAndShrinkWithRecompute) {
  for (const Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    const CostSeries& stored = Config(rc).stored_activation_mb[kEnc];
    const CostSeries& peak = Config(rc).peak_activation_mb[kEnc];
    for (const int64_t mbs : {1, 2, 4}) {
      EXPECT_GT(At(stored, 64, mbs), At(stored, 16, mbs)) << RecomputeName(rc) << " mbs " << mbs;
      EXPECT_GE(At(peak, 64, mbs), At(stored, 64, mbs));
    }
    for (const int64_t len : {16, 64}) {
      EXPECT_GT(At(stored, len, 2), At(stored, len, 1));
      EXPECT_GT(At(stored, len, 4), At(stored, len, 2));
    }
  }
  for (const int64_t len : {16, 64}) {
    for (const int64_t mbs : {1, 2, 4}) {
      const double none = At(Config(Recompute::kNone).stored_activation_mb[kEnc], len, mbs);
      const double sel = At(Config(Recompute::kSelective).stored_activation_mb[kEnc], len, mbs);
      const double full = At(Config(Recompute::kFull).stored_activation_mb[kEnc], len, mbs);
      EXPECT_LT(sel, none) << len << " " << mbs;
      EXPECT_LT(full, sel) << len << " " << mbs;
      // Full recompute keeps only the layer's output: mbs x len x hidden floats.
      EXPECT_NEAR(full, static_cast<double>(mbs * len * 32 * 4) / 1e6, 1e-9);
    }
  }
}

TEST_F(GptProfile, BiggerShapesAreNotMuchCheaper) {
  // A sanity bound, not a speed goal: 16x the tokens may not cost a third of the smallest point.
  for (const Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    const TableConfig& c = Config(rc);
    const double small = At(c.forward_ms[kEnc], 16, 1) + At(c.backward_ms[kEnc], 16, 1);
    const double big = At(c.forward_ms[kEnc], 64, 4) + At(c.backward_ms[kEnc], 64, 4);
    EXPECT_GT(big, small / 3) << RecomputeName(rc);
    EXPECT_GT(At(c.backward_ms[kEnc], 64, 4), 0);
  }
  const TableConfig& c = Config(Recompute::kNone);
  EXPECT_GT(At(c.forward_ms[kPost], 64, 4) + At(c.backward_ms[kPost], 64, 4),
            (At(c.forward_ms[kPost], 16, 1) + At(c.backward_ms[kPost], 16, 1)) / 3);
}

TEST(ProfilerTest, PointsAboveTheActivationLimitAreHoles) {
  ProfileOptions o = SmallGrid();
  o.recompute = {Recompute::kNone};
  o.repeats = 3;
  o.warmup = 0;
  o.seqlens = {16, 128};
  // One layer of seqlen 128 at mbs >= 2 stores well above 0.5 MB (the attention scores alone are
  // 2 x 2 heads x 128 x 128 x 4 B = 0.26 MB, softmax and dropout-free output again as much).
  o.activation_limit = Bytes::MB(0.5);
  StatusOr<LayerCostTable> t = ProfileModel(TinyGpt(), o, nullptr);
  ASSERT_TRUE(t.ok()) << t.status().message();
  const TableConfig& c = t->configs.at(0);
  EXPECT_GT(At(c.forward_ms[kEnc], 16, 4), 0);
  EXPECT_EQ(At(c.forward_ms[kEnc], 128, 4), -1);
  for (const CostRow& row : c.peak_activation_mb[kEnc]) {
    for (const double v : row.value) EXPECT_LE(v, 0.5);
  }
  auto cost = ProfiledCostModel::Create(*t, TinyGpt());
  ASSERT_TRUE(cost.ok()) << cost.status().message();
  EXPECT_FALSE(
      (*cost)->Layer(LayerKind::kEncoder, LayerShape{4, 128, 0}, 1, Recompute::kNone).feasible);
  EXPECT_TRUE(
      (*cost)->Layer(LayerKind::kEncoder, LayerShape{4, 16, 0}, 1, Recompute::kNone).feasible);
  // A limit nothing fits is an error, not an empty table.
  o.activation_limit = Bytes::Of(16);
  EXPECT_EQ(ProfileModel(TinyGpt(), o, nullptr).status().code(), StatusCode::kFailedPrecondition);
}

TEST(ProfilerTest, EncoderDecoderTableHasDecoderPairsAndLoads) {
  ProfileOptions o;
  o.mbs = {1, 2};
  o.seqlens = {16, 32};
  o.dec_seqlens = {8, 16};
  o.recompute = {Recompute::kNone, Recompute::kFull};
  o.repeats = 3;
  o.warmup = 1;
  Progress progress("test", ProfileWorkUnits(TinyT5(), o), stderr, /*min_total=*/1 << 30);
  StatusOr<LayerCostTable> t = ProfileModel(TinyT5(), o, &progress);
  ASSERT_TRUE(t.ok()) << t.status().message();
  const TableConfig& none = *t->Find(1, Recompute::kNone);
  EXPECT_EQ(none.forward_ms[kEnc].size(), 2u);
  EXPECT_EQ(none.forward_ms[kDec].size(), 4u);  // (16, 8), (16, 16), (32, 8), (32, 16)
  EXPECT_GT(At(none.forward_ms[kDec], 32, 2, 16), 0);
  EXPECT_GT(At(none.stored_activation_mb[kDec], 32, 2, 16),
            At(none.stored_activation_mb[kDec], 16, 2, 16));
  // The head is keyed by the decoder length.
  EXPECT_GT(At(none.forward_ms[kPost], 16, 2), 0);
  EXPECT_EQ(At(none.forward_ms[kPost], 32, 2), -1);
  auto cost = ProfiledCostModel::Create(*t, TinyT5());
  ASSERT_TRUE(cost.ok()) << cost.status().message();
  EXPECT_TRUE(
      (*cost)->Layer(LayerKind::kDecoder, LayerShape{2, 24, 12}, 1, Recompute::kFull).feasible);
}

ModelSpec TinyMoe(int64_t interval) {
  ModelSpec m = TinyGpt();
  m.name = "moe-profile-test";
  m.layers = 4;
  m.moe = MoeSpec{.experts = 4, .top_k = 2, .capacity_factor = 1.25, .layer_interval = interval};
  return m;
}

TEST(ProfilerTest, MoeTableHasTheMoeAndTheDenseLayerAndLoads) {
  constexpr int kMoe = static_cast<int>(TableStage::kMoeEncoder);
  ProfileOptions o;
  o.mbs = {1, 2};
  o.seqlens = {16, 32};
  o.recompute = {Recompute::kNone, Recompute::kFull};
  o.repeats = 3;
  o.warmup = 1;
  // An MoE layer every 2nd layer: both rows; every layer: the MoE rows only.
  for (const int64_t interval : {2, 1}) {
    const ModelSpec model = TinyMoe(interval);
    // Per point: the layer rows at each recompute level, the head, the MoE layer's parts.
    EXPECT_EQ(ProfileWorkUnits(model, o), 2 * 2 * ((interval == 2 ? 2 : 1) * 2 + 1 + 1));
    StatusOr<LayerCostTable> t = ProfileModel(model, o, nullptr);
    ASSERT_TRUE(t.ok()) << t.status().message();
    ASSERT_TRUE(t->model.moe.has_value());
    EXPECT_EQ(*t->model.moe, *model.moe);
    for (const Recompute rc : o.recompute) {
      const TableConfig& c = *t->Find(1, rc);
      EXPECT_EQ(c.forward_ms[kMoe].size(), 2u) << interval;
      EXPECT_EQ(c.forward_ms[kEnc].size(), interval == 2 ? 2u : 0u);
      EXPECT_GT(At(c.forward_ms[kMoe], 32, 2), 0);
      EXPECT_GT(At(c.backward_ms[kMoe], 32, 2), 0);
      ASSERT_TRUE(c.param_mb[kMoe].has_value());
      if (interval == 2) {
        // The MoE layer holds 4 expert MLPs and a router where the dense layer holds one MLP,
        // and keeps its dispatch buffers and routing for the backward.
        EXPECT_GT(*c.param_mb[kMoe], *c.param_mb[kEnc]);
        EXPECT_GT(At(c.stored_activation_mb[kMoe], 32, 2), At(c.stored_activation_mb[kEnc], 32, 2));
      }
    }
    // The MoE layer's parts, one by one, at every point: each positive; the parts without the
    // attention and norms are less than the whole layer; the sliced experts give a per-piece
    // overhead that the cost model passes on.
    ASSERT_TRUE(t->moe_parts.has_value());
    EXPECT_EQ(t->moe_parts->slices, 4);
    const TableConfig& layer = *t->Find(1, Recompute::kNone);
    double parts = 0;
    for (int k = 0; k < kNumMoeParts; ++k) {
      const auto part = static_cast<MoePart>(k);
      ASSERT_EQ(t->moe_parts->forward_ms[k].size(), 2u) << MoePartName(part);
      ASSERT_EQ(t->moe_parts->backward_ms[k].size(), 2u) << MoePartName(part);
      for (const int64_t len : {16, 32}) {
        for (const int64_t mbs : {1, 2}) {
          EXPECT_GT(At(t->moe_parts->forward_ms[k], len, mbs), 0) << MoePartName(part);
          EXPECT_GT(At(t->moe_parts->backward_ms[k], len, mbs), 0) << MoePartName(part);
        }
      }
      if (part != MoePart::kExpertsSliced) {
        parts += At(t->moe_parts->forward_ms[k], 32, 2) + At(t->moe_parts->backward_ms[k], 32, 2);
      }
    }
    EXPECT_LT(parts, 3 * (At(layer.forward_ms[kMoe], 32, 2) + At(layer.backward_ms[kMoe], 32, 2)))
        << "parts of one layer, each with its own autograd call";
    ASSERT_TRUE(MoeSliceOverhead(*t).has_value());
    // Through the file format, as `sluice profile` writes it, into the cost model of the model.
    StatusOr<LayerCostTable> back =
        LayerCostTableFromJson(LayerCostTableToJson(*t), "moe-profile.json");
    ASSERT_TRUE(back.ok()) << back.status().message();
    EXPECT_EQ(back->moe_parts, t->moe_parts);
    auto cost = ProfiledCostModel::Create(*back, model);
    ASSERT_TRUE(cost.ok()) << cost.status().message();
    EXPECT_EQ((*cost)->MoeSliceOverhead(), MoeSliceOverhead(*t));
    const TableConfig& none = *t->Find(1, Recompute::kNone);
    const double phi = interval == 2 ? 0.5 : 1.0;
    const double dense = interval == 2 ? At(none.forward_ms[kEnc], 32, 2) : 0;
    const LayerCost mean =
        (*cost)->Layer(LayerKind::kEncoder, LayerShape{2, 32, 0}, 1, Recompute::kNone);
    ASSERT_TRUE(mean.feasible);
    EXPECT_NEAR(mean.forward.millis(), (1 - phi) * dense + phi * At(none.forward_ms[kMoe], 32, 2),
                1e-6);
    // A dense table does not price the MoE model.
    ModelSpec dense_model = model;
    dense_model.moe.reset();
    EXPECT_FALSE(ProfiledCostModel::Create(*back, dense_model).ok());
  }
  // Encoder-decoder MoE layers are not in the format.
  ModelSpec t5 = TinyT5();
  t5.moe = MoeSpec{.experts = 4, .top_k = 2};
  EXPECT_THAT(ValidateProfileOptions(t5, o).message(),
              AllOf(HasSubstr("--model"), HasSubstr("decoder-only models only")));
}

}  // namespace
}  // namespace sluice::runtime
