// MoE overlap: plan rewrites that hide expert-parallel all-to-alls under computation (Lancet,
// MLSys'24) and the baselines a user has today, on the segmented ops of plan/moe_segments.h.
//
// Every pass here takes a plan whose MoE compute ops are whole (as the lowering writes them) and
// rewrites each F, B and I of a stage with MoE layers into its 2k+1 segments with the all-to-alls
// between (docs/passes.md, "MoE overlap"):
//  - kNone (MoeSegmentPass): segments in order, every all-to-all blocking: the same timeline as
//    the whole op (the reference the others are compared with);
//  - kTutel: inside each MoE block only, the dispatch, the expert computation and the combine
//    cut into `tutel_degree` slices along the expert capacity, so slice c's all-to-all overlaps
//    slice c-1's experts (Tutel's adaptive pipelining, forward and backward);
//  - kMegatron: with pp = 1, each backward B(i) is interleaved with the forward F(i+1) that
//    follows it, segment by segment, their all-to-alls posted so that one's all-to-all runs
//    under the other's computation, and weight gradients delayed into the all-to-all windows
//    (Megatron-Core's --overlap-moe-expert-parallel-comm --delay-wgrad-compute);
//  - kDw: Lancet's dW scheduling: every B becomes I segments and W segments; the backward
//    all-to-alls are posted and the W segments whose I segment has run are packed into their
//    windows by best fit (|t_W - time left| smallest, stop when the window is full or the best
//    is over twice what is left), the rest run at the op's end;
//  - kPartition: Lancet's forward partition + pipeline: runs of consecutive elements of each F's
//    chain (segments, and the all-to-alls inside) are cut into n slices along the tokens, slice
//    c's all-to-all overlapping slice c-1's computation (non-MoE layers included); the runs and
//    n (2 .. max_chunks) are chosen by Lancet's DP over the chain, D[i] = min_j D[j] + c(j, i),
//    c the better of the run whole and its best pipelined time on a two-stream model;
//  - kLancet: kDw and kPartition together.
//  - kLancetMegatron: Lancet's passes composed with Megatron's interleaving (pp = 1): each
//    backward interleaved with the next forward as kMegatron does, and every forward left
//    unpaired (a rank's first, or those a memory-bound stride skips) cut by kPartition's DP; a
//    paired forward stays whole, its all-to-alls already under the backward's computation.
//    Where no stride of pairs fits the memory limit: no pair (Lancet's passes alone).
// Segment times are the op's duration split by analytic FLOP shares (MoeSegmentShares); a slice
// of a segment costs its share plus the slice overhead (measured by `sluice profile` when the
// plan's cost model has it, else 20 us); a slice of an all-to-all costs its
// group's latencies plus its share of the rest. The ep members of a group take the same
// decisions (from the group's largest times) so their all-to-alls pair up.
//
// Memory: a segmented op holds its whole memory from its first piece to its last (the memory
// rule, plan/memory_rule.h); a rewrite that puts a rank over the limit or breaks any other check
// of ValidatePlan is not kept (the plan is returned as it was, PassRecord::rejected says why).
//
// Thread safety: immutable values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "passes/pass.h"

namespace sluice::passes {

enum class MoeOverlap { kNone, kTutel, kMegatron, kDw, kPartition, kLancet, kLancetMegatron };

// "none", "tutel", "megatron", "dw", "partition", "lancet", "lancet-megatron".
std::string_view MoeOverlapName(MoeOverlap overlap);
// The inverse; the error names `flag` and lists the allowed names.
StatusOr<MoeOverlap> ParseMoeOverlap(std::string_view name, std::string_view flag);

// The slice overhead of a plan whose cost model did not measure one: launches and smaller GEMMs,
// a modelling choice, not a measurement.
inline constexpr Duration kDefaultSliceOverhead = Duration::Micros(20);

struct MoeOverlapOptions {
  int64_t tutel_degree = 4;                       // kTutel: slices of each MoE block
  int64_t max_chunks = 8;                         // kPartition: largest n the DP tries
  // Extra time of each sliced compute piece; nullopt: the plan's (ExecutionPlan::
  // moe_slice_overhead, measured by `sluice profile`), else kDefaultSliceOverhead.
  std::optional<Duration> slice_overhead;
  // Every rewrite (kNone included): post each data-parallel gradient bucket as soon as the
  // segmented last backward has produced its gradients, as PyTorch DDP does
  // (passes/grad_overlap.h); false: the lowering's runs after the whole backward.
  bool overlap_grad_reduction = true;
};

// Shares of a compute op's time per segment, in the op's order (2k+1 entries summing to 1): the
// analytic forward FLOPs of attention and dense MLPs, routers and experts (and the output head on
// the last stage) of the micro-batch's shape; `weight_grad`: only the linear layers' FLOPs (what
// the weight gradient repeats). Backward ops take the forward's shares reversed.
// REQUIRES: NumSegments(plan, stage) > 0.
std::vector<double> MoeSegmentShares(const ExecutionPlan& plan, int64_t dp_index, int64_t mb,
                                     int64_t stage, bool weight_grad);

// The slice overhead the pass prices `plan`'s slices with (see MoeOverlapOptions).
Duration SliceOverheadFor(const ExecutionPlan& plan, const MoeOverlapOptions& options);

class MoeOverlapPass : public PlanPass {
 public:
  explicit MoeOverlapPass(MoeOverlap overlap, MoeOverlapOptions options = {})
      : overlap_(overlap), options_(options) {}
  std::string Describe() const override;
  // No-op (changed = false, nothing rejected) for plans without expert parallelism; rejected for
  // plans already segmented, and (kMegatron, kLancetMegatron) for pp > 1.
  StatusOr<PassRecord> Run(ExecutionPlan* plan) const override;

 private:
  MoeOverlap overlap_;
  MoeOverlapOptions options_;
};

}  // namespace sluice::passes
