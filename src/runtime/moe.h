// MoE layers of the runtime's models (model.h): router, expert capacity, token dropping,
// combine, load-balancing loss, and expert parallelism through an ExpertExchange.
//
// One MoE layer on a micro-batch x [B, T, hidden] with real-token mask [B, T] (padding is never
// routed and never takes a slot):
//   router    p = softmax(x W_r^T) over E experts; each real token picks its top_k experts
//             (choice 0 = the highest probability; torch::topk)
//   capacity  C = ceil(capacity_factor * B * T * top_k / E) slots per expert (the plan's
//             ExpertCapacity: T counts padding, so the all-to-all sizes are the plan's)
//   dropping  slots are given choice by choice, and within a choice by the token's position in
//             the micro-batch (row-major over [B, T]): every token's first choice before any
//             token's second. An assignment whose expert is full is dropped: that choice adds
//             nothing; a token whose every choice is dropped passes through the residual only
//   dispatch  a buffer [E * C, hidden], expert e's slots at rows e*C .. e*C+C-1, empty slots zero
//   experts   expert e runs its MLP on its C rows (at ep > 1 on the rows of every group member)
//   combine   y[t] = sum over t's kept choices c of p[t, e_c] * expert_e_c(x[t]) (the router's
//             probability, not renormalised over the top_k)
//   aux loss  Switch Transformer's: E * sum_i f_i * P_i over the micro-batch's real tokens N,
//             f_i = assignments to expert i (before dropping) / (N * top_k), P_i = mean p[., i];
//             added to the objective as kMoeAuxLossCoef * (that) * N * loss_scale, i.e. the
//             token-weighted sum over micro-batches normalised like the token loss
// Expert parallelism (ep > 1): the rank holds experts [index*E/ep, (index+1)*E/ep); dispatch
// sends member j the slots of j's experts ((E/ep) * C rows, padded: capacity makes the splits
// static) and receives (E/ep) * C_j rows from member j (C_j from j's micro-batch shape, given by
// the plan); the rank runs each of its experts on the rows of all members, and combine returns
// them. Both are one ExpertExchange::Exchange each in the forward and, reversed with swapped
// splits, in the backward (an autograd function), so the gradients equal those of the ep = 1
// layer up to summation order. When the plan cuts them into capacity slices (Tutel), the
// dispatch, the experts and the combine run slice by slice as one autograd node, posting and
// waiting in the plan's order forward and backward (docs/moe.md, "Capacity slices").
//
// Token slices (the forward partition of `--moe-overlap partition|lancet`, docs/moe.md): a
// partitioned forward runs the op's rows in n slices, each a forward of its own (the executor's
// fibers, segmented_ops.h) that stops at every all-to-all boundary. The slices share a
// MoePartition: each MoE layer's expert capacity is the whole micro-batch's and threaded from
// slice to slice (slice c's router continues the per-expert slot counters where slice c-1 left
// them, so with top-1 every token gets the slot, or is dropped, as in the whole layer); a
// sliced dispatch sends each member only the slice's rows for its experts (an all-to-allv after
// a count exchange) and the combine returns them; a whole all-to-all inside a partitioned op
// moves the whole layer's capacity buffer, posted by the slice that completes it. Each
// all-to-all of a layer, over all slices, is one autograd node whose backward is the whole
// layer's all-to-all (the plan's backward ops are whole), so the backward runs as for the
// unpartitioned layer. The load-balancing loss is the whole micro-batch's (AuxLoss).
//
// Thread safety: as model.h.
#pragma once

#include <array>
#include <cstdint>
#include <memory>

#include "base/units.h"
#include "cost/profile_table.h"
#include "model/model_spec.h"
#include "runtime/model.h"

namespace sluice::runtime {

// The load-balancing loss coefficient (Switch Transformer's alpha; ModelSpec has no field).
inline constexpr double kMoeAuxLossCoef = 0.01;

// The state the token slices of one partitioned forward share (see above).
class MoePartition {
 public:
  // `slices` of a micro-batch of `rows` rows.
  MoePartition(int64_t slices, int64_t rows);
  ~MoePartition();
  MoePartition(const MoePartition&) = delete;
  MoePartition& operator=(const MoePartition&) = delete;

  int64_t slices() const;
  int64_t rows() const;
  // Once every slice ran: the scaled load-balancing losses of the MoE layers over the whole
  // micro-batch, summed (undefined when none had a real token), and the router's counts.
  at::Tensor AuxLoss(const ModelSpec& model, double loss_scale) const;
  int64_t assignments() const;
  int64_t dropped() const;

  struct Impl;  // moe.cc
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// One MoE layer's MLP on x [B, T, hidden] (the LayerNorm already applied); returns [B, T,
// hidden]. `real`: [B, T] bool. Adds its auxiliary loss and counts to `ctx`. `tape`: records
// the experts' linear layers (model.h). With ctx->partition, x is one token slice's rows (see
// above; the loss and counts go to the partition). REQUIRES: ctx; ctx->exchange when
// shard.ep > 1.
at::Tensor MoeForward(const ModelSpec& model, const MoeMlp& moe, const ExpertShard& shard,
                      const at::Tensor& x, const at::Tensor& real, double loss_scale,
                      WeightGradTape* tape, MoeContext* ctx);

// One MoE layer's parts (cost/profile_table.h, MoePart) timed one by one, for `sluice profile`:
// each part runs forward and backward on its own (its inputs are fresh leaves, its backward takes
// random output gradients), with the functions MoeForward runs, on x [B, T, hidden] with every
// token real and every expert on this rank (ep 1). kExpertsSliced is the experts through the
// sliced-experts node of Tutel's capacity slices, `slices` of them, with an all-to-all that hands
// back what it was given (no transfers). Wall-clock times of one run (the caller warms up and
// takes medians). Expert weights accumulate gradients as in training.
// REQUIRES: model.moe, moe holds every expert, slices >= 2.
struct MoePartTimes {
  std::array<Duration, kNumMoeParts> forward;
  std::array<Duration, kNumMoeParts> backward;
};
MoePartTimes TimeMoeParts(const ModelSpec& model, const MoeMlp& moe, const at::Tensor& x,
                          int64_t slices, at::Generator& gen);

}  // namespace sluice::runtime
