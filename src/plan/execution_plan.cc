#include "plan/execution_plan.h"

#include <cmath>
#include <limits>

#include "model/chunk_cut.h"
#include "schedule/dependencies.h"

namespace sluice {

std::optional<TransferLink> LinkOf(OpKind op, int64_t stage, int64_t num_stages) {
  if (!IsCommStart(op) && !IsCommFinish(op)) return std::nullopt;
  const OpKind start = IsCommStart(op) ? op : StartOf(op);
  const bool send = IsSend(start);
  // Activations move with F, gradients with B/I (I stands for both: the same boundary rules).
  const bool gradient = start == OpKind::kSendGradStart || start == OpKind::kRecvGradStart;
  const ActionKind kind = gradient ? ActionKind::kBackwardInput : ActionKind::kForward;
  const std::optional<BoundaryTransfer> t = send ? ProducedBoundary(kind, stage, num_stages)
                                                 : ConsumedBoundary(kind, stage, num_stages);
  if (!t) return std::nullopt;
  return TransferLink{t->boundary, send ? t->to_stage : t->from_stage, t->gradient};
}

std::vector<TensorShape> BoundaryShapes(const ModelSpec& model, const LayerShape& shape,
                                        int64_t boundary, const ParallelConfig& par) {
  std::vector<TensorShape> out = {{shape.mbs, shape.seqlen, model.hidden}};
  if (model.is_encoder_decoder() && boundary >= EncoderEndChunk(model, par)) {
    out.push_back({shape.mbs, shape.dec_seqlen, model.hidden});
  }
  return out;
}

bool IsBoundaryShapes(const std::vector<TensorShape>& shapes, const ModelSpec& model,
                      const LayerShape& shape, int64_t boundary, const ParallelConfig& par) {
  const bool two = model.is_encoder_decoder() && boundary >= EncoderEndChunk(model, par);
  auto is = [&](const TensorShape& t, int64_t len) {
    return t.size() == 3 && t[0] == shape.mbs && t[1] == len && t[2] == model.hidden;
  };
  return shapes.size() == (two ? 2u : 1u) && is(shapes[0], shape.seqlen) &&
         (!two || is(shapes[1], shape.dec_seqlen));
}

std::vector<TensorShape> InputShapes(const ModelSpec& model, const LayerShape& shape) {
  std::vector<TensorShape> out = {{shape.mbs, shape.seqlen}};
  if (model.is_encoder_decoder()) out.push_back({shape.mbs, shape.dec_seqlen});
  return out;
}

std::vector<TensorShape> LabelShapes(const ModelSpec& model, const LayerShape& shape) {
  if (model.is_encoder_decoder()) return {{shape.mbs, shape.dec_seqlen}};
  return {{shape.mbs, shape.seqlen}};
}

std::vector<TensorShape> LoadShapes(const ModelSpec& model, const LayerShape& shape, int64_t stage,
                                    int64_t num_stages) {
  std::vector<TensorShape> out;
  if (stage == 0) out = InputShapes(model, shape);
  if (stage == num_stages - 1) {
    for (TensorShape& t : LabelShapes(model, shape)) out.push_back(std::move(t));
  }
  return out;
}

namespace {

// sum(elements) * element_bytes, saturating at INT64_MAX.
Bytes SaturatingBytes(const std::vector<TensorShape>& shapes, int64_t element_bytes) {
  int64_t n = 0;
  for (const TensorShape& t : shapes) {
    if (__builtin_add_overflow(n, NumElements(t), &n)) n = std::numeric_limits<int64_t>::max();
  }
  if (__builtin_mul_overflow(n, element_bytes, &n)) n = std::numeric_limits<int64_t>::max();
  return Bytes::Of(n);
}

}  // namespace

Bytes Fp16Bytes(const std::vector<TensorShape>& shapes) { return SaturatingBytes(shapes, 2); }

Bytes TokenBytes(const std::vector<TensorShape>& shapes) { return SaturatingBytes(shapes, 8); }

std::vector<int64_t> MoeLayersOfStage(const ModelSpec& model, int64_t stage,
                                      const ParallelConfig& par) {
  std::vector<int64_t> out;
  if (!model.moe.has_value()) return out;
  const ChunkCut cut = CutIntoChunks(model, par)[static_cast<size_t>(stage)];
  for (int64_t i = cut.first_encoder_layer; i < cut.first_encoder_layer + cut.encoder_layers;
       ++i) {
    if (model.IsMoeLayer(i)) out.push_back(i);
  }
  for (int64_t j = cut.first_decoder_layer; j < cut.first_decoder_layer + cut.decoder_layers;
       ++j) {
    if (model.IsMoeLayer(j)) out.push_back(model.layers + j);
  }
  return out;
}

int64_t ExpertCapacity(const ModelSpec& model, const LayerShape& shape, int64_t layer) {
  SLUICE_CHECK(model.moe.has_value());
  const bool decoder = model.is_encoder_decoder() && layer >= model.layers;
  const double tokens =
      static_cast<double>(shape.mbs) * static_cast<double>(decoder ? shape.dec_seqlen
                                                                   : shape.seqlen);
  const double c = model.moe->capacity_factor * tokens * static_cast<double>(model.moe->top_k) /
                   static_cast<double>(model.moe->experts);
  return static_cast<int64_t>(std::ceil(c - 1e-9));
}

std::vector<int64_t> EpGroupOf(const ExecutionPlan& plan, int64_t rank) {
  const int64_t ep = plan.parallel.ep;
  SLUICE_CHECK(ep >= 1 && plan.dp() % ep == 0);
  const RankProgram& p = plan.ranks[static_cast<size_t>(rank)];
  const int64_t first = p.dp_index / ep * ep;
  std::vector<int64_t> out;
  for (int64_t j = 0; j < ep; ++j) out.push_back(plan.RankId(first + j, p.pp_index));
  return out;
}

std::vector<Instruction> AllToAllsOf(const ExecutionPlan& plan, int64_t rank, OpKind op,
                                     int64_t mb, int64_t stage) {
  std::vector<Instruction> out;
  const int64_t ep = plan.parallel.ep;
  if (ep <= 1 || !plan.model.moe.has_value() || op == OpKind::kBackwardWeight ||
      !IsCompute(op)) {
    return out;
  }
  const std::vector<int64_t> layers = MoeLayersOfStage(plan.model, stage, plan.parallel);
  if (layers.empty()) return out;
  const std::vector<int64_t> group = EpGroupOf(plan, rank);
  const int64_t local = plan.model.moe->experts / ep;
  const int64_t hidden = plan.model.hidden;
  int64_t me = 0;
  std::vector<const PlanMicroBatch*> member_mb;
  for (size_t j = 0; j < group.size(); ++j) {
    const RankProgram& p = plan.ranks[static_cast<size_t>(group[j])];
    if (group[j] == rank) me = static_cast<int64_t>(j);
    member_mb.push_back(&plan.replicas[static_cast<size_t>(p.dp_index)].micro_batches[mb]);
  }
  auto make = [&](OpKind kind, int64_t layer, bool to_experts) {
    // to_experts: this rank sends its own capacity-padded tokens to every member (a forward
    // dispatch, the gradient of a forward combine).
    Instruction in;
    in.op = kind;
    in.microbatch = mb;
    in.stage = stage;
    in.layer = layer;
    in.group = group;
    const int64_t mine = local * ExpertCapacity(plan.model, member_mb[me]->shape, layer);
    int64_t sent = 0, received = 0, remote = 0;
    for (size_t j = 0; j < group.size(); ++j) {
      const int64_t theirs = local * ExpertCapacity(plan.model, member_mb[j]->shape, layer);
      in.send_splits.push_back(to_experts ? mine : theirs);
      in.recv_splits.push_back(to_experts ? theirs : mine);
      sent += in.send_splits.back();
      received += in.recv_splits.back();
      if (static_cast<int64_t>(j) != me) remote += in.send_splits.back();
    }
    in.shapes = {{sent, hidden}, {received, hidden}};
    in.bytes = Fp16Bytes({{remote, hidden}});
    out.push_back(std::move(in));
  };
  if (op == OpKind::kForward) {
    for (int64_t layer : layers) {
      make(OpKind::kAllToAllDispatch, layer, true);
      make(OpKind::kAllToAllCombine, layer, false);
    }
  } else {
    for (auto it = layers.rbegin(); it != layers.rend(); ++it) {
      make(OpKind::kAllToAllCombine, *it, true);
      make(OpKind::kAllToAllDispatch, *it, false);
    }
  }
  return out;
}

}  // namespace sluice
