// The prices the MoE overlap rewrites give a segmented op's pieces (moe_overlap.h): the
// analytic FLOP shares of its segments, and the time a sliced piece adds.
#include <vector>

#include "model/chunk_cut.h"
#include "passes/moe_overlap.h"

namespace sluice::passes {

std::vector<double> MoeSegmentShares(const ExecutionPlan& plan, int64_t dp_index, int64_t mb,
                                     int64_t stage, bool weight_grad) {
  const ModelSpec& m = plan.model;
  const LayerShape& shape = plan.replicas[dp_index].micro_batches[mb].shape;
  const int64_t S = plan.num_stages();
  const ChunkCut cut = CutIntoChunks(m, plan.parallel)[static_cast<size_t>(stage)];
  const double t = static_cast<double>(plan.parallel.tp), h = static_cast<double>(m.hidden);
  const double mats = m.mlp == MlpKind::kSwiGlu ? 3 : 2;
  const double b = static_cast<double>(shape.mbs);
  std::vector<double> seg;
  double acc = 0;
  auto layer = [&](int64_t index, bool decoder) {
    const double len = static_cast<double>(decoder ? shape.dec_seqlen : shape.seqlen);
    const double tokens = b * len;
    acc += 8 * tokens * h * h / t;  // QKV and output projections
    if (!weight_grad) acc += 4 * b * len * len * h / t;  // scores and their product with V
    if (decoder) {
      acc += 8 * tokens * h * h / t;
      if (!weight_grad) acc += 4 * b * len * static_cast<double>(shape.seqlen) * h / t;
    }
    if (m.IsMoeLayer(index)) {
      const MoeSpec& moe = *m.moe;
      const double fe =
          static_cast<double>(moe.expert_ffn_hidden > 0 ? moe.expert_ffn_hidden : m.ffn_hidden);
      acc += 2 * tokens * h * static_cast<double>(moe.experts);  // router
      seg.push_back(acc);
      seg.push_back(2 * moe.capacity_factor * tokens * static_cast<double>(moe.top_k) * h * fe /
                    t * mats);
      acc = 0;
    } else {
      acc += 2 * tokens * h * static_cast<double>(m.ffn_hidden) / t * mats;
    }
  };
  for (int64_t i = cut.first_encoder_layer; i < cut.first_encoder_layer + cut.encoder_layers; ++i) {
    layer(i, false);
  }
  for (int64_t j = cut.first_decoder_layer; j < cut.first_decoder_layer + cut.decoder_layers; ++j) {
    layer(j, true);
  }
  if (stage == S - 1) {
    const double len = static_cast<double>(m.is_encoder_decoder() ? shape.dec_seqlen : shape.seqlen);
    acc += 2 * b * len * h * static_cast<double>(m.vocab) / t;
  }
  seg.push_back(acc);
  double total = 0;
  for (double x : seg) total += x;
  for (double& x : seg) x = total > 0 ? x / total : 1.0 / static_cast<double>(seg.size());
  return seg;
}

Duration SliceOverheadFor(const ExecutionPlan& plan, const MoeOverlapOptions& options) {
  if (options.slice_overhead.has_value()) return *options.slice_overhead;
  return plan.moe_slice_overhead.value_or(kDefaultSliceOverhead);
}

}  // namespace sluice::passes
