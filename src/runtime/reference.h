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
};
using ReferenceBatch = std::vector<std::vector<Sample>>;  // rows
StatusOr<ReferenceResult> RunReference(const ModelSpec& model, uint64_t seed, double lr,
                                       std::span<const ReferenceBatch> batches,
                                       int64_t grad_batch);

}  // namespace sluice::runtime
