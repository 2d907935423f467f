#include "runtime/layout.h"

#include <algorithm>

#include "base/status.h"

namespace sluice::runtime {

std::vector<ChunkSpec> ChunkLayout(const ModelSpec& model, int64_t chunks) {
  SLUICE_CHECK(chunks >= 1);
  std::vector<ChunkSpec> out(static_cast<size_t>(chunks));
  for (int64_t c = 0; c < chunks; ++c) out[c].index = c;
  if (!model.is_encoder_decoder()) {
    const int64_t per = model.layers / chunks;
    for (int64_t c = 0; c < chunks; ++c) {
      out[c].layers.encoder_layers = per;
      out[c].first_encoder_layer = c * per;
    }
  } else if (chunks == 1) {
    out[0].layers.encoder_layers = model.layers;
    out[0].layers.decoder_layers = model.decoder_layers;
    out[0].ends_encoder = true;
  } else {
    const int64_t half = chunks / 2;
    const int64_t enc = model.layers / half;
    const int64_t dec = model.decoder_layers / half;
    for (int64_t c = 0; c < chunks; ++c) {
      if (c < half) {
        out[c].layers.encoder_layers = enc;
        out[c].first_encoder_layer = c * enc;
        out[c].ends_encoder = c == half - 1;
      } else {
        out[c].layers.decoder_layers = dec;
        out[c].first_decoder_layer = (c - half) * dec;
      }
    }
  }
  out.front().layers.embedding = true;
  out.back().layers.output_head = true;
  return out;
}

bool ChunkNeedsWordEmbedding(const ModelSpec& model, const ChunkSpec& c) {
  return c.layers.embedding || c.ends_encoder || (c.layers.output_head && model.tied_embeddings);
}

std::vector<int64_t> WordEmbeddingRanks(const ModelSpec& model, int64_t pp, int64_t vpp) {
  std::vector<int64_t> ranks;
  for (const ChunkSpec& c : ChunkLayout(model, pp * vpp)) {
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
