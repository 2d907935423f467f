// Simulator: discrete-event simulation of one ExecutionPlan across all of its ranks.
//
// Each rank has one compute stream and separate communication streams: a send and a receive
// stream per pipeline direction (towards the next and the previous stage's rank), one stream
// for data-parallel collectives and one for all-to-all. Instructions of a rank issue strictly in
// program order (the plan's contract, plan/instruction.h): a compute op occupies the compute
// stream for its `duration` (the plan's cost model, scaled by the what-if knobs); a *Start posts
// a transfer that runs on its communication stream once both sides have posted it (NCCL pairs
// point-to-point ops in posting order) and its link is free; a *Finish blocks the rank's issue
// until that transfer has completed; collectives run on the collective stream once every member
// of the group has posted them; OptimizerStep waits for the rank's collectives. An MoE all-to-all
// (dispatch or combine) blocks its rank from its post until it completes on the all-to-all
// stream: it starts once every member of the expert-parallel group posted it and the data is
// there, pays (n-1) link latencies and then moves one flow per ordered pair of members, the
// bytes its send splits give (contention as for transfers); in the fast mode one α-β interval:
// (n-1) latencies + the busiest member's bytes to the others over the group's slowest link.
// Compute ops do not block the issue (as a CUDA host does not wait for kernels): sends wait for
// the data they read, collectives for the compute issued before them.
//
// Communication times come from the cluster's links (ClusterSpec intra_node / inter_node; device
// placement as in execution_plan.h). Transfers that share a link at the same time share its
// bandwidth (contention: every device has an egress and an ingress port per link class, a flow's
// rate is the smallest fair share of the ports it crosses). Collectives are simulated step by step
// (ring all-reduce = 2(n-1) steps of S/n bytes between ring neighbours; reduce-scatter /
// all-gather n-1 steps) or, in the fast mode, as one closed-form α-β interval
// (cost/comm_model.h); the two agree within 1% on a single uncontended collective. The plan's
// own `duration` of transfers and collectives is not used: links decide.
//
// Memory: the plan's memory rule (plan/memory_rule.h, ValidatePlan's check 7) over simulated
// time. Per rank, model states (plan.model_states) plus activations (stored activations of
// forwards whose backward has not run yet, plus the transient peak of the running compute op,
// from the plan's per-stage ChunkCost) plus the live buffer slots (a forward's input activation
// is inside its `stored` from the forward until its backward ends). Every change happens where
// its instruction reaches the compute stream (a compute op's start and end, a load, a receive's
// post, a FreeBuffer), so the changes come in program order and the peak is exactly
// PredictPeakMemory's (with count_buffers = false, PredictPeakMemory without buffers): a plan
// that passes ValidatePlan never runs out of memory here. docs/simulator.md has the whole model.
//
// A plan whose ranks cannot all finish (e.g. a receive without its send, or a rank that stops on
// a slot nothing wrote) ends with outcome kDeadlock and the blocked ranks with the instruction
// each waits on; the simulation never hangs.
//
// Determinism: events are ordered by (time, sequence number); the same plan and options give a
// byte-identical SimResult. No static state: one Simulator per simulation, any number per process.
//
// Thread safety: a Simulator is used by one thread; distinct Simulators are independent.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/units.h"
#include "data/sample.h"
#include "plan/execution_plan.h"

namespace sluice {

enum class StreamKind : uint8_t {
  kCompute,
  kSendNext,    // sends towards the next stage's rank (activations)
  kSendPrev,    // sends towards the previous stage's rank (gradients)
  kRecvPrev,    // receives from the previous stage's rank (activations)
  kRecvNext,    // receives from the next stage's rank (gradients)
  kCollective,  // data-parallel gradient / parameter collectives
  kAllToAll,    // expert-parallel all-to-all (MoE dispatch and combine instructions)
};
inline constexpr int kNumStreamKinds = 7;
std::string_view StreamKindName(StreamKind kind);  // "compute", "send-next", ...

enum class CollectiveMode : uint8_t {
  kStepwise,    // ring / pairwise steps over the links, with contention
  kClosedForm,  // one α-β interval per collective (fast)
};

// What-if scaling of one link class: effective bandwidth × bandwidth_scale, latency ×
// latency_scale.
struct LinkScale {
  double bandwidth_scale = 1.0;
  double latency_scale = 1.0;
};

struct Straggler {
  int64_t rank = 0;       // rank id of the plan
  double slowdown = 1.0;  // compute durations on this rank × slowdown (> 0)
};

struct SimOptions {
  CollectiveMode collectives = CollectiveMode::kStepwise;
  double compute_scale = 1.0;  // every compute duration × compute_scale (> 0)
  LinkScale intra_node;
  LinkScale inter_node;
  std::vector<Straggler> stragglers;
  bool record_timeline = true;  // keep every executed interval (traces, reports, critical path)
  bool record_memory = true;    // keep the per-rank memory timeline
  // Count live buffer slots on top of the activations (false: activations and model states only).
  bool count_buffers = true;
  // The global batch's samples as planned (clipped lengths), to count real tokens and useful
  // FLOPs. Empty: the plan holds no lengths, so real tokens and FLOPs fall back to the padded
  // shapes (SimResult::tokens_from_samples = false). Every sample id of a plan row must be here.
  std::vector<Sample> samples;
  // Asked every 512 events; when it returns true the run stops and Run returns
  // FailedPrecondition ("interrupted"). Empty: never (`sluice simulate` stops on Ctrl-C).
  std::function<bool()> cancelled;
};

enum class SimOutcome : uint8_t { kOk, kDeadlock, kOutOfMemory };
std::string_view SimOutcomeName(SimOutcome outcome);  // "ok", "deadlock", "out-of-memory"

// One executed instruction (or, for a transfer, the time it occupied its stream).
struct SimInterval {
  int64_t rank = 0;
  int64_t instruction = 0;  // index in the rank's program
  StreamKind stream = StreamKind::kCompute;
  Duration start;
  Duration end;

  friend bool operator==(const SimInterval&, const SimInterval&) = default;
};

struct MemoryPoint {
  Duration time;
  Bytes bytes;  // total on the device from `time` on (model states included)

  friend bool operator==(const MemoryPoint&, const MemoryPoint&) = default;
};

struct RankSimStats {
  Duration finish;        // when the rank's last instruction completed
  Duration compute;       // busy time of the compute stream
  Duration bubble;        // iteration time - compute - exposed communication
  Duration exposed_comm;  // time the rank was blocked on communication in flight with its
                          // compute idle (a Finish or OptimizerStep waiting, and the end of
                          // the iteration waiting for trailing transfers / collectives)
  Duration comm;          // total busy time of the communication streams (overlapped or not)
  Duration all_to_all;          // busy time of the all-to-all stream (MoE dispatch / combine)
  Duration exposed_all_to_all;  // the part of exposed_comm spent in all-to-alls
  Bytes peak_memory;
  int64_t peak_instruction = -1;  // the instruction during which the peak was reached

  friend bool operator==(const RankSimStats&, const RankSimStats&) = default;
};

// A rank blocked when the simulation could not go on.
struct BlockedRank {
  int64_t rank = 0;
  int64_t instruction = 0;  // the instruction it waits on
  std::string text;         // InstructionText of it, and what it waits for

  friend bool operator==(const BlockedRank&, const BlockedRank&) = default;
};

struct SimResult {
  SimOutcome outcome = SimOutcome::kOk;
  std::string problem;               // empty when kOk: what went wrong, naming ranks/instructions
  std::vector<BlockedRank> blocked;  // kDeadlock: every rank that could not finish

  Duration iteration_time;       // the last rank's finish
  int64_t real_tokens = 0;       // unpadded tokens of the placed samples (input + target)
  int64_t padded_tokens = 0;     // tokens the micro-batch shapes compute (mbs × lengths)
  double tokens_per_second = 0;  // real_tokens / iteration_time
  double model_flops = 0;        // useful model FLOPs of the real tokens (fwd + bwd, no
                                 // recompute, no padding)
  double mfu = 0;                // model_flops / (iteration_time × devices × peak_flops)

  bool tokens_from_samples = false;  // real_tokens / model_flops from SimOptions::samples
                                     // (false: from the padded shapes)

  std::vector<RankSimStats> ranks;       // [rank id]
  std::vector<Duration> stage_compute;   // [pipeline rank] max over replicas of compute time
  std::vector<Duration> replica_finish;  // [dp index] the replica's last finish
  double stage_imbalance = 0;            // max / mean of stage_compute - 1
  double replica_imbalance = 0;          // max / mean of replica_finish - 1

  bool memory_exceeded = false;  // some rank's peak > plan.memory_limit()
  int64_t oom_rank = -1;         // the first rank (by time) that exceeded it
  int64_t oom_instruction = -1;  // and the instruction where it happened

  std::vector<SimInterval> critical_path;  // the chain of intervals that sets iteration_time,
                                           // first to last (record_timeline only)
  std::vector<SimInterval> timeline;       // every interval (record_timeline), by (rank, start)
  std::vector<std::vector<MemoryPoint>> memory;  // [rank] (record_memory)

  int64_t instructions = 0;  // instructions executed
  int64_t events = 0;        // events processed

  friend bool operator==(const SimResult&, const SimResult&) = default;
};

class Simulator {
 public:
  // REQUIRES: `plan` outlives the simulator. Options are checked by Run (InvalidArgument naming
  // the field: a non-positive scale, a straggler rank outside the plan).
  Simulator(const ExecutionPlan& plan, SimOptions options);
  Simulator(const Simulator&) = delete;
  Simulator& operator=(const Simulator&) = delete;
  // Runs the simulation once. A deadlock or an out-of-memory plan is an outcome, not an error;
  // a Status is returned only for bad options, a structurally broken plan (an instruction
  // naming a rank or slot that does not exist) or a run that SimOptions::cancelled stopped.
  StatusOr<SimResult> Run();

 private:
  const ExecutionPlan* plan_;
  SimOptions options_;
};

// Convenience: Simulator(plan, options).Run().
StatusOr<SimResult> Simulate(const ExecutionPlan& plan, const SimOptions& options = {});

}  // namespace sluice
