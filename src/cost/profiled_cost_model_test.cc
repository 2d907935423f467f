#include "cost/profiled_cost_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>

#include "base/json_util.h"
#include "cost/cost_test_util.h"
#include "cost/profile_table.h"

namespace sluice {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr LayerKind kEnc = LayerKind::kEncoder;
constexpr LayerKind kDec = LayerKind::kDecoder;
constexpr LayerKind kHead = LayerKind::kOutputHead;
constexpr Recompute kNone = Recompute::kNone;

std::unique_ptr<ProfiledCostModel> Load(const std::string& path, const ModelSpec& spec) {
  StatusOr<LayerCostTable> t = ReadLayerCostTable(path);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  StatusOr<std::unique_ptr<ProfiledCostModel>> m = ProfiledCostModel::Create(*t, spec);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(m).value() : nullptr;
}

// A 3 x 3 grid over seqlen {16, 32, 64} x mbs {2, 4, 8} with forward = seqlen * mbs / 16 ms and
// a hole at (64, 8); backward = 2x forward; memory = 10x forward.
LayerCostTable GridTable() {
  LayerCostTable t;
  t.path = "grid.json";
  t.model = {"gpt-6.7b", ModelKind::kDecoderOnly, 4096, 32, 0, 16384, {}};
  TableConfig c;
  for (int64_t s : {16, 32, 64}) {
    CostRow row{s, 0, {2, 4, 8}, {}};
    if (s == 64) row.mbs = {2, 4};
    for (int64_t m : row.mbs) row.value.push_back(static_cast<double>(s * m) / 16.0);
    auto scaled = [&](double k) {
      CostRow r = row;
      for (double& v : r.value) v *= k;
      return r;
    };
    const int e = static_cast<int>(TableStage::kEncoder);
    const int p = static_cast<int>(TableStage::kPostprocess);
    c.forward_ms[e].push_back(row);
    c.backward_ms[e].push_back(scaled(2));
    c.stored_activation_mb[e].push_back(scaled(10));
    c.peak_activation_mb[e].push_back(scaled(30));
    c.forward_ms[p].push_back(row);
    c.backward_ms[p].push_back(scaled(2));
  }
  t.configs.push_back(c);
  return t;
}

std::unique_ptr<ProfiledCostModel> GridModel() {
  StatusOr<std::unique_ptr<ProfiledCostModel>> m =
      ProfiledCostModel::Create(GridTable(), cost_test::Gpt67b());
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return std::move(m).value();
}

// Every measured point of every series comes back exactly, including points next to holes.
void ExpectExactAtMeasuredPoints(const std::string& path, const ModelSpec& spec) {
  std::unique_ptr<ProfiledCostModel> m = Load(path, spec);
  ASSERT_NE(m, nullptr);
  int64_t checked = 0;
  for (const TableConfig& c : m->table().configs) {
    for (int s = 0; s < kNumTableStages; ++s) {
      const TableStage stage = static_cast<TableStage>(s);
      const LayerKind kind = stage == TableStage::kEncoder   ? kEnc
                             : stage == TableStage::kDecoder ? kDec
                                                             : kHead;
      for (size_t r = 0; r < c.forward_ms[s].size(); ++r) {
        const CostRow& fwd = c.forward_ms[s][r];
        const CostRow& bwd = c.backward_ms[s][r];
        ASSERT_EQ(fwd.seqlen, bwd.seqlen);
        ASSERT_EQ(fwd.dec_seqlen, bwd.dec_seqlen);
        for (size_t k = 0; k < fwd.mbs.size(); ++k) {
          LayerShape shape{fwd.mbs[k], fwd.seqlen, fwd.dec_seqlen};
          if (kind == kHead && spec.is_encoder_decoder()) shape = {fwd.mbs[k], 16, fwd.seqlen};
          const LayerCost cost = m->Layer(kind, shape, c.tp, c.recompute);
          ASSERT_TRUE(cost.feasible) << path << " " << TableStageName(stage) << " tp " << c.tp;
          EXPECT_EQ(cost.forward, Duration::Millis(fwd.value[k]));
          EXPECT_EQ(cost.backward, Duration::Millis(bwd.value[k]));
          if (kind != kHead) {
            EXPECT_EQ(cost.stored_activation, Bytes::MB(c.stored_activation_mb[s][r].value[k]));
            EXPECT_EQ(cost.peak_activation, Bytes::MB(c.peak_activation_mb[s][r].value[k]));
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 1000);
}

TEST(ProfiledCostModelTest, ExactAtEveryMeasuredPointGpt) {
  ExpectExactAtMeasuredPoints(cost_test::GptTablePath(), cost_test::Gpt67b());
}

TEST(ProfiledCostModelTest, ExactAtEveryMeasuredPointT5) {
  ExpectExactAtMeasuredPoints(cost_test::T5TablePath(), cost_test::T511b());
}

TEST(ProfiledCostModelTest, InterpolatesBetweenPoints) {
  std::unique_ptr<ProfiledCostModel> m = GridModel();
  // Along mbs: (seqlen 16, mbs 3) lies between 2 ms (mbs 2) and 4 ms (mbs 4).
  EXPECT_EQ(m->Layer(kEnc, {3, 16, 0}, 1, kNone).forward, Duration::Millis(3));
  // Along seqlen: (24, mbs 2) lies between 2 ms (seqlen 16) and 4 ms (seqlen 32).
  EXPECT_EQ(m->Layer(kEnc, {2, 24, 0}, 1, kNone).forward, Duration::Millis(3));
  // Bilinear: (24, 3) -> 24 * 3 / 16 = 4.5 (the function is bilinear, so exact).
  const LayerCost c = m->Layer(kEnc, {3, 24, 0}, 1, kNone);
  ASSERT_TRUE(c.feasible);
  EXPECT_EQ(c.forward, Duration::Millis(4.5));
  EXPECT_EQ(c.backward, Duration::Millis(9));
  EXPECT_EQ(c.stored_activation, Bytes::MB(45));
  EXPECT_EQ(c.peak_activation, Bytes::MB(135));
  // Between the uneven seqlen points 32 and 64: (48, 4) -> 12.
  EXPECT_EQ(m->Layer(kEnc, {4, 48, 0}, 1, kNone).forward, Duration::Millis(12));
}

TEST(ProfiledCostModelTest, RoundsUpBelowTheGrid) {
  std::unique_ptr<ProfiledCostModel> m = GridModel();
  // mbs 1 < 2 and seqlen 8 < 16 both round up to the smallest measured point.
  EXPECT_EQ(m->Layer(kEnc, {1, 16, 0}, 1, kNone).forward, Duration::Millis(2));
  EXPECT_EQ(m->Layer(kEnc, {2, 8, 0}, 1, kNone).forward, Duration::Millis(2));
  EXPECT_EQ(m->Layer(kEnc, {1, 1, 0}, 1, kNone), m->Layer(kEnc, {2, 16, 0}, 1, kNone));
  // Shipped GPT table: seqlen 10 answers as 16.
  std::unique_ptr<ProfiledCostModel> gpt = Load(cost_test::GptTablePath(), cost_test::Gpt67b());
  EXPECT_EQ(gpt->Layer(kEnc, {4, 10, 0}, 2, kNone), gpt->Layer(kEnc, {4, 16, 0}, 2, kNone));
}

TEST(ProfiledCostModelTest, InfeasibleAboveTheGridAndInHoles) {
  std::unique_ptr<ProfiledCostModel> m = GridModel();
  EXPECT_FALSE(m->Layer(kEnc, {2, 65, 0}, 1, kNone).feasible);  // above the longest length
  EXPECT_FALSE(m->Layer(kEnc, {9, 16, 0}, 1, kNone).feasible);  // above the largest mbs
  EXPECT_FALSE(m->Layer(kEnc, {8, 64, 0}, 1, kNone).feasible);  // the hole itself
  EXPECT_FALSE(m->Layer(kEnc, {6, 48, 0}, 1, kNone).feasible);  // a corner is the hole
  EXPECT_TRUE(m->Layer(kEnc, {4, 64, 0}, 1, kNone).feasible);   // the hole's neighbour
  EXPECT_TRUE(m->Layer(kEnc, {8, 32, 0}, 1, kNone).feasible);   // the hole's neighbour

  std::unique_ptr<ProfiledCostModel> gpt = Load(cost_test::GptTablePath(), cost_test::Gpt67b());
  // tp 1, none: the 2048 row stops at mbs 8 (mbs 16 ran out of memory).
  EXPECT_TRUE(gpt->Layer(kEnc, {8, 2048, 0}, 1, kNone).feasible);
  EXPECT_FALSE(gpt->Layer(kEnc, {16, 2048, 0}, 1, kNone).feasible);
  EXPECT_FALSE(gpt->Layer(kEnc, {12, 2048, 0}, 1, kNone).feasible);
  EXPECT_TRUE(gpt->Layer(kEnc, {4, 3000, 0}, 1, kNone).feasible);   // 2048 and 4096 rows have 4
  EXPECT_FALSE(gpt->Layer(kEnc, {5, 3000, 0}, 1, kNone).feasible);  // 4096 row stops at 4
  EXPECT_FALSE(gpt->Layer(kEnc, {1, 8193, 0}, 1, kNone).feasible);  // longer than any row
  EXPECT_FALSE(gpt->Layer(kEnc, {4096, 16, 0}, 1, kNone).feasible);
  EXPECT_FALSE(gpt->Layer(kDec, {1, 16, 16}, 1, kNone).feasible);  // no decoder in GPT
}

TEST(ProfiledCostModelTest, T5DecoderGridAndHole) {
  std::unique_ptr<ProfiledCostModel> t5 = Load(cost_test::T5TablePath(), cost_test::T511b());
  EXPECT_TRUE(t5->Layer(kDec, {1, 4096, 2048}, 1, kNone).feasible);
  EXPECT_TRUE(t5->Layer(kDec, {1, 2048, 4096}, 1, kNone).feasible);
  EXPECT_FALSE(t5->Layer(kDec, {1, 4096, 4096}, 1, kNone).feasible);  // out-of-memory pair
  EXPECT_FALSE(t5->Layer(kDec, {1, 3000, 3000}, 1, kNone).feasible);  // touches that pair
  EXPECT_TRUE(t5->Layer(kDec, {1, 4096, 4096}, 1, Recompute::kSelective).feasible);
  const LayerCost mid = t5->Layer(kDec, {2, 300, 100}, 2, kNone);
  const LayerCost lo = t5->Layer(kDec, {2, 256, 64}, 2, kNone);
  const LayerCost hi = t5->Layer(kDec, {2, 512, 128}, 2, kNone);
  ASSERT_TRUE(mid.feasible && lo.feasible && hi.feasible);
  EXPECT_GT(mid.forward, lo.forward);
  EXPECT_LT(mid.forward, hi.forward);
}

TEST(ProfiledCostModelTest, T5OutputHeadIsKeyedByDecoderLength) {
  std::unique_ptr<ProfiledCostModel> t5 = Load(cost_test::T5TablePath(), cost_test::T511b());
  // tp 1, none: postprocess at seqlen 4096 (mbs 1) is 6.45 ms, at 16 it is 1.24 ms.
  EXPECT_EQ(t5->Layer(kHead, {1, 16, 4096}, 1, kNone).forward, Duration::Millis(6.45));
  EXPECT_EQ(t5->Layer(kHead, {1, 4096, 16}, 1, kNone).forward, Duration::Millis(1.24));
  EXPECT_GT(t5->Layer(kHead, {1, 16, 4096}, 1, kNone).stored_activation,
            t5->Layer(kHead, {1, 4096, 16}, 1, kNone).stored_activation);
}

TEST(ProfiledCostModelTest, UnknownTpOrRecomputeIsInfeasible) {
  std::unique_ptr<ProfiledCostModel> gpt = Load(cost_test::GptTablePath(), cost_test::Gpt67b());
  EXPECT_TRUE(gpt->SupportsTp(8));
  EXPECT_FALSE(gpt->SupportsTp(16));
  EXPECT_FALSE(gpt->SupportsTp(3));
  EXPECT_FALSE(gpt->Layer(kEnc, {1, 128, 0}, 16, kNone).feasible);
  EXPECT_FALSE(gpt->Layer(LayerKind::kEmbedding, {1, 128, 0}, 16, kNone).feasible);
  std::unique_ptr<ProfiledCostModel> grid = GridModel();  // has only (tp 1, none)
  EXPECT_FALSE(grid->Layer(kEnc, {2, 16, 0}, 1, Recompute::kFull).feasible);
}

TEST(ProfiledCostModelTest, BackwardSplitsIntoInputAndWeightGradients) {
  std::unique_ptr<ProfiledCostModel> gpt = Load(cost_test::GptTablePath(), cost_test::Gpt67b());
  for (Recompute rc : {kNone, Recompute::kSelective, Recompute::kFull}) {
    for (LayerKind kind : {kEnc, kHead, LayerKind::kEmbedding}) {
      const LayerCost c = gpt->Layer(kind, {3, 700, 0}, 2, rc);
      ASSERT_TRUE(c.feasible);
      EXPECT_EQ(c.backward_input + c.backward_weight, c.backward);
      EXPECT_GE(c.backward_weight, Duration::Zero());
      EXPECT_GE(c.backward_input, Duration::Zero());
    }
  }
  // The embedding's backward is all weight gradient; a layer's W is under half its backward,
  // and recomputation (counted in I) lowers W's share.
  const LayerCost emb = gpt->Layer(LayerKind::kEmbedding, {4, 512, 0}, 1, kNone);
  EXPECT_EQ(emb.backward_input, Duration::Zero());
  EXPECT_GT(emb.backward_weight, Duration::Zero());
  const LayerCost none = gpt->Layer(kEnc, {4, 512, 0}, 1, kNone);
  const LayerCost full = gpt->Layer(kEnc, {4, 512, 0}, 1, Recompute::kFull);
  const double w_none = none.backward_weight.seconds() / none.backward.seconds();
  const double w_full = full.backward_weight.seconds() / full.backward.seconds();
  EXPECT_GT(w_none, 0.35);
  EXPECT_LT(w_none, 0.5);
  EXPECT_LT(w_full, w_none);
}

TEST(ProfiledCostModelTest, LayerParamsFromParamMb) {
  std::unique_ptr<ProfiledCostModel> gpt = Load(cost_test::GptTablePath(), cost_test::Gpt67b());
  EXPECT_EQ(gpt->LayerParams(kEnc, 1), 201385500);  // 402.771 MB / 2 B
  EXPECT_EQ(gpt->LayerParams(LayerKind::kEmbedding, 1), 208828000);
  EXPECT_EQ(gpt->LayerParams(kHead, 1), 0);  // tied
  EXPECT_EQ(gpt->LayerParams(kEnc, 8), 25195500);
  // tp 16 is not in the table: the analytic count (12h^2 + 13h over tp, plus replicas).
  EXPECT_NEAR(static_cast<double>(gpt->LayerParams(kEnc, 16)), 201379840.0 / 16, 0.01 * 12.6e6);
  std::unique_ptr<ProfiledCostModel> t5 = Load(cost_test::T5TablePath(), cost_test::T511b());
  EXPECT_EQ(t5->LayerParams(kDec, 2), 134310000);  // 268.62 MB / 2 B
}

TEST(ProfiledCostModelTest, ModelStatesPerZeroStage) {
  std::unique_ptr<ProfiledCostModel> gpt = Load(cost_test::GptTablePath(), cost_test::Gpt67b());
  StageLayers stage;
  stage.encoder_layers = 8;
  stage.embedding = true;
  ParallelConfig par;
  par.dp = 4;
  const int64_t params = 8 * 201385500 + 208828000;
  for (int64_t zero = 0; zero <= 3; ++zero) {
    par.zero = zero;
    EXPECT_EQ(gpt->ModelStates(stage, par), ModelStatesFromParams(params, 4, zero));
  }
  par.zero = 0;
  EXPECT_EQ(gpt->ModelStates(stage, par).total(), Bytes::Of(16 * params));
}

TEST(ProfiledCostModelTest, RejectsAMismatchedModel) {
  StatusOr<LayerCostTable> t = ReadLayerCostTable(cost_test::GptTablePath());
  ASSERT_TRUE(t.ok());
  ModelSpec wide = cost_test::Gpt67b();
  wide.hidden = 5120;
  wide.heads = 40;
  wide.kv_heads = 40;
  auto m = ProfiledCostModel::Create(*t, wide);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), AllOf(HasSubstr("a100_gpt_6.7b.json: field 'model.hidden'"),
                                          HasSubstr("4096"), HasSubstr("5120")));
  EXPECT_THAT(ProfiledCostModel::Create(*t, cost_test::T511b()).status().message(),
              HasSubstr("field 'model.kind'"));
  ModelSpec swiglu = cost_test::Gpt67b();
  swiglu.mlp = MlpKind::kSwiGlu;
  EXPECT_THAT(ProfiledCostModel::Create(*t, swiglu).status().message(), HasSubstr("SwiGLU"));
  ModelSpec gqa = cost_test::Gpt67b();
  gqa.kv_heads = 8;
  EXPECT_THAT(ProfiledCostModel::Create(*t, gqa).status().message(),
              HasSubstr("grouped-query attention"));
}

TEST(ProfiledCostModelTest, RejectsATableWithoutANeededSeries) {
  LayerCostTable t = GridTable();
  t.configs[0].backward_ms[static_cast<int>(TableStage::kPostprocess)].clear();
  auto m = ProfiledCostModel::Create(t, cost_test::Gpt67b());
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(),
              AllOf(HasSubstr("grid.json: field 'tables[0].time_ms.postprocess_backward'"),
                    HasSubstr("required")));
}

TEST(ProfiledCostModelTest, RespectsMaxPosition) {
  StatusOr<LayerCostTable> t = ReadLayerCostTable(cost_test::GptTablePath());
  ModelSpec shorter = cost_test::Gpt67b();
  shorter.max_position = 2048;
  auto m = ProfiledCostModel::Create(*t, shorter);
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE((*m)->Layer(kEnc, {1, 2048, 0}, 1, kNone).feasible);
  EXPECT_FALSE((*m)->Layer(kEnc, {1, 4096, 0}, 1, kNone).feasible);
}

// The example in docs/formats.md parses and answers the queries the text lists.
TEST(ProfiledCostModelTest, FormatDocExampleAnswersAsDocumented) {
  const std::string doc_path = std::string(SLUICE_TEST_SOURCE_DIR) + "/docs/formats.md";
  StatusOr<std::string> doc = ReadFileToString(doc_path);
  ASSERT_TRUE(doc.ok()) << doc.status().ToString();
  const size_t section = doc->find("## Layer cost tables");
  ASSERT_NE(section, std::string::npos);
  const size_t begin = doc->find("```json\n", section);
  ASSERT_NE(begin, std::string::npos);
  const size_t end = doc->find("```", begin + 8);
  StatusOr<nlohmann::json> j = ParseJson(doc->substr(begin + 8, end - begin - 8), doc_path);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  StatusOr<LayerCostTable> t = LayerCostTableFromJson(*j, doc_path);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto m = ProfiledCostModel::Create(*t, cost_test::Gpt67b());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)->Layer(kEnc, {1, 24, 0}, 1, kNone).forward, Duration::Millis(1.775));
  EXPECT_EQ((*m)->Layer(kEnc, {1, 8, 0}, 1, kNone).forward, Duration::Millis(1.84));
  EXPECT_FALSE((*m)->Layer(kEnc, {2, 24, 0}, 1, kNone).feasible);
  EXPECT_FALSE((*m)->Layer(kEnc, {1, 64, 0}, 1, kNone).feasible);
  EXPECT_FALSE((*m)->Layer(kEnc, {1, 16, 0}, 2, kNone).feasible);
}

// GridTable with MoE rows: the MoE layer 3x the dense layer in time and stored memory, 2x in
// peak; `interval`: an MoE layer every `interval` layers.
LayerCostTable MoeGridTable(int64_t interval) {
  LayerCostTable t = GridTable();
  t.model.moe = MoeSpec{.experts = 8, .top_k = 2, .layer_interval = interval};
  const int e = static_cast<int>(TableStage::kEncoder);
  const int me = static_cast<int>(TableStage::kMoeEncoder);
  TableConfig& c = t.configs[0];
  auto scaled = [](CostSeries series, double k) {
    for (CostRow& r : series) {
      for (double& v : r.value) v *= k;
    }
    return series;
  };
  c.forward_ms[me] = scaled(c.forward_ms[e], 3);
  c.backward_ms[me] = scaled(c.backward_ms[e], 3);
  c.stored_activation_mb[me] = scaled(c.stored_activation_mb[e], 3);
  c.peak_activation_mb[me] = scaled(c.peak_activation_mb[e], 2);
  c.param_mb[e] = 400;
  c.param_mb[me] = 1600;
  return t;
}

ModelSpec MoeGpt(int64_t interval) {
  ModelSpec m = cost_test::Gpt67b();
  m.moe = MoeSpec{.experts = 8, .top_k = 2, .layer_interval = interval};
  return m;
}

TEST(ProfiledCostModelTest, MoeModelAnswersTheStacksMeanLayer) {
  const ModelSpec dense = cost_test::Gpt67b();
  auto d = ProfiledCostModel::Create(GridTable(), dense);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  const LayerCost one = (*d)->Layer(kEnc, {4, 32, 0}, 1, kNone);
  ASSERT_TRUE(one.feasible);
  // Every 4th of 32 layers: phi = 1/4; every layer: phi = 1.
  for (const auto& [interval, phi] : {std::pair<int64_t, double>{4, 0.25}, {1, 1.0}}) {
    auto m = ProfiledCostModel::Create(MoeGridTable(interval), MoeGpt(interval));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    const LayerCost mean = (*m)->Layer(kEnc, {4, 32, 0}, 1, kNone);
    ASSERT_TRUE(mean.feasible);
    const double k = (1 - phi) + 3 * phi;
    EXPECT_NEAR(mean.forward.millis(), k * one.forward.millis(), 1e-9) << interval;
    EXPECT_NEAR(mean.backward.millis(), k * one.backward.millis(), 1e-9) << interval;
    EXPECT_NEAR(mean.stored_activation.mb(), k * one.stored_activation.mb(), 1e-6) << interval;
    EXPECT_NEAR(mean.peak_activation.mb(), 2 * one.peak_activation.mb(), 1e-6) << interval;
    EXPECT_EQ((*m)->LayerParams(kEnc, 1),
              std::llround(((1 - phi) * 400 + phi * 1600) * 1e6 / 2)) << interval;
    // The hole at (64, 8) is a hole of the mean layer too.
    EXPECT_FALSE((*m)->Layer(kEnc, {8, 64, 0}, 1, kNone).feasible);
  }
}

TEST(ProfiledCostModelTest, MoeTablesMatchOnlyTheirMoeModel) {
  // A dense table for an MoE model, an MoE table for a dense one, another expert count.
  auto a = ProfiledCostModel::Create(GridTable(), MoeGpt(2));
  ASSERT_FALSE(a.ok());
  EXPECT_THAT(a.status().message(), AllOf(HasSubstr("grid.json: field 'model.moe'"),
                                          HasSubstr("a dense model"), HasSubstr("8 experts")));
  auto b = ProfiledCostModel::Create(MoeGridTable(2), cost_test::Gpt67b());
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(b.status().message(), HasSubstr("field 'model.moe'"));
  ModelSpec other = MoeGpt(2);
  other.moe->experts = 16;
  auto c = ProfiledCostModel::Create(MoeGridTable(2), other);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("16 experts"));
  // The interval between MoE layers is the model's: a table with both rows serves any.
  EXPECT_TRUE(ProfiledCostModel::Create(MoeGridTable(2), MoeGpt(4)).ok());
  EXPECT_TRUE(ProfiledCostModel::Create(MoeGridTable(2), MoeGpt(1)).ok());
  // The MoE rows are required where MoE layers are; the dense rows only where dense ones are.
  LayerCostTable no_moe_rows = MoeGridTable(2);
  const int me = static_cast<int>(TableStage::kMoeEncoder);
  no_moe_rows.configs[0].forward_ms[me].clear();
  auto d = ProfiledCostModel::Create(no_moe_rows, MoeGpt(2));
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.status().message(), HasSubstr("'tables[0].time_ms.moe_encoder_forward'"));
  LayerCostTable no_dense_rows = MoeGridTable(1);
  const int e = static_cast<int>(TableStage::kEncoder);
  no_dense_rows.configs[0].forward_ms[e].clear();
  no_dense_rows.configs[0].backward_ms[e].clear();
  EXPECT_TRUE(ProfiledCostModel::Create(no_dense_rows, MoeGpt(1)).ok());
}

TEST(ProfiledCostModelTest, DescribeNamesTableAndAnalyticParts) {
  std::unique_ptr<ProfiledCostModel> gpt = Load(cost_test::GptTablePath(), cost_test::Gpt67b());
  EXPECT_THAT(gpt->Describe(),
              AllOf(HasSubstr("profiled: "), HasSubstr("a100_gpt_6.7b.json"),
                    HasSubstr("A100-SXM4-40GB"), HasSubstr("embedding"), HasSubstr("I/W")));
}

}  // namespace
}  // namespace sluice
