#include "model/chunk_cut.h"

#include <algorithm>
#include <numeric>

#include "base/status.h"
#include "model/spec_util.h"

namespace sluice {
namespace {

// Encoder-decoder, more than one chunk: whether the Megatron split at the middle applies.
bool SplitsAtMiddle(const ModelSpec& model, int64_t chunks) {
  const int64_t half = chunks / 2;
  return chunks % 2 == 0 && model.layers % half == 0 && model.decoder_layers % half == 0;
}

// Chunk c holds layers [begin, end) of [encoder; decoder].
ChunkCut RunOfStack(const ModelSpec& model, int64_t begin, int64_t end) {
  ChunkCut cut;
  cut.first_encoder_layer = std::min(begin, model.layers);
  cut.encoder_layers = std::min(end, model.layers) - cut.first_encoder_layer;
  cut.first_decoder_layer = std::max<int64_t>(begin - model.layers, 0);
  cut.decoder_layers = std::max<int64_t>(end - model.layers, 0) - cut.first_decoder_layer;
  if (cut.encoder_layers == 0) cut.first_encoder_layer = 0;
  cut.ends_encoder = model.is_encoder_decoder() && begin < model.layers && model.layers <= end;
  return cut;
}

std::vector<ChunkCut> ExplicitCut(const ModelSpec& model, int64_t chunks,
                                  std::span<const int64_t> layer_cut) {
  SLUICE_CHECK(static_cast<int64_t>(layer_cut.size()) == chunks);
  std::vector<ChunkCut> out;
  out.reserve(layer_cut.size());
  int64_t begin = 0;
  for (const int64_t n : layer_cut) {
    SLUICE_CHECK(n >= 1);
    out.push_back(RunOfStack(model, begin, begin + n));
    begin += n;
  }
  SLUICE_CHECK(begin == model.layers + (model.is_encoder_decoder() ? model.decoder_layers : 0));
  return out;
}

}  // namespace

bool ChunksFit(const ModelSpec& model, int64_t chunks) {
  if (chunks < 1) return false;
  // With at least one layer, chunks > layers leaves a remainder.
  if (!model.is_encoder_decoder()) return model.layers % chunks == 0;
  const int64_t total = model.layers + model.decoder_layers;
  return chunks == 1 || SplitsAtMiddle(model, chunks) || (total > 0 && total % chunks == 0);
}

std::vector<int64_t> AllowedChunkCounts(const ModelSpec& model) {
  using model_internal::Divisors;
  if (!model.is_encoder_decoder()) return Divisors(model.layers);
  std::vector<int64_t> out = Divisors(model.layers + model.decoder_layers);
  for (const int64_t d : Divisors(std::gcd(model.layers, model.decoder_layers))) {
    out.push_back(2 * d);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<ChunkCut> CutIntoChunks(const ModelSpec& model, const ParallelConfig& par) {
  return CutIntoChunks(model, par.chunks(), par.layer_cut);
}

int64_t EncoderEndChunk(const ModelSpec& model, const ParallelConfig& par) {
  return EncoderEndChunk(model, par.chunks(), par.layer_cut);
}

std::vector<int64_t> EvenLayerCut(const ModelSpec& model, int64_t chunks) {
  std::vector<int64_t> out;
  for (const ChunkCut& c : CutIntoChunks(model, chunks, {})) {
    out.push_back(c.encoder_layers + c.decoder_layers);
  }
  return out;
}

std::string DescribeLayerCut(std::span<const int64_t> layer_cut) {
  if (layer_cut.empty()) return "even";
  std::string s;
  for (const int64_t n : layer_cut) {
    if (!s.empty()) s += '+';
    s += std::to_string(n);
  }
  return s;
}

std::vector<ChunkCut> CutIntoChunks(const ModelSpec& model, int64_t chunks,
                                    std::span<const int64_t> layer_cut) {
  if (!layer_cut.empty()) return ExplicitCut(model, chunks, layer_cut);
  SLUICE_CHECK(ChunksFit(model, chunks));
  std::vector<ChunkCut> out(static_cast<size_t>(chunks));
  if (!model.is_encoder_decoder()) {
    const int64_t per = model.layers / chunks;
    for (int64_t c = 0; c < chunks; ++c) {
      out[c].first_encoder_layer = c * per;
      out[c].encoder_layers = per;
    }
    return out;
  }
  if (chunks == 1) {
    out[0].encoder_layers = model.layers;
    out[0].decoder_layers = model.decoder_layers;
    out[0].ends_encoder = true;
    return out;
  }
  if (SplitsAtMiddle(model, chunks)) {
    const int64_t half = chunks / 2;
    const int64_t enc = model.layers / half, dec = model.decoder_layers / half;
    for (int64_t c = 0; c < half; ++c) {
      out[c].first_encoder_layer = c * enc;
      out[c].encoder_layers = enc;
      out[c + half].first_decoder_layer = c * dec;
      out[c + half].decoder_layers = dec;
    }
    out[half - 1].ends_encoder = true;
    return out;
  }
  // Runs of `per` layers over [encoder; decoder]: layer i < layers is encoder layer i, otherwise
  // decoder layer i - layers.
  const int64_t per = (model.layers + model.decoder_layers) / chunks;
  for (int64_t c = 0; c < chunks; ++c) out[c] = RunOfStack(model, c * per, (c + 1) * per);
  return out;
}

int64_t EncoderEndChunk(const ModelSpec& model, int64_t chunks,
                        std::span<const int64_t> layer_cut) {
  if (!model.is_encoder_decoder()) return -1;
  if (!layer_cut.empty()) {
    int64_t end = 0;
    for (size_t c = 0; c < layer_cut.size(); ++c) {
      end += layer_cut[c];
      if (end >= model.layers) return static_cast<int64_t>(c);
    }
    SLUICE_CHECK(false);
  }
  SLUICE_CHECK(ChunksFit(model, chunks));
  if (chunks == 1) return 0;
  if (SplitsAtMiddle(model, chunks)) return chunks / 2 - 1;
  const int64_t per = (model.layers + model.decoder_layers) / chunks;
  return (model.layers - 1) / per;
}

}  // namespace sluice
