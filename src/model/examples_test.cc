// Parses every example config under examples/ so that a format change cannot leave them stale.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "model/cluster_spec.h"
#include "model/model_spec.h"
#include "model/parallel_config.h"

namespace sluice {
namespace {

std::string Example(const std::string& name) {
  return std::string(SLUICE_TEST_SOURCE_DIR) + "/examples/" + name;
}

TEST(ModelExamplesTest, ExampleFilesParseAndFitTogether) {
  StatusOr<ModelSpec> model = ResolveModel(Example("model-gpt-1.3b.json"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_EQ(model->name, "gpt-1.3b");
  EXPECT_EQ(model->layers, 24);
  EXPECT_EQ(model->hidden, 2048);
  EXPECT_EQ(model->heads, 16);
  EXPECT_EQ(model->HeadDim(), 128);

  StatusOr<ClusterSpec> cluster = ResolveCluster(Example("cluster-a100-2x8.json"));
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  ClusterSpec preset = *ClusterPreset("a100-40g", 16);
  preset.name = "a100-2x8";
  EXPECT_EQ(*cluster, preset);  // The example spells out the a100-40g:16 preset.

  StatusOr<ParallelConfig> parallel = ResolveParallel(Example("parallel-dp2-pp4.json"));
  ASSERT_TRUE(parallel.ok()) << parallel.status().ToString();
  EXPECT_EQ(parallel->dp, 2);
  EXPECT_EQ(parallel->pp, 4);
  EXPECT_EQ(parallel->zero, 1);
  EXPECT_EQ(parallel->MemoryLimit(*cluster), Bytes::MB(36000));

  Status fits = CheckParallelFits(*parallel, *model, &*cluster, "parallel-dp2-pp4.json");
  EXPECT_TRUE(fits.ok()) << fits.ToString();
}

// The T5 3 + 3 example is t5-tiny one layer deeper per stack: it cuts into 3 pipeline chunks,
// the middle one holding the encoder's end and the decoder's start (docs/runtime.md).
TEST(ModelExamplesTest, T5Tiny3IsTheTinyPresetCutIntoThreeChunks) {
  StatusOr<ModelSpec> model = ResolveModel(Example("model-t5-tiny-3.json"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  ModelSpec preset = *ModelPreset("t5-tiny");
  preset.name = "t5-tiny-3";
  preset.layers = 3;
  preset.decoder_layers = 3;
  EXPECT_EQ(*model, preset);
  ParallelConfig pp3;
  pp3.pp = 3;
  EXPECT_TRUE(CheckParallelFits(pp3, *model, nullptr, "test").ok());
  EXPECT_FALSE(CheckParallelFits(pp3, *ModelPreset("t5-tiny"), nullptr, "test").ok());
}

}  // namespace
}  // namespace sluice
