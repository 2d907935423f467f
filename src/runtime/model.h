// The runtime's models in libtorch: decoder-only GPT and encoder-decoder T5 families, fp32, cut
// into the plan's pipeline chunks (layout.h).
//
// Blocks are pre-LN: x + Attn(LN(x)), [x + CrossAttn(LN(x), encoder output)], x + MLP(LN(x)),
// with biases, multi-head or grouped-query attention (kv_heads), GELU or SwiGLU MLPs. Inputs are
// word + learned absolute position embeddings (T5's relative position bias is replaced by
// learned positions; the decoder has its own position table). Attention is masked per
// micro-batch: causal for decoders, per-sample spans for rows that pack several samples, padding
// keys never attended. The loss is the summed token cross-entropy times MicroBatchInputs::
// loss_scale. MoE models replace the MLP of every MoE layer (ModelSpec::IsMoeLayer) by a router
// and experts (moe.h: routing, capacity, dropping order, auxiliary loss, expert parallelism).
//
// Initialisation is a function of (seed, parameter group, global layer index) only, so a model
// cut into any number of chunks starts from exactly the weights of the uncut model. Parameter
// names are global ("layers.3.attn.qkv.weight", "wte", ...) and identical across cuts.
//
// Profiling a stage: build a ModelShard for a configuration, make MicroBatchInputs of the shape
// to time, call Chunk::Forward and autograd on its outputs (the executor does exactly that).
//
// Thread safety: a ModelShard is used by one thread at a time (autograd state in the tensors).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "model/model_spec.h"
#include "plan/instruction.h"
#include "runtime/batch_layout.h"
#include "runtime/layout.h"
#include "runtime/token_source.h"
#include "runtime/torch_pch.h"

namespace sluice::runtime {

inline constexpr int64_t kIgnoreLabel = -100;

// Context parallelism (context_parallel.h): the exchange that gives a self-attention layer every
// key and value of its micro-batch from this process's share of them.
class SequenceGather {
 public:
  virtual ~SequenceGather() = default;
  // [B, L, C] of this process's tokens -> [B, cp * L, C] of every cp index's, in gather order,
  // differentiable (its backward sums the gradients over the cp group). Throws
  // std::runtime_error when the exchange fails.
  virtual at::Tensor Gather(const at::Tensor& local) const = 0;
};

// Everything about one micro-batch that each chunk derives locally from the plan and the samples
// (never transferred): tokens, labels, positions and masks.
struct MicroBatchInputs {
  LayerShape shape;
  at::Tensor tokens;         // [mbs, seqlen] int64 (the encoder's, or the only sequence); 0 = pad
  at::Tensor dec_tokens;     // [mbs, dec_seqlen] int64 decoder inputs (encoder-decoder)
  at::Tensor labels;         // [mbs, seqlen] or [mbs, dec_seqlen] int64, kIgnoreLabel = none
  at::Tensor positions;      // [mbs, seqlen] int64 (from 0 per sample in varlen rows)
  at::Tensor dec_positions;  // [mbs, dec_seqlen]
  at::Tensor self_mask;      // [mbs, 1, seqlen, seqlen] bool, true = may not attend
  at::Tensor dec_self_mask;  // [mbs, 1, dec_seqlen, dec_seqlen]
  at::Tensor cross_mask;     // [mbs, 1, dec_seqlen, seqlen]
  at::Tensor real;           // [mbs, seqlen] bool, true = a sample's token (MoE routes only these)
  at::Tensor dec_real;       // [mbs, dec_seqlen] bool (encoder-decoder)
  double loss_scale = 1.0;   // 1 / labels of the global batch
  // cp > 1 (context_parallel.h): the tensors above hold this process's tokens only, self_mask is
  // [mbs, 1, local, cp * local] over the gathered keys, and self-attention gathers K/V here.
  const SequenceGather* cp = nullptr;
};

// REQUIRES: `layout` came from LayoutMicroBatch for `model`.
MicroBatchInputs BuildMicroBatchInputs(const ModelSpec& model, const MicroBatchLayout& layout,
                                       const TokenSource& tokens, double loss_scale);
// Rows [start, start + rows) of `mb` (every per-row tensor narrowed, shape.mbs = rows): a token
// slice of a partitioned forward. REQUIRES: the range lies within mb's rows.
MicroBatchInputs SliceRows(const MicroBatchInputs& mb, int64_t start, int64_t rows);

struct Linear {
  at::Tensor weight;  // [out, in]
  at::Tensor bias;    // [out]
};
struct Norm {
  at::Tensor weight, bias;  // [hidden]
};
// One expert of an MoE layer: an MLP of width expert_ffn_hidden (or ffn_hidden), of the model's
// MLP kind.
struct Expert {
  int64_t index = 0;      // global expert index in [0, experts)
  Linear fc1, fc2, gate;  // as Block's MLP
};
// The MLP of an MoE layer: a router and the experts this rank holds (all of them at ep = 1;
// experts [ep_index * E / ep, (ep_index + 1) * E / ep) otherwise).
struct MoeMlp {
  int64_t layer = -1;           // MoE layer id in the stack [encoder; decoder] (plan's `layer`)
  Linear router;                // [experts, hidden], no bias
  std::vector<Expert> experts;  // this rank's experts, ascending index
};
struct Block {
  bool decoder = false;  // has cross-attention (T5 decoder layer)
  Norm ln1, ln2, ln3;    // ln3: decoder layers only (before the MLP)
  Linear qkv, proj;      // self-attention
  Linear cross_q, cross_kv, cross_proj;
  Linear fc1, fc2, gate;  // MLP: GELU uses fc1/fc2; SwiGLU uses gate, fc1 (up), fc2 (down)
  std::optional<MoeMlp> moe;  // MoE layers: replaces the MLP (fc1, fc2, gate undefined)
};

// Expert parallelism of a shard: the experts are cut into `ep` equal groups; this rank holds
// group `index`.
struct ExpertShard {
  int64_t ep = 1;
  int64_t index = 0;
};

// The all-to-alls of expert parallelism as the model sees them (the executor implements it from
// the plan's all-to-all instructions, moe.h).
class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  // The receive splits (rows from each member of the group) of the next all-to-all of the
  // running compute op, which must be `kind` at MoE layer `layer` (summed over its slices when
  // the plan cuts it into slices). Throws std::runtime_error (with the reason) when the plan's
  // next all-to-all is another one.
  virtual std::vector<int64_t> NextRecvSplits(OpKind kind, int64_t layer) = 0;
  // How many slices the plan cuts that all-to-all into (Tutel's capacity slices, docs/formats.md
  // "Segmented MoE ops"; slice c moves SplitPart(x, c, n) rows of every split x); 0: whole.
  virtual int64_t NextSlices(OpKind kind, int64_t layer) = 0;
  // Performs that (whole) all-to-all: sends rows [sum(send), hidden] (send[j] rows to member j,
  // in member order) and returns the rows received [sum(recv), hidden]. Throws
  // std::runtime_error when the splits differ from the plan's or the transfer fails.
  virtual at::Tensor Exchange(OpKind kind, int64_t layer, const at::Tensor& rows,
                              const std::vector<int64_t>& send,
                              const std::vector<int64_t>& recv) = 0;
  // Slice `slice` of it (-1: the whole one), posted without waiting (the splits are the
  // slice's); returns a ticket for Wait. Throws as Exchange.
  virtual int64_t Post(OpKind kind, int64_t layer, int64_t slice, const at::Tensor& rows,
                       const std::vector<int64_t>& send, const std::vector<int64_t>& recv) = 0;
  // A token slice of a partitioned forward (docs/moe.md, "Token slices"): what it moves depends
  // on the routing, so its sizes are the layer's, not the plan's. `send_counts` [ep, local]
  // int64: the rows for each member's local experts, in that order; `recv_counts` likewise for
  // what arrives, or undefined (a dispatch): the members exchange their counts first, and
  // ReceivedCounts(ticket) gives them. Posted without waiting; Wait gives the rows. Throws as
  // Exchange, and outside a segmented op.
  virtual int64_t PostTokenSlice(OpKind kind, int64_t layer, int64_t slice, const at::Tensor& rows,
                                 const at::Tensor& send_counts, const at::Tensor& recv_counts) = 0;
  // The counts a token slice posted with undefined recv_counts received [ep, local]; once per
  // ticket, after its Wait.
  virtual at::Tensor ReceivedCounts(int64_t ticket) = 0;
  // What the posted slices `tickets` received, in that order. In a segmented op the code stops
  // here until the plan has completed them (its next piece).
  virtual std::vector<at::Tensor> Wait(const std::vector<int64_t>& tickets) = 0;
};

class MoePartition;  // moe.h

// What the MoE layers of one chunk's forward need and report.
struct MoeContext {
  ExpertExchange* exchange = nullptr;  // required when the shard's ep > 1
  // A token slice of a partitioned forward (moe.h, MoePartition): the slices' shared state, this
  // slice's index, and how it stops at the end of a segment until the executor runs its next
  // piece. The counts and the load-balancing loss are then the partition's, not these fields.
  MoePartition* partition = nullptr;
  int64_t slice = -1;
  std::function<void()> park;
  at::Tensor aux_loss;      // out: the scaled load-balancing losses of the chunk's MoE layers,
                            // summed, part of the graph (undefined when it has none)
  int64_t assignments = 0;  // out: (real token, choice) pairs the routers assigned
  int64_t dropped = 0;      // out: of those, the pairs dropped over expert capacity
};

// Zero-bubble weight gradients (ZB-H1's W) without a second pass over the graph. While a chunk's
// forward records into a tape, every linear layer of its transformer blocks notes its input and
// output (x, y = x W^T + b). The input-gradient pass asks autograd, in one call, for the
// gradients of the chunk's inputs, of every recorded output and of the chunk's other
// parameters (Untaped(): embeddings, LayerNorms, the output head); the engine skips the
// recorded layers' weight branches because their parameters are not asked for. The weight pass is
// AccumulateWeightGrads: dW = g_y^T x and db = sum g_y into .grad, as autograd's AccumulateGrad
// would. The recorded inputs are tensors autograd saves for the backward anyway; the output
// gradients (the zero-bubble W memory) live from the input-gradient pass to the weight pass. The
// other parameters are cheap (reductions, an index-add) or, for the head, would hold a vocab-wide
// output gradient, so their gradients are taken in the input-gradient pass.
// Adds `g` into `param`'s .grad the way autograd's AccumulateGrad does (the first gradient
// becomes .grad). REQUIRES: g has the shape of param and no graph.
void AccumulateGrad(const at::Tensor& param, at::Tensor g);

class WeightGradTape {
 public:
  struct Entry {
    at::Tensor input;   // x
    at::Tensor output;  // y, part of the graph
    at::Tensor weight;  // W [out, in]
    at::Tensor bias;    // b [out] (undefined when none)
    int64_t segment = 0;  // the forward's MoE segment it ran in (set by Add, see set_segment)
  };

  // Stamps e with the current segment.
  void Add(Entry e) {
    e.segment = segment_;
    entries_.push_back(std::move(e));
  }
  const std::vector<Entry>& entries() const { return entries_; }
  // The forward's current MoE segment (plan/moe_segments.h): the executor advances it after
  // each of the forward's all-to-alls, so a segmented backward-weight can take one segment's
  // entries (AccumulateWeightGrads(segment)).
  void set_segment(int64_t segment) { segment_ = segment; }
  // The tensors of `params` that are neither the weight nor the bias of an entry.
  std::vector<at::Tensor> Untaped(const std::vector<at::Tensor>& params) const;
  // The input-gradient pass, releasing the graph: returns the gradients of `leaves` (undefined
  // where unused), adds those of Untaped(params) into .grad, and keeps the recorded outputs'
  // gradients for AccumulateWeightGrads. `params`: every parameter of the chunk.
  std::vector<at::Tensor> InputGradients(const std::vector<at::Tensor>& outputs,
                                         const std::vector<at::Tensor>& grad_outputs,
                                         const std::vector<at::Tensor>& leaves,
                                         const std::vector<at::Tensor>& params);
  // Whether InputGradients ran and AccumulateWeightGrads has not.
  bool pending() const { return pending_; }
  // The weight pass: adds every entry's weight (and bias) gradient into .grad from the kept output
  // gradients (an undefined one did not reach the loss: nothing to add) and releases them.
  // REQUIRES: pending().
  void AccumulateWeightGrads();
  // The weight pass of the entries of forward segment `segment` only (a segmented
  // backward-weight piece). It may run while InputGradients is still inside the engine (a
  // segmented backward-input suspended at an all-to-all): each entry's output gradient is taken
  // by a hook as autograd produces it. Entries already done are skipped; once every entry is
  // done, pending() is false.
  void AccumulateWeightGrads(int64_t segment);

 private:
  void AccumulateEntry(size_t i);

  std::vector<Entry> entries_;
  std::vector<at::Tensor> output_grads_;  // [entry], from InputGradients (hooks)
  std::vector<bool> done_;                // [entry] its weight gradient was added
  int64_t segment_ = 0;
  bool pending_ = false;
};

// One virtual stage of the model.
class Chunk {
 public:
  const ChunkSpec& spec() const { return spec_; }
  // Runs the chunk on one micro-batch. `inputs`: on chunk 0 the token tensors LoadInput produced
  // (tokens, and decoder tokens for encoder-decoder models); on other chunks the boundary
  // activations (plan BoundaryShapes). `labels`: on the last chunk. Returns the boundary
  // activations for the next chunk, or on the last chunk a one-element vector with the scaled
  // loss. `selective`: recompute the attention core (scores, softmax) in the backward instead of
  // storing it (Megatron's selective recomputation).
  // `tape`: record for a split backward (WeightGradTape); null for a whole backward.
  // `moe`: REQUIRES non-null when the chunk has MoE layers (has_moe()); the caller adds
  // moe->aux_loss to what it differentiates.
  std::vector<at::Tensor> Forward(const std::vector<at::Tensor>& inputs, const at::Tensor& labels,
                                  const MicroBatchInputs& mb, bool selective,
                                  WeightGradTape* tape = nullptr, MoeContext* moe = nullptr) const;
  // Whether any layer of the chunk is an MoE layer.
  bool has_moe() const;
  // The MLP of the chunk's first MoE layer; nullptr when it has none.
  const MoeMlp* first_moe() const;
  // This chunk's parameters (the shared word embedding included when it uses it).
  const std::vector<at::Tensor>& parameters() const { return params_; }

 private:
  friend class ModelShard;
  at::Tensor RunBlock(const Block& b, const at::Tensor& x, const at::Tensor& mask,
                      const at::Tensor& enc_out, const at::Tensor& cross_mask,
                      const at::Tensor& real, double loss_scale, bool selective,
                      WeightGradTape* tape, MoeContext* moe,
                      const SequenceGather* gather = nullptr) const;

  const ModelSpec* model_ = nullptr;
  ExpertShard experts_;
  ChunkSpec spec_;
  at::Tensor wte_, wpe_, dec_wpe_;  // as used by this chunk (undefined otherwise)
  std::vector<Block> encoder_, decoder_;
  Norm enc_ln_, final_ln_;
  at::Tensor head_;  // untied output head [vocab, hidden]
  std::vector<at::Tensor> params_;
};

// The chunks one pipeline rank holds, sharing one word-embedding parameter.
class ModelShard {
 public:
  // Chunks c with c % pp == pp_index of a pp * vpp cut, holding expert group `experts` of every
  // MoE layer. Errors: a cut CheckParallelFits would reject; ep > 1 for a dense model or an ep
  // that does not divide the experts.
  static StatusOr<std::unique_ptr<ModelShard>> Create(const ModelSpec& model, int64_t pp,
                                                      int64_t vpp, int64_t pp_index, uint64_t seed,
                                                      ExpertShard experts = {},
                                                      std::vector<int64_t> layer_cut = {});
  ModelShard(const ModelShard&) = delete;
  ModelShard& operator=(const ModelShard&) = delete;

  const ModelSpec& model() const { return model_; }
  bool HasChunk(int64_t stage) const;
  // REQUIRES: HasChunk(stage).
  const Chunk& chunk(int64_t stage) const;
  // Parameters whose gradients the reductions of `stage` carry: the chunk's own, and the shared
  // word embedding on the lowest stage of this rank that uses it (its last backward, so its
  // reduction, comes last); at ep > 1 without the experts' (ExpertParameters).
  // REQUIRES: HasChunk(stage).
  const std::vector<at::Tensor>& StageParameters(int64_t stage) const;
  // ep > 1: every expert parameter of this rank, in creation order (reduced over the replicas
  // that hold the same experts, not over the data-parallel group); empty at ep = 1.
  const std::vector<at::Tensor>& ExpertParameters() const { return expert_params_; }
  const ExpertShard& experts() const { return experts_; }
  // Every parameter once, with its global name, in creation order.
  const std::vector<std::pair<std::string, at::Tensor>>& NamedParameters() const { return named_; }
  std::vector<at::Tensor> Parameters() const;
  int64_t NumParameters() const;
  // The word embedding when this rank holds it (else undefined).
  const at::Tensor& word_embedding() const { return wte_; }

 private:
  ModelShard() = default;

  ModelSpec model_;
  int64_t pp_ = 1;
  std::vector<std::unique_ptr<Chunk>> chunks_;  // [stage / pp] this rank's chunks, ascending
  std::vector<std::vector<at::Tensor>> stage_params_;
  std::vector<std::pair<std::string, at::Tensor>> named_;
  std::vector<at::Tensor> expert_params_;
  ExpertShard experts_;
  at::Tensor wte_;
};

}  // namespace sluice::runtime
