#include "cost/profile_table.h"

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "base/json_util.h"
#include "cost/cost_test_util.h"

namespace sluice {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A minimal valid decoder-only table: one (tp, rc) entry, two rows per series.
nlohmann::json SmallTable() {
  return nlohmann::json::parse(R"({
    "format": "layer-cost-table/1",
    "measured_on": "unit test",
    "source": "hand-written",
    "model": {"name": "gpt-6.7b", "kind": "decoder-only", "hidden": 4096, "heads": 32,
              "ffn_hidden": 16384},
    "tables": [{
      "tp": 1, "recompute": "none",
      "time_ms": {
        "encoder_forward": [{"seqlen": 16, "mbs": [1, 2], "value": [1.5, 2.5]},
                            {"seqlen": 32, "mbs": [1], "value": [3.0]}],
        "encoder_backward": [{"seqlen": 16, "mbs": [1, 2], "value": [3.0, 5.0]},
                             {"seqlen": 32, "mbs": [1], "value": [6.0]}],
        "postprocess_forward": [{"seqlen": 16, "mbs": [1, 2], "value": [1.0, 1.0]}],
        "postprocess_backward": [{"seqlen": 16, "mbs": [1, 2], "value": [1.0, 1.0]}]
      },
      "stored_activation_mb": {"encoder": [{"seqlen": 16, "mbs": [1, 2], "value": [4, 8]}]},
      "peak_activation_mb": {"encoder": [{"seqlen": 16, "mbs": [1, 2], "value": [9, 18]}]},
      "param_mb": {"embedding": 417.656, "encoder": 402.771}
    }]
  })");
}

// Applies `edit` to the small table and returns the reader's error message.
template <typename Edit>
std::string ErrorAfter(Edit edit) {
  nlohmann::json j = SmallTable();
  edit(j);
  StatusOr<LayerCostTable> t = LayerCostTableFromJson(j, "bad.json");
  EXPECT_FALSE(t.ok()) << "expected an error for " << j.dump();
  if (t.ok()) return "";
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  return t.status().message();
}

TEST(LayerCostTableTest, ReadsSmallTable) {
  StatusOr<LayerCostTable> t = LayerCostTableFromJson(SmallTable(), "small.json");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->path, "small.json");
  EXPECT_EQ(t->model.kind, ModelKind::kDecoderOnly);
  ASSERT_EQ(t->configs.size(), 1u);
  const TableConfig& c = t->configs[0];
  const int enc = static_cast<int>(TableStage::kEncoder);
  ASSERT_EQ(c.forward_ms[enc].size(), 2u);
  EXPECT_EQ(c.forward_ms[enc][1].seqlen, 32);
  EXPECT_EQ(c.forward_ms[enc][0].value, (std::vector<double>{1.5, 2.5}));
  EXPECT_EQ(c.param_mb[enc], 402.771);
  EXPECT_EQ(c.embedding_param_mb, 417.656);
  EXPECT_EQ(t->Find(1, Recompute::kNone), &c);
  EXPECT_EQ(t->Find(2, Recompute::kNone), nullptr);
}

TEST(LayerCostTableTest, ReadsShippedTables) {
  StatusOr<LayerCostTable> gpt = ReadLayerCostTable(cost_test::GptTablePath());
  ASSERT_TRUE(gpt.ok()) << gpt.status().ToString();
  EXPECT_EQ(gpt->model.name, "gpt-6.7b");
  EXPECT_EQ(gpt->configs.size(), 12u);
  EXPECT_THAT(gpt->measured_on, HasSubstr("A100-SXM4-40GB"));
  StatusOr<LayerCostTable> t5 = ReadLayerCostTable(cost_test::T5TablePath());
  ASSERT_TRUE(t5.ok()) << t5.status().ToString();
  EXPECT_EQ(t5->model.kv_channels, 128);
  const TableConfig* c = t5->Find(1, Recompute::kNone);
  ASSERT_NE(c, nullptr);
  // 9 x 9 (encoder, decoder) lengths less the (4096, 4096) pair that ran out of memory.
  EXPECT_EQ(c->forward_ms[static_cast<int>(TableStage::kDecoder)].size(), 80u);
  EXPECT_EQ(c->forward_ms[static_cast<int>(TableStage::kDecoder)][0].dec_seqlen, 16);
}

TEST(LayerCostTableTest, RepoCopyEqualsSharedOriginal) {
  for (const char* name : {"a100_gpt_6.7b.json", "a100_t5_11b.json"}) {
    StatusOr<LayerCostTable> repo =
        ReadLayerCostTable(std::string(SLUICE_TEST_SOURCE_DIR) + "/data/profiles/" + name);
    StatusOr<LayerCostTable> shared =
        ReadLayerCostTable(std::string(SLUICE_TEST_SHARED_DIR) + "/data/profiles/" + name);
    if (!shared.ok()) GTEST_SKIP() << "shared data not present: " << shared.status().ToString();
    ASSERT_TRUE(repo.ok()) << repo.status().ToString();
    shared->path = repo->path;
    EXPECT_TRUE(*repo == *shared) << name;
  }
}

TEST(LayerCostTableTest, RoundTripsThroughJson) {
  StatusOr<LayerCostTable> t5 = ReadLayerCostTable(cost_test::T5TablePath());
  ASSERT_TRUE(t5.ok());
  StatusOr<LayerCostTable> back = LayerCostTableFromJson(LayerCostTableToJson(*t5), t5->path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(*back == *t5);
}

TEST(LayerCostTableTest, MissingFileNamesPath) {
  StatusOr<LayerCostTable> t = ReadLayerCostTable("/nonexistent/table.json");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(t.status().message(), HasSubstr("/nonexistent/table.json"));
}

TEST(LayerCostTableTest, SyntaxErrorNamesFileAndLine) {
  StatusOr<nlohmann::json> j = ParseJson("{\n \"format\": }", "broken.json");
  ASSERT_FALSE(j.ok());
  EXPECT_THAT(j.status().message(), HasSubstr("broken.json:2:"));
}

TEST(LayerCostTableErrorsTest, TopLevel) {
  EXPECT_THAT(ErrorAfter([](nlohmann::json& j) { j = nlohmann::json::array(); }),
              HasSubstr("bad.json: top level: expected a JSON object"));
  EXPECT_THAT(ErrorAfter([](nlohmann::json& j) { j["format"] = "layer-cost-table/2"; }),
              AllOf(HasSubstr("bad.json: field 'format'"), HasSubstr("'layer-cost-table/1'"),
                    HasSubstr("got 'layer-cost-table/2'")));
  EXPECT_THAT(ErrorAfter([](nlohmann::json& j) { j.erase("measured_on"); }),
              HasSubstr("field 'measured_on': is required"));
  EXPECT_THAT(ErrorAfter([](nlohmann::json& j) { j["extra"] = 1; }),
              AllOf(HasSubstr("field 'extra': unknown key"), HasSubstr("'tables'")));
  EXPECT_THAT(ErrorAfter([](nlohmann::json& j) { j["tables"] = nlohmann::json::array(); }),
              HasSubstr("field 'tables': is required (a non-empty array"));
}

TEST(LayerCostTableErrorsTest, ModelObject) {
  EXPECT_THAT(
      ErrorAfter([](nlohmann::json& j) { j["model"]["kind"] = "encoder-only"; }),
      AllOf(HasSubstr("field 'model.kind'"), HasSubstr("'decoder-only' or 'encoder-decoder'")));
  EXPECT_THAT(ErrorAfter([](nlohmann::json& j) { j["model"]["hidden"] = "4096"; }),
              AllOf(HasSubstr("field 'model.hidden'"), HasSubstr("got a string")));
  EXPECT_THAT(ErrorAfter([](nlohmann::json& j) { j["model"]["profiled_stages"] = {1}; }),
              HasSubstr("field 'model.profiled_stages[0]': must be a string"));
}

TEST(LayerCostTableErrorsTest, EntryFields) {
  EXPECT_THAT(ErrorAfter([](nlohmann::json& j) { j["tables"][0]["tp"] = "one"; }),
              AllOf(HasSubstr("bad.json: field 'tables[0].tp'"), HasSubstr("got a string")));
  EXPECT_THAT(
      ErrorAfter([](nlohmann::json& j) { j["tables"][0]["recompute"] = "some"; }),
      AllOf(HasSubstr("field 'tables[0].recompute'"), HasSubstr("'none', 'selective' or 'full'")));
  EXPECT_THAT(ErrorAfter([](nlohmann::json& j) { j["tables"].push_back(j["tables"][0]); }),
              AllOf(HasSubstr("field 'tables[1]'"),
                    HasSubstr("duplicate entry for tp 1, recompute 'none'")));
  EXPECT_THAT(ErrorAfter([](nlohmann::json& j) { j["tables"][0].erase("time_ms"); }),
              HasSubstr("field 'tables[0].time_ms': is required"));
}

TEST(LayerCostTableErrorsTest, StageNames) {
  EXPECT_THAT(ErrorAfter([](nlohmann::json& j) {
                j["tables"][0]["time_ms"]["decoder_forward"] = nlohmann::json::array();
              }),
              AllOf(HasSubstr("field 'tables[0].time_ms.decoder_forward': unknown stage key"),
                    HasSubstr("'encoder_forward'"), HasSubstr("'postprocess_backward'")));
  EXPECT_THAT(ErrorAfter([](nlohmann::json& j) {
                j["tables"][0]["stored_activation_mb"]["postprocess"] = nlohmann::json::array();
              }),
              AllOf(HasSubstr("field 'tables[0].stored_activation_mb.postprocess'"),
                    HasSubstr("allowed keys here: 'encoder'")));
  EXPECT_THAT(
      ErrorAfter([](nlohmann::json& j) { j["tables"][0]["param_mb"]["head"] = 1.0; }),
      AllOf(HasSubstr("field 'tables[0].param_mb.head'"), HasSubstr("'embedding' or 'encoder'")));
}

// An MoE table: `model.moe` and the MoE layer's rows beside the dense layer's.
nlohmann::json SmallMoeTable() {
  nlohmann::json j = SmallTable();
  j["model"]["moe"] = {{"experts", 8}, {"top_k", 2}, {"layer_interval", 2}};
  nlohmann::json& e = j["tables"][0];
  e["time_ms"]["moe_encoder_forward"] = e["time_ms"]["encoder_forward"];
  e["time_ms"]["moe_encoder_backward"] = e["time_ms"]["encoder_backward"];
  e["stored_activation_mb"]["moe_encoder"] = e["stored_activation_mb"]["encoder"];
  e["peak_activation_mb"]["moe_encoder"] = e["peak_activation_mb"]["encoder"];
  e["param_mb"]["moe_encoder"] = 3000.5;
  return j;
}

TEST(LayerCostTableTest, MoeTableRoundTripsAndNamesItsStage) {
  StatusOr<LayerCostTable> t = LayerCostTableFromJson(SmallMoeTable(), "moe.json");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE(t->model.moe.has_value());
  EXPECT_EQ(t->model.moe->experts, 8);
  EXPECT_EQ(t->model.moe->top_k, 2);
  EXPECT_EQ(t->model.moe->layer_interval, 2);
  const int me = static_cast<int>(TableStage::kMoeEncoder);
  EXPECT_EQ(TableStageName(TableStage::kMoeEncoder), "moe_encoder");
  EXPECT_EQ(t->configs[0].forward_ms[me].size(), 2u);
  EXPECT_EQ(t->configs[0].param_mb[me], 3000.5);
  StatusOr<LayerCostTable> back = LayerCostTableFromJson(LayerCostTableToJson(*t), "moe.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->model, t->model);
  EXPECT_EQ(back->configs, t->configs);
}

// The MoE table with measured parts: experts 1.0/2.0 ms whole; sliced (4 slices) at seqlen 16:
// mbs 1 +0.4/+0.4 ms (0.1 ms per piece), mbs 2 +0.8/+0.8 (0.2); at seqlen 32 mbs 1: -0.4/-0.4
// (a faster sliced run: -0.1).
nlohmann::json MoeTableWithParts() {
  nlohmann::json j = SmallMoeTable();
  auto rows = [](double a, double b, double c) {
    return nlohmann::json::parse(fmt::format(
        R"([{{"seqlen": 16, "mbs": [1, 2], "value": [{}, {}]}}, {{"seqlen": 32, "mbs": [1], "value": [{}]}}])",
        a, b, c));
  };
  nlohmann::json times = nlohmann::json::object();
  for (const char* part : {"route", "dispatch", "combine"}) {
    times[fmt::format("{}_forward", part)] = rows(0.1, 0.2, 0.2);
    times[fmt::format("{}_backward", part)] = rows(0.2, 0.4, 0.4);
  }
  times["experts_forward"] = rows(1.0, 2.0, 2.0);
  times["experts_backward"] = rows(2.0, 4.0, 4.0);
  times["experts_sliced_forward"] = rows(1.4, 2.8, 1.6);
  times["experts_sliced_backward"] = rows(2.4, 4.8, 3.6);
  j["moe_parts"] = {{"slices", 4}, {"time_ms", times}};
  return j;
}

TEST(LayerCostTableTest, MoePartsRoundTripAndGiveTheSliceOverhead) {
  StatusOr<LayerCostTable> t = LayerCostTableFromJson(MoeTableWithParts(), "moe.json");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE(t->moe_parts.has_value());
  EXPECT_EQ(t->moe_parts->slices, 4);
  const auto experts = static_cast<size_t>(MoePart::kExperts);
  EXPECT_EQ(t->moe_parts->forward_ms[experts].size(), 2u);
  EXPECT_EQ(MoePartName(MoePart::kExpertsSliced), "experts_sliced");
  // Per piece: (0.4 + 0.4) / 8 = 0.1, (0.8 + 0.8) / 8 = 0.2, (-0.4 - 0.4) / 8 = -0.1: median 0.1.
  ASSERT_TRUE(MoeSliceOverhead(*t).has_value());
  EXPECT_EQ(MoeSliceOverhead(*t)->nanos(), 100000);
  StatusOr<LayerCostTable> back = LayerCostTableFromJson(LayerCostTableToJson(*t), "moe.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->moe_parts, t->moe_parts);
  // A faster sliced run everywhere is no negative overhead; a table without parts has none.
  nlohmann::json faster = MoeTableWithParts();
  faster["moe_parts"]["time_ms"]["experts_sliced_forward"] =
      faster["moe_parts"]["time_ms"]["experts_forward"];
  faster["moe_parts"]["time_ms"]["experts_sliced_backward"] = nlohmann::json::parse(
      R"([{"seqlen": 16, "mbs": [1, 2], "value": [1.0, 3.0]}, {"seqlen": 32, "mbs": [1], "value": [3.0]}])");
  StatusOr<LayerCostTable> f = LayerCostTableFromJson(faster, "moe.json");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(MoeSliceOverhead(*f), Duration::Zero());
  StatusOr<LayerCostTable> plain = LayerCostTableFromJson(SmallMoeTable(), "moe.json");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(MoeSliceOverhead(*plain).has_value());
  // Without the sliced series there is nothing to compare.
  nlohmann::json no_sliced = MoeTableWithParts();
  no_sliced["moe_parts"]["time_ms"].erase("experts_sliced_forward");
  StatusOr<LayerCostTable> n = LayerCostTableFromJson(no_sliced, "moe.json");
  ASSERT_TRUE(n.ok());
  EXPECT_FALSE(MoeSliceOverhead(*n).has_value());
}

TEST(LayerCostTableErrorsTest, MoeParts) {
  // Only MoE tables; known part keys; slices >= 2; rows as the stage series.
  EXPECT_THAT(ErrorAfter([](nlohmann::json& j) {
                j["moe_parts"] = {{"slices", 4}, {"time_ms", nlohmann::json::object()}};
              }),
              AllOf(HasSubstr("bad.json: field 'moe_parts'"), HasSubstr("MoE models")));
  auto moe_error = [](auto edit) {
    nlohmann::json j = MoeTableWithParts();
    edit(j);
    StatusOr<LayerCostTable> t = LayerCostTableFromJson(j, "moe.json");
    EXPECT_FALSE(t.ok());
    return t.ok() ? std::string() : t.status().message();
  };
  EXPECT_THAT(moe_error([](nlohmann::json& j) {
                j["moe_parts"]["time_ms"]["router_forward"] = nlohmann::json::array();
              }),
              AllOf(HasSubstr("'moe_parts.time_ms.router_forward': unknown part key"),
                    HasSubstr("'route_forward'"), HasSubstr("'experts_sliced_backward'")));
  EXPECT_THAT(moe_error([](nlohmann::json& j) { j["moe_parts"]["slices"] = 1; }),
              HasSubstr("'moe_parts.slices'"));
  EXPECT_THAT(moe_error([](nlohmann::json& j) { j["moe_parts"].erase("time_ms"); }),
              HasSubstr("'moe_parts.time_ms': is required"));
  EXPECT_THAT(moe_error([](nlohmann::json& j) { j["moe_parts"]["degree"] = 4; }),
              HasSubstr("'moe_parts.degree'"));
  EXPECT_THAT(moe_error([](nlohmann::json& j) {
                j["moe_parts"]["time_ms"]["experts_forward"][0]["value"][0] = -1;
              }),
              HasSubstr("'moe_parts.time_ms.experts_forward[0].value[0]'"));
}

TEST(LayerCostTableErrorsTest, MoeRowsOnlyInMoeTables) {
  // A dense table has no MoE layer rows; an MoE table lists them beside the others.
  EXPECT_THAT(ErrorAfter([](nlohmann::json& j) {
                j["tables"][0]["time_ms"]["moe_encoder_forward"] = nlohmann::json::array();
              }),
              AllOf(HasSubstr("field 'tables[0].time_ms.moe_encoder_forward': unknown stage key"),
                    HasSubstr("'encoder_forward'")));
  nlohmann::json moe = SmallMoeTable();
  moe["tables"][0]["time_ms"]["decoder_forward"] = nlohmann::json::array();
  StatusOr<LayerCostTable> t = LayerCostTableFromJson(moe, "moe.json");
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(),
              AllOf(HasSubstr("'tables[0].time_ms.decoder_forward'"),
                    HasSubstr("'moe_encoder_forward'"), HasSubstr("'encoder_forward'")));
  EXPECT_THAT(ErrorAfter([](nlohmann::json& j) { j["model"]["moe"] = {{"top_k", 2}}; }),
              HasSubstr("field 'model.moe.experts': is required"));
  EXPECT_THAT(ErrorAfter([](nlohmann::json& j) {
                j["model"]["moe"] = {{"experts", 4}, {"capacity_factor", -1}};
              }),
              HasSubstr("field 'model.moe.capacity_factor'"));
  EXPECT_THAT(ErrorAfter([](nlohmann::json& j) {
                j["model"]["moe"] = {{"experts", 4}, {"gate", "top"}};
              }),
              AllOf(HasSubstr("'model.moe.gate'"), HasSubstr("'experts'")));
  EXPECT_THAT(ErrorAfter([](nlohmann::json& j) {
                j["model"]["kind"] = "encoder-decoder";
                j["model"]["moe"] = {{"experts", 4}};
              }),
              AllOf(HasSubstr("field 'model.moe'"), HasSubstr("decoder-only models only")));
}

TEST(LayerCostTableErrorsTest, Rows) {
  EXPECT_THAT(ErrorAfter([](nlohmann::json& j) {
                j["tables"][0]["time_ms"]["encoder_forward"][0]["mbs"] = {2, 1};
              }),
              AllOf(HasSubstr("field 'tables[0].time_ms.encoder_forward[0].mbs[1]'"),
                    HasSubstr("strictly ascending: got 1 after 2")));
  EXPECT_THAT(ErrorAfter([](nlohmann::json& j) {
                j["tables"][0]["time_ms"]["encoder_forward"][1]["mbs"] = {0};
              }),
              AllOf(HasSubstr("field 'tables[0].time_ms.encoder_forward[1].mbs[0]'"),
                    HasSubstr("must be an integer in [1, ")));
  EXPECT_THAT(ErrorAfter([](nlohmann::json& j) {
                j["tables"][0]["time_ms"]["encoder_backward"][0]["mbs"] = {1, 2.5};
              }),
              HasSubstr("field 'tables[0].time_ms.encoder_backward[0].mbs[1]'"));
  EXPECT_THAT(ErrorAfter([](nlohmann::json& j) {
                j["tables"][0]["time_ms"]["encoder_forward"][0]["value"] = {1.0};
              }),
              AllOf(HasSubstr("field 'tables[0].time_ms.encoder_forward[0].value'"),
                    HasSubstr("one value per micro-batch size: 2 in 'mbs', 1 here")));
  EXPECT_THAT(ErrorAfter([](nlohmann::json& j) {
                j["tables"][0]["peak_activation_mb"]["encoder"][0]["value"] = {1.0, -2.0};
              }),
              AllOf(HasSubstr("field 'tables[0].peak_activation_mb.encoder[0].value[1]'"),
                    HasSubstr("positive finite number")));
  EXPECT_THAT(ErrorAfter([](nlohmann::json& j) {
                j["tables"][0]["time_ms"]["encoder_forward"][1]["seqlen"] = 16;
              }),
              AllOf(HasSubstr("field 'tables[0].time_ms.encoder_forward[1].seqlen'"),
                    HasSubstr("duplicate row for seqlen 16")));
  EXPECT_THAT(ErrorAfter([](nlohmann::json& j) {
                j["tables"][0]["time_ms"]["encoder_forward"][0]["enc_seqlen"] = 16;
              }),
              AllOf(HasSubstr("field 'tables[0].time_ms.encoder_forward[0].enc_seqlen'"),
                    HasSubstr("unknown key")));
  EXPECT_THAT(ErrorAfter([](nlohmann::json& j) {
                j["tables"][0]["time_ms"]["encoder_forward"][0].erase("mbs");
              }),
              HasSubstr("field 'tables[0].time_ms.encoder_forward[0].mbs': is required"));
  EXPECT_THAT(
      ErrorAfter([](nlohmann::json& j) { j["tables"][0]["param_mb"]["encoder"] = 0; }),
      AllOf(HasSubstr("field 'tables[0].param_mb.encoder'"), HasSubstr("positive number of MB")));
}

TEST(LayerCostTableErrorsTest, DecoderRowsNeedBothLengths) {
  StatusOr<LayerCostTable> t5 = ReadLayerCostTable(cost_test::T5TablePath());
  ASSERT_TRUE(t5.ok());
  nlohmann::json j = LayerCostTableToJson(*t5);
  j["tables"][3]["time_ms"]["decoder_forward"][5].erase("dec_seqlen");
  StatusOr<LayerCostTable> bad = LayerCostTableFromJson(j, "t5.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(),
              AllOf(HasSubstr("t5.json: field 'tables[3].time_ms.decoder_forward[5].dec_seqlen'"),
                    HasSubstr("is required")));
}

}  // namespace
}  // namespace sluice
