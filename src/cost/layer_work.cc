#include "cost/layer_work.h"

#include <algorithm>
#include <cmath>

namespace sluice {
namespace {

// Widths of one tp rank, as doubles.
struct Widths {
  double h = 0;            // hidden
  double heads = 0;        // attention heads on this rank (heads / tp)
  double d = 0;            // head dim
  double q = 0;            // query / attention-output width on this rank
  double kv = 0;           // key (= value) width on this rank
  double f = 0;            // dense MLP width on this rank
  double v = 0;            // vocabulary rows on this rank
  double mlp_mats = 2;     // 2 (GELU) or 3 (SwiGLU) matrices
  double mlp_act = 4;      // MLP activation bytes per f element stored (GELU 4, SwiGLU 6)
  double mlp_traffic = 8;  // elementwise MLP traffic bytes per f element (GELU 8, SwiGLU 12)
};

Widths WidthsOf(const ModelSpec& m, int64_t tp) {
  Widths w;
  const double t = static_cast<double>(tp);
  w.h = static_cast<double>(m.hidden);
  w.d = static_cast<double>(m.HeadDim());
  w.heads = static_cast<double>(m.heads) / t;
  w.q = w.heads * w.d;
  const int64_t kv_heads = m.kv_heads > 0 ? m.kv_heads : m.heads;
  w.kv = (kv_heads >= tp ? static_cast<double>(kv_heads) / t : 1.0) * w.d;
  w.f = static_cast<double>(m.ffn_hidden) / t;
  w.v = static_cast<double>(m.vocab) / t;
  const bool swiglu = m.mlp == MlpKind::kSwiGlu;
  w.mlp_mats = swiglu ? 3 : 2;
  w.mlp_act = swiglu ? 6 : 4;
  w.mlp_traffic = swiglu ? 12 : 8;
  return w;
}

// Share of a stack's layers that are MoE (layers x Layer() must be the stack's total).
double MoeFraction(const ModelSpec& m, LayerKind kind) {
  if (!m.moe.has_value() || m.moe->layer_interval < 1) return 0;
  const int64_t layers = kind == LayerKind::kDecoder ? m.decoder_layers : m.layers;
  if (layers <= 0) return 0;
  return static_cast<double>(layers / m.moe->layer_interval) / static_cast<double>(layers);
}

// The MLP block of the mean layer: gemm FLOPs, elementwise traffic, stored activation bytes
// and parameters (per tp rank) for `tokens` tokens.
struct MlpBlock {
  double gemm = 0;
  double traffic = 0;
  double stored = 0;
  double params = 0;
  double expert_params = 0;
};

MlpBlock Mlp(const ModelSpec& m, const Widths& w, LayerKind kind, double tokens, int64_t tp) {
  MlpBlock dense;
  dense.gemm = 2 * tokens * w.h * w.f * w.mlp_mats;
  dense.traffic = tokens * w.f * w.mlp_traffic;
  dense.stored = tokens * w.f * w.mlp_act;
  dense.params = w.mlp_mats * w.h * w.f + w.f * (w.mlp_mats - 1) + w.h;
  const double phi = MoeFraction(m, kind);
  if (phi == 0) return dense;
  const MoeSpec& moe = *m.moe;
  const double experts = static_cast<double>(moe.experts);
  const double fe =
      static_cast<double>(moe.expert_ffn_hidden > 0 ? moe.expert_ffn_hidden : m.ffn_hidden) /
      static_cast<double>(tp);
  // Every expert is padded to its capacity: cf * tokens * top_k / experts tokens each.
  const double routed = moe.capacity_factor * tokens * static_cast<double>(moe.top_k);
  MlpBlock sparse;
  sparse.gemm = 2 * tokens * w.h * experts + 2 * routed * w.h * fe * w.mlp_mats;
  sparse.traffic = routed * (fe * w.mlp_traffic + 8 * w.h) + tokens * experts * 8;
  sparse.stored = routed * (fe * w.mlp_act + 4 * w.h) + tokens * experts * 4;
  const double one_expert = w.mlp_mats * w.h * fe + fe * (w.mlp_mats - 1) + w.h;
  sparse.expert_params = experts * one_expert;
  sparse.params = sparse.expert_params + w.h * experts;
  MlpBlock mean;
  mean.gemm = (1 - phi) * dense.gemm + phi * sparse.gemm;
  mean.traffic = (1 - phi) * dense.traffic + phi * sparse.traffic;
  mean.stored = (1 - phi) * dense.stored + phi * sparse.stored;
  mean.params = (1 - phi) * dense.params + phi * sparse.params;
  mean.expert_params = phi * sparse.expert_params;
  return mean;
}

// Self-attention parameters (QKV + output projection, with biases) of one rank.
double AttentionParams(const Widths& w) {
  return w.h * (w.q + 2 * w.kv) + w.q * w.h + w.q + 2 * w.kv + w.h;
}
// Cross-attention: Q from the decoder, K and V from the encoder output, output projection.
double CrossAttentionParams(const Widths& w) { return AttentionParams(w); }

// Parameters of a transformer layer (kEncoder / kDecoder) on one rank.
void TransformerParams(const ModelSpec& m, LayerKind kind, int64_t tp, double* params,
                       double* expert) {
  const Widths w = WidthsOf(m, tp);
  const MlpBlock mlp = Mlp(m, w, kind, 0, tp);
  double p = AttentionParams(w) + mlp.params + 4 * w.h;  // two norms (scale + shift)
  if (kind == LayerKind::kDecoder) p += CrossAttentionParams(w) + 2 * w.h;
  *params = p;
  *expert = mlp.expert_params;
}

void Add(PassWork* a, const PassWork& b) {
  a->gemm_flops += b.gemm_flops;
  a->attention_flops += b.attention_flops;
  a->attention_bytes += b.attention_bytes;
  a->memory_bytes += b.memory_bytes;
  a->tp_allreduce_bytes += b.tp_allreduce_bytes;
  a->tp_allreduces += b.tp_allreduces;
}

// Forward work of a transformer layer; also returns the core-attention part (what selective
// recomputation replays) and the layer's parameter count on this rank.
void TransformerForward(const ModelSpec& m, LayerKind kind, const LayerShape& s, int64_t tp,
                        const WorkOptions& o, PassWork* fwd, PassWork* core, double* params) {
  const Widths w = WidthsOf(m, tp);
  const double b = static_cast<double>(s.mbs);
  const bool decoder = kind == LayerKind::kDecoder;
  const double len = static_cast<double>(decoder ? s.dec_seqlen : s.seqlen);  // query length
  const double enc = static_cast<double>(s.seqlen);
  const double tokens = b * len;
  // Causal self-attention: a decoder-only model's layer and an encoder-decoder's decoder layer.
  const bool causal = decoder || !m.is_encoder_decoder();
  const double self_scores = b * w.heads * len * len;
  const double cross_scores = decoder ? b * w.heads * len * enc : 0;
  const double flash_self = o.flash_attention && causal ? 0.5 : 1.0;

  double expert = 0;
  TransformerParams(m, kind, tp, params, &expert);
  const MlpBlock mlp = Mlp(m, w, kind, tokens, tp);

  PassWork f;
  f.gemm_flops = 2 * tokens * w.h * (w.q + 2 * w.kv) + 2 * tokens * w.q * w.h + mlp.gemm;
  f.memory_bytes = mlp.traffic + 2 * *params;
  if (decoder) {
    const double enc_tokens = b * enc;
    f.gemm_flops +=
        2 * tokens * w.h * w.q + 2 * enc_tokens * w.h * 2 * w.kv + 2 * tokens * w.q * w.h;
    f.memory_bytes += tokens * (36 * w.h + 16 * w.q) + enc_tokens * (4 * w.h + 16 * w.kv);
  } else {
    f.memory_bytes += tokens * (24 * w.h + 8 * w.q);
  }
  core->attention_flops = 4 * w.d * (self_scores * flash_self + cross_scores);
  core->attention_bytes = o.flash_attention ? 0 : 12 * (self_scores + cross_scores);
  f.attention_flops = core->attention_flops;
  f.attention_bytes = core->attention_bytes;
  if (tp > 1) {
    f.tp_allreduces = decoder ? 3 : 2;
    f.tp_allreduce_bytes = static_cast<double>(f.tp_allreduces) * 2 * tokens * w.h;
  }
  *fwd = f;
}

}  // namespace

double MoeLayerFraction(const ModelSpec& model, LayerKind kind) {
  if (kind != LayerKind::kEncoder && kind != LayerKind::kDecoder) return 0;
  return MoeFraction(model, kind);
}

double LayerWork::WeightGradFraction() const {
  const double total = backward.gemm_flops + backward.attention_flops;
  // A backward without FLOPs is the embedding's scatter-add: all of it is the weight gradient.
  if (total <= 0) return 1.0;
  return std::clamp(weight_grad_flops / total, 0.0, 1.0);
}

int64_t HeadLength(const ModelSpec& model, const LayerShape& shape) {
  return model.is_encoder_decoder() ? shape.dec_seqlen : shape.seqlen;
}

LayerWork ComputeLayerWork(const ModelSpec& model, LayerKind kind, const LayerShape& shape,
                           int64_t tp, Recompute rc, const WorkOptions& options) {
  LayerWork out;
  const Widths w = WidthsOf(model, tp);
  const double b = static_cast<double>(shape.mbs);
  switch (kind) {
    case LayerKind::kEncoder:
    case LayerKind::kDecoder: {
      PassWork core;
      double params = 0;
      TransformerForward(model, kind, shape, tp, options, &out.forward, &core, &params);
      const PassWork& f = out.forward;
      PassWork bwd;
      bwd.gemm_flops = 2 * f.gemm_flops;
      bwd.attention_flops = (options.flash_attention ? 2.5 : 2.0) * f.attention_flops;
      bwd.attention_bytes = 2 * f.attention_bytes;
      bwd.memory_bytes = 2 * (f.memory_bytes - 2 * params) + 4 * params;
      bwd.tp_allreduce_bytes = f.tp_allreduce_bytes;
      bwd.tp_allreduces = f.tp_allreduces;
      if (rc == Recompute::kFull) {
        Add(&bwd, f);
      } else if (rc == Recompute::kSelective && !options.flash_attention) {
        Add(&bwd, core);
      }
      out.backward = bwd;
      out.weight_grad_flops = f.gemm_flops;
      break;
    }
    case LayerKind::kOutputHead: {
      const double tokens = b * static_cast<double>(HeadLength(model, shape));
      const double params = static_cast<double>(AnalyticLayerParams(model, kind, tp));
      PassWork& f = out.forward;
      f.gemm_flops = 2 * tokens * w.h * w.v;
      f.memory_bytes = tokens * w.v * 24 + tokens * w.h * 8 + 2 * params;
      PassWork& g = out.backward;
      g.gemm_flops = 2 * f.gemm_flops;
      g.memory_bytes = tokens * w.v * 12 + tokens * w.h * 16 + 4 * params;
      if (tp > 1) {  // the input's gradient is all-reduced over the vocabulary-parallel ranks
        g.tp_allreduces = 1;
        g.tp_allreduce_bytes = 2 * tokens * w.h;
      }
      out.weight_grad_flops = f.gemm_flops;
      break;
    }
    case LayerKind::kEmbedding: {
      // Both inputs of an encoder-decoder model go through the shared embedding.
      const double len = static_cast<double>(shape.seqlen) +
                         (model.is_encoder_decoder() ? static_cast<double>(shape.dec_seqlen) : 0);
      const double tokens = b * len;
      PassWork& f = out.forward;
      f.memory_bytes = 11 * tokens * w.h;  // gather rows, add positions, dropout (+ mask)
      if (tp > 1) {  // vocabulary-parallel lookup: partial rows are all-reduced
        f.tp_allreduces = 1;
        f.tp_allreduce_bytes = 2 * tokens * w.h;
      }
      out.backward.memory_bytes = 7 * tokens * w.h;  // dropout backward + scatter-add into dW
      out.weight_grad_flops = 0;
      break;
    }
  }
  return out;
}

ActivationBytes ComputeActivation(const ModelSpec& model, LayerKind kind, const LayerShape& shape,
                                  int64_t tp, Recompute rc, const WorkOptions& options) {
  const Widths w = WidthsOf(model, tp);
  const double b = static_cast<double>(shape.mbs);
  ActivationBytes out;
  switch (kind) {
    case LayerKind::kEncoder:
    case LayerKind::kDecoder: {
      const bool decoder = kind == LayerKind::kDecoder;
      const double len = static_cast<double>(decoder ? shape.dec_seqlen : shape.seqlen);
      const double enc = static_cast<double>(shape.seqlen);
      const double tokens = b * len;
      const MlpBlock mlp = Mlp(model, w, kind, tokens, tp);
      // Self-attention block: norm input 2h, QKV input 2h, Q 2q, K 2kv, V 2kv, projection
      // input 2q, dropout mask h. MLP block: norm input 2h, input 2h, mask h, inner widths.
      double linear = tokens * (5 * w.h + 4 * w.q + 4 * w.kv) + tokens * 5 * w.h + mlp.stored;
      double scores = 5 * w.heads * b * len * len;
      double lse = 4 * w.heads * b * len;
      if (decoder) {  // cross-attention: Q, projection input, norms, mask; K and V of the encoder
        linear += tokens * (5 * w.h + 4 * w.q) + b * enc * 4 * w.kv;
        scores += 5 * w.heads * b * len * enc;
        lse *= 2;
      }
      const bool flash = options.flash_attention;
      Recompute level = rc;
      if (flash && level == Recompute::kSelective) level = Recompute::kNone;
      // Peak: empirical coefficients on (linear, scores), fitted to both A100 tables; with flash
      // attention the score term is replaced by the softmax statistics.
      switch (level) {
        case Recompute::kNone:
          out.stored = linear + (flash ? lse : scores);
          out.peak = 3.1 * linear + (flash ? lse : 1.4 * scores);
          break;
        case Recompute::kSelective:
          out.stored = linear;
          out.peak = 3.0 * linear + 0.6 * scores;
          break;
        case Recompute::kFull:
          out.stored = 2 * tokens * w.h;
          out.peak = 1.6 * linear + (flash ? lse : 0.65 * scores);
          break;
      }
      out.peak = std::max(out.peak, out.stored);
      break;
    }
    case LayerKind::kOutputHead: {
      const double tokens = b * static_cast<double>(HeadLength(model, shape));
      out.stored = 4 * tokens * w.v + 4 * tokens * w.h;
      out.peak = out.stored + 6 * tokens * w.v;
      break;
    }
    case LayerKind::kEmbedding: {
      const double len = static_cast<double>(shape.seqlen) +
                         (model.is_encoder_decoder() ? static_cast<double>(shape.dec_seqlen) : 0);
      out.stored = b * len * w.h;
      out.peak = 4 * b * len * w.h;
      break;
    }
  }
  return out;
}

int64_t AnalyticLayerParams(const ModelSpec& model, LayerKind kind, int64_t tp) {
  const Widths w = WidthsOf(model, tp);
  switch (kind) {
    case LayerKind::kEncoder:
    case LayerKind::kDecoder: {
      double params = 0, expert = 0;
      TransformerParams(model, kind, tp, &params, &expert);
      return std::llround(params);
    }
    case LayerKind::kEmbedding:
      return std::llround(w.v * w.h);
    case LayerKind::kOutputHead:
      return model.tied_embeddings ? 0 : std::llround(w.v * w.h);
  }
  return 0;
}

int64_t AnalyticExpertParams(const ModelSpec& model, LayerKind kind, int64_t tp) {
  if (!model.moe.has_value() || (kind != LayerKind::kEncoder && kind != LayerKind::kDecoder)) {
    return 0;
  }
  double params = 0, expert = 0;
  TransformerParams(model, kind, tp, &params, &expert);
  return std::llround(expert);
}

}  // namespace sluice
