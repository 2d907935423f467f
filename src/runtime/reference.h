// RunReference: the single-process oracle the runtime's correctness tests compare `sluice train`
// with. Torch-free header.
//
// Thread safety: runs libtorch work on the calling thread; one at a time per process.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "data/sample.h"
#include "model/model_spec.h"
#include "plan/execution_plan.h"
#include "runtime/dump.h"

namespace sluice::runtime {

// The single-process reference: the same model and seed, no pipeline, no padding: each batch
// is a list of rows, each row the samples that share one sequence (one sample; or several that a
// non-varlen packing made attend across one row), run one at a time through the whole model at
// their exact length; the loss normalised by the batch's labels; then AdamW. Returns the loss of
// every batch and the gradients of batch `grad_batch` (by parameter name, before its step).
struct ReferenceResult {
  std::vector<double> losses;
  std::vector<NamedValues> grads;
  // MoE models (RunMicroBatchReference), per batch: the load-balancing loss added to the
  // objective (not in `losses`), (token, choice) assignments and those dropped over capacity.
  std::vector<double> aux_losses;
  std::vector<int64_t> assignments, dropped;
};
using ReferenceBatch = std::vector<std::vector<Sample>>;  // rows
StatusOr<ReferenceResult> RunReference(const ModelSpec& model, uint64_t seed, double lr,
                                       std::span<const ReferenceBatch> batches,
                                       int64_t grad_batch);

// The reference for MoE models, whose routing depends on which tokens share a micro-batch
// (capacity and dropping order, moe.h): the plan's micro-batches of every replica as they are
// (their padded shape, padding masked and never routed), each through the whole model with every
// expert local (ep = 1), in the given order; the loss normalised by the batch's labels; then
// AdamW. Also fills aux_losses, assignments and dropped.
struct MicroBatchReferenceBatch {
  std::vector<Sample> samples;
  std::vector<PlanMicroBatch> micro_batches;
};
StatusOr<ReferenceResult> RunMicroBatchReference(const ModelSpec& model, uint64_t seed, double lr,
                                                 std::span<const MicroBatchReferenceBatch> batches,
                                                 int64_t grad_batch);

}  // namespace sluice::runtime
