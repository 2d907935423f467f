#include "model/model_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "base/json_util.h"

namespace sluice {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsSupersetOf;

// A valid custom model as JSON, for tests that break one field at a time.
nlohmann::json SmallModel() {
  return nlohmann::json::parse(R"({"name": "small", "layers": 4, "hidden": 256, "heads": 8,
                                   "ffn_hidden": 1024, "vocab": 1000, "max_position": 512})");
}

std::string ErrorOf(const nlohmann::json& j) {
  StatusOr<ModelSpec> spec = ModelSpecFromJson(j, "m.json");
  EXPECT_FALSE(spec.ok()) << j.dump();
  return spec.status().message();
}

TEST(ModelPresetTest, EveryPresetValidatesAndRoundTrips) {
  const std::vector<std::string> names = ModelPresetNames();
  EXPECT_THAT(names, IsSupersetOf({"gpt-6.7b", "gpt-13b", "t5-11b", "llama-7b", "gpt-tiny",
                                   "t5-tiny", "gpt-tiny-moe"}));
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    StatusOr<ModelSpec> spec = ModelPreset(name);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    EXPECT_EQ(spec->name, name);
    EXPECT_TRUE(ValidateModelSpec(*spec, name).ok());
    // Through the JSON value and through its text.
    StatusOr<ModelSpec> back = ModelSpecFromJson(ModelSpecToJson(*spec), "rt");
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, *spec);
    StatusOr<nlohmann::json> text = ParseJson(ModelSpecToJson(*spec).dump(2), "rt.json");
    ASSERT_TRUE(text.ok());
    StatusOr<ModelSpec> again = ModelSpecFromJson(*text, "rt.json");
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(*again, *spec);
  }
}

TEST(ModelPresetTest, PublishedNumbers) {
  ModelSpec gpt = *ModelPreset("gpt-6.7b");
  EXPECT_EQ(gpt.kind, ModelKind::kDecoderOnly);
  EXPECT_EQ(gpt.layers, 32);
  EXPECT_EQ(gpt.hidden, 4096);
  EXPECT_EQ(gpt.heads, 32);
  EXPECT_EQ(gpt.kv_heads, 32);
  EXPECT_EQ(gpt.HeadDim(), 128);
  EXPECT_EQ(gpt.ffn_hidden, 16384);
  EXPECT_EQ(gpt.vocab, 50257);
  EXPECT_EQ(gpt.max_position, 8192);
  EXPECT_TRUE(gpt.tied_embeddings);
  EXPECT_FALSE(gpt.moe.has_value());

  ModelSpec gpt13 = *ModelPreset("gpt-13b");
  EXPECT_EQ(gpt13.layers, 40);
  EXPECT_EQ(gpt13.hidden, 5120);
  EXPECT_EQ(gpt13.heads, 40);
  EXPECT_EQ(gpt13.HeadDim(), 128);
  EXPECT_EQ(gpt13.ffn_hidden, 20480);

  ModelSpec t5 = *ModelPreset("t5-11b");
  EXPECT_TRUE(t5.is_encoder_decoder());
  EXPECT_EQ(t5.layers, 24);
  EXPECT_EQ(t5.decoder_layers, 24);
  EXPECT_EQ(t5.TotalLayers(), 48);
  EXPECT_EQ(t5.hidden, 1024);
  EXPECT_EQ(t5.heads, 128);
  EXPECT_EQ(t5.HeadDim(), 128);
  EXPECT_EQ(t5.ffn_hidden, 65536);
  EXPECT_EQ(t5.vocab, 32128);
  EXPECT_TRUE(t5.tied_embeddings);

  ModelSpec llama = *ModelPreset("llama-7b");
  EXPECT_EQ(llama.layers, 32);
  EXPECT_EQ(llama.hidden, 4096);
  EXPECT_EQ(llama.kv_heads, 32);
  EXPECT_EQ(llama.ffn_hidden, 11008);
  EXPECT_EQ(llama.mlp, MlpKind::kSwiGlu);
  EXPECT_EQ(llama.vocab, 32000);
  EXPECT_FALSE(llama.tied_embeddings);
  EXPECT_EQ(llama.max_position, 4096);

  ModelSpec tiny = *ModelPreset("gpt-tiny");
  EXPECT_EQ(tiny.layers, 4);
  EXPECT_EQ(tiny.hidden, 128);
  EXPECT_EQ(tiny.heads, 4);
  EXPECT_EQ(tiny.ffn_hidden, 512);
  EXPECT_EQ(tiny.vocab, 8192);
  EXPECT_EQ(tiny.max_position, 4096);

  ModelSpec t5_tiny = *ModelPreset("t5-tiny");
  EXPECT_EQ(t5_tiny.layers, 2);
  EXPECT_EQ(t5_tiny.decoder_layers, 2);
  EXPECT_EQ(t5_tiny.hidden, 128);

  ModelSpec moe = *ModelPreset("gpt-tiny-moe");
  ASSERT_TRUE(moe.moe.has_value());
  EXPECT_EQ(moe.moe->experts, 4);
  EXPECT_EQ(moe.moe->top_k, 2);
  ModelSpec dense_part = moe;
  dense_part.name = "gpt-tiny";
  dense_part.moe.reset();
  EXPECT_EQ(dense_part, tiny);
}

TEST(ModelPresetTest, UnknownPresetListsPresets) {
  StatusOr<ModelSpec> spec = ModelPreset("gpt-7b");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(spec.status().message(),
              AllOf(HasSubstr("'gpt-7b'"), HasSubstr("'gpt-6.7b'"), HasSubstr("'t5-11b'")));
}

TEST(ModelSpecTest, KindNames) {
  EXPECT_EQ(ModelKindName(ModelKind::kDecoderOnly), "decoder-only");
  EXPECT_EQ(ModelKindName(ModelKind::kEncoderDecoder), "encoder-decoder");
  EXPECT_EQ(MlpKindName(MlpKind::kGelu), "gelu");
  EXPECT_EQ(MlpKindName(MlpKind::kSwiGlu), "swiglu");
}

TEST(ModelSpecTest, MinimalJsonTakesDefaults) {
  StatusOr<ModelSpec> spec = ModelSpecFromJson(SmallModel(), "m.json");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->kind, ModelKind::kDecoderOnly);
  EXPECT_EQ(spec->kv_heads, 8);
  EXPECT_EQ(spec->head_dim, 0);
  EXPECT_EQ(spec->HeadDim(), 32);
  EXPECT_EQ(spec->mlp, MlpKind::kGelu);
  EXPECT_TRUE(spec->tied_embeddings);
  EXPECT_FALSE(spec->moe.has_value());
}

TEST(ModelSpecTest, CustomModelRoundTrips) {
  nlohmann::json j = SmallModel();
  j["kind"] = "encoder-decoder";
  j["decoder_layers"] = 6;
  j["kv_heads"] = 2;
  j["head_dim"] = 48;
  j["mlp"] = "swiglu";
  j["tied_embeddings"] = false;
  j["moe"] = {{"experts", 16},
              {"top_k", 1},
              {"capacity_factor", 1.1},
              {"layer_interval", 2},
              {"expert_ffn_hidden", 512}};
  StatusOr<ModelSpec> spec = ModelSpecFromJson(j, "m.json");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->HeadDim(), 48);
  EXPECT_EQ(spec->moe->capacity_factor, 1.1);
  EXPECT_EQ(ModelSpecToJson(*spec), j);
  StatusOr<ModelSpec> back = ModelSpecFromJson(ModelSpecToJson(*spec), "rt");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, *spec);
}

TEST(ModelSpecTest, MoeDropPolicyRoundTripsAndIsWrittenOnlyWhenNotTheDefault) {
  nlohmann::json j = SmallModel();
  j["moe"] = {{"experts", 4}, {"top_k", 2}, {"drop_policy", "position"}};
  StatusOr<ModelSpec> spec = ModelSpecFromJson(j, "m.json");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->moe->drop_policy, MoeDropPolicy::kPosition);
  EXPECT_EQ(ModelSpecToJson(*spec)["moe"]["drop_policy"], "position");
  StatusOr<ModelSpec> back = ModelSpecFromJson(ModelSpecToJson(*spec), "rt");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, *spec);
  spec->moe->drop_policy = MoeDropPolicy::kChoice;
  EXPECT_FALSE(ModelSpecToJson(*spec)["moe"].contains("drop_policy"));
  EXPECT_EQ(MoeDropPolicyName(MoeDropPolicy::kChoice), "choice");
  j["moe"]["drop_policy"] = "probs";
  EXPECT_THAT(ErrorOf(j), AllOf(HasSubstr("m.json: field 'moe.drop_policy'"),
                                HasSubstr("choice"), HasSubstr("position")));
}

TEST(ModelSpecTest, MoeLayers) {
  ModelSpec spec = *ModelPreset("gpt-tiny");
  EXPECT_FALSE(spec.IsMoeLayer(0));
  spec.moe = MoeSpec{};
  spec.moe->layer_interval = 2;
  EXPECT_FALSE(spec.IsMoeLayer(0));
  EXPECT_TRUE(spec.IsMoeLayer(1));
  EXPECT_FALSE(spec.IsMoeLayer(2));
  EXPECT_TRUE(spec.IsMoeLayer(3));
  spec.moe->layer_interval = 1;
  for (int64_t i = 0; i < spec.layers; ++i) EXPECT_TRUE(spec.IsMoeLayer(i));
}

TEST(ModelSpecTest, UnknownKeyNamesFileFieldAndAllowedKeys) {
  nlohmann::json j = SmallModel();
  j["kv_head"] = 8;
  EXPECT_THAT(ErrorOf(j), AllOf(HasSubstr("m.json"), HasSubstr("field 'kv_head': unknown key"),
                                HasSubstr("'kv_heads'"), HasSubstr("'max_position'")));
  j = SmallModel();
  j["moe"] = {{"experts", 4}, {"topk", 2}};
  EXPECT_THAT(ErrorOf(j),
              AllOf(HasSubstr("m.json: field 'moe.topk': unknown key"), HasSubstr("'top_k'")));
}

TEST(ModelSpecTest, WrongTypeNamesField) {
  nlohmann::json j = SmallModel();
  j["heads"] = "8";
  EXPECT_THAT(ErrorOf(j), AllOf(HasSubstr("m.json: field 'heads'"), HasSubstr("got a string")));
  j = SmallModel();
  j["layers"] = 2.5;
  EXPECT_THAT(ErrorOf(j), HasSubstr("m.json: field 'layers': must be an integer"));
  j = SmallModel();
  j["tied_embeddings"] = 1;
  EXPECT_THAT(ErrorOf(j), HasSubstr("m.json: field 'tied_embeddings': must be true or false"));
  j = SmallModel();
  j["kind"] = "decoder";
  EXPECT_THAT(ErrorOf(j), AllOf(HasSubstr("m.json: field 'kind'"),
                                HasSubstr("'decoder-only' or 'encoder-decoder'")));
  j = SmallModel();
  j["moe"] = 4;
  EXPECT_THAT(ErrorOf(j), HasSubstr("m.json: field 'moe': expected a JSON object"));
  EXPECT_THAT(ErrorOf(nlohmann::json::array()), HasSubstr("m.json: top level"));
  j = SmallModel();
  j.erase("vocab");
  EXPECT_THAT(ErrorOf(j), HasSubstr("m.json: field 'vocab': is required"));
}

TEST(ModelSpecTest, ImpossibleValuesNameFieldAndAllowed) {
  nlohmann::json j = SmallModel();
  j["heads"] = 0;
  EXPECT_THAT(ErrorOf(j), HasSubstr("m.json: field 'heads': must be an integer in [1, 65536]"));
  j = SmallModel();
  j["kv_heads"] = 3;
  EXPECT_THAT(ErrorOf(j),
              HasSubstr("m.json: field 'kv_heads': must divide heads = 8 (allowed: 1, 2, 4, 8)"));
  j = SmallModel();
  j["kv_heads"] = 16;
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'kv_heads': must be an integer in [1, 8]"));
  j = SmallModel();
  j["heads"] = 6;
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'heads': must divide hidden = 256"));
  j["head_dim"] = 64;  // An explicit head width lifts the requirement.
  EXPECT_TRUE(ModelSpecFromJson(j, "m.json").ok());
  j = SmallModel();
  j["decoder_layers"] = 2;
  EXPECT_THAT(ErrorOf(j), AllOf(HasSubstr("field 'decoder_layers'"), HasSubstr("decoder-only"),
                                HasSubstr("encoder-decoder")));
  j = SmallModel();
  j["kind"] = "encoder-decoder";
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'decoder_layers': must be an integer in [1, 10000]"));
  j = SmallModel();
  j["max_position"] = -1;
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'max_position'"));
}

TEST(ModelSpecTest, ImpossibleMoeValues) {
  auto with_moe = [](nlohmann::json moe) {
    nlohmann::json j = SmallModel();
    j["moe"] = std::move(moe);
    return j;
  };
  EXPECT_THAT(ErrorOf(with_moe({{"experts", 1}})),
              HasSubstr("m.json: field 'moe.experts': must be an integer in [2, 65536], got 1"));
  EXPECT_THAT(ErrorOf(with_moe({{"experts", 4}, {"top_k", 5}})),
              HasSubstr("field 'moe.top_k': must be an integer in [1, 4], got 5"));
  EXPECT_THAT(ErrorOf(with_moe({{"experts", 4}, {"top_k", 0}})), HasSubstr("'moe.top_k'"));
  EXPECT_THAT(ErrorOf(with_moe({{"experts", 4}, {"capacity_factor", 0}})),
              HasSubstr("field 'moe.capacity_factor': must be a number in (0, 1000], got 0"));
  EXPECT_THAT(ErrorOf(with_moe({{"experts", 4}, {"capacity_factor", "1.0"}})),
              HasSubstr("field 'moe.capacity_factor': must be a number"));
  EXPECT_THAT(ErrorOf(with_moe({{"experts", 4}, {"layer_interval", 0}})),
              HasSubstr("field 'moe.layer_interval'"));
  EXPECT_THAT(ErrorOf(with_moe({{"experts", 4}, {"layer_interval", 5}})),
              HasSubstr("field 'moe.layer_interval': must be an integer in [1, 4]"));
  EXPECT_THAT(ErrorOf(with_moe({{"top_k", 1}})), HasSubstr("field 'moe.experts': is required"));
}

TEST(ModelSpecTest, ValidateChecksStructsBuiltInCode) {
  ModelSpec spec = *ModelPreset("gpt-tiny");
  spec.kv_heads = 0;
  EXPECT_THAT(ValidateModelSpec(spec, "code").message(), HasSubstr("code: field 'kv_heads'"));
  spec = *ModelPreset("t5-tiny");
  spec.decoder_layers = 0;
  EXPECT_THAT(ValidateModelSpec(spec, "code").message(), HasSubstr("'decoder_layers'"));
  spec = *ModelPreset("gpt-tiny-moe");
  spec.moe->capacity_factor = -1;
  EXPECT_THAT(ValidateModelSpec(spec, "code").message(), HasSubstr("'moe.capacity_factor'"));
}

TEST(ModelSpecTest, ResolveModelPresetFileAndErrors) {
  StatusOr<ModelSpec> preset = ResolveModel("llama-7b");
  ASSERT_TRUE(preset.ok());
  EXPECT_EQ(preset->name, "llama-7b");

  const std::string good = ::testing::TempDir() + "/sluice_model_good.json";
  ASSERT_TRUE(WriteStringToFile(good, SmallModel().dump()).ok());
  StatusOr<ModelSpec> from_file = ResolveModel(good);
  ASSERT_TRUE(from_file.ok()) << from_file.status().ToString();
  EXPECT_EQ(from_file->name, "small");

  nlohmann::json bad_json = SmallModel();
  bad_json["hiden"] = 1;
  const std::string bad = ::testing::TempDir() + "/sluice_model_bad.json";
  ASSERT_TRUE(WriteStringToFile(bad, bad_json.dump()).ok());
  EXPECT_THAT(ResolveModel(bad).status().message(),
              HasSubstr(bad + ": field 'hiden': unknown key"));

  const std::string broken = ::testing::TempDir() + "/sluice_model_broken.json";
  ASSERT_TRUE(WriteStringToFile(broken, "{\"name\": ").ok());
  EXPECT_THAT(ResolveModel(broken).status().message(),
              AllOf(HasSubstr(broken), HasSubstr("not valid JSON")));

  StatusOr<ModelSpec> missing = ResolveModel("gpt-6.7");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(),
              AllOf(HasSubstr("--model 'gpt-6.7'"), HasSubstr("no such file"),
                    HasSubstr("'gpt-6.7b'"), HasSubstr("'gpt-tiny-moe'")));
}

}  // namespace
}  // namespace sluice
