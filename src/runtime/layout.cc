#include "runtime/layout.h"

#include <algorithm>

#include "base/status.h"
#include "model/chunk_cut.h"

namespace sluice::runtime {

std::vector<ChunkSpec> ChunkLayout(const ModelSpec& model, int64_t chunks,
                                   std::span<const int64_t> layer_cut) {
  const std::vector<ChunkCut> cuts = CutIntoChunks(model, chunks, layer_cut);
  ParallelConfig par;
  par.pp = chunks;
  par.layer_cut.assign(layer_cut.begin(), layer_cut.end());
  const std::vector<StageLayers> layers = ChunkStageLayers(model, par);
  std::vector<ChunkSpec> out(cuts.size());
  for (size_t c = 0; c < cuts.size(); ++c) {
    out[c].index = static_cast<int64_t>(c);
    out[c].layers = layers[c];
    out[c].first_encoder_layer = cuts[c].first_encoder_layer;
    out[c].first_decoder_layer = cuts[c].first_decoder_layer;
    out[c].ends_encoder = cuts[c].ends_encoder;
  }
  return out;
}

bool ChunkNeedsWordEmbedding(const ModelSpec& model, const ChunkSpec& c) {
  return c.layers.embedding || c.ends_encoder || (c.layers.output_head && model.tied_embeddings);
}

std::vector<int64_t> WordEmbeddingRanks(const ModelSpec& model, int64_t pp, int64_t vpp,
                                        std::span<const int64_t> layer_cut) {
  std::vector<int64_t> ranks;
  for (const ChunkSpec& c : ChunkLayout(model, pp * vpp, layer_cut)) {
    if (ChunkNeedsWordEmbedding(model, c)) ranks.push_back(c.index % pp);
  }
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return ranks;
}

std::vector<std::pair<int64_t, int64_t>> BucketRanges(std::span<const Bytes> bucket_bytes,
                                                      int64_t elements) {
  SLUICE_CHECK(!bucket_bytes.empty() && elements >= 0);
  // Cumulative fractions in 128-bit arithmetic: bytes up to 2^50 times elements up to 2^40.
  __int128 total = 0;
  for (const Bytes b : bucket_bytes) {
    SLUICE_CHECK(b.count() > 0);
    total += b.count();
  }
  std::vector<std::pair<int64_t, int64_t>> out;
  __int128 cum = 0;
  int64_t begin = 0;
  for (const Bytes b : bucket_bytes) {
    cum += b.count();
    const int64_t end = static_cast<int64_t>(cum * elements / total);
    out.emplace_back(begin, end);
    begin = end;
  }
  return out;
}

uint64_t Fnv1a64(std::span<const uint8_t> bytes) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const uint8_t b : bytes) {
    h ^= b;
    h *= 0x100000001b3ULL;
  }
  return h;
}

}  // namespace sluice::runtime
