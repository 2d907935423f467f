#include "cost/context_parallel.h"

#include <algorithm>

namespace sluice {
namespace {

// The attention part of `full` estimated against `half` (same tokens, half the query-key pairs):
// full - half is half the attention; never negative (a per-call floor can hide it).
Duration AttentionPart(Duration full, Duration half) {
  return std::max(Duration::Zero(), (full - half) * 2);
}

Duration RingStep(Bytes bytes, const LinkSpec& link) {
  if (link.bandwidth <= 0) return link.latency;
  return link.latency + Duration::Seconds(static_cast<double>(bytes.count()) / link.bandwidth);
}

}  // namespace

LinkSpec CpRingLink(const ClusterSpec& cluster, const ParallelConfig& par) {
  const int64_t group = par.devices_per_rank();
  const bool inside = group <= cluster.devices_per_node && cluster.devices_per_node % group == 0;
  return inside ? cluster.intra_node : cluster.inter_node;
}

int64_t CpLocalLength(int64_t seqlen, int64_t cp) {
  const int64_t chunks = 2 * cp;
  return (seqlen + chunks - 1) / chunks * 2;
}

CpLayerBreakdown ContextParallelBreakdown(const CostModel& cost, LayerKind kind,
                                          const LayerShape& shape, int64_t tp, Recompute rc,
                                          const CpRing& ring) {
  CpLayerBreakdown out;
  out.local = shape;
  if (ring.cp <= 1) {
    out.cost = cost.Layer(kind, shape, tp, rc);
    return out;
  }
  out.local.seqlen = CpLocalLength(shape.seqlen, ring.cp);
  const LayerCost local = cost.Layer(kind, out.local, tp, rc);
  if (!local.feasible) return out;
  if (kind != LayerKind::kEncoder && kind != LayerKind::kDecoder) {
    out.cost = local;  // per-token layers: the local tokens are all there is
    return out;
  }
  const ModelSpec& model = cost.model();
  if (out.local.seqlen >= 2) {
    const LayerShape halved{out.local.mbs * 2, out.local.seqlen / 2, out.local.dec_seqlen};
    const LayerCost half = cost.Layer(kind, halved, tp, rc);
    if (!half.feasible) return out;
    // seqlen odd: halved holds one token fewer per row; the difference is below the model's
    // resolution (local lengths are even by CpLocalLength anyway).
    out.attention_forward = AttentionPart(local.forward, half.forward);
    out.attention_backward = AttentionPart(local.backward, half.backward);
  }
  const int64_t kv_heads = model.kv_heads > 0 ? model.kv_heads : model.heads;
  const int64_t kv_width = (kv_heads >= tp ? kv_heads / tp : 1) * model.HeadDim();
  // K and V, fp16.
  out.kv_block = Bytes::Of(2 * 2 * out.local.mbs * out.local.seqlen * kv_width);
  out.ring_step_forward = RingStep(out.kv_block, ring.link);
  out.ring_step_backward = RingStep(out.kv_block * 2, ring.link);
  const int64_t steps = ring.cp - 1;
  out.exposed_forward =
      std::max(Duration::Zero(), out.ring_step_forward - out.attention_forward) * steps;
  out.exposed_backward =
      std::max(Duration::Zero(), out.ring_step_backward - out.attention_backward) * steps;

  LayerCost& c = out.cost;
  c = local;
  c.forward = local.forward + out.attention_forward * steps + out.exposed_forward;
  c.backward_input =
      local.backward_input + out.attention_backward * steps + out.exposed_backward;
  c.backward_weight = local.backward_weight;
  c.backward = c.backward_input + c.backward_weight;
  c.peak_activation = local.peak_activation + out.kv_block * 2;
  return out;
}

LayerCost ContextParallelLayer(const CostModel& cost, LayerKind kind, const LayerShape& shape,
                               int64_t tp, Recompute rc, const CpRing& ring) {
  return ContextParallelBreakdown(cost, kind, shape, tp, rc, ring).cost;
}

}  // namespace sluice
