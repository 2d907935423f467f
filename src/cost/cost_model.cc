#include "cost/cost_model.h"

#include <fmt/core.h>

#include <algorithm>

#include "base/json_util.h"
#include "cost/layer_work.h"
#include "model/chunk_cut.h"

namespace sluice {
namespace {

constexpr std::string_view kRecomputeNames[] = {"none", "selective", "full"};

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

std::string_view LayerKindName(LayerKind kind) {
  switch (kind) {
    case LayerKind::kEncoder:
      return "encoder";
    case LayerKind::kDecoder:
      return "decoder";
    case LayerKind::kEmbedding:
      return "embedding";
    case LayerKind::kOutputHead:
      return "output-head";
  }
  return "?";
}

std::string_view RecomputeName(Recompute rc) { return kRecomputeNames[static_cast<int>(rc)]; }

StatusOr<Recompute> ParseRecompute(std::string_view name) {
  for (int i = 0; i < 3; ++i) {
    if (kRecomputeNames[i] == name) return static_cast<Recompute>(i);
  }
  return InvalidArgumentError(fmt::format("unknown recompute level '{}' (allowed: {})", name,
                                          JoinAllowed(kRecomputeNames)));
}

ModelStateMemory ModelStatesFromParams(int64_t params, int64_t dp, int64_t zero_stage) {
  SLUICE_CHECK(params >= 0 && dp >= 1 && zero_stage >= 0 && zero_stage <= 3);
  const int64_t shard = CeilDiv(params, dp);
  ModelStateMemory m;
  m.params = params;
  m.weights = Bytes::Of(2 * (zero_stage >= 3 ? shard : params));
  m.gradients = Bytes::Of(2 * (zero_stage >= 2 ? shard : params));
  m.optimizer = Bytes::Of(12 * (zero_stage >= 1 ? shard : params));
  return m;
}

ModelStateMemory operator+(const ModelStateMemory& a, const ModelStateMemory& b) {
  ModelStateMemory m;
  m.params = a.params + b.params;
  m.weights = a.weights + b.weights;
  m.gradients = a.gradients + b.gradients;
  m.optimizer = a.optimizer + b.optimizer;
  return m;
}

ModelStateMemory CostModel::ModelStates(const StageLayers& stage, const ParallelConfig& par) const {
  SLUICE_CHECK(par.tp >= 1 && par.dp >= 1 && par.ep >= 1);
  const ModelSpec& spec = model();
  int64_t params = stage.encoder_layers * LayerParams(LayerKind::kEncoder, par.tp) +
                   stage.decoder_layers * LayerParams(LayerKind::kDecoder, par.tp);
  // One word embedding per stage that uses it: the input embedding, the decoder-input embedding
  // of the chunk that ends the encoder, or a tied head (its own copy on a stage without the others).
  if (stage.embedding || stage.decoder_embedding ||
      (stage.output_head && spec.tied_embeddings)) {
    params += LayerParams(LayerKind::kEmbedding, par.tp);
  }
  if (stage.output_head) params += LayerParams(LayerKind::kOutputHead, par.tp);  // 0 when tied
  const int64_t experts =
      stage.encoder_layers * AnalyticExpertParams(spec, LayerKind::kEncoder, par.tp) +
      stage.decoder_layers * AnalyticExpertParams(spec, LayerKind::kDecoder, par.tp);
  const int64_t dense = std::max<int64_t>(0, params - experts);
  // The cp ranks of a position hold the same parameters: ZeRO shards over dp * cp (Megatron-Core's
  // distributed optimizer over the dp x cp group).
  ModelStateMemory states = ModelStatesFromParams(dense, par.dp * par.cp, par.zero);
  if (experts > 0) {
    states = states + ModelStatesFromParams(CeilDiv(experts, par.ep),
                                            std::max<int64_t>(1, par.dp / par.ep), par.zero);
  }
  return states;
}

int64_t ReducedGradientParams(const CostModel& cost, const StageLayers& stage,
                              const ParallelConfig& par) {
  int64_t params = cost.ModelStates(stage, par).params;
  if (par.ep > 1 && par.dp / par.ep <= 1) {
    const ModelSpec& spec = cost.model();
    const int64_t experts =
        stage.encoder_layers * AnalyticExpertParams(spec, LayerKind::kEncoder, par.tp) +
        stage.decoder_layers * AnalyticExpertParams(spec, LayerKind::kDecoder, par.tp);
    params -= CeilDiv(experts, par.ep);
  }
  return std::max<int64_t>(0, params);
}

std::vector<StageLayers> ChunkStageLayers(const ModelSpec& model, const ParallelConfig& par) {
  std::vector<StageLayers> out;
  out.reserve(static_cast<size_t>(par.chunks()));
  for (const ChunkCut& cut : CutIntoChunks(model, par)) {
    StageLayers l;
    l.encoder_layers = cut.encoder_layers;
    l.decoder_layers = cut.decoder_layers;
    l.decoder_embedding = cut.ends_encoder;
    out.push_back(l);
  }
  out.front().embedding = true;
  out.back().output_head = true;
  return out;
}

}  // namespace sluice
