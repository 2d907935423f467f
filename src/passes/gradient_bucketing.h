// Gradient bucketing: how each virtual stage's gradient reduction is cut into buckets.
//
// The lowering (plan/lower.h, step 5) emits, per rank and per virtual stage, the reductions of
// that stage's fp16 gradients as one run of collectives right after the stage's last backward, in
// decreasing stage order, cut into buckets of at most 25 MiB (PyTorch DDP's bucket_cap_mb).
// BucketGradientsPass re-cuts every run: the stage's bytes (the sum of its run) become
// ceil(bytes / bucket_bytes) buckets of equal size (the first bytes % n one byte larger, the
// lowering's rule), at the run's position, with each bucket's predicted duration from the
// cluster's alpha-beta model (cost/comm_model.h). With ZeRO >= 2 the all-gathers after the
// optimizer step are re-cut the same way. Bucket ids are renumbered 0, 1, ... in program order
// on every rank, so every data-parallel group still posts identical collectives.
//
// With `bucket_bytes` = the lowering's (LowerOptions::bucket_bytes) the pass reproduces the
// lowered plan byte for byte (passes_test checks it), so the lowering's buckets are this pass's
// default. Smaller buckets start a stage's first reduction no earlier (all of a stage's buckets are
// posted together) but split the link into more alpha terms; larger ones fewer. A plan with
// dp = 1 has no reductions: the pass records a no-op.
//
// Always valid: the runs keep their positions and the groups their order, and no buffer is used.
//
// Thread safety: an immutable value.
#pragma once

#include <string>

#include "base/units.h"
#include "passes/pass.h"

namespace sluice::passes {

class BucketGradientsPass final : public PlanPass {
 public:
  // REQUIRES nothing; Run rejects bucket_bytes <= 0 (InvalidArgument).
  explicit BucketGradientsPass(Bytes bucket_bytes) : bucket_bytes_(bucket_bytes) {}
  std::string Describe() const override;
  StatusOr<PassRecord> Run(ExecutionPlan* plan) const override;

 private:
  Bytes bucket_bytes_;
};

}  // namespace sluice::passes
