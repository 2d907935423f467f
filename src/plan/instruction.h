// Instruction: one step of one rank's program in an ExecutionPlan (see execution_plan.h).
//
// A rank executes its instructions strictly in order, with no synchronisation other than what the
// instructions say: a *Start posts a non-blocking point-to-point transfer, the matching *Finish
// waits for it; collectives are posted asynchronously and OptimizerStep waits for them. Tensor
// shapes travel in the instructions, so receivers allocate exact buffers and no rank exchanges
// shapes at run time.
//
// Buffers are slots, numbered 0 .. RankProgram::buffer_slots-1 per rank. An instruction's
// `outputs` allocate slots (they must be free) and fill them; `inputs` read live slots; FreeBuffer
// releases its one input slot, after which the slot may be allocated again. What each op reads and
// writes is listed in docs/formats.md ("Execution plan"), with the element types: token ids and
// labels are int64, boundary activations and gradients fp16.
//
// Thread safety: value types.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "base/units.h"
#include "cost/chunk_cost.h"
#include "cost/cost_model.h"

namespace sluice {

enum class OpKind : uint8_t {
  kLoadInput,       // read the micro-batch's token ids (first stage) or labels (last stage)
  kForward,         // forward of one virtual stage
  kBackward,        // full backward (input and weight gradient)
  kBackwardInput,   // input-gradient half of the backward (zero-bubble "I")
  kBackwardWeight,  // weight-gradient half (zero-bubble "W")
  kSendActStart,    // post the send of a stage's output activations to the next stage's rank
  kSendActFinish,   // wait until that send completed
  kRecvActStart,    // post the receive of the previous stage's activations
  kRecvActFinish,   // wait until they arrived
  kSendGradStart,   // post the send of the input gradient to the previous stage's rank
  kSendGradFinish,
  kRecvGradStart,  // post the receive of the output gradient from the next stage's rank
  kRecvGradFinish,
  kFreeBuffer,         // release one buffer slot
  kAllReduceGrad,      // all-reduce one gradient bucket across the data-parallel group (ZeRO 0, 1)
  kReduceScatterGrad,  // reduce-scatter one gradient bucket across the group (ZeRO >= 2)
  kAllGatherParams,    // all-gather one bucket of updated parameters after the step (ZeRO >= 2)
  kOptimizerStep,      // wait for the rank's reductions, then update the parameters
  kAllToAllDispatch,   // expert parallelism: tokens from their owners to the experts' ranks
  kAllToAllCombine,    // expert parallelism: expert outputs back to the tokens' owners
  kAllToAllWait,       // wait for the posted (tag >= 0) all-to-all with the same tag
};
inline constexpr int kNumOpKinds = 21;

// JSON names: "load-input", "forward", "backward", "backward-input", "backward-weight",
// "send-act-start", "send-act-finish", "recv-act-start", "recv-act-finish", "send-grad-start",
// "send-grad-finish", "recv-grad-start", "recv-grad-finish", "free-buffer", "all-reduce-grad",
// "reduce-scatter-grad", "all-gather-params", "optimizer-step", "all-to-all-dispatch",
// "all-to-all-combine", "all-to-all-wait".
std::string_view OpKindName(OpKind op);
// The inverse of OpKindName; nullopt for any other text.
std::optional<OpKind> OpKindFromName(std::string_view name);

bool IsCompute(OpKind op);     // Forward, Backward, BackwardInput, BackwardWeight
// What a compute op lasts at `cost`: F its forward, B backward(), I backward_input, W
// backward_weight. REQUIRES: IsCompute(op).
Duration ComputeDuration(OpKind op, const ChunkCost& cost);
bool IsCommStart(OpKind op);   // the four *Start ops
bool IsCommFinish(OpKind op);  // the four *Finish ops
bool IsSend(OpKind op);        // SendAct*, SendGrad*
bool IsCollective(OpKind op);  // AllReduceGrad, ReduceScatterGrad, AllGatherParams
bool IsAllToAll(OpKind op);    // AllToAllDispatch, AllToAllCombine
// The Start op a Finish op waits for, and back. REQUIRES: IsCommFinish / IsCommStart.
OpKind StartOf(OpKind finish);
OpKind FinishOf(OpKind start);

// Dimensions of one tensor, outermost first, e.g. {mbs, seqlen, hidden}.
using TensorShape = std::vector<int64_t>;
// Elements of a shape (product of the dims; 1 for no dims), saturating at INT64_MAX (also for a
// negative dim) so that no input can overflow it.
int64_t NumElements(const TensorShape& shape);

struct Instruction {
  OpKind op = OpKind::kForward;
  int64_t microbatch = -1;          // index into the rank's replica's micro-batches; -1: none
  int64_t stage = -1;               // virtual stage on THIS rank (a send's source, a receive's
                                    // destination stage, a collective's stage); -1: none
  int64_t peer = -1;                // point-to-point: the other rank's id; -1: none
  int64_t tag = -1;                 // point-to-point: MessageTag(); -1: none
  std::vector<TensorShape> shapes;  // tensors loaded, transferred or produced (see header)
  std::vector<int64_t> inputs;      // buffer slots read; FreeBuffer: the slot released
  std::vector<int64_t> outputs;     // buffer slots allocated and written
  Bytes bytes;                      // payload of a transfer, collective or load
  int64_t bucket = -1;              // collectives: gradient bucket id of this rank; -1: none
  Recompute recompute = Recompute::kNone;  // Forward / Backward / BackwardInput
  Duration duration;                       // predicted time of the op (0: not predicted)
  // All-to-all (expert parallelism, see "MoE all-to-all" below); empty / -1 for other ops.
  int64_t layer = -1;                // the MoE layer: index in the stack [encoder; decoder]
  std::vector<int64_t> group;        // ranks of the expert-parallel group, this one included
  std::vector<int64_t> send_splits;  // rows (tokens of `hidden` fp16 values) sent to group[j]
  std::vector<int64_t> recv_splits;  // rows received from group[j]
  // MoE overlap (see "Segmented MoE ops" below); -1 / 0 for whole ops.
  int64_t segment = -1;  // compute ops: which segment of the op's MoE segmentation this piece is
  int64_t chunk = -1;    // pieces and all-to-alls: the slice [0, chunks) of the work it does
  int64_t chunks = 0;    // how many slices its segment or all-to-all is cut into (0: not cut)

  friend bool operator==(const Instruction&, const Instruction&) = default;
};

// MoE all-to-all. An AllToAllDispatch / AllToAllCombine instruction belongs to the compute op
// (Forward, Backward or BackwardInput) of the same micro-batch and stage that precedes it in the
// program (only FreeBuffers and other all-to-alls of that op lie between): that op performs it at
// MoE layer `layer`, in order. A forward runs, per MoE layer, the dispatch then the combine; a
// backward runs them in reverse (the combine's gradient, then the dispatch's), each moving
// gradients opposite to its forward direction, so its splits are the forward's swapped. Expert
// capacity makes the splits static: with E experts, ep ranks per group and a rank's micro-batch
// of T tokens, capacity C = ceil(capacity_factor * T * top_k / E) and a forward dispatch sends
// (E / ep) * C rows to every member (padded to capacity, GShard style) and receives
// (E / ep) * C_j from member j. shapes: {{sum(send_splits), hidden}, {sum(recv_splits), hidden}};
// bytes: the fp16 bytes sent to other members.
//
// Segmented MoE ops (overlap of all-to-all with computation, passes/moe_overlap.h). A compute op
// (F, B, I or W) of a stage with k MoE layers may instead be written as pieces, one instruction
// each with `segment` in [0, 2k] (the op's "segments"): for F, segment 2i is the computation
// before MoE layer i's dispatch (the layers before it, its attention and its router; segment 0
// also the embedding), 2i+1 is layer i's expert computation, and segment 2k the rest of the
// stage; the all-to-all between segments j and j+1 is the j-th of AllToAllsOf. B and I run the
// same chain backwards (segment j between the (j-1)-th and j-th all-to-all of the backward's
// list), W's segment j is the weight gradient of I's segment j and needs only that. A segment
// may be cut into `chunks` slices (chunk 0 .. chunks-1 of the micro-batch's tokens, or of the
// expert capacity), and so may an all-to-all: chunk c of a sliced all-to-all moves a part of the
// whole one's rows, and the parts' splits sum to the whole's. An element of the chain (a piece or
// an all-to-all) depends on the element before it: on the same chunk when both are cut into the
// same number of slices, else on all of it. The op's inputs are read by its first piece in
// program order and its outputs written by its last.
// An all-to-all with tag >= 0 is posted: the rank goes on, and the AllToAllWait with the same tag
// (mb, stage and layer copied) blocks until it completes; tag -1 blocks at the all-to-all itself.

// Short text for grids and messages, PyTorch pipelining style where one exists:
// "2F0", "2B0", "2I0", "2W0", "0LOAD3", "1SEND_F3", "1SEND_F3.wait", "2RECV_F3", "2RECV_F3.wait",
// "2SEND_B3", "1RECV_B3", "FREE(s4)", "ALLREDUCE(b2)", "REDUCE_SCATTER(b2)", "ALLGATHER(b2)",
// "STEP", "2A2A_D3(L1)", "2A2A_C3(L1)".
std::string InstructionText(const Instruction& instruction);

// The tag of a point-to-point message of micro-batch `microbatch` across the boundary between
// virtual stages `boundary` and `boundary + 1`: ((microbatch * num_stages) + boundary) * 2, plus
// 1 for gradients. Unique within a data-parallel replica (messages never cross replicas).
int64_t MessageTag(int64_t microbatch, int64_t boundary, bool gradient, int64_t num_stages);

// Formats `cells` ([column][step]) as PyTorch's _format_pipeline_order does: a step x column
// grid with `labels` as column headers. When `error_step` >= 0 that row ends in
// " <-- ERROR HERE" + `error_note`. Only rows [first_step, last_step) are printed.
std::string FormatStepGrid(const std::vector<std::string>& labels,
                           const std::vector<std::vector<std::string>>& cells, int64_t first_step,
                           int64_t last_step, int64_t error_step, std::string_view error_note);

}  // namespace sluice
