// Train: the per-rank training loop behind `sluice train`. Torch-free header (the CLI includes
// it); the single-process reference the tests compare it with is reference.h.
//
// Every rank: join the rendezvous (comm.h), build its chunks of the model (model.h) and an
// AdamW optimizer, then per iteration fetch the plan rank 0 published in the store, verify its
// hash and that it was made for this job (CheckPlanMatches), run its own instruction stream
// (executor.h), and post its figures to the store. Rank 0 also plans: a background thread runs
// the Planner on the global batches (or reads --plan files) up to `lookahead` iterations ahead
// of rank 0's own execution and publishes each as a PlanPackage (plan_package.h); batches that
// cannot be planned within memory are skipped with a note. Rank 0 prints one line per iteration
// (loss, real tokens/s, peak tensor bytes and peak resident memory over ranks) with a progress
// bar, and a summary. Tensor bytes are counted by a CpuMemoryCounter (memory_stats.h) installed
// for the trainer's lifetime.
//
// Outputs: `trace_dir`/trace-rank-R.json per rank and trace.json merged by rank 0
// (trace_recorder.h); `metrics_path`: one JSON object per iteration; `dump_dir`: each
// iteration's package and every rank's gradients just before the optimizer step (dump.h).
//
// Failures (docs/runtime.md): an error on any rank is posted to the store and every rank exits
// non-zero naming the rank (comm.h's Watchdog); after a failure Train returns without tearing
// down the process groups (peers may be gone and c10d teardown would block).
//
// Thread safety: Train runs once per process.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "batching/stage_cost.h"
#include "data/global_batcher.h"
#include "data/sample.h"
#include "model/cluster_spec.h"
#include "model/hetero_config.h"
#include "model/model_spec.h"
#include "model/parallel_config.h"
#include "planner/hetero.h"
#include "planner/planner.h"
#include "runtime/fault.h"
#include "runtime/launcher.h"

namespace sluice::runtime {

struct TrainOptions {
  ModelSpec model;
  ParallelConfig parallel;
  // Planning on rank 0 (unused on other ranks): the planner (Planner::Create; it must outlive
  // Train) and the batcher that cuts the data into global batches.
  const Planner* planner = nullptr;
  GlobalBatcher* batcher = nullptr;
  // Execute these plan files, one per iteration, instead of planning (rank 0 reads them);
  // their samples' lengths come from `plan_samples` (the data after clipping).
  std::vector<std::string> plan_files;
  // Heterogeneous replicas (`--replicas`, hetero_train.h): the replica groups (then `parallel`
  // is unused) and, on rank 0, the planner that routes each batch's sequences to them (it must
  // outlive Train; `planner` is then unused).
  std::optional<HeteroConfig> replicas;
  const HeteroPlanner* hetero_planner = nullptr;
  std::vector<Sample> plan_samples;
  int64_t iterations = 0;  // batches considered (skipped ones too); 0 = until the data ends
  int64_t max_seqlen = 0;  // the run's --max-seqlen: plan files with longer rows are rejected
  // Train plans that leave samples of their batch out (ExecutionPlan::dropped) instead of
  // failing (--allow-partial).
  bool allow_partial = false;
  int64_t lookahead = 2;  // how many plans rank 0 keeps ready beyond the running one
  uint64_t seed = 0;      // model initialisation and token streams
  double lr = 1e-3;       // AdamW learning rate (betas 0.9, 0.95; weight decay 0.01)
  std::chrono::milliseconds timeout = std::chrono::seconds(300);  // rendezvous, waits, heartbeats
  int64_t threads = 0;           // intra-op threads per rank; 0 = cores / local ranks (>= 1)
  std::string backend = "gloo";  // gloo | nccl (needs a CUDA libtorch; see docs/runtime.md)
  std::string trace_dir;         // "" = no traces
  std::string metrics_path;      // "" = none
  std::string dump_dir;          // "" = no dumps
  FaultSpec fault;
  // Testing aid (--link-delay-ms): every point-to-point send is handed to c10d this much later
  // (comm.h, Communicator::SetLinkDelay); 0 = none.
  std::chrono::nanoseconds link_delay{0};
  bool print = true;  // rank 0 prints lines and the summary
  // Rank 0 (--calibration): applied to every plan before it is published (planned or read from
  // --plan; it rewrites durations and links, which the executor does not read, so what runs is
  // unchanged), and the plan then simulated: its iteration time and per-rank peak memory are
  // printed beside the measured ones, with a summary of the errors, and written to --metrics.
  // The planner's choices (batching, order search, optimizer) keep the cost model.
  std::function<void(ExecutionPlan*)> adjust_plan;
  // Rank 0 (--moe-overlap): applied to every plan after adjust_plan, before it is published
  // (planned or read from --plan); what runs is the rewritten plan, and it is simulated and
  // printed beside the measured time as with adjust_plan. Returns a note when it left the plan
  // as it was (a rewrite the pass rejected) or applied less than asked, else "".
  std::function<std::string(ExecutionPlan*)> rewrite_plan;
};

// Heterogeneous replicas (hetero_train.h): errors for `sluice train --replicas` that the
// planner's checks leave to the runtime: tp, ep, vpp, ZeRO >= 2, a world size that is not the
// groups' devices. Messages start with `source`.
Status CheckHeteroRunnable(const HeteroConfig& config, int64_t world_size, std::string_view source);

// Runs this process's rank of the job `env` describes. Errors: bad options (InvalidArgument:
// tp > 1, ZeRO >= 2, cp > 1 with T5 or ep > 1, a world size that is not dp * pp * cp or the
// replica groups' devices, a plan for another job) or a failed run (FailedPrecondition, naming
// the rank).
Status Train(const TrainOptions& options, const DistEnv& env);

}  // namespace sluice::runtime
