// Layout: how the runtime cuts a model into pipeline chunks and maps a plan's gradient buckets
// onto parameters. Torch-free, so the rules are unit-tested without libtorch.
//
// Chunks follow the plan's layout exactly: model/chunk_cut.h's cut, which StageCostEvaluator
// and the lowering's gradient buckets use too. pp * vpp chunks in pipeline order, chunk c on
// pipeline rank c % pp; the embedding on chunk 0, the final LayerNorm and output head on the last
// chunk. Encoder-decoder: encoder layers come before decoder layers; the chunk that ends the
// encoder (the last encoder chunk of a middle split, or the chunk whose run of the concatenated
// stack holds the encoder's last layer, possibly with the decoder's first layers) also applies the
// encoder's final LayerNorm and embeds the decoder inputs, and the plan's boundary from that chunk
// on carries the encoder output and the decoder hidden state. One chunk (pp * vpp = 1) holds
// everything.
//
// The word embedding is one parameter per pipeline rank that uses it (embedding, decoder-input
// embedding, tied head); when several ranks of a replica hold a copy their gradients are summed
// before the optimizer step (Megatron-LM's embedding group), so every copy stays identical.
//
// Thread safety: pure functions and value types.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "base/units.h"
#include "cost/cost_model.h"
#include "model/model_spec.h"

namespace sluice::runtime {

// What one chunk computes, in order: [word+position embedding of the inputs], layers of the
// encoder [first_encoder_layer, +encoder_layers), [encoder final LN + decoder-input embedding],
// decoder layers [first_decoder_layer, +decoder_layers), [final LN + head + loss].
struct ChunkSpec {
  int64_t index = 0;                // chunk (virtual stage) index
  StageLayers layers;               // the plan's view: layers, embedding, output_head
  int64_t first_encoder_layer = 0;  // global index (within its stack) of the first layer
  int64_t first_decoder_layer = 0;
  bool ends_encoder = false;    // encoder-decoder: applies the encoder's final LN and embeds the
                                // decoder inputs (model/chunk_cut.h's EncoderEndChunk)
  friend bool operator==(const ChunkSpec&, const ChunkSpec&) = default;
};

// The pp * vpp chunks of `model`, cut by `layer_cut` (ParallelConfig::layer_cut; empty: the even
// cut). REQUIRES: as model/chunk_cut.h's CutIntoChunks.
std::vector<ChunkSpec> ChunkLayout(const ModelSpec& model, int64_t chunks,
                                   std::span<const int64_t> layer_cut);

// Whether chunk `c` needs the word embedding matrix (embedding, decoder-input embedding, or a
// tied output head).
bool ChunkNeedsWordEmbedding(const ModelSpec& model, const ChunkSpec& c);

// Pipeline ranks (ascending) that hold a copy of the word embedding.
std::vector<int64_t> WordEmbeddingRanks(const ModelSpec& model, int64_t pp, int64_t vpp,
                                        std::span<const int64_t> layer_cut);

// Element ranges [begin, end) of a stage's flat gradient of `elements` values that the plan's
// buckets of that stage (their bytes, in issue order) cover: cut in proportion to the bytes, so
// a runtime whose parameter count differs from the cost model's still reduces every value once.
// REQUIRES: !bucket_bytes.empty(), every entry > 0.
std::vector<std::pair<int64_t, int64_t>> BucketRanges(std::span<const Bytes> bucket_bytes,
                                                      int64_t elements);

// 64-bit FNV-1a of `bytes` (the plan hash every rank verifies).
uint64_t Fnv1a64(std::span<const uint8_t> bytes);

}  // namespace sluice::runtime
