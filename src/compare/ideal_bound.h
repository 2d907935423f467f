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
// Length-aware bound (beside the ideal above): each sample's useful FLOPs at the best rate a
// micro-batch of sequences of ITS length reaches on the cluster, R(L) = max over tensor-parallel
// degrees, context-parallel degrees (cost/context_parallel.h on the cluster's ring link) and
// micro-batch sizes (up to 2^16 tokens per micro-batch, at least one row) of useful FLOPs /
// (tp x cp x (forward + backward)), at no recomputation, one layer at a time (memory checked per
// layer, as in the sweep). Lengths are swept at powers of two; a sample between two of them gets
// the higher of the two rates (optimistic, so the bound stays low). The length-aware time of a
// batch is the sum over its placed samples of useful / R(L), over the devices: a short sequence
// cannot run at the rate only long ones reach. R(L) <= the sweep's R, so the length-aware time is
// never below the ideal time. Not a proof: a packed micro-batch that mixes lengths can run a
// short sample's work faster than R(L) (it shares kernels with long ones), so a method may in
// principle exceed it; the report prints the fraction as it comes.
//
// Thread safety: immutable value types and pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

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

// R(L) at the swept lengths (ascending powers of two from 64 to the model's max_position).
struct LengthRates {
  std::vector<int64_t> lengths;
  std::vector<double> flops_per_s;  // useful FLOP/s per device, 0 where nothing was feasible

  friend bool operator==(const LengthRates&, const LengthRates&) = default;

  // R of a sequence of `length` tokens: the higher rate of the swept lengths around it (the
  // nearest one beyond either end); 0 when none is feasible.
  double RateOf(int64_t length) const;
};
// The sweep over `tps` (those the cost model supports) and `cps` (cp > 1 only for decoder-only
// models, its ring on CpRingLink of `cluster`), each rate capped at `max_rate` (the sweep's R,
// so that R(L) <= R).
LengthRates SweepLengthRates(const CostModel& cost, const FlopCounter& flops,
                             const ClusterSpec& cluster, std::span<const int64_t> tps,
                             std::span<const int64_t> cps, double max_rate);
// Device-seconds of `samples` at their length rates: sum of useful / R(L) (samples whose rate is
// 0 count 0).
double LengthAwareDeviceSeconds(const LengthRates& rates, const FlopCounter& flops,
                                std::span<const Sample> samples);

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
