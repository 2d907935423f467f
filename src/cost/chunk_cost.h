// ChunkCost: sluice's one record of what one micro-batch costs on one piece of a pipeline.
//
// The batching layer prices a micro-batch per device stage (MicroBatch::stages, pp records); the
// schedules, the estimator and the plan price it per virtual stage (ScheduleCosts::chunks and
// PlanMicroBatch::stages, pp * vpp records, StageCostEvaluator::SplitOverChunks). Both are this
// record. Times are int64 nanoseconds, memory int64 bytes, so sums are exact.
//
// Invariants: every field >= 0; B = backward_input + backward_weight (backward()); peak includes
// what the piece has stored so far; stored_until_w <= stored (0 until a schedule asks for
// zero-bubble's split, see schedule/schedule_costs.h).
//
// Thread safety: value type.
#pragma once

#include "base/units.h"

namespace sluice {

struct ChunkCost {
  Duration forward;
  Duration backward_input;   // I: the input-gradient half of the backward (with any recompute)
  Duration backward_weight;  // W: the weight-gradient half; B = I + W
  Bytes stored;              // activations kept from F until B (or W, when split: see below)
  // Transient extra while the action runs, over what the rank held before it: for F the piece's
  // own high-water mark (the activations it has stored so far plus the running layer's
  // transient); B and I need max(0, peak - stored) on top of the held activations, W nothing
  // (the memory rule of schedule/estimator.h).
  Bytes peak;
  // With B split into I and W, W keeps this much of `stored` alive until it runs (the inputs and
  // output gradients of the linear layers); I frees the rest.
  Bytes stored_until_w;

  // The full backward B = I + W.
  Duration backward() const { return backward_input + backward_weight; }

  friend bool operator==(const ChunkCost&, const ChunkCost&) = default;
};

}  // namespace sluice
