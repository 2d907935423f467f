// Context parallelism (cp) in the runtime: a micro-batch's sequences split over the cp processes
// of one plan rank (plan/execution_plan.h "Context parallelism"), each running the rank's program
// on its share of the tokens.
//
// Split: the padded row length S is rounded up to S' = a multiple of 2 * cp (the extra positions
// are padding: no token, no label, masked as keys) and cut into 2 * cp equal chunks; cp index r
// holds chunks r and 2cp-1-r (the load-balanced order for causal masks: every index gets one
// early and one late chunk, so the same number of (query, key) pairs). Tokens, positions,
// labels and the "real" mask of a micro-batch are the full micro-batch's at the local positions
// (LocalPositions), so the embedding, LayerNorms, MLPs, the output head and the loss are
// token-parallel and need no communication; the boundary activations and gradients that the
// pipeline sends are [mbs, S'/cp, hidden] (LocalShape), between processes of the same cp index.
//
// Attention: every self-attention layer all-gathers K and V over the cp group (SequenceGather,
// model.h), in gather order: index 0's local positions, then index 1's, ... (GatherOrder); its
// local queries attend over all S' keys with the full micro-batch's mask, whose rows are the
// local positions and whose columns the gather order, so causal and per-sample masking across
// chunks is exactly the single-process one. The backward of the all-gather is an all-reduce of
// the keys' and values' gradients over the cp group, of which each index keeps its own slice:
// autograd then differentiates through the exchange (the all-gather form of ring attention that
// Megatron-Core and Llama 3 use; K/V travel once per layer instead of cp - 1 ring steps).
//
// Each index's loss is its own tokens' part of the micro-batch's summed loss (scaled by the
// global batch's labels), so the losses add up over the cp group, and so do the parameter
// gradients: the plan's data-parallel reduction runs over dp x cp (plan/lower.h), and every
// copy then holds the full batch's gradient. Decoder-only models only (ParallelConfig's rule).
//
// Thread safety: functions are pure; a CpGather is used by one thread.
#pragma once

#include <cstdint>
#include <vector>

#include "plan/instruction.h"
#include "runtime/comm.h"
#include "runtime/model.h"

namespace sluice::runtime {

// S rounded up to a multiple of 2 * cp.
int64_t CpPaddedLength(int64_t seqlen, int64_t cp);
// The positions (of the padded row) that cp index `index` holds, ascending within each of its two
// chunks: chunk `index`, then chunk 2cp-1-index. REQUIRES: padded % (2 * cp) == 0.
std::vector<int64_t> LocalPositions(int64_t padded, int64_t cp, int64_t index);
// LocalPositions of index 0, 1, ..., cp-1, concatenated (the keys' order after the all-gather).
std::vector<int64_t> GatherOrder(int64_t padded, int64_t cp);
// A plan tensor shape of a micro-batch of row length `seqlen` as cp index holds it: dimension 1
// (the sequence of [mbs, seqlen] tokens and labels and [mbs, seqlen, hidden] activations)
// becomes CpPaddedLength(seqlen, cp) / cp. Unchanged at cp = 1.
TensorShape LocalShape(const TensorShape& shape, int64_t seqlen, int64_t cp);

// The inputs of cp index `index` from the full micro-batch's inputs built at the padded length
// (BuildMicroBatchInputs on a layout whose shape.seqlen is CpPaddedLength). `gather` is stored
// in the result (MicroBatchInputs::cp). REQUIRES: a decoder-only micro-batch.
MicroBatchInputs ShardMicroBatchInputs(const MicroBatchInputs& full, int64_t cp, int64_t index,
                                       const SequenceGather* gather);

// The all-gather of K/V over the communicator's cp group (see the file comment), with the
// watchdog told about every blocking wait. Failures throw std::runtime_error (the executor turns
// them into the instruction's error).
class CpGather final : public SequenceGather {
 public:
  CpGather(Communicator* comm, Watchdog* watchdog) : comm_(comm), watchdog_(watchdog) {}
  at::Tensor Gather(const at::Tensor& local) const override;
  // Used by the autograd function: all-gather [B, L, C] -> [B, cp * L, C] in gather order, and
  // the backward's all-reduce of [B, cp * L, C] then this index's slice.
  at::Tensor AllGather(const at::Tensor& local) const;
  at::Tensor ReduceSlice(const at::Tensor& grad) const;

 private:
  void WaitFor(const Communicator::Handle& h, const char* what) const;
  Communicator* comm_;
  Watchdog* watchdog_;
};

}  // namespace sluice::runtime
