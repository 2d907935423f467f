// Gradient reduction overlapped with the last backward, as PyTorch DDP does it, on the segmented
// MoE ops of plan/moe_segments.h.
//
// The lowering posts a stage's data-parallel gradient reduction (its run of buckets) after the
// stage's last backward (plan/lower.h, step 5): with whole compute ops it cannot say which
// gradients are ready earlier. A real DDP all-reduces a bucket as soon as the backward has
// produced all of its gradients, in reverse order of the layers, under the rest of the backward.
// A segmented backward (B or I + W pieces, one per segment) says which layers are done, so
// OverlapGradientReduction moves each bucket of a run to just after the piece that completes its
// gradients:
//  - the run's bytes are given to the segments of the stage in proportion to their reduced
//    parameters (MoeSegmentGradParams): attention, dense MLPs and routers; experts only when
//    their gradients are reduced at all (more than one replica of each expert, dp > ep); the
//    word embedding (and a tied output head on a one-stage model) is done only when the whole
//    backward is, an untied head with the last segment;
//  - a segment's gradients are complete after the last W piece of it of the stage's last
//    backward micro-batch (after its last B piece when the backward is not split);
//  - buckets keep their order (bucket 0 first: the stage's last layers), so every member of a
//    data-parallel group still posts the same collectives in the same order; bucket b moves to
//    after the piece at which the completed bytes first cover buckets 0..b.
// Runs after a whole (unsegmented) backward stay where they are. ZeRO >= 2's all-gathers stay
// after the optimizer step. No buffer is touched, so memory does not change.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "plan/execution_plan.h"

namespace sluice::passes {

// Reduced parameters of each segment of `stage` (forward numbering, 2k+1 entries for k MoE
// layers; see the header comment), per tp rank; the embedding's are not included (they complete
// with the whole backward). REQUIRES: the plan's model has MoE layers on `stage`.
std::vector<double> MoeSegmentGradParams(const ExecutionPlan& plan, int64_t stage);

// Moves the gradient buckets of every run that follows a segmented backward (see above).
// Returns how many buckets moved over all ranks. The caller validates the plan.
int64_t OverlapGradientReduction(ExecutionPlan* plan);

}  // namespace sluice::passes
