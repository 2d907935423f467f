#include "plan/execution_plan.h"

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
                                        int64_t boundary, int64_t num_stages) {
  std::vector<TensorShape> out = {{shape.mbs, shape.seqlen, model.hidden}};
  if (model.is_encoder_decoder() && boundary >= EncoderEndChunk(model, num_stages)) {
    out.push_back({shape.mbs, shape.dec_seqlen, model.hidden});
  }
  return out;
}

bool IsBoundaryShapes(const std::vector<TensorShape>& shapes, const ModelSpec& model,
                      const LayerShape& shape, int64_t boundary, int64_t num_stages) {
  const bool two =
      model.is_encoder_decoder() && boundary >= EncoderEndChunk(model, num_stages);
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

}  // namespace sluice
