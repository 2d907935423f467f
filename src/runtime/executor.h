// Executor: runs one rank's instruction stream of an ExecutionPlan, exactly as planned.
//
// Per op (docs/runtime.md has the full table):
//   load-input       materialise the micro-batch's token ids / labels (TokenSource) into the slot
//   forward          run the chunk; stage inputs become fresh autograd leaves; at recompute
//                    "full" the forward runs without a graph and is replayed in the backward,
//                    at "selective" the attention core is recomputed (model.h)
//   backward         autograd backward of the chunk's outputs into its parameters' .grad and its
//                    input leaves; the input gradients fill the output slot
//   backward-input   torch::autograd::grad w.r.t. the input leaves, the output of every block
//                    linear layer the forward recorded (model.h, WeightGradTape) and the other
//                    parameters (added to .grad at once), releasing the graph; autograd skips
//                    the recorded layers' weight branches
//   backward-weight  those layers' weight gradients from their output gradients and recorded
//                    inputs (dW = g^T x, db = sum g) into .grad, without the graph
//   *-start/*-finish post an asynchronous c10d send/recv of exactly the plan's shapes (several
//                    tensors travel as one flat message) and wait for it; no shapes are exchanged
//   free-buffer      drop the slot's tensors
//   all-reduce-grad  post a sum over the data-parallel group of the bucket's slice of its stage's
//                    flattened gradient (BucketRanges cuts the plan's buckets onto parameters)
//   optimizer-step   wait for the buckets, write them back, sum the word embedding over its
//                    group (layout.h) and, at ep > 1 with dp > ep, the expert gradients over the
//                    replicas holding the same experts (comm.h "edp"), then AdamW
//   all-to-all-*     performed inside the compute op they belong to (plan/instruction.h "MoE
//                    all-to-all"): the MoE layer asks the executor's ExpertExchange (model.h)
//                    for the plan's next all-to-all, which checks kind, layer and splits and
//                    runs alltoall_base on the ep group; the instruction itself then only checks
//                    that it was performed. A forward at recompute "full" keeps what its
//                    all-to-alls received; its replay in the backward reads that instead of
//                    communicating (the plan lists no all-to-all for a replay).
//   segmented ops    (an MoE-overlap rewrite, plan/moe_segments.h; pieces whose segments and
//                    all-to-alls are whole or, in F and B, capacity slices of the experts): the
//                    op's code runs in a Fiber that stops where it needs an all-to-all's result
//                    (moe_exchange.h); the all-to-all instruction posts it (blocking at tag -1,
//                    else completed at its all-to-all-wait), the op's next piece resumes the
//                    fiber, a backward-weight piece adds one segment's weight gradients. Token
//                    slices and slices of a split backward are refused. A gradient bucket posted
//                    before its stage's last backward instruction is posted right after it.
// MoE: the chunk's load-balancing loss (moe.h) is differentiated with its outputs.
// Context parallelism (cp > 1, context_parallel.h): this process runs its plan rank's program on
// its share of every micro-batch's tokens; shapes are the plan's with the sequence dimension
// made local (LocalShape), peers are the processes of the same cp index (Communicator::
// ProcessRank), self-attention gathers K/V over the cp group inside the compute ops.
// Reduce-scatter / all-gather (ZeRO >= 2) are rejected. Tensors are fp32 (the plan prices fp16).
// Every instruction is recorded in the TraceRecorder; every blocking wait is announced to the
// Watchdog so a hang becomes an error naming the awaited rank.
//
// Thread safety: one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "base/status.h"
#include "base/units.h"
#include "plan/execution_plan.h"
#include "runtime/batch_layout.h"
#include "runtime/comm.h"
#include "runtime/model.h"
#include "runtime/token_source.h"
#include "runtime/trace_recorder.h"

namespace sluice::runtime {

struct IterationResult {
  double loss = 0;           // this rank's share of the batch's mean token loss (last stage)
  int64_t instructions = 0;  // executed
  int64_t start_ns = 0;      // since the job's epoch
  int64_t end_ns = 0;
  Duration compute;          // forward and backward ops
  Duration waiting;          // Finish ops and the step's waits for collectives
  // MoE (moe.h), over this rank's forwards: the load-balancing loss added to the objective,
  // (real token, choice) assignments, those dropped over capacity, and the time spent in
  // all-to-alls (all of it exposed: they block the compute op).
  double moe_aux_loss = 0;
  int64_t moe_assignments = 0, moe_dropped = 0;
  // all_to_all: the time the rank was blocked by all-to-alls (exposed): inside the all-to-alls
  // of whole compute ops, which block their op, and in the blocking all-to-alls and waits of
  // segmented ops; all_to_all_span: from each all-to-all's post to its observed completion
  // (equal to all_to_all for whole ops; under an MoE-overlap rewrite, the hidden part on top).
  Duration all_to_all, all_to_all_span;
};

class Executor {
 public:
  // Called after the gradients are final and before the optimizer updates (e.g. to dump them).
  using BeforeStep = std::function<Status()>;

  // REQUIRES: every pointer outlives the executor; `shard` holds the chunks of this rank.
  Executor(ModelShard* shard, Communicator* comm, torch::optim::Optimizer* optimizer,
           Watchdog* watchdog, TraceRecorder* trace, const TokenSource* tokens,
           std::chrono::steady_clock::time_point epoch)
      : shard_(shard), comm_(comm), optimizer_(optimizer), watchdog_(watchdog), trace_(trace),
        tokens_(tokens), epoch_(epoch) {}
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Runs this rank's program of `plan` (one iteration). REQUIRES: CheckPlanMatches(plan) passed.
  // Errors name the instruction ("rank 1, instruction 17 (1RECV_F3.wait): ...") and, for a
  // failed transfer, the peer.
  // `loss_labels` > 0: normalise the loss by this many labels instead of the plan's (a replica
  // group of a heterogeneous job runs part of the global batch, hetero_train.h).
  StatusOr<IterationResult> Run(const ExecutionPlan& plan, const SampleTable& samples,
                                int64_t iteration, const BeforeStep& before_step = {},
                                int64_t loss_labels = 0);

 private:
  ModelShard* shard_;
  Communicator* comm_;
  torch::optim::Optimizer* optimizer_;
  Watchdog* watchdog_;
  TraceRecorder* trace_;
  const TokenSource* tokens_;
  std::chrono::steady_clock::time_point epoch_;
};

}  // namespace sluice::runtime
