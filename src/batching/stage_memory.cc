// The memory side of StageCostEvaluator (stage_cost.h): the buffers a stage holds beside its
// activations, and the memory rule over a sequence of micro-batches (FindMemoryViolation,
// SequenceFitsMemory, CheckSequenceMemory).
#include <fmt/core.h>

#include <algorithm>
#include <optional>
#include <string>

#include "batching/micro_batch.h"
#include "batching/stage_cost.h"
#include "model/chunk_cut.h"

namespace sluice {

Bytes StageCostEvaluator::BoundaryBytes(const LayerShape& shape, int64_t stage) const {
  Bytes out;
  for (int64_t v = 0; v < par_.vpp; ++v) {
    out = std::max(out, ChunkBoundaryBytes(shape, stage + v * par_.pp));
  }
  return out;
}

Bytes StageCostEvaluator::ChunkBoundaryBytes(const LayerShape& shape, int64_t chunk) const {
  const int64_t chunks = par_.chunks();
  if (chunk >= chunks - 1) return Bytes::Zero();
  int64_t tokens = shape.mbs * shape.seqlen;
  if (model().is_encoder_decoder() && chunk >= EncoderEndChunk(model(), par_)) {
    tokens += shape.mbs * shape.dec_seqlen;
  }
  return Bytes::Of(2 * tokens * model().hidden);
}

Bytes StageCostEvaluator::ChunkHeldBuffers(const LayerShape& shape, int64_t chunk) const {
  const int64_t chunks = par_.chunks();
  const bool encdec = model().is_encoder_decoder();
  int64_t tokens = 0;  // int64 token ids and labels loaded
  if (chunk == 0) tokens += shape.mbs * (shape.seqlen + (encdec ? shape.dec_seqlen : 0));
  if (chunk == chunks - 1) tokens += shape.mbs * (encdec ? shape.dec_seqlen : shape.seqlen);
  return ChunkBoundaryBytes(shape, chunk) + Bytes::Of(8 * tokens);
}

Bytes StageCostEvaluator::HeldBuffers(const LayerShape& shape, int64_t stage) const {
  Bytes out;
  for (int64_t c = stage; c < par_.chunks(); c += par_.pp) out += ChunkHeldBuffers(shape, c);
  return out;
}

Bytes StageCostEvaluator::TransientBuffers(const LayerShape& shape, int64_t stage) const {
  if (par_.pp == 1) return Bytes::Zero();
  Bytes largest;
  for (int64_t c = stage; c < par_.chunks(); c += par_.pp) {
    largest = std::max(largest, ChunkBoundaryBytes(shape, c));
    if (c > 0) largest = std::max(largest, ChunkBoundaryBytes(shape, c - 1));
  }
  return largest * options_.transient_boundary_buffers;
}

std::optional<MemoryViolation> FindMemoryViolation(const StageCostEvaluator& eval,
                                                   std::span<const MicroBatch> micro_batches) {
  const int64_t m = static_cast<int64_t>(micro_batches.size());
  std::vector<Bytes> held(static_cast<size_t>(m)), transient(static_cast<size_t>(m));
  for (int64_t s = 0; s < eval.pp(); ++s) {
    const int64_t k = eval.InFlight(s, m);
    const Bytes budget = eval.ActivationBudget(s);
    for (int64_t i = 0; i < m; ++i) {
      held[i] = eval.HeldBuffers(micro_batches[i].shape, s);
      transient[i] = eval.TransientBuffers(micro_batches[i].shape, s);
    }
    // Windows [w, w + k); with m <= k there is one window holding all of them.
    for (int64_t w = 0; w < m; ++w) {
      const int64_t end = std::min(m, w + k);
      Bytes stored, buffers;
      Bytes reserve;  // the window's largest transient
      for (int64_t i = w; i < end; ++i) {
        stored += micro_batches[i].stages[s].stored;
        buffers += held[i];
        reserve = std::max(reserve, transient[i]);
      }
      buffers += reserve;
      for (int64_t i = w; i < end; ++i) {
        const MicroBatch& run = micro_batches[i];
        const Bytes need = stored - run.stages[s].stored + run.stages[s].peak + buffers;
        if (need > budget) return MemoryViolation{s, w, end, i, need, buffers, budget};
      }
      if (end == m) break;
    }
  }
  return std::nullopt;
}

bool SequenceFitsMemory(const StageCostEvaluator& eval, std::span<const MicroBatch> micro_batches) {
  for (const MicroBatch& mb : micro_batches) {
    if (static_cast<int64_t>(mb.stages.size()) != eval.pp()) return false;
  }
  return !FindMemoryViolation(eval, micro_batches).has_value();
}

std::string CheckSequenceMemory(const StageCostEvaluator& eval,
                                std::span<const MicroBatch> micro_batches) {
  const int64_t pp = eval.pp();
  for (size_t i = 0; i < micro_batches.size(); ++i) {
    const MicroBatch& mb = micro_batches[i];
    if (static_cast<int64_t>(mb.stages.size()) != pp) {
      return fmt::format("micro-batch {}: memory given for {} stages, the pipeline has {}", i,
                         mb.stages.size(), pp);
    }
  }
  const std::optional<MemoryViolation> v = FindMemoryViolation(eval, micro_batches);
  if (!v) return "";
  return fmt::format(
      "stage {}: micro-batches {}..{} in flight with {} running need {} (stored activations of "
      "the others + its peak {} + buffers {}), budget {} (memory limit {} - model states {})",
      v->stage, v->begin, v->end - 1, v->running, FormatBytes(v->need),
      FormatBytes(micro_batches[v->running].stages[v->stage].peak), FormatBytes(v->buffers),
      FormatBytes(v->budget), FormatBytes(eval.memory_limit()),
      FormatBytes(eval.stage_states()[v->stage].total()));
}

}  // namespace sluice
