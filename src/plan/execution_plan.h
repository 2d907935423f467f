// ExecutionPlan: sluice's intermediate representation of one training iteration (one global
// batch), the contract between the planner, the simulator and the runtime.
//
// A plan holds one program (an ordered Instruction list, instruction.h) per (data-parallel
// replica, pipeline rank). Rank id = dp_index * pp + pp_index. The tensor-parallel ranks of one
// (dp_index, pp_index) position all run that same program (their collectives inside a layer are
// part of Forward/Backward). Virtual stage s (0 .. pp*vpp-1) runs on pipeline rank s % pp of its
// replica. Alongside the programs the plan records everything needed to check and replay it: the
// model, cluster and parallel configuration, the cost model it was planned with (its one-line
// description), the batching method and schedule names, the global batch's sample ids, every
// replica's micro-batches (sample ids per row, padded shape, recompute level, predicted per
// virtual stage costs) and the model-state memory of each pipeline rank.
//
// Invariants of a valid plan are the checks of ValidatePlan (validate.h). Plans are plain values:
// compared with ==, copied, serialised exactly by plan_json.h.
//
// Context parallelism: the cp ranks of a position run its program too, each on 1/cp of every
// sequence (its per-stage costs are per device, batching/stage_cost.h); the K/V ring exchanges
// are part of Forward/Backward, like the tp all-reduces. Shapes stay the whole micro-batch's.
//
// Device placement (for link choice and collectives): device = parallel.FirstDevice(rank) +
// cp_index * tp + tp_index (parallel.order: Megatron-Core's tp-cp-dp-pp by default), nodes are
// runs of devices_per_node devices (NodeOfRank, model/parallel_config.h), so a data-parallel
// group of one pipeline rank spans nodes when its devices do.
//
// Thread safety: value types.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/units.h"
#include "batching/micro_batch.h"
#include "cost/cost_model.h"
#include "model/cluster_spec.h"
#include "model/model_spec.h"
#include "model/parallel_config.h"
#include "plan/instruction.h"
#include "schedule/action.h"

namespace sluice {

inline constexpr const char* kPlanFormat = "sluice-plan/1";

// A micro-batch as the plan runs it.
struct PlanMicroBatch {
  std::vector<std::vector<int64_t>> rows;  // sample ids per row (shape.mbs rows)
  LayerShape shape;                        // padded shape every instruction's tensors follow
  bool varlen = false;                     // per-sample attention inside packed rows
  Recompute recompute = Recompute::kNone;
  std::vector<ChunkCost> stages;  // predicted cost per virtual stage (pp*vpp entries)
  // Varlen micro-batches: the segment lengths of each row, sample by sample in packing order
  // (the runtime's per-sample attention spans, flash-attention's cu_seqlens): seg_lens the
  // (encoder or only) lengths, dec_seg_lens the decoder lengths of encoder-decoder models (a
  // sample's two segments at the same index of the same row). Empty for padded micro-batches
  // and in plans written before these fields; the runtime then takes the lengths from the data.
  std::vector<std::vector<int64_t>> seg_lens;
  std::vector<std::vector<int64_t>> dec_seg_lens;

  friend bool operator==(const PlanMicroBatch&, const PlanMicroBatch&) = default;
};

struct PlanReplica {
  std::string schedule;                       // the schedule generator's name, e.g. "1f1b"
  std::vector<PlanMicroBatch> micro_batches;  // in the order instructions index them

  friend bool operator==(const PlanReplica&, const PlanReplica&) = default;
};

struct RankProgram {
  int64_t rank = 0;  // dp_index * pp + pp_index
  int64_t dp_index = 0;
  int64_t pp_index = 0;
  // Slots the program uses. Dense: every slot id is < buffer_slots and each id is allocated by
  // some instruction (ValidatePlan checks it before anything sizes storage by it).
  int64_t buffer_slots = 0;
  std::vector<Instruction> instructions;

  friend bool operator==(const RankProgram&, const RankProgram&) = default;
};

struct ExecutionPlan {
  ModelSpec model;
  ClusterSpec cluster;
  ParallelConfig parallel;
  std::string cost_model;               // CostModel::Describe() of the model it was planned with
  // CostModel::MoeSliceOverhead() of that model: what each sliced compute piece of an MoE
  // overlap rewrite adds (passes/moe_overlap.h); nullopt: not measured (the pass's default).
  std::optional<Duration> moe_slice_overhead;
  std::string method;                   // batching method, e.g. "dynapipe"
  std::vector<int64_t> sample_ids;      // the global batch's sample ids, ascending
  std::vector<UnplacedSample> dropped;  // samples of the batch no micro-batch holds, with reasons
  std::vector<Bytes> model_states;      // per pipeline rank: weights + gradients + optimizer
  std::vector<PlanReplica> replicas;    // [dp_index]
  std::vector<RankProgram> ranks;       // [rank id], dp * pp programs

  int64_t dp() const { return parallel.dp; }
  int64_t pp() const { return parallel.pp; }
  int64_t vpp() const { return parallel.vpp; }
  int64_t num_stages() const { return parallel.pp * parallel.vpp; }
  int64_t RankId(int64_t dp_index, int64_t pp_index) const { return dp_index * pp() + pp_index; }
  // Pipeline rank of virtual stage s.
  int64_t PipelineRankOf(int64_t stage) const { return stage % pp(); }
  // The node of rank `rank` (model/parallel_config.h's placement rule).
  int64_t NodeOf(int64_t rank) const { return NodeOfRank(cluster, parallel, rank); }
  // The per-device memory limit the plan must respect (parallel.MemoryLimit(cluster)).
  Bytes memory_limit() const { return parallel.MemoryLimit(cluster); }

  friend bool operator==(const ExecutionPlan&, const ExecutionPlan&) = default;
};

// The boundary tensor a point-to-point op of virtual stage `stage` carries, by the dependency
// rules of schedule/dependencies.h: a send-act sends what F on `stage` produces, a recv-act
// receives what F consumes, a send-grad sends what B/I produces, a recv-grad receives what B/I
// consumes. `peer_stage` is the stage at the other end. nullopt for other ops, and for a stage
// without that neighbour. The lowering builds transfers from it and the validator checks them
// against it. REQUIRES: 0 <= stage < num_stages.
struct TransferLink {
  int64_t boundary = 0;    // between stages boundary and boundary + 1
  int64_t peer_stage = 0;  // the neighbour stage, on the peer rank
  bool gradient = false;   // gradients (backward) or activations (forward)
};
std::optional<TransferLink> LinkOf(OpKind op, int64_t stage, int64_t num_stages);

// Tensors of the model's boundary between virtual stages `boundary` and `boundary + 1` for a
// micro-batch of `shape` (fp16). Decoder-only: {mbs, seqlen, hidden}. Encoder-decoder: before the
// stage that ends the encoder (model/chunk_cut.h's EncoderEndChunk) the encoder hidden state
// {mbs, seqlen, hidden}; from it on the encoder output and the decoder hidden state
// {mbs, seqlen, hidden}, {mbs, dec_seqlen, hidden} (StageCostEvaluator::BoundaryBytes' rule).
// `par`: the plan's configuration (its chunks and layer cut).
std::vector<TensorShape> BoundaryShapes(const ModelSpec& model, const LayerShape& shape,
                                        int64_t boundary, const ParallelConfig& par);
// Whether `shapes` == BoundaryShapes(model, shape, boundary, par), without allocating
// (the validator asks once per transfer).
bool IsBoundaryShapes(const std::vector<TensorShape>& shapes, const ModelSpec& model,
                      const LayerShape& shape, int64_t boundary, const ParallelConfig& par);
// Token ids the first stage loads (int64): {mbs, seqlen}, plus {mbs, dec_seqlen} decoder inputs
// for encoder-decoder models.
std::vector<TensorShape> InputShapes(const ModelSpec& model, const LayerShape& shape);
// Labels the last stage loads (int64): {mbs, seqlen}, or {mbs, dec_seqlen} for encoder-decoder.
std::vector<TensorShape> LabelShapes(const ModelSpec& model, const LayerShape& shape);
// What LoadInput of `stage` loads: inputs on stage 0, labels on the last stage, both (inputs
// first) when the model is one stage; empty for other stages.
std::vector<TensorShape> LoadShapes(const ModelSpec& model, const LayerShape& shape, int64_t stage,
                                    int64_t num_stages);
// Bytes of fp16 tensors (2 per element) and of int64 token tensors (8 per element), saturating
// at INT64_MAX.
Bytes Fp16Bytes(const std::vector<TensorShape>& shapes);
Bytes TokenBytes(const std::vector<TensorShape>& shapes);

// Expert parallelism (instruction.h, "MoE all-to-all"). An expert-parallel group is ep
// consecutive data-parallel replicas at one pipeline rank: replicas g*ep .. g*ep+ep-1, so plans
// with ep > 1 need ep to divide dp (tensor-parallel ranks of a position run its program as they
// do everything else).
//
// The MoE layers of virtual stage `stage`, ascending, as indices in the stack [encoder; decoder]
// (decoder-only: the layer index; an encoder-decoder's decoder layer j is layers + j), by
// model/chunk_cut.h's cut of `par`. Empty for dense models. REQUIRES: as CutIntoChunks.
std::vector<int64_t> MoeLayersOfStage(const ModelSpec& model, int64_t stage,
                                      const ParallelConfig& par);
// Expert capacity of one MoE layer for a micro-batch of `shape`: ceil(capacity_factor * T *
// top_k / experts) tokens, T = mbs * seqlen (mbs * dec_seqlen for an encoder-decoder's decoder
// layers; `layer` as in MoeLayersOfStage). REQUIRES: model.moe.
int64_t ExpertCapacity(const ModelSpec& model, const LayerShape& shape, int64_t layer);
// Ranks of `rank`'s expert-parallel group in group order (this rank included).
// REQUIRES: plan.parallel.ep divides plan.dp().
std::vector<int64_t> EpGroupOf(const ExecutionPlan& plan, int64_t rank);
// The all-to-all instructions that compute op `op` (Forward, Backward or BackwardInput) of
// micro-batch `mb` on virtual stage `stage` of `rank` performs, in order, with every field but
// `duration` (the lowering prices them); empty when ep == 1, for BackwardWeight and for stages
// without MoE layers. The lowering emits exactly these and the validator compares with them.
// REQUIRES: ep divides dp, and every replica of the group holds micro-batch `mb`.
std::vector<Instruction> AllToAllsOf(const ExecutionPlan& plan, int64_t rank, OpKind op,
                                     int64_t mb, int64_t stage);

}  // namespace sluice
