// The ideal bound of `sluice compare` and the accounting of where each method's time goes.
//
// Useful FLOPs of a sample: forward + backward of every layer it passes through, at its own
// (unpadded) lengths, without recomputation, plus the output head's logits; the embedding lookup
// counts zero. Attention counts its full score matrix, as the simulator's model_flops and
// Megatron's MFU formula do (layer_work.h, default WorkOptions).
//
// Achievable rate R (useful FLOP/s per device): the highest rate the cost model reaches for one
// layer, max over layer kinds, tensor-parallel degrees, micro-batch sizes and lengths (powers of
// two), of useful FLOPs / (tp x (forward + backward time)) at no recomputation; and, so that the
// bound also covers shapes between those points and the varlen fits, every (micro-batch, stage)
// of every compared plan: useful FLOPs of its samples on that stage / (tp x its forward +
// backward time). The ideal time of a global batch is useful FLOPs / (devices x R): every device
// computing useful work at the best rate anything reaches, no padding, no bubbles, no
// communication. Sound: each rank's compute stream is busy at most the iteration time, and every
// compute op's time is at least its useful FLOPs / (tp x R), so no simulated iteration of the
// compared plans can be shorter than its ideal time.
//
// The accounting splits devices x iteration time of a simulated batch into: useful work at R,
// compute spent on padding (op time x (1 - useful / padded-shape FLOPs)), on recomputation (op
// time x the recomputed share of its FLOPs), kernel efficiency (the rest of the compute: shapes
// that run below R), exposed communication, imbalance (a rank idle while the busiest rank still
// computes, capped by its idle time) and the remaining pipeline bubble. The parts sum to 1.
//
// Thread safety: immutable value types and pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "batching/micro_batch.h"
#include "batching/stage_cost.h"
#include "cost/cost_model.h"
#include "data/sample.h"
#include "model/cluster_spec.h"
#include "model/model_spec.h"
#include "planner/planner.h"
#include "sim/simulator.h"

namespace sluice {

class FlopCounter {
 public:
  explicit FlopCounter(const ModelSpec& model) : model_(model) {}

  // Useful FLOPs of one whole layer (tp = 1) of `kind` for a micro-batch of `shape`.
  double Layer(LayerKind kind, const LayerShape& shape) const;
  // Of the layers of one pipeline stage (embedding: 0).
  double Stage(const StageLayers& stage, const LayerShape& shape) const;
  // Of one sample's pass through a stage / through the whole model.
  double SampleStage(const StageLayers& stage, const Sample& sample) const;
  double SampleTotal(const Sample& sample) const;
  // Share of the FLOPs of one stage pass at `shape` and `rc` that recomputation adds, in [0, 1).
  double RecomputeShare(const StageLayers& stage, const LayerShape& shape, Recompute rc) const;
  const ModelSpec& model() const { return model_; }

 private:
  LayerShape SampleShape(const Sample& sample) const;
  ModelSpec model_;
};

struct AchievableRate {
  double flops_per_s = 0;  // useful FLOP/s per device
  std::string where;       // e.g. "encoder layer, tp 1, 8 x 2048 (sweep)"

  friend bool operator==(const AchievableRate&, const AchievableRate&) = default;
};

// The sweep part of R over tensor-parallel degrees `tps` (those the cost model supports).
AchievableRate SweepAchievableRate(const CostModel& cost, const FlopCounter& flops,
                                   std::span<const int64_t> tps);

// Device-seconds of one simulated batch (or a sum of them), before R is known.
struct BatchAccount {
  double useful_flops = 0;    // of the placed samples
  double device_seconds = 0;  // cluster devices x iteration time
  double compute = 0;         // busy compute streams (simulator), x tp
  double padding = 0;         // of `compute`: spent on padding
  double recompute = 0;       // of `compute`: spent recomputing activations
  double comm = 0;            // exposed communication
  double imbalance = 0;       // waiting for the busiest rank
  double bubble = 0;          // the rest of the idle time
  double max_op_rate = 0;     // highest useful FLOP/s per device of one (micro-batch, stage)

  void Add(const BatchAccount& other);
};

// Accounts one batch: `plan` planned `batch` on `eval`'s configuration, `sim` simulated it.
BatchAccount AccountBatch(const PlanResult& plan, const SimResult& sim,
                          const StageCostEvaluator& eval, std::span<const Sample> batch,
                          const FlopCounter& flops, int64_t cluster_devices);

// Fractions of device_seconds; they sum to 1 (when device_seconds > 0).
struct Breakdown {
  double useful = 0;  // = ideal time / iteration time, the fraction of the ideal reached
  double padding = 0;
  double recompute = 0;
  double kernel = 0;
  double comm = 0;
  double imbalance = 0;
  double bubble = 0;

  friend bool operator==(const Breakdown&, const Breakdown&) = default;
};
// REQUIRES: rate >= account.max_op_rate (the ideal is sound only then).
Breakdown Finalize(const BatchAccount& account, double rate);

}  // namespace sluice
