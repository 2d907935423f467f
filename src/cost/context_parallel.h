// Context parallelism: the cost of one layer on one device when every sequence of a micro-batch is
// split over cp devices (ring attention with load-balanced causal chunks), on top of any
// CostModel.
//
// Split (Megatron-Core's causal load balancing): a sequence of length s is padded to a multiple of
// 2cp and cut into 2cp chunks; device i holds chunks i and 2cp-1-i, so each device holds s/cp
// tokens, does 1/cp of the linear work and 1/cp of the causal attention: s^2/(2cp) query-key
// pairs, i.e. cp causal triangles of its local length s/cp. The per-device price of a
// transformer layer is therefore
//   t = Layer(local) + (cp - 1) * A(local)          local = {mbs, s/cp}
// per pass, where A(x) is the attention part of Layer at shape x, read off the CostModel as
// 2 * (Layer(mbs, x) - Layer(2 mbs, x/2)) (same tokens, half the query-key pairs; >= 0). The
// extra attention of the backward is input-gradient work (I); weight gradients do not change.
// Ring: each pass runs cp - 1 steps; in each step every device sends the K and V of its chunks
// (fp16, mbs x s/cp x the kv width of its tp rank, twice) to its ring neighbour, and the backward
// also sends dK and dV (twice the bytes). A step overlaps the attention of one block (A(local));
// what does not hide is exposed: (cp - 1) * max(0, step - A(local)) per pass, added to it.
// Memory: the local shape's stored activations (1/cp of the tokens) and peak, plus two K/V blocks
// in flight (the one in use and the one arriving).
// Embedding and output head: Layer(local) (they are per token). cp = 1 is Layer itself.
// Decoder-only models only (CheckParallelFits rejects cp > 1 for encoder-decoder models).
//
// Thread safety: pure functions over a const CostModel.
#pragma once

#include <cstdint>

#include "base/units.h"
#include "cost/cost_model.h"
#include "model/cluster_spec.h"
#include "model/parallel_config.h"

namespace sluice {

// The ring of one context-parallel group: degree and the link between ring neighbours.
struct CpRing {
  int64_t cp = 1;
  LinkSpec link;  // per device and direction (CpRingLink)
};

// The link the cp ring of `par` runs on: the cluster's intra-node link when every cp group (tp*cp
// consecutive devices from a multiple of tp*cp, model/parallel_config.h) lies inside one node,
// else the inter-node link.
LinkSpec CpRingLink(const ClusterSpec& cluster, const ParallelConfig& par);

// The tokens of one sequence row on each device: seqlen padded to a multiple of 2cp, over cp.
// REQUIRES: seqlen >= 1, cp >= 1.
int64_t CpLocalLength(int64_t seqlen, int64_t cp);

// What ContextParallelLayer adds up, for tests and reports.
struct CpLayerBreakdown {
  LayerCost cost;               // the per-device answer (as ContextParallelLayer)
  LayerShape local;             // the shape each device runs
  Duration attention_forward;   // A(local) of the forward, one block
  Duration attention_backward;  // A(local) of the backward, one block
  Duration ring_step_forward;   // one ring step's transfer (K, V)
  Duration ring_step_backward;  // one ring step's transfer (K, V, dK, dV)
  Duration exposed_forward;     // ring time the forward's attention does not hide
  Duration exposed_backward;
  Bytes kv_block;               // K and V of one device's chunks, one tp rank
};

// Cost of ONE layer of `kind` on one device of a cp group (one tp rank), for a micro-batch of
// padded `shape` (the whole sequences). Infeasible when the CostModel cannot price the local
// shape or the half-length probe. REQUIRES: shape as CostModel::Layer, ring.cp >= 1.
CpLayerBreakdown ContextParallelBreakdown(const CostModel& cost, LayerKind kind,
                                          const LayerShape& shape, int64_t tp, Recompute rc,
                                          const CpRing& ring);
LayerCost ContextParallelLayer(const CostModel& cost, LayerKind kind, const LayerShape& shape,
                               int64_t tp, Recompute rc, const CpRing& ring);

}  // namespace sluice
