// What the evaluator's two files share (stage_cost.cc: shapes and the memo of per-kind lookups;
// stage_cost_varlen.cc: varlen micro-batches and the per-stage fits). Internal to
// src/batching/.
//
// Thread safety: KindCosts and SummaryBuilder are values; LookupKinds goes through the memo's
// lock.
#pragma once

#include <algorithm>

#include "batching/stage_cost.h"
#include "cost/chunk_cost.h"
#include "cost/context_parallel.h"
#include "cost/cost_model.h"

namespace sluice {

class KindCostCache;

namespace stage_cost_internal {

// The per-kind costs of one micro-batch shape: looked up once, combined over stages.
struct KindCosts {
  LayerCost encoder;
  LayerCost decoder;
  LayerCost embedding;
  LayerCost head;
};

// One device stage's cost from its layers and the per-kind costs. The layers run in the order
// embedding, encoder layers, decoder layers, output head (true for every cut of model/chunk_cut.h), so
// the high-water mark is the largest "stored before this layer + this layer's peak".
inline ChunkCost CombineStage(const StageLayers& l, const KindCosts& k) {
  ChunkCost s;
  Bytes stored;
  Bytes peak;
  auto add = [&](const LayerCost& c, int64_t count) {
    if (count <= 0) return;
    s.forward += c.forward * count;
    s.backward_input += c.backward_input * count;
    s.backward_weight += c.backward_weight * count;
    peak = std::max(peak, stored + c.stored_activation * (count - 1) + c.peak_activation);
    stored += c.stored_activation * count;
  };
  add(k.embedding, l.embedding ? 1 : 0);
  add(k.encoder, l.encoder_layers);
  add(k.decoder, l.decoder_layers);
  add(k.head, l.output_head ? 1 : 0);
  s.stored = stored;
  s.peak = peak;
  return s;
}

// Accumulates a CostSummary stage by stage.
class SummaryBuilder {
 public:
  // `held` and `transient`: the stage's buffers (StageCostEvaluator::HeldBuffers and
  // TransientBuffers).
  void Add(const ChunkCost& s, int64_t in_flight, Bytes budget, Bytes held, Bytes transient) {
    const Duration t = s.forward + s.backward();
    summary_.bottleneck = std::max(summary_.bottleneck, t);
    summary_.total += t;
    summary_.max_stored = std::max(summary_.max_stored, s.stored);
    summary_.max_peak = std::max(summary_.max_peak, s.peak);
    const double need = static_cast<double>(
        ((s.stored + held) * (in_flight - 1) + s.peak + held + transient).count());
    summary_.memory_load =
        std::max(summary_.memory_load, need / static_cast<double>(budget.count()));
    summary_.memory_load_alone =
        std::max(summary_.memory_load_alone, static_cast<double>((s.peak + held + transient).count()) /
                                                 static_cast<double>(budget.count()));
  }
  CostSummary Finish(bool lookups_ok) {
    summary_.feasible = lookups_ok && summary_.memory_load <= 1.0;
    return summary_;
  }

 private:
  CostSummary summary_;
};

// The layer kinds the model uses at `shape` (cp > 1: per device of the cp group), through the
// evaluator's memo; false when one is infeasible (*k then partly filled).
bool LookupKinds(KindCostCache& cache, const CostModel& cost, const LayerShape& shape, int64_t tp,
                 const CpRing& ring, Recompute rc, KindCosts* k);

}  // namespace stage_cost_internal
}  // namespace sluice
