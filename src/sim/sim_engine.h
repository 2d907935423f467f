// Engine: the event engine behind Simulator::Run (internal to src/sim/). docs/simulator.md
// explains the model; in short:
//  - each rank's host walks its program in order and only blocks on a *Finish whose transfer has
//    not completed and on OptimizerStep while its collectives run; a rank that cannot go on (a
//    Finish without its Start, a slot read before anything wrote it, collectives that differ
//    across the group) stops there and is reported as blocked;
//  - compute ops (and LoadInput, FreeBuffer, OptimizerStep) run on the rank's compute stream in
//    issue order, so their times are known when they are issued and need no events;
//  - point-to-point transfers start when both sides have posted them at the head of their
//    streams, the sender's data is ready and both streams are free; they pay the link's latency,
//    then move their bytes as a FlowNetwork flow (contention);
//  - collectives of a data-parallel group start when every member posted them and the group's
//    previous collective is done; stepwise ones hold the ring's ports and run their steps,
//    closed-form ones last AlphaBetaCommModel::Collective;
//  - an MoE all-to-all blocks its rank's host from its post until it completes; it starts when
//    every member of the expert-parallel group posted it and the group's previous one is done,
//    pays (n-1) latencies, then moves one flow per ordered member pair (contention), or in the
//    closed form lasts (n-1) latencies + the busiest member's remote bytes / the slowest link.
// Events (EventQueue, on (time, sequence)): a transfer's data phase, a flow's completion, a
// collective's start, step latency and (closed form) end. The run reads the plan only through
// its compiled form (sim_program.h). sim_engine_setup.cc checks and compiles the plan;
// sim_engine.cc runs the hosts and transfers, sim_engine_collectives.cc the collectives and
// all-to-alls; sim_engine_result.cc runs the event loop and turns the state into a SimResult.
//
// Thread safety: one Engine per simulation, used by one thread.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "base/units.h"
#include "cost/comm_model.h"
#include "plan/execution_plan.h"
#include "sim/event_queue.h"
#include "sim/flow_network.h"
#include "sim/sim_program.h"
#include "sim/sim_stats.h"
#include "sim/simulator.h"

namespace sluice::sim_internal {

// Point-to-point streams, index = StreamKind - 1.
constexpr int kSendNext = 0, kSendPrev = 1, kRecvPrev = 2, kRecvNext = 3;
constexpr int kNoInterval = -1;

inline int P2pStreamOf(OpKind op) {
  switch (op) {
    case OpKind::kSendActStart:
    case OpKind::kSendActFinish:
      return kSendNext;
    case OpKind::kSendGradStart:
    case OpKind::kSendGradFinish:
      return kSendPrev;
    case OpKind::kRecvActStart:
    case OpKind::kRecvActFinish:
      return kRecvPrev;
    default:
      return kRecvNext;
  }
}
inline StreamKind StreamOfP2p(int s) { return static_cast<StreamKind>(s + 1); }

// An executed interval (SimInterval) as the engine records it, in its rank's list: `id` is its
// place in creation order (interval ids are what `pred` and the engine's *_pred fields hold).
struct IntervalRec {
  Duration start, end;
  int32_t instruction = 0;
  int32_t id = 0;
  int32_t pred = kNoInterval;  // the interval that decided its start
  StreamKind stream = StreamKind::kCompute;
};

// A Start posted on a point-to-point stream.
struct Post {
  int64_t tag = 0;
  Duration posted;
  Duration ready;  // sends: when the data is there
  Bytes bytes;
  int32_t instr = 0;
  int32_t peer = 0;
  int32_t posted_pred = kNoInterval;
  int32_t ready_pred = kNoInterval;
  int32_t slot = -1;  // receives: the slot written
  int32_t transfer = -1;
  bool done = false;  // the transfer completed
};

struct P2pStream {
  std::vector<Post> posts;
  size_t head = 0;  // first post not started
  bool busy = false;
  Duration free_at;
  int32_t last = kNoInterval;
};

// A posted Start whose Finish has not run yet.
struct OpenPost {
  int64_t tag;
  int32_t peer;
  int32_t post;
  OpKind op;
  int8_t stream;
};

struct Slot {
  bool live = false;
  bool pending = false;      // written by a receive that has not completed
  bool activation = false;   // an fp16 stage input (received or produced), coverable by a forward
  bool covered = false;      // counted inside a forward's stored activations, until the
                             // backward (B or I) of that micro-batch and stage ends
  bool counted = false;      // its bytes are in the memory level
  int32_t cover_chunk = -1;  // the forward's chunk (ChunkMemory index) while covered
  int32_t writer = kNoInterval;
  Bytes bytes;
  Duration ready;
};

// kStopped: the rank cannot go on (a Finish without its Start, a slot read before it was written,
// collectives that do not match); `stop_reason` says why.
enum class Wait : uint8_t { kRunning, kPost, kCollectives, kAllToAll, kStopped, kDone };

struct alignas(64) RankState {
  // What the host reads for every op first (the first two cache lines).
  const SimOp* ops = nullptr;  // the compiled program: ops[0, size)
  size_t size = 0;
  size_t pc = 0;
  Duration host;
  Duration tail;  // compute stream free from here on
  int32_t host_pred = kNoInterval;
  int32_t tail_interval = kNoInterval;
  Wait wait = Wait::kRunning;
  Duration compute;
  std::vector<Slot> slots;
  std::vector<MemoryDelta> memory;  // emitted at compute-stream times: non-decreasing
  // The rest.
  const RankProgram* program = nullptr;  // for messages
  // Empty when the plan's slot ids index `slots` directly (they are dense: buffer_slots is at
  // most the slots the program allocates, ValidatePlan's invariant). Otherwise the plan's id of
  // each index, ascending: the ids the program names, numbered densely, so the engine's memory
  // follows the plan's size and not its largest slot id.
  std::vector<int64_t> slot_ids;
  std::string stop_reason;
  int32_t wait_stream = 0, wait_post = 0;
  Duration blocked_at, blocked_tail;
  std::array<P2pStream, 4> p2p;
  std::vector<OpenPost> open;
  int64_t coll_posted = 0, coll_pending = 0;
  int32_t a2a_group = -1;    // its expert-parallel group in a2a_groups_ (-1: none)
  int32_t a2a_member = 0;    // its index in that group
  int64_t a2a_posted = 0;    // all-to-alls posted
  int64_t wait_a2a = -1;     // Wait::kAllToAll: the group's all-to-all it waits for
  std::vector<std::pair<int64_t, int64_t>> a2a_tags;  // posted (tag >= 0) and not waited: (tag, k)
  // [instruction] 1: a token slice of a partitioned forward's dispatch, which exchanges the row
  // counts first (one more round of latencies; docs/moe.md, "Token slices"). Empty: none.
  std::vector<uint8_t> counted_a2a;
  Duration a2a, a2a_exposed;  // all-to-all busy time, and the part the compute stream idled
  double compute_factor = 1.0;
  // Figures.
  Duration comm, exposed, host_end;
  std::vector<std::pair<Duration, Duration>> comm_spans;
  std::vector<std::pair<Duration, Duration>> coll_spans;
  // record_timeline: its intervals in creation order, compute stream (in start order: the stream
  // and the host only move forward) and communication (recorded as they end) apart.
  std::array<std::vector<IntervalRec>, 2> intervals;
};

struct Transfer {
  Duration start, end;
  double bytes = 0;
  int32_t src = 0, dst = 0;
  int32_t src_post = 0, dst_post = 0;
  int32_t pred = kNoInterval;
  std::array<int32_t, 2> ports = {};
  int8_t src_stream = 0, dst_stream = 0;
  bool done = false;
};

struct Collective {
  OpKind op = OpKind::kAllReduceGrad;
  Bytes bytes;
  int64_t posted = 0;
  Duration ready;
  int32_t ready_pred = kNoInterval;
  std::vector<int32_t> instr;  // [member]
  Duration start;
  int32_t pred = kNoInterval;
  int64_t steps_left = 0;
  int32_t flow = -1;
  bool done = false;
};

struct Group {
  std::vector<int32_t> members;  // rank ids by dp index
  std::vector<Collective> colls;
  size_t next = 0;  // first collective not done
  bool started = false;
  CollectiveRing span;         // GradientRing: members, nodes, crossing shares
  std::vector<int32_t> ports;  // ring: egress and ingress of every hop
  std::vector<double> weights;  // per port: the share of a step's bytes that crosses it
  Duration step_latency;       // slowest hop's latency
  double min_bandwidth = 0;    // a step's bandwidth uncontended, bytes/s (dp * cp > 1)
  int64_t ring = 1;            // ring size: dp * cp (the cp ranks of each member reduce with it)
  Duration prev_end;
  int32_t prev_interval = kNoInterval;
};

// One all-to-all of an expert-parallel group, the k-th the group runs (every member posts the
// same k-th; their instructions' splits say what moves).
struct AllToAll {
  int64_t posted = 0;
  Duration ready;  // every member's data is there (the compute issued before each post)
  int32_t ready_pred = kNoInterval;
  std::vector<int32_t> instr;  // [member] its instruction index, -1 until posted
  Duration start;
  int32_t pred = kNoInterval;
  int64_t flows_left = 0;
  bool done = false;
};

// An expert-parallel group: its members run their all-to-alls one at a time, in order, on
// their all-to-all streams.
struct A2aGroup {
  std::vector<int32_t> members;  // rank ids in group order (ExecutionPlan's EpGroupOf)
  std::vector<AllToAll> ops;
  size_t next = 0;  // first all-to-all not done
  bool started = false;
  Duration prev_end;
  int32_t prev_interval = kNoInterval;
};

struct FlowOwner {
  enum class Kind : uint8_t { kTransfer, kCollective, kAllToAll };
  Kind kind = Kind::kTransfer;
  int32_t id = 0;  // the transfer, data-parallel group or expert-parallel group
};

class Engine {
 public:
  Engine(const ExecutionPlan& plan, const SimOptions& options)
      : plan_(plan),
        options_(options),
        intra_{plan.cluster.intra_node.bandwidth * options.intra_node.bandwidth_scale,
               plan.cluster.intra_node.latency.Scaled(options.intra_node.latency_scale)},
        inter_{plan.cluster.inter_node.bandwidth * options.inter_node.bandwidth_scale,
               plan.cluster.inter_node.latency.Scaled(options.inter_node.latency_scale)},
        comm_(intra_, inter_) {}
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Checks the plan's structure (a Status naming the field), runs every event, fills `result`'s
  // engine figures (outcome and derived figures are Simulator::Run's).
  Status Run(SimResult* result);

 private:
  // Whether ranks a and b talk over the inter-node link: their first devices are in different
  // nodes (ExecutionPlan::NodeOf; the gradient ring's own placement is GradientRing's).
  // REQUIRES: Prepare has run.
  bool Inter(int64_t a, int64_t b) const { return node_[a] != node_[b]; }
  // Ports of rank r: 0 intra egress, 1 intra ingress, 2 inter egress, 3 inter ingress.
  int32_t Port(int64_t rank, bool inter, bool ingress) const {
    return static_cast<int32_t>(rank * 4 + (inter ? 2 : 0) + (ingress ? 1 : 0));
  }
  const LinkSpec& Link(bool inter) const { return inter ? inter_ : intra_; }

  // Checks the plan's structure and compiles it (ops_, slot_refs_, chunks_, the ranks' state,
  // ports and groups). InvalidArgument naming the field for a plan the engine cannot run, and
  // when the plan's work could take simulated times or memory levels past int64 (durations and
  // sizes are each in range, their sums may not be).
  Status Prepare();
  // Prepare's part for rank r: compiles its program into ops_ from `op` on and onto slot_refs_,
  // adds its work (ns) to `work_ns` and its sends to `sends`, and sets `memory` to its model
  // states plus every allocation and activation it makes (bytes).
  Status CompileRank(int64_t r, SimOp* op, double* work_ns, double* memory, size_t* sends);
  // Prepare's part for the data-parallel groups and the ports: InvalidArgument when a group's
  // ring uses a link without bandwidth.
  Status BuildGroups();
  void Push(Duration t, EventType type, int32_t a, uint32_t b = 0) {
    events_.Push({t.nanos(), type, a, b});
  }
  // Records an interval when record_timeline; returns its id (kNoInterval when not recorded).
  int32_t AddInterval(int64_t rank, int64_t instr, StreamKind stream, Duration start, Duration end,
                      int32_t pred) {
    if (!options_.record_timeline) return kNoInterval;
    return RecordInterval(rank, instr, stream, start, end, pred);
  }
  int32_t RecordInterval(int64_t rank, int64_t instr, StreamKind stream, Duration start,
                         Duration end, int32_t pred);
  void Mem(RankState& r, Duration t, int64_t bytes, size_t instr) {
    if (bytes != 0) r.memory.push_back({t.nanos(), bytes, static_cast<int32_t>(instr)});
  }

  // The host of `rank` runs from `now` until it blocks or ends.
  void RunHost(int32_t rank, Duration now);
  // Runs one compute-stream op; returns its start.
  Duration RunOnCompute(int32_t rank, size_t instr, Duration duration, StreamKind stream);
  void IssueCompute(int32_t rank, const SimOp& in);
  const int32_t* Inputs(const SimOp& in) const { return slot_refs_.data() + in.slots; }
  const int32_t* Outputs(const SimOp& in) const { return slot_refs_.data() + in.slots + in.n_in; }
  // REQUIRES: `in` is an op of ops_ (the next op ends its slots).
  static int32_t NumOutputs(const SimOp& in) { return (&in)[1].slots - in.slots - in.n_in; }
  // The plan's id of the rank's slot index `slot`, for messages.
  int64_t SlotId(int32_t rank, int64_t slot) const {
    const std::vector<int64_t>& ids = ranks_[rank].slot_ids;
    return ids.empty() ? slot : ids[slot];
  }
  // False (and the rank stopped) when the slot holds no finished buffer.
  bool Readable(int32_t rank, int64_t slot);
  // False (and the rank stopped) when the slot still holds a buffer.
  bool Allocate(int32_t rank, int64_t slot, Bytes bytes, bool activation);
  void Stop(int32_t rank, std::string reason) {
    ranks_[rank].wait = Wait::kStopped;
    ranks_[rank].stop_reason = std::move(reason);
  }
  void PostP2p(int32_t rank, const SimOp& in);
  void PostCollective(int32_t rank, const SimOp& in);
  // Posts the rank's next all-to-all; one with tag -1 blocks its host until it completes (the
  // rest of its compute op needs what it brings), a posted one (tag >= 0) until its wait.
  void PostAllToAll(int32_t rank);
  // The rank's all-to-all wait: blocks until the posted all-to-all of its tag completes.
  void WaitAllToAll(int32_t rank, int64_t tag);
  void TryStartAllToAll(int32_t group);
  void OnAllToAllStart(int32_t group, Duration now);
  void CompleteAllToAll(int32_t group, Duration now);
  // Prepare's part for the expert-parallel groups (ep > 1 dividing dp).
  void BuildA2aGroups();
  void TryStartTransfer(int32_t sender, int send_stream);
  void TryStartCollective(int32_t group);
  void OnTransferData(int32_t t, Duration now);
  void OnFlowDone(int32_t flow, uint32_t version, Duration now);
  void OnCollStart(int32_t g, Duration now);
  void CompleteTransfer(int32_t t, Duration now);
  void CompleteCollective(int32_t g, Duration now);
  void Resume(int32_t rank, Duration now, int32_t pred);
  void DrainChanged();
  std::string WaitReason(int32_t rank) const;
  void Finish(SimResult* result);
  // record_timeline: the critical path and the timeline, by (rank, start, creation).
  void FinishTimeline(SimResult* result);

  const ExecutionPlan& plan_;
  const SimOptions& options_;
  const LinkSpec intra_, inter_;
  const AlphaBetaCommModel comm_;
  std::unique_ptr<SimOp[]> ops_;      // the compiled program (SimOp), with its end marker
  std::vector<int32_t> slot_refs_;    // the ops' slots, as indices into their rank's `slots`
  std::vector<int64_t> node_;         // [rank] its node
  std::vector<ChunkMemory> chunks_;   // [first_chunk_[dp index] + micro-batch * stages + stage]
  std::vector<int64_t> first_chunk_;  // [dp index]
  std::vector<RankState> ranks_;
  std::vector<Transfer> transfers_;
  std::vector<Group> groups_;
  std::vector<A2aGroup> a2a_groups_;
  std::vector<FlowOwner> owners_;
  FlowNetwork net_;
  EventQueue events_;
  int64_t popped_ = 0;
  int64_t executed_ = 0;
  struct IntervalAt {
    int32_t rank;
    bool comm;  // in intervals[1]
    int32_t index;
  };
  std::vector<IntervalAt> interval_at_;  // record_timeline: [interval id] where it is
};

}  // namespace sluice::sim_internal
