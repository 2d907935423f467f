// StageCostEvaluator: what one micro-batch costs on each pipeline stage of a configuration.
//
// It cuts the model into pp * vpp chunks the way the runtime will (model/chunk_cut.h:
// decoder-only: layers split evenly; encoder-decoder: encoder then decoder, split at the middle
// chunk or in equal runs of the concatenated stack; embedding on the first chunk, output head on
// the last; pp * vpp = 1 holds everything), sums each device stage's chunks, and answers per device stage:
// forward, backward (= input-gradient + weight-gradient) time, stored activation and transient
// peak of one micro-batch, plus the model-state memory of the stage and so its activation budget.
//
// Context parallelism (par.cp > 1): every figure is per device of the cp group: each layer is
// priced by ContextParallelLayer (cost/context_parallel.h: 1/cp of the tokens and of the causal
// attention, the K/V ring on CpRingLink, memory of the local tokens). Boundary tensors and held
// buffers stay those of the whole micro-batch (the plan's shapes), an overestimate of cp x for
// the boundary traffic and buffers of a cp rank.
//
// Two shapes of micro-batch:
//  - padded: mbs rows of one padded length (and a decoder length for encoder-decoder models),
//    priced by the CostModel directly;
//  - varlen: samples packed into rows with per-sample attention spans (flash-attention varlen,
//    as Hydraulis and multipack run them). Priced by the CostModel at
//    the padded shape with the same tokens T = sum s and attention work Q = sum s^2: m* rows of
//    L* tokens with m* L* = T, m* L*^2 = Q, i.e. m* = T^2 / Q and L* = Q / T. m* is fractional
//    in general: the price is linear in Q between the two integer row counts around it, each
//    with rows of T / m tokens (rounded to whole tokens). So k sequences of length L cost
//    exactly what the padded k x L micro-batch costs, at every tp, with the per-call floor,
//    kernel efficiency and memory the CostModel has at that shape.
//    Encoder-decoder models (encoder and decoder rows packed separately, a sample's two segments
//    in the same row index, cross attention within the sample): the same moment matching per
//    side. Encoder layers (and the embedding) at m_e* = Te^2 / Qe rows of Qe / Te tokens
//    (Te = sum of input lengths, Qe = sum of their squares); decoder layers (and the output head)
//    at m_d* = Td^2 / Qd rows of Qd / Td decoder tokens against Qx / Td encoder tokens
//    (Qx = sum_i in_i * target_i), so decoder tokens, decoder self-attention work and cross-
//    attention work all match; only the cross K/V projection's encoder tokens (m_d* Qx / Td
//    instead of Te) are approximate. k samples of one (input, target) pair cost exactly the
//    padded k x input x target micro-batch.
//    Separately, per stage and recompute level, a non-negative least-squares fit
//    t(s) = a s^2 + b s + c (c once per micro-batch) gives Hydraulis its per-sequence cost
//    estimate (BottleneckQuadratic); it is an estimate for ranking and balancing, never a price.
//
// Memory rule (used by every batching method): a stage s holds at most k_s micro-batches in flight
// (k_s = in-flight count of the schedule, the running one included; 1F1B: pp - s; GPipe: all
// micro-batches). `peak_s` is a micro-batch's own high-water mark on the stage (the activations
// its earlier layers stored plus the running layer's transient peak). Besides activations, a
// micro-batch in flight holds buffers (`held_s`: the boundary tensors its chunks send on, which
// their backward reads, and its token ids and labels), and the stage needs room for the buffers
// that come and go between micro-batches (`transient_s`: received gradients waiting for their
// backward, input gradients waiting for their send; TransientBuffers). So a
// micro-batch fits when, on every stage, k_s - 1 copies of it stay stored while it runs:
//   (k_s - 1) * (stored_s + held_s) + peak_s + held_s + transient_s
//       <= budget_s = memory_limit - model_states_s.
// Windows of unequal micro-batches are checked exactly by CheckSequenceMemory: for every k_s
// consecutive micro-batches and each of them running, the others' stored + held, its peak + held,
// and the largest transient of the window. The buffer terms are the batching layer's share of the
// plan's memory rule (plan/memory_rule.h), which counts every buffer of the lowered program; they
// reserve room so that a batch that passes here rarely fails there.
//
// Per-kind cost lookups (one micro-batch shape's encoder, decoder, embedding and output-head
// costs, ContextParallelLayer at the evaluator's tp and cp ring) are memoised per evaluator (and
// shared by its copies), keyed by (shape, recompute level): the same shapes recur across the
// candidate partitions of a batch, the rounds of a heterogeneous plan and across batches. A
// lookup's answer is a pure function of its key, so the memo changes no result; it is a
// direct-mapped table of kKindCacheEntries answers (a new answer replaces its slot's).
//
// Thread safety: immutable after Create apart from that memo, which is guarded by a mutex;
// Evaluate*() and Summarize*() may be called concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/units.h"
#include "cost/chunk_cost.h"
#include "cost/context_parallel.h"
#include "cost/cost_model.h"
#include "data/sample.h"
#include "model/cluster_spec.h"
#include "model/parallel_config.h"

namespace sluice {

// How many micro-batches a stage holds in flight.
enum class InFlightPolicy {
  k1F1B,         // stage s holds min(pp - s, m) (1F1B, zero-bubble, adaptive bound)
  kGPipe,        // every stage holds all m micro-batches
  kInterleaved,  // Megatron's interleaved 1F1B with vpp > 1: stage s holds up to
                 // (pp - s - 1) * 2 + (vpp - 1) * pp + 1 chunks of 1/vpp of a micro-batch's
                 // activations each, i.e. ceil(that / vpp) micro-batches (min m); = k1F1B at vpp 1
};

// The figures the batching algorithms compare, without per-stage vectors.
struct CostSummary {
  bool feasible = false;     // every lookup answered and the memory rule holds
  Duration bottleneck;       // max over stages of forward + backward
  Duration total;            // sum over stages of forward + backward
  Bytes max_stored;          // max over stages
  Bytes max_peak;            // max over stages
  double memory_load = 0;    // max over stages of the memory rule's need / budget_s
  // Max over stages of (peak + buffers) / budget_s: the need with nothing else in flight. Above
  // 1, no sequence of micro-batches holding this one fits (FindMemoryViolation).
  double memory_load_alone = 0;

  friend bool operator==(const CostSummary&, const CostSummary&) = default;
};

struct StageCostOptions {
  int64_t pad_multiple = 8;  // padded lengths are rounded up to a multiple of this
  InFlightPolicy in_flight = InFlightPolicy::k1F1B;
  // Boundary tensors of room each stage keeps for transient buffers (TransientBuffers), >= 0.
  // A backward holds two besides its micro-batch's: the gradient it received and the one it
  // produces (which stays until its send finishes, before the next backward; plan/lower.h), and
  // a forward those of the backward before it. Receives posted ahead of their compute come on
  // top; the lowered plan's check (plan/memory_rule.h) counts them exactly. With 2, the planner
  // sweeps (sim/memory_sweep_test.cc, 11,040 runs of a wider one) find no plan that this reserve
  // admits and that check rejects; with 0, 28 of those 11,040.
  int64_t transient_boundary_buffers = 2;
};

class KindCostCache;  // stage_cost.cc: the memo of per-kind lookups (header)

class StageCostEvaluator {
 public:
  // Slots of the memo of per-kind lookups (a power of two; about 270 bytes each, allocated at
  // the first lookup).
  static constexpr int64_t kKindCacheEntries = 2048;

  // REQUIRES: `cost` outlives the evaluator. Errors: `par` does not fit the model or cluster,
  // or a stage's model states alone exceed the memory limit (a Status, since no batching
  // method could run; the planner reports it as out-of-memory for that configuration).
  static StatusOr<StageCostEvaluator> Create(const CostModel& cost, const ParallelConfig& par,
                                             const ClusterSpec& cluster,
                                             const StageCostOptions& options = {});

  const CostModel& cost_model() const { return *cost_; }
  const ModelSpec& model() const { return cost_->model(); }
  const ParallelConfig& parallel() const { return par_; }
  int64_t pp() const { return par_.pp; }
  Bytes memory_limit() const { return limit_; }
  // Layers of each device stage (its vpp chunks summed) and its model-state memory.
  const std::vector<StageLayers>& stage_layers() const { return stage_layers_; }
  const std::vector<ModelStateMemory>& stage_states() const { return stage_states_; }
  // memory_limit - model states of stage s.
  Bytes ActivationBudget(int64_t stage) const { return budgets_[stage]; }
  // In-flight count k_s of stage s when the replica runs `num_micro_batches`.
  int64_t InFlight(int64_t stage, int64_t num_micro_batches) const;
  const StageCostOptions& options() const { return options_; }

  // The length a sample occupies: input + target for decoder-only models (prompt and response
  // are one sequence), the input length for encoder-decoder models.
  int64_t SeqLen(const Sample& s) const;
  // The decoder length of a sample: target_len for encoder-decoder models, else 0.
  int64_t DecLen(const Sample& s) const;
  // Rounds up to the pad multiple.
  int64_t Pad(int64_t len) const;

  // Per-stage costs of a padded micro-batch (shape already padded) at `rc`; false when a
  // lookup is infeasible. Fills `out` (resized to pp).
  bool EvaluateStages(const LayerShape& shape, Recompute rc, std::vector<ChunkCost>* out) const;
  // Per-chunk (virtual stage) costs of a padded micro-batch at `rc`, for schedules that place
  // the pp * vpp chunks separately: `out` is resized to pp * vpp, chunk c runs on device c % pp
  // (the layout of the first paragraph). A device's chunks sum to its EvaluateStages times and
  // stored bytes; each chunk's peak is its own high-water mark. False when a lookup is
  // infeasible. With vpp = 1 this is EvaluateStages.
  bool EvaluateChunks(const LayerShape& shape, Recompute rc, std::vector<ChunkCost>* out) const;
  // The per-chunk (virtual stage) records of a micro-batch whose per-device records are
  // `stages` (pp entries), into `out` (pp * vpp entries, stored_until_w 0). vpp = 1: `stages`
  // itself. vpp > 1: each device stage's times and stored bytes are split over its chunks in the
  // proportions EvaluateChunks gives for `shape` and `rc`, and a chunk's peak is its own
  // high-water mark at that shape scaled like its stored bytes: exact for padded micro-batches,
  // the padded shape's proportions for varlen ones. When that shape has no cost, the split is
  // even and each chunk keeps the stage's whole transient (peak - stored).
  // REQUIRES: stages.size() == pp.
  void SplitOverChunks(const LayerShape& shape, Recompute rc, std::span<const ChunkCost> stages,
                       std::vector<ChunkCost>* out) const;
  // Summary of a padded micro-batch; memory_load uses k_s for `num_micro_batches` in flight
  // (pass a large number for the worst case, pp for 1F1B's steady state).
  CostSummary Summarize(const LayerShape& shape, Recompute rc, int64_t num_micro_batches) const;

  // Varlen (packed, per-sample attention) micro-batch of decoder-only samples: `lengths` are the
  // samples' sequence lengths (not padded), priced at the moment-matched shapes of the first
  // paragraph (all holding T tokens). False (infeasible summary) when !varlen_supported(),
  // `lengths` is empty, a length is outside [1, max_position], or the CostModel cannot price a
  // shape the blend needs (a row longer than max_position, beyond a profile table's range or in
  // one of its out-of-memory holes), as for a padded micro-batch.
  // Encoder-decoder models: varlen_supported() is true when the cost model prices one small
  // shape, and every call passes `dec_lengths` (the samples' target lengths, in [0,
  // max_position], one per entry of `lengths`; 0: no decoder segment); decoder-only models pass
  // none.
  bool varlen_supported() const { return varlen_supported_; }
  bool EvaluateVarlenStages(std::span<const int64_t> lengths, Recompute rc,
                            std::vector<ChunkCost>* out) const;
  bool EvaluateVarlenStages(std::span<const int64_t> lengths, std::span<const int64_t> dec_lengths,
                            Recompute rc, std::vector<ChunkCost>* out) const;
  CostSummary SummarizeVarlen(std::span<const int64_t> lengths, Recompute rc,
                              int64_t num_micro_batches) const;
  CostSummary SummarizeVarlen(std::span<const int64_t> lengths,
                              std::span<const int64_t> dec_lengths, Recompute rc,
                              int64_t num_micro_batches) const;
  // Hydraulis' per-sequence cost terms for the bottleneck stage at `rc`: t(s) = a s^2 + b s,
  // plus c once per micro-batch, in milliseconds (a in ms/token^2, b in ms/token). The bottleneck
  // stage is the one whose fit is slowest for one sequence of the longest fitted length; all zero
  // when !varlen_supported() or `rc` has no fit. Fits are non-negative least squares on relative
  // error of the padded cost t(mbs, L) = a mbs L^2 + b mbs L + c at lengths 64, 96, 128, 192, ...
  // (decoder-only models; no fit for encoder-decoder ones)
  // (powers of two and 1.5x) up to max_position and micro-batch sizes 1, 2, 4, ... for as long as
  // the CostModel answers and the micro-batch alone fits the memory rule (so both the per-call
  // floor and the token-bound regime are in the fit, at every tp). An estimate: a layer's cost is
  // closer to max(floor, work) than to floor + work, so the fit is off by up to tens of percent
  // near the knee; prices come from EvaluateVarlenStages.
  struct Quadratic {
    double a = 0, b = 0, c = 0;
  };
  Quadratic BottleneckQuadratic(Recompute rc) const;

  // Bytes one micro-batch sends from stage s to s+1 (activations; gradients are the same size):
  // fp16 mbs x seqlen x hidden, plus mbs x dec_seqlen x hidden from the chunk that ends the
  // encoder on (encoder-decoder models, model/chunk_cut.h's EncoderEndChunk). With vpp > 1 the
  // largest message leaving one of the device's chunks; 0 when no chunk of the stage has a
  // successor.
  Bytes BoundaryBytes(const LayerShape& shape, int64_t stage) const;
  // Bytes one micro-batch sends from chunk c to chunk c + 1 (the per-chunk form of
  // BoundaryBytes); 0 for the last chunk. REQUIRES: 0 <= chunk < pp * vpp.
  Bytes ChunkBoundaryBytes(const LayerShape& shape, int64_t chunk) const;

  // Buffers of the memory rule above (the lowering's slots, plan/lower.h). ChunkHeldBuffers:
  // what a micro-batch of `shape` holds on chunk c from its forward until its backward (B or I)
  // ends: the boundary tensor the chunk sends on (ChunkBoundaryBytes; the backward reads it) and
  // the int64 token ids (chunk 0: mbs x seqlen, plus mbs x dec_seqlen for encoder-decoder
  // models) and labels (the last chunk: mbs x seqlen, or mbs x dec_seqlen) it loads
  // (plan/execution_plan.h LoadShapes). HeldBuffers: the sum over the device stage's chunks.
  // REQUIRES: 0 <= chunk < pp * vpp, 0 <= stage < pp.
  Bytes ChunkHeldBuffers(const LayerShape& shape, int64_t chunk) const;
  Bytes HeldBuffers(const LayerShape& shape, int64_t stage) const;
  // Room device stage `stage` keeps for buffers outside its micro-batches in flight:
  // options().transient_boundary_buffers of the largest boundary tensor (of `shape`) the stage
  // receives or sends (0 when pp = 1: no transfers).
  Bytes TransientBuffers(const LayerShape& shape, int64_t stage) const;

 private:
  struct StageFit {       // per stage, per recompute level
    Quadratic time;       // forward + backward
    int64_t max_len = 0;  // longest fitted (feasible) length; 0 = no fit at this level
  };
  StageCostEvaluator() = default;
  Status FitVarlen();
  CostSummary SummaryFromStages(const LayerShape& shape, const std::vector<ChunkCost>& stages,
                                bool ok, int64_t num_micro_batches) const;

  const CostModel* cost_ = nullptr;
  std::shared_ptr<KindCostCache> kinds_;  // never null after Create
  ParallelConfig par_;
  StageCostOptions options_;
  Bytes limit_;
  CpRing ring_;  // cp and its link; cp = 1: plain CostModel lookups
  std::vector<StageLayers> stage_layers_;
  std::vector<StageLayers> chunk_layers_;  // pp * vpp chunks in pipeline order
  std::vector<ModelStateMemory> stage_states_;
  std::vector<Bytes> budgets_;
  bool varlen_supported_ = false;
  std::vector<StageFit> fits_[3];  // [recompute][stage]
};

// Exact memory check of one replica's micro-batch order under `policy`: for every stage, every
// window of k_s consecutive micro-batches' stored activations plus the peak of the one running
// must fit its budget. Returns "" when it fits, else a description of the first violation.
struct MicroBatch;
std::string CheckSequenceMemory(const StageCostEvaluator& eval,
                                std::span<const MicroBatch> micro_batches);
// CheckSequenceMemory(eval, micro_batches).empty(), without building the message (for searches
// that test many orders or levels).
bool SequenceFitsMemory(const StageCostEvaluator& eval, std::span<const MicroBatch> micro_batches);

// The first violation CheckSequenceMemory describes, as data (for repairs that raise recompute).
struct MemoryViolation {
  int64_t stage = 0;
  int64_t begin = 0;    // the window of micro-batches in flight: [begin, end)
  int64_t end = 0;
  int64_t running = 0;  // the one running at its peak
  Bytes need;           // stored + held of the others, peak + held of the running one, transient
  Bytes buffers;        // of which buffers (held and transient)
  Bytes budget;         // ActivationBudget(stage)
};
// REQUIRES: every micro-batch has pp per-stage costs (MicroBatch::stages).
std::optional<MemoryViolation> FindMemoryViolation(const StageCostEvaluator& eval,
                                                   std::span<const MicroBatch> micro_batches);

}  // namespace sluice
