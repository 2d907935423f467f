// Analytic work and memory of one layer on one tensor-parallel rank.
//
// For a layer kind at a padded shape, tp degree and recompute level: the FLOPs of the linear
// layers and of attention, the HBM traffic, the tensor-parallel all-reduce volume (PassWork, for
// the forward and for the backward including recomputation), activation memory after
// Korthikanti et al. 2022 generalised to any head width, GQA, SwiGLU, cross-attention and MoE, and
// parameter counts. AnalyticCostModel turns these into times; ProfiledCostModel uses them to split
// a measured backward into its input-gradient (I) and weight-gradient (W) parts and to answer the
// embedding and the output head's memory; the fit uses them as regressors. docs/cost-models.md
// derives every coefficient.
//
// All quantities are doubles in FLOPs and bytes. Widths per rank: q = heads/tp * head_dim,
// kv = max(kv_heads/tp, 1) * head_dim (GQA heads are replicated when tp > kv_heads), f = ffn/tp.
//
// Thread safety: pure functions; no allocation.
#pragma once

#include <cstdint>

#include "cost/cost_model.h"
#include "model/model_spec.h"

namespace sluice {

struct WorkOptions {
  // Fused (flash) attention: score tensors never reach HBM, causal masks skip half the score
  // FLOPs, the backward recomputes the scores (2.5x the forward attention FLOPs), and no
  // s^2 activation is stored (selective recompute then equals none).
  bool flash_attention = false;
};

// Work of one pass (forward, or backward with its recomputation) of one layer on one tp rank.
struct PassWork {
  double gemm_flops = 0;          // matrix multiplies of linear layers (logits, router, experts)
  double attention_flops = 0;     // QK^T and scores x V
  double attention_bytes = 0;     // HBM traffic of the score tensors (0 with flash attention)
  double memory_bytes = 0;        // other HBM traffic: norms, activations, dropout, loss, weights
  double tp_allreduce_bytes = 0;  // sum of the sizes of the tp all-reduces (0 when tp == 1)
  int64_t tp_allreduces = 0;      // how many all-reduces (each pays the ring's latency)

  friend bool operator==(const PassWork&, const PassWork&) = default;
};

struct LayerWork {
  PassWork forward;
  PassWork backward;             // input + weight gradients + any recomputed forward
  double weight_grad_flops = 0;  // W: the weight gradients = the forward's gemm FLOPs

  // W / (all backward FLOPs): the share of backward time charged to the weight gradient. The
  // rest (input gradients, attention backward, recomputed forward) is I. 1 for the embedding,
  // whose backward is only the (scatter-add) weight gradient.
  double WeightGradFraction() const;
};

// REQUIRES: tp >= 1, shape.mbs >= 1, shape.seqlen >= 1 (and dec_seqlen >= 1 for kDecoder).
LayerWork ComputeLayerWork(const ModelSpec& model, LayerKind kind, const LayerShape& shape,
                           int64_t tp, Recompute rc, const WorkOptions& options);

struct ActivationBytes {
  double stored = 0;  // kept from the forward until the backward
  double peak = 0;    // transient peak while the layer runs its forward and backward
};

// Stored: Korthikanti et al. for kEncoder/kDecoder (none: sbh(10 + 24/t + 5as/(ht)) for GPT;
// selective drops the 5as^2b term; full keeps only the layer input 2sbh); output head: fp32
// logits 4sbV/t plus its 4sbh inputs; embedding: the dropout mask sbh. Peak: an empirical fit to
// the A100 tables (docs/cost-models.md). Same preconditions as ComputeLayerWork.
ActivationBytes ComputeActivation(const ModelSpec& model, LayerKind kind, const LayerShape& shape,
                                  int64_t tp, Recompute rc, const WorkOptions& options);

// Parameters of one layer on one tp rank (MoE: the mean over the stack, all experts held; the
// embedding counts the word embedding only; a tied output head counts 0). REQUIRES: tp >= 1.
int64_t AnalyticLayerParams(const ModelSpec& model, LayerKind kind, int64_t tp);
// The expert part of AnalyticLayerParams (0 for dense models and for embedding/head).
int64_t AnalyticExpertParams(const ModelSpec& model, LayerKind kind, int64_t tp);

// The share of a stack's layers of `kind` that are MoE layers: (layers / layer_interval) / layers
// (0 for dense models, the embedding and the head), the weight of the MoE layer in the stack's
// mean layer.
double MoeLayerFraction(const ModelSpec& model, LayerKind kind);

// The tokens per sequence the output head sees: dec_seqlen for encoder-decoder models (the head
// reads the decoder's output), seqlen otherwise.
int64_t HeadLength(const ModelSpec& model, const LayerShape& shape);

}  // namespace sluice
