#include "model/chunk_cut.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace sluice {
namespace {

ModelSpec EncDec(int64_t layers, int64_t decoder_layers) {
  ModelSpec m = *ModelPreset("t5-tiny");
  m.layers = layers;
  m.decoder_layers = decoder_layers;
  return m;
}

// {first_encoder_layer, encoder_layers, first_decoder_layer, decoder_layers, ends_encoder}.
ChunkCut Cut(int64_t fe, int64_t e, int64_t fd, int64_t d, bool ends) {
  return {fe, e, fd, d, ends};
}

TEST(ChunkCutTest, DecoderOnlySplitsEvenly) {
  const ModelSpec gpt = *ModelPreset("gpt-6.7b");  // 32 layers
  EXPECT_TRUE(ChunksFit(gpt, 8));
  EXPECT_FALSE(ChunksFit(gpt, 3));
  EXPECT_FALSE(ChunksFit(gpt, 64));
  EXPECT_FALSE(ChunksFit(gpt, 0));
  EXPECT_EQ(AllowedChunkCounts(gpt), (std::vector<int64_t>{1, 2, 4, 8, 16, 32}));
  EXPECT_EQ(CutIntoChunks(gpt, 4, {}),
            (std::vector<ChunkCut>{Cut(0, 8, 0, 0, false), Cut(8, 8, 0, 0, false),
                                   Cut(16, 8, 0, 0, false), Cut(24, 8, 0, 0, false)}));
  EXPECT_EQ(EncoderEndChunk(gpt, 4, {}), -1);
  // No layers: empty chunks (the profiler's head-only probe), embedding and head apart.
  ModelSpec head_only = gpt;
  head_only.layers = 0;
  EXPECT_TRUE(ChunksFit(head_only, 2));
  EXPECT_EQ(CutIntoChunks(head_only, 2, {}), (std::vector<ChunkCut>(2)));
  ModelSpec enc_dec_head = *ModelPreset("t5-tiny");
  enc_dec_head.layers = 0;
  enc_dec_head.decoder_layers = 0;
  EXPECT_TRUE(ChunksFit(enc_dec_head, 2));
  EXPECT_FALSE(ChunksFit(enc_dec_head, 3));
  EXPECT_EQ(EncoderEndChunk(enc_dec_head, 2, {}), 0);
}

TEST(ChunkCutTest, EncoderDecoderOneChunkHoldsBoth) {
  const ModelSpec t5 = EncDec(3, 3);
  EXPECT_EQ(CutIntoChunks(t5, 1, {}), (std::vector<ChunkCut>{Cut(0, 3, 0, 3, true)}));
  EXPECT_EQ(EncoderEndChunk(t5, 1, {}), 0);
}

TEST(ChunkCutTest, EncoderDecoderSplitsAtTheMiddleWhenBothStacksDivide) {
  // 4 + 2 layers over 4 chunks: runs of 6/4 do not exist, the middle split does.
  const ModelSpec m = EncDec(4, 2);
  ASSERT_TRUE(ChunksFit(m, 4));
  EXPECT_EQ(CutIntoChunks(m, 4, {}),
            (std::vector<ChunkCut>{Cut(0, 2, 0, 0, false), Cut(2, 2, 0, 0, true),
                                   Cut(0, 0, 0, 1, false), Cut(0, 0, 1, 1, false)}));
  EXPECT_EQ(EncoderEndChunk(m, 4, {}), 1);
}

TEST(ChunkCutTest, EncoderDecoderRunsSpanTheStackBoundary) {
  const ModelSpec t5 = EncDec(3, 3);
  ASSERT_TRUE(ChunksFit(t5, 3));
  EXPECT_EQ(CutIntoChunks(t5, 3, {}),
            (std::vector<ChunkCut>{Cut(0, 2, 0, 0, false), Cut(2, 1, 0, 1, true),
                                   Cut(0, 0, 1, 2, false)}));
  EXPECT_EQ(EncoderEndChunk(t5, 3, {}), 1);
  // 4 + 2 over 3 chunks: the encoder ends exactly at a chunk's end.
  const ModelSpec m = EncDec(4, 2);
  EXPECT_EQ(CutIntoChunks(m, 3, {}),
            (std::vector<ChunkCut>{Cut(0, 2, 0, 0, false), Cut(2, 2, 0, 0, true),
                                   Cut(0, 0, 0, 2, false)}));
  EXPECT_EQ(EncoderEndChunk(m, 3, {}), 1);
  // 1 + 5 over 6 chunks: the first chunk ends the encoder.
  const ModelSpec shallow = EncDec(1, 5);
  EXPECT_EQ(EncoderEndChunk(shallow, 6, {}), 0);
  EXPECT_TRUE(CutIntoChunks(shallow, 6, {})[0].ends_encoder);
}

TEST(ChunkCutTest, EveryAllowedCountCutsEachLayerOnceAndEndsTheEncoderOnce) {
  for (const auto& [layers, dec] : std::vector<std::pair<int64_t, int64_t>>{
           {3, 3}, {24, 24}, {24, 6}, {5, 7}, {1, 1}, {2, 9}}) {
    const ModelSpec m = EncDec(layers, dec);
    for (int64_t chunks = 1; chunks <= layers + dec + 2; ++chunks) {
      const std::vector<int64_t> allowed = AllowedChunkCounts(m);
      const bool listed = std::find(allowed.begin(), allowed.end(), chunks) != allowed.end();
      ASSERT_EQ(ChunksFit(m, chunks), listed) << layers << "+" << dec << " chunks " << chunks;
      if (!listed) continue;
      int64_t next_enc = 0, next_dec = 0, ends = 0;
      const std::vector<ChunkCut> cuts = CutIntoChunks(m, chunks, {});
      for (size_t c = 0; c < cuts.size(); ++c) {
        const ChunkCut& k = cuts[c];
        EXPECT_GT(k.encoder_layers + k.decoder_layers, 0);
        if (k.encoder_layers > 0) {
          EXPECT_EQ(k.first_encoder_layer, next_enc);
          EXPECT_EQ(next_dec, 0) << "encoder layers after decoder layers";
        }
        if (k.decoder_layers > 0) {
          EXPECT_EQ(k.first_decoder_layer, next_dec);
        }
        next_enc += k.encoder_layers;
        next_dec += k.decoder_layers;
        if (k.ends_encoder) {
          ++ends;
          EXPECT_EQ(static_cast<int64_t>(c), EncoderEndChunk(m, chunks, {}));
          EXPECT_EQ(next_enc, layers);
        }
      }
      EXPECT_EQ(next_enc, layers);
      EXPECT_EQ(next_dec, dec);
      EXPECT_EQ(ends, 1);
    }
  }
}

TEST(ChunkCutTest, AnExplicitCutOfTheEvenCountsIsTheEvenCut) {
  std::vector<ModelSpec> models = {*ModelPreset("gpt-6.7b"), *ModelPreset("t5-11b")};
  for (const auto& [layers, dec] :
       std::vector<std::pair<int64_t, int64_t>>{{3, 3}, {24, 6}, {5, 7}, {1, 1}, {2, 9}}) {
    models.push_back(EncDec(layers, dec));
  }
  for (const ModelSpec& m : models) {
    for (const int64_t chunks : AllowedChunkCounts(m)) {
      const std::vector<int64_t> even = EvenLayerCut(m, chunks);
      ASSERT_EQ(static_cast<int64_t>(even.size()), chunks);
      EXPECT_EQ(CutIntoChunks(m, chunks, even), CutIntoChunks(m, chunks, {}))
          << m.name << " " << m.layers << "+" << m.decoder_layers << " chunks " << chunks;
      EXPECT_EQ(EncoderEndChunk(m, chunks, even), EncoderEndChunk(m, chunks, {}));
    }
  }
}

TEST(ChunkCutTest, ExplicitCutsRunOverTheConcatenatedStack) {
  const ModelSpec gpt = *ModelPreset("gpt-6.7b");
  ParallelConfig par;
  par.pp = 4;
  par.layer_cut = {9, 8, 8, 7};
  EXPECT_EQ(CutIntoChunks(gpt, par),
            (std::vector<ChunkCut>{Cut(0, 9, 0, 0, false), Cut(9, 8, 0, 0, false),
                                   Cut(17, 8, 0, 0, false), Cut(25, 7, 0, 0, false)}));
  EXPECT_EQ(EncoderEndChunk(gpt, par), -1);
  // T5 24 + 24 on 4 stages with the encoder on three of them: 9 + 9 + 6 encoder, then the
  // decoder's 24 on the last.
  const ModelSpec t5 = *ModelPreset("t5-11b");
  par.layer_cut = {9, 9, 10, 20};
  EXPECT_EQ(CutIntoChunks(t5, par),
            (std::vector<ChunkCut>{Cut(0, 9, 0, 0, false), Cut(9, 9, 0, 0, false),
                                   Cut(18, 6, 0, 4, true), Cut(0, 0, 4, 20, false)}));
  EXPECT_EQ(EncoderEndChunk(t5, par), 2);
  // The encoder ending exactly at a chunk boundary: that chunk ends it.
  par.layer_cut = {12, 12, 6, 18};
  EXPECT_EQ(EncoderEndChunk(t5, par), 1);
  EXPECT_TRUE(CutIntoChunks(t5, par)[1].ends_encoder);
  EXPECT_EQ(DescribeLayerCut(par.layer_cut), "12+12+6+18");
  EXPECT_EQ(DescribeLayerCut({}), "even");
  // Any depth fits an explicit cut, 30 layers on 4 stages included.
  ModelSpec odd = gpt;
  odd.layers = 30;
  par.layer_cut = {8, 8, 7, 7};
  EXPECT_EQ(CutIntoChunks(odd, par).back(), Cut(23, 7, 0, 0, false));
}

}  // namespace
}  // namespace sluice
