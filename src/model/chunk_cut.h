// How a model's layers are cut into pipeline chunks: the one rule the batching cost evaluator,
// the plan's boundary shapes, the lowering's gradient buckets and the runtime's model shards
// share (each used to carry its own copy).
//
// There are pp * vpp chunks in pipeline order; chunk c runs on pipeline rank c % pp.
//  - Decoder-only: `layers` split evenly (pp * vpp divides layers); the embedding on chunk 0, the
//    final LayerNorm and output head on the last chunk.
//  - Encoder-decoder, one chunk: both stacks.
//  - Encoder-decoder, pp * vpp even and pp * vpp / 2 dividing both stacks: the first half of the
//    chunks cut the encoder stack evenly, the second half the decoder stack (Megatron-LM's
//    pipeline split rank at the middle).
//  - Encoder-decoder otherwise: the concatenated stack [encoder layers; decoder layers] is cut
//    into pp * vpp runs of (layers + decoder_layers) / (pp * vpp) consecutive layers, so one chunk
//    may hold the encoder's last layers and the decoder's first (T5 3 + 3 at pp = 3: [e0 e1],
//    [e2 | d0], [d1 d2]). When both stacks have the same depth the two rules agree wherever both
//    apply.
// An explicit cut (ParallelConfig::layer_cut: layers per chunk, every chunk at least one, summing
// to layers + decoder_layers) runs over the concatenated stack like the last rule: chunk c holds
// layers [sum of the counts before c, + its count) of [encoder; decoder], so any pipeline depth
// fits and the stages may be uneven (the output head's stage one layer lighter, T5's encoder on
// more or fewer stages than its decoder). The even rules are the explicit cut of their counts
// (EvenLayerCut): the two give the same chunks.
// A model with no layers (`sluice profile`'s head-only probe; ModelSpec validation requires
// layers >= 1 of user models) cuts into any number of empty decoder-only chunks, or into 1 or 2
// encoder-decoder chunks.
// The chunk holding the encoder's last layer "ends the encoder": it applies the encoder's final
// LayerNorm and embeds the decoder inputs, so every boundary from that chunk on carries the
// encoder output and the decoder hidden state.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/model_spec.h"
#include "model/parallel_config.h"

namespace sluice {

// The layers of one chunk; indices count within their stack.
struct ChunkCut {
  int64_t first_encoder_layer = 0;
  int64_t encoder_layers = 0;  // kEncoder layers (all layers of a decoder-only model)
  int64_t first_decoder_layer = 0;
  int64_t decoder_layers = 0;
  bool ends_encoder = false;  // encoder-decoder: holds the encoder's final LN + decoder embedding

  friend bool operator==(const ChunkCut&, const ChunkCut&) = default;
};

// Whether `model` can be cut into `chunks` (>= 1) chunks by the rules above.
bool ChunksFit(const ModelSpec& model, int64_t chunks);
// Every chunk count ChunksFit accepts, ascending.
std::vector<int64_t> AllowedChunkCounts(const ModelSpec& model);
// The chunks, in pipeline order: `layer_cut` empty, the even rules (REQUIRES: ChunksFit(model,
// chunks)); else the explicit cut (REQUIRES: `chunks` entries >= 1 summing to layers +
// decoder_layers, which CheckParallelFits checks).
std::vector<ChunkCut> CutIntoChunks(const ModelSpec& model, int64_t chunks,
                                    std::span<const int64_t> layer_cut);
// The chunks of a configuration: CutIntoChunks(model, par.chunks(), par.layer_cut).
std::vector<ChunkCut> CutIntoChunks(const ModelSpec& model, const ParallelConfig& par);
// Encoder-decoder: the index of the chunk that ends the encoder; -1 for decoder-only models.
// No allocation; O(1) for the even cut, O(chunks) for an explicit one. REQUIRES: as CutIntoChunks.
int64_t EncoderEndChunk(const ModelSpec& model, int64_t chunks, std::span<const int64_t> layer_cut);
int64_t EncoderEndChunk(const ModelSpec& model, const ParallelConfig& par);
// Layers per chunk of the even rules, over the concatenated stack (a one-chunk encoder-decoder
// model: both stacks in one). REQUIRES: ChunksFit(model, chunks).
std::vector<int64_t> EvenLayerCut(const ModelSpec& model, int64_t chunks);
// "8+8+9+7", or "even" for an empty cut.
std::string DescribeLayerCut(std::span<const int64_t> layer_cut);

}  // namespace sluice
