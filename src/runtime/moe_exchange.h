// PlanExchange: the executor's side of expert parallelism (model.h ExpertExchange). It serves the
// all-to-alls of the compute op a thread is running from the plan's instructions, in two modes:
//  - a whole compute op (the lowering's form): the op's all-to-alls follow it in the program and
//    are performed synchronously inside it, on the calling (main) thread: alltoall_base on the
//    ep group, waited for at once;
//  - a segmented op (an MoE-overlap pass's rewrite, plan/moe_segments.h): the op runs in a Fiber
//    (fiber.h) and each all-to-all (or slice of one, Post) it reaches is handed to the executor
//    through its SegmentChannel; the fiber suspends when it needs a result not delivered yet
//    (Wait), the executor posts each all-to-all when the program reaches it (blocking, or
//    posted and waited for at its all-to-all-wait) and resumes the fiber, with what arrived, at
//    the op's next piece.
// Either way the layer's kind, MoE layer and split sizes are checked against the plan's
// instruction, so no sizes are exchanged at run time; except for a token slice of a partitioned
// forward (PostTokenSlice), which moves what its routing gave: a dispatch slice's row counts are
// exchanged first (segmented_ops.h).
//
// Which op a call belongs to is per thread: the main thread's whole ops use the exchange's own
// state, a fiber binds its op's state (Bind) before it runs. The autograd function of an
// all-to-all keeps a pointer to the exchange and calls it from the backward, so the backward's
// all-to-alls reach the state of the op running that backward.
//
// Thread safety: one thread at a time (the executor's thread and its fibers take turns).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "plan/instruction.h"
#include "runtime/comm.h"
#include "runtime/fiber.h"
#include "runtime/model.h"
#include "runtime/trace_recorder.h"

namespace sluice::runtime {

// Between a segmented op's fiber and the executor. The op hands over what it posts (in its
// order, which must be the plan's) and stops when it needs a result the executor has not
// delivered yet; the executor posts each when the program reaches its instruction and delivers
// what arrived (PlanExchange::OpState::results) when it completes.
struct SegmentChannel {
  struct Request {
    const Instruction* in = nullptr;  // the plan's all-to-all (or slice of one)
    at::Tensor rows;                  // what it sends
    int64_t ticket = 0;               // where its result goes
    // A token slice (ExpertExchange::PostTokenSlice): its own splits (empty: the plan's), and
    // the row counts [ep, local] to exchange first when the receive splits are not known yet.
    std::vector<int64_t> send_splits, recv_splits;
    at::Tensor counts;
  };
  Fiber* fiber = nullptr;
  std::deque<Request> posts;      // handed over, not yet posted by the executor
  std::vector<int64_t> awaiting;  // the tickets the fiber stopped for (empty: not stopped)
  // Set by the executor before each piece: the piece is a slice (chunks > 0), so every wait
  // ends it, also when the results are already there (a slice's work is one slice's).
  bool slice_piece = false;
  // Set by the executor before each piece: its slice (-1: whole). A token-sliced forward
  // (RunTokenSlices) runs that slice's fiber, or every slice's, and then stops by itself
  // (`yielded`) rather than in a wait.
  int64_t piece_chunk = -1;
  bool yielded = false;
};

// Waits for the all-to-all `in` posted at `posted_ns` (announced to the watchdog, which names the
// group member that keeps it on a timeout), records it on the collective stream from its post to
// its completion, and returns the time blocked in the wait (ns). Errors name the instruction and
// the iteration. Whole ops (PlanExchange) and segmented ops (segmented_ops.h) both wait here.
// `record` false: no trace event (a token slice's count exchange, part of its all-to-all).
StatusOr<int64_t> AwaitAllToAll(Communicator& comm, Watchdog& watchdog, TraceRecorder& trace,
                                const Instruction& in, Communicator::Handle& handle,
                                int64_t posted_ns, int64_t iteration,
                                const std::function<int64_t()>& now, bool record = true);

class PlanExchange final : public ExpertExchange {
 public:
  // The all-to-alls of one compute op.
  struct OpState {
    const std::vector<const Instruction*>* list = nullptr;  // in the op's order
    size_t next = 0;
    std::vector<at::Tensor>* record = nullptr;        // keep what each received
    const std::vector<at::Tensor>* replay = nullptr;  // answer from these
    WeightGradTape* tape = nullptr;         // a forward's: set_segment(next) after each all-to-all
    SegmentChannel* channel = nullptr;      // segmented op: hand all-to-alls to the executor
    std::map<int64_t, at::Tensor> results;  // [ticket: the all-to-all's index in `list`]
    std::map<int64_t, at::Tensor> counts;   // [ticket] what a token slice's count exchange got
  };

  PlanExchange(Communicator& comm, Watchdog& watchdog, TraceRecorder& trace,
               std::function<int64_t()> now, int64_t iteration)
      : comm_(comm),
        watchdog_(watchdog),
        trace_(trace),
        now_(std::move(now)),
        iteration_(iteration) {}

  // From a fiber's thread, before its op runs: its calls use `state` (the main thread's use the
  // exchange's own).
  static void Bind(OpState* state);
  // The state this thread's calls use (null: the exchange's own, a whole op's).
  static OpState* Bound();

  // The all-to-alls the compute op about to run performs, in order; `tape`: the forward's.
  void Begin(const std::vector<const Instruction*>* list, WeightGradTape* tape = nullptr);
  // A forward that the backward replays (recompute "full"): also keep what each all-to-all
  // received in `cache`.
  void Record(std::vector<at::Tensor>* cache);
  // The replay of such a forward: the same all-to-alls (`list`, the forward's) answered from
  // `cache` without communicating: the members' rows are the ones they sent in the forward, and
  // the plan lists no all-to-all for a replay.
  void BeginReplay(const std::vector<const Instruction*>* list,
                   const std::vector<at::Tensor>* cache, WeightGradTape* tape);
  // How many of them ran; none may be left.
  Status End(std::string_view what);
  // Whether a whole op performed `in`.
  bool Performed(const Instruction* in) const { return performed_.count(in) > 0; }
  // Time spent inside the synchronous all-to-alls of whole ops.
  int64_t nanos() const { return nanos_; }

  std::vector<int64_t> NextRecvSplits(OpKind kind, int64_t layer) override;
  int64_t NextSlices(OpKind kind, int64_t layer) override;
  at::Tensor Exchange(OpKind kind, int64_t layer, const at::Tensor& rows,
                      const std::vector<int64_t>& send, const std::vector<int64_t>& recv) override;
  int64_t Post(OpKind kind, int64_t layer, int64_t slice, const at::Tensor& rows,
               const std::vector<int64_t>& send, const std::vector<int64_t>& recv) override;
  int64_t PostTokenSlice(OpKind kind, int64_t layer, int64_t slice, const at::Tensor& rows,
                         const at::Tensor& send_counts, const at::Tensor& recv_counts) override;
  at::Tensor ReceivedCounts(int64_t ticket) override;
  std::vector<at::Tensor> Wait(const std::vector<int64_t>& tickets) override;

 private:
  OpState& State();
  const Instruction& Expect(OpKind kind, int64_t layer);
  // Post for a whole all-to-all (slice -1) or a slice.
  int64_t PostOne(OpKind kind, int64_t layer, int64_t slice, const at::Tensor& rows,
                  const std::vector<int64_t>& send, const std::vector<int64_t>& recv);
  at::Tensor Synchronous(const Instruction& in, const at::Tensor& rows,
                         const std::vector<int64_t>& send, const std::vector<int64_t>& recv);

  Communicator& comm_;
  Watchdog& watchdog_;
  TraceRecorder& trace_;
  std::function<int64_t()> now_;
  const int64_t iteration_;
  OpState main_;
  std::set<const Instruction*> performed_;
  int64_t nanos_ = 0;
};

// The sums of each row of a 2-D integer tensor (a members x experts count matrix: the rows each
// member sends or receives).
std::vector<int64_t> RowSums(const at::Tensor& counts);

}  // namespace sluice::runtime
