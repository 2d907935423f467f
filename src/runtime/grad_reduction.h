// GradientReduction: the data-parallel gradient reduction of one rank's iteration, as the executor
// runs it (executor.cc). Each plan bucket (kAllReduceGrad) all-reduces its range of its stage's
// flattened gradients (BucketRanges cuts the plan's bucket bytes onto the parameters) over the
// data-parallel group; a bucket the plan posts before its stage's last backward instruction (a
// reduction overlapping a segmented backward, passes/grad_overlap.h) is deferred until that
// backward is complete, because a stage's gradients are flattened once, when they are final. At
// the optimizer step every posted bucket is waited for and its sum written back into .grad, then
// the expert gradients are summed over the expert data-parallel group (ep > 1, dp > ep) and the
// word embedding's over the embedding group. Each wait is watched (Watchdog) and traced on the
// collective stream.
//
// Thread safety: the executor's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "base/status.h"
#include "plan/execution_plan.h"
#include "runtime/comm.h"
#include "runtime/model.h"
#include "runtime/trace_recorder.h"

namespace sluice::runtime {

// `params`' gradients (zeros where a parameter has none) as one flat fp32 tensor.
at::Tensor FlattenGrads(const std::vector<at::Tensor>& params);
// Writes `flat` (FlattenGrads' layout) back into `params`' .grad, as their reduced gradients (a
// parameter without one gets a copy).
void WriteFlatGrads(const at::Tensor& flat, const std::vector<at::Tensor>& params);

class GradientReduction {
 public:
  // `now`: nanoseconds on the trace's clock. REQUIRES: every reference outlives this.
  GradientReduction(ModelShard& shard, Communicator& comm, Watchdog& watchdog, TraceRecorder& trace,
                    int64_t iteration, std::function<int64_t()> now);

  // Pre-scans `program`: which buckets each stage reduces, in issue order, with their bytes.
  // Errors: a bucket of a stage this rank does not run, or one of no bytes.
  Status Prepare(const RankProgram& program);
  // Bucket instruction `in`, executed at program position `pc`: posted now, or deferred when
  // `last_backward` (stage -> its last backward instruction) has not been reached. `*bytes`: the
  // bytes posted (0 when deferred).
  Status AllReduce(const Instruction& in, int64_t pc,
                   const std::map<int64_t, int64_t>& last_backward, int64_t* bytes);
  // After instruction `index`: posts the buckets deferred to it.
  Status PostDeferred(int64_t index, const std::map<int64_t, int64_t>& last_backward);
  // The step's reductions: waits for every posted bucket and writes the sums into .grad, then
  // sums the expert and the word-embedding gradients. Errors name the collective and whom it
  // waited for.
  Status Finish();
  // Buckets posted and not yet finished.
  size_t outstanding() const { return collectives_.size(); }

 private:
  struct Collective {
    Communicator::Handle handle;
    int64_t stage = -1, bucket = -1;
    int64_t posted_ns = 0, bytes = 0;
  };
  // One stage's flattened gradient while its buckets are reduced.
  struct StageGrad {
    at::Tensor flat;
    std::vector<std::pair<int64_t, int64_t>> ranges;  // per bucket of the stage, in issue order
    std::vector<int64_t> bucket_ids;
  };

  Status AllReduceNow(const Instruction& in, int64_t* bytes);
  Status ReduceExpertGrads();
  Status ReduceEmbeddingGrad();
  // Waits for `h` (a collective over `peers`, described by `what`), watched.
  Status WaitWatched(const Communicator::Handle& h, const std::vector<int64_t>& peers,
                     const std::string& what);

  ModelShard& shard_;
  Communicator& comm_;
  Watchdog& watchdog_;
  TraceRecorder& trace_;
  const int64_t iteration_;
  std::function<int64_t()> now_;
  std::map<int64_t, StageGrad> stage_grads_;
  std::vector<Collective> collectives_;
  std::map<int64_t, std::vector<const Instruction*>> deferred_;  // stage -> its buckets
};

}  // namespace sluice::runtime
