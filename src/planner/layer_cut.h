// Layer cut search: how many layers each pipeline chunk holds (ParallelConfig::layer_cut), chosen
// for the data so that the stages take about the same time.
//
// The even cut gives every chunk the same number of layers, but the stages do not take the same
// time: the last one also runs the final LayerNorm, the output head and the loss (about one layer
// of a GPT-6.7B at 2K tokens), and a T5 split at the middle puts the encoder, whose layers run the
// long inputs, on half the stages and the decoder, whose layers run the short targets, on the
// other half (on flan-like data the encoder stages are busy 1.5-2x as long). The pipeline runs at
// its slowest stage. Megatron-LM users fix this by hand (--decoder-first-pipeline-num-layers,
// --decoder-last-pipeline-num-layers, T5's --pipeline-model-parallel-split-rank); DeepSpeed's
// PipelineModule has partition_method. Here the planner chooses it, once per run (the model is
// sharded once; every batch of a run keeps the cut):
//
// 1. Seed: per-layer weights from the cost model (each layer kind's forward + backward summed
//    over the given samples, one sample a row, at the configuration's tp, a cp rank's share of
//    the sequence), the embedding added to the first chunk and the output head to the last; the
//    cut that minimises the heaviest chunk (the exact min-max contiguous partition, every chunk
//    at least one layer).
// 2. Score: a callback that plans the run's score batches with a cut and returns the estimated
//    time and the batches that did not fit memory (`sluice plan`: Planner::Plan on the first
//    batches; `sluice compare`: the configuration search's own estimate, CandidateScorer::Score).
//    Fewer failed batches rank first, then the shorter time (run_tally.h's rule).
//    2b. Refit: where the scorer reports each chunk's compute time, the layers of each chunk (and
//    its embedding or head) are rescaled by its measured time over its weight, and the min-max
//    cut of the rescaled weights is scored next; repeated from the best cut while that is
//    shorter (at most kMaxRefits), so the cost model's per-layer times need only be right
//    within a chunk.
// 3. Search: from the best cut so far (the even cut wins unless another is shorter by more than
//    min_gain), move one layer across one chunk boundary at a time (2 (chunks - 1) neighbours),
//    take the best neighbour while it is shorter by more than min_gain, up to max_evaluations
//    cuts scored in all.
// With vpp > 1 (a device's chunks are not contiguous layers) or one chunk the even cut is kept,
// unsearched.
//
// Thread safety: pure functions (the callback's own rules apply). Deterministic.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/units.h"
#include "cost/cost_model.h"
#include "data/global_batcher.h"
#include "data/sample.h"
#include "model/cluster_spec.h"
#include "model/parallel_config.h"
#include "planner/planner.h"
#include "sim/simulator.h"

namespace sluice {

struct LayerCutScore {
  int64_t failed_batches = 0;  // batches that did not fit memory (or could not be planned)
  Duration time;               // estimated time of the batches that ran
  // Compute time of each chunk (StageComputeSeconds summed over the batches that ran); empty
  // when the scorer does not say (step 2b is then skipped).
  std::vector<double> chunk_busy;
  bool operator<(const LayerCutScore& o) const {
    return failed_batches != o.failed_batches ? failed_batches < o.failed_batches : time < o.time;
  }
};

// Scores one cut (pp * vpp entries). Errors stop the search (bugs; memory is a failed batch).
using LayerCutScorer = std::function<StatusOr<LayerCutScore>(const std::vector<int64_t>& cut)>;

struct LayerCutSearchOptions {
  int64_t max_evaluations = 24;  // cuts scored, the even cut and the seed included; >= 1
  double min_gain = 0.001;       // a move must shorten the time by more than this fraction
};

struct LayerCutChoice {
  std::vector<int64_t> cut;   // the chosen cut; empty when it is the even cut (or unsearched)
  std::vector<int64_t> seed;  // step 1's cut
  bool even_exists = false;   // the model has an even cut into pp * vpp chunks
  LayerCutScore even;         // its score (when even_exists)
  LayerCutScore chosen;       // the chosen cut's score (the even one's when cut is empty)
  int64_t evaluated = 0;      // cuts scored
  bool searched = false;      // false: vpp > 1 or one chunk
};

// Step 1's per-layer weights: [layers + decoder_layers] forward + backward time, and the
// embedding's and output head's, summed over `samples` (see the header comment). Samples the
// cost model cannot price are skipped; with none priced every layer weighs 1 and the extras 0.
struct LayerWeights {
  std::vector<double> layer;
  double embedding = 0;
  double output_head = 0;
};
LayerWeights WeighLayers(const CostModel& cost, const ParallelConfig& par,
                         std::span<const Sample> samples);
// The min-max contiguous partition of weights.layer into `chunks` runs of at least one layer,
// the embedding counted on the first and the output head on the last. REQUIRES: 1 <= chunks <=
// weights.layer.size(). Ties go to the cut with the earlier runs longer.
std::vector<int64_t> MinMaxLayerCut(const LayerWeights& weights, int64_t chunks);

// Step 2's scorer for `sluice plan`: plans every batch of `batches` with `options` (the optimizer
// off) on `base` with the cut, and sums each planned batch's estimated makespan plus
// EstimateGradientSync (config_search.h's score); a batch out of memory is a failed batch, and so
// is every batch when the cut does not fit (a stage's model states exceed the limit). REQUIRES:
// every argument outlives the scorer.
LayerCutScorer PlannerLayerCutScorer(const CostModel& cost, const ClusterSpec& cluster,
                                     const ParallelConfig& base, const PlannerOptions& options,
                                     std::span<const GlobalBatch> batches);

// The simulated check of a chosen cut: plans every batch as PlannerLayerCutScorer does and
// simulates each plan (sim/simulator.h, `sim`); time = the summed simulated iteration times, a
// batch that does not plan or whose simulation runs out of memory or deadlocks a failed batch.
// `sluice plan --layer-cut balanced` keeps a cut only when this says it is shorter than the even
// cut, as `sluice compare` keeps a configuration by its simulation.
StatusOr<LayerCutScore> SimulateLayerCut(const CostModel& cost, const ClusterSpec& cluster,
                                         const ParallelConfig& base, const PlannerOptions& options,
                                         std::span<const GlobalBatch> batches,
                                         const std::vector<int64_t>& cut, const SimOptions& sim);

// Step 3 alone: from `start` (whose score is `start_score`), one-layer moves scored by `score`,
// the best neighbour taken while it is shorter by more than options.min_gain, at most
// options.max_evaluations cuts scored. Returns the cut it ends on; *best is that cut's score and
// *evaluated the cuts scored. `sluice plan` and `train` run it with SimulateLayerCut after
// ChooseLayerCut: the estimate ranks cuts, the simulation settles the last steps (the estimate
// charges every stage's gradient reduction as fully exposed, the simulator overlaps the last
// stage's with the earlier stages' backwards).
StatusOr<std::vector<int64_t>> PolishLayerCut(std::vector<int64_t> start, LayerCutScore start_score,
                                              const LayerCutScorer& score,
                                              const LayerCutSearchOptions& options,
                                              LayerCutScore* best, int64_t* evaluated);

// Compute time (seconds) of each virtual stage of `plan`: the durations of its forward,
// backward, backward-input and backward-weight instructions summed over every rank.
std::vector<double> StageComputeSeconds(const ExecutionPlan& plan);

inline constexpr int64_t kMaxRefits = 4;

// Steps 1-3 for `par` (its layer_cut is ignored). REQUIRES: CheckParallelFits(par without its
// layer_cut, model) apart from the even-cut rule.
StatusOr<LayerCutChoice> ChooseLayerCut(const CostModel& cost, const ParallelConfig& par,
                                        std::span<const Sample> samples,
                                        const LayerCutScorer& score,
                                        const LayerCutSearchOptions& options = {});

}  // namespace sluice
