#include "cost/cost_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace sluice {
namespace {

using ::testing::HasSubstr;

// A CostModel with fixed parameter counts, to test ModelStates' arithmetic alone.
class FixedParamsModel final : public CostModel {
 public:
  explicit FixedParamsModel(bool tied) {
    spec_.name = "fixed";
    spec_.tied_embeddings = tied;
  }
  std::string Describe() const override { return "fixed"; }
  const ModelSpec& model() const override { return spec_; }
  bool SupportsTp(int64_t) const override { return true; }
  LayerCost Layer(LayerKind, const LayerShape&, int64_t, Recompute) const override { return {}; }
  int64_t LayerParams(LayerKind kind, int64_t tp) const override {
    switch (kind) {
      case LayerKind::kEncoder:
        return 1000 / tp;
      case LayerKind::kDecoder:
        return 1500 / tp;
      case LayerKind::kEmbedding:
        return 400 / tp;
      case LayerKind::kOutputHead:
        return spec_.tied_embeddings ? 0 : 300 / tp;
    }
    return 0;
  }

 private:
  ModelSpec spec_;
};

TEST(CostModelNamesTest, NamesAndParsing) {
  EXPECT_EQ(LayerKindName(LayerKind::kOutputHead), "output-head");
  EXPECT_EQ(LayerKindName(LayerKind::kDecoder), "decoder");
  EXPECT_EQ(RecomputeName(Recompute::kSelective), "selective");
  for (Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    StatusOr<Recompute> back = ParseRecompute(RecomputeName(rc));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, rc);
  }
  StatusOr<Recompute> bad = ParseRecompute("partial");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("'none', 'selective' or 'full'"));
}

TEST(ModelStatesTest, MixedPrecisionAdamPerZeroStage) {
  // 16 bytes per parameter before sharding: 2 (fp16 weights) + 2 (fp16 grads) + 12 (fp32 Adam).
  const ModelStateMemory z0 = ModelStatesFromParams(1000, 4, 0);
  EXPECT_EQ(z0.params, 1000);
  EXPECT_EQ(z0.weights, Bytes::Of(2000));
  EXPECT_EQ(z0.gradients, Bytes::Of(2000));
  EXPECT_EQ(z0.optimizer, Bytes::Of(12000));
  EXPECT_EQ(z0.total(), Bytes::Of(16000));
  const ModelStateMemory z1 = ModelStatesFromParams(1000, 4, 1);  // optimizer sharded
  EXPECT_EQ(z1.total(), Bytes::Of(2000 + 2000 + 3000));
  const ModelStateMemory z2 = ModelStatesFromParams(1000, 4, 2);  // + gradients
  EXPECT_EQ(z2.gradients, Bytes::Of(500));
  EXPECT_EQ(z2.total(), Bytes::Of(2000 + 500 + 3000));
  const ModelStateMemory z3 = ModelStatesFromParams(1000, 4, 3);  // + weights
  EXPECT_EQ(z3.total(), Bytes::Of(16000 / 4));
  // Shards round up; dp 1 shards nothing.
  EXPECT_EQ(ModelStatesFromParams(1001, 4, 3).weights, Bytes::Of(2 * 251));
  EXPECT_EQ(ModelStatesFromParams(1000, 1, 3), ModelStatesFromParams(1000, 1, 0));
}

TEST(ModelStatesTest, StageParamsAreLayersTimesLayerParamsPlusEnds) {
  FixedParamsModel untied(/*tied=*/false);
  StageLayers stage;
  stage.encoder_layers = 3;
  stage.decoder_layers = 2;
  ParallelConfig par;
  par.tp = 2;
  par.dp = 2;
  par.zero = 1;
  EXPECT_EQ(untied.ModelStates(stage, par), ModelStatesFromParams(3 * 500 + 2 * 750, 2, 1));
  stage.embedding = true;
  EXPECT_EQ(untied.ModelStates(stage, par).params, 3 * 500 + 2 * 750 + 200);
  stage.output_head = true;
  EXPECT_EQ(untied.ModelStates(stage, par).params, 3 * 500 + 2 * 750 + 200 + 150);
  // Tied: the head adds nothing next to the embedding, and a copy of it on a later stage.
  FixedParamsModel tied(/*tied=*/true);
  EXPECT_EQ(tied.ModelStates(stage, par).params, 3 * 500 + 2 * 750 + 200);
  stage.embedding = false;
  EXPECT_EQ(tied.ModelStates(stage, par).params, 3 * 500 + 2 * 750 + 200);
  // The chunk that ends the encoder embeds the decoder inputs: one copy of the word embedding,
  // shared with the input embedding or a tied head on the same stage.
  StageLayers ends;
  ends.encoder_layers = 1;
  ends.decoder_embedding = true;
  EXPECT_EQ(tied.ModelStates(ends, par).params, 500 + 200);
  ends.output_head = true;
  EXPECT_EQ(tied.ModelStates(ends, par).params, 500 + 200);
  EXPECT_EQ(untied.ModelStates(ends, par).params, 500 + 200 + 150);
  ends.embedding = true;
  EXPECT_EQ(tied.ModelStates(ends, par).params, 500 + 200);
}

TEST(ModelStateMemoryTest, Adds) {
  const ModelStateMemory sum = ModelStatesFromParams(10, 1, 0) + ModelStatesFromParams(20, 1, 0);
  EXPECT_EQ(sum, ModelStatesFromParams(30, 1, 0));
}

}  // namespace
}  // namespace sluice
