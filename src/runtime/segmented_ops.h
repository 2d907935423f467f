// SegmentedOps: the segmented MoE ops (plan/moe_segments.h) of one rank's iteration, as the
// executor runs them (executor.cc). A segmented F, B or I runs the whole op's code (the
// executor's forward or backward, given as RunOp) in a Fiber (fiber.h) that stops where its MoE
// layers need an all-to-all's result (moe_exchange.h, SegmentChannel; at every slice boundary
// in a sliced piece): the op's first piece starts it, each later piece resumes it for one
// segment or slice, its last piece completes it. An all-to-all
// instruction of a segmented op posts the rows the fiber handed over (alltoall_base with the
// plan's splits); a blocking one (tag -1) completes at once, a posted one at its
// all-to-all-wait, and what arrived goes to the op for its next piece. Weight-gradient pieces
// are the executor's (they need its stage runs); Running tells it whether an I is still in
// flight. Slices of the expert segments and their all-to-alls (Tutel's capacity slices) run
// like whole ones, one piece and one all-to-all each. A forward whose pieces cut the tokens
// (the forward partition: a sliced even segment) runs its rows in n slices (the executor calls
// RunTokenSlices from the op's code; `whole.chunks` is n): each slice's forward in a fiber of its
// own, resumed by the piece of its slice (or, for a whole piece, each in turn), stopping at each
// all-to-all boundary (moe.h, MoePartition). A token slice's all-to-all exchanges its row counts
// first when the receivers do not know them (a dispatch), then moves exactly the slice's rows.
//
// Figures: exposed_ns is the time blocked in the blocking all-to-alls and the waits, span_ns
// from each post to its observed completion.
//
// Thread safety: the executor's thread; the fibers run only while it waits for them. Destroying
// it aborts every fiber still suspended (so it must go before the state the ops use).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "base/status.h"
#include "plan/execution_plan.h"
#include "runtime/comm.h"
#include "runtime/fiber.h"
#include "runtime/moe_exchange.h"
#include "runtime/trace_recorder.h"

namespace sluice::runtime {

// A Fiber for torch computation: its thread takes this process's intra-op thread count
// (torch::set_num_threads: `sluice train --threads`) before `body` runs. A new thread otherwise
// starts with OpenMP's default team (every core), and the BLAS calls in it (the GEMMs of a
// segmented op) would use it whatever --threads said.
std::unique_ptr<Fiber> NewComputeFiber(std::function<void()> body);

// From a token-sliced forward's code (running in its op's fiber, which PlanExchange::Bind bound):
// runs body(c, park) for c in [0, n), each in a fiber of its own, driven by the op's pieces (the
// slice of each piece, every slice for a whole one); `park` stops the calling slice until the
// executor runs its next piece. Returns once every body returned; rethrows a body's exception.
// Throws std::runtime_error when a piece names a slice that has completed, or a slice needs an
// all-to-all the plan has not completed before its piece.
void RunTokenSlices(int64_t n,
                    const std::function<void(int64_t slice, const std::function<void()>& park)>& body);

// A forward cut into n token slices of its rows (moe.h, MoePartition), from the op's code:
// each slice's Chunk::Forward on its rows (RunTokenSlices), the outputs joined (boundary
// activations concatenated; on the last stage, `last`, the losses summed), and the MoE counts
// and the load-balancing loss the whole micro-batch's, into *moe. Errors: n above the rows, a
// stage without MoE layers; throws as RunTokenSlices.
StatusOr<std::vector<at::Tensor>> TokenSlicedForward(
    const Chunk& chunk, const ModelSpec& model, int64_t n, const MicroBatchInputs& mb,
    const std::vector<at::Tensor>& inputs, const at::Tensor& labels, bool selective,
    WeightGradTape* tape, ExpertExchange* exchange, bool last, MoeContext* moe);

class SegmentedOps;

// The executor's pre-scan of a rank's program: attaches every all-to-all to the compute op it
// belongs to (`a2a_of`: a whole op's follow it, the last Forward, Backward or BackwardInput before
// it with only FreeBuffers and all-to-alls between), hands a segmented op's pieces and
// all-to-alls to `segmented` (they lie anywhere between its pieces and belong to the F of their
// (micro-batch, stage) until that F completes, then to its B or I), and records each stage's
// last backward instruction. Errors: slices the runtime does not run (a token slice outside a
// forward, or of a replayed one; a capacity slice of a split backward), and an all-to-all whose
// group is not `ep_group`; each names the instruction.
Status AttachAllToAlls(const RankProgram& program, const std::vector<int64_t>& ep_group,
                       SegmentedOps& segmented,
                       std::map<int64_t, std::vector<const Instruction*>>* a2a_of,
                       std::map<int64_t, int64_t>* last_backward);

class SegmentedOps {
 public:
  // (F 0 | B or I 1 | W 2, micro-batch, stage).
  using Key = std::tuple<int, int64_t, int64_t>;
  static Key KeyOf(const Instruction& in);
  // Runs an op's whole code: `whole` is its first piece with the last piece's outputs and
  // shapes, `a2a` its all-to-alls in order (null: none).
  using RunOp =
      std::function<Status(const Instruction& whole, const std::vector<const Instruction*>* a2a)>;

  // REQUIRES: every reference outlives this object.
  SegmentedOps(const RankProgram& program, Communicator& comm, Watchdog& watchdog,
               TraceRecorder& trace, std::function<int64_t()> now, int64_t iteration, RunOp run);
  SegmentedOps(const SegmentedOps&) = delete;
  SegmentedOps& operator=(const SegmentedOps&) = delete;

  // The pre-scan, in program order: a piece (a compute op with segment >= 0), and an all-to-all
  // that belongs to no whole op (to the F of its micro-batch and stage until that F completed,
  // `forward_done`, then to its B or I).
  void AddPiece(const Instruction& in, int64_t index);
  void AddAllToAll(const Instruction& in, int64_t index, bool forward_done);
  // kFirstPiece / kLastPiece (plan/moe_segments.h) of instruction `index`.
  uint8_t Role(int64_t index) const { return roles_.at(static_cast<size_t>(index)); }
  bool OwnsAllToAll(int64_t index) const { return a2a_owner_.count(index) > 0; }
  bool Running(const Key& key) const { return ops_.count(key) > 0; }

  // A piece of an F, B or I (instruction `index`).
  Status Piece(const Instruction& in, int64_t index);
  // A segmented op's all-to-all (instruction `index`); *bytes: what it moves.
  Status PostAllToAll(const Instruction& in, int64_t index, int64_t* bytes);
  Status Wait(const Instruction& in);

  size_t running() const { return ops_.size(); }
  size_t posted() const { return posted_.size(); }
  int64_t exposed_ns() const { return exposed_ns_; }
  int64_t span_ns() const { return span_ns_; }

 private:
  struct Op {
    Instruction whole;
    PlanExchange::OpState a2a;
    SegmentChannel channel;
    std::unique_ptr<Fiber> fiber;
    Status status;                   // what the op's code returned
    int64_t segment = -1;            // the last piece run
    int64_t chunk = -1, chunks = 0;  // its slice (-1, 0: whole)
  };
  struct Posted {
    Communicator::Handle handle;
    at::Tensor rows, out;  // sent (kept alive until it completes) and received
    Op* op = nullptr;
    const Instruction* in = nullptr;
    int64_t ticket = 0;
    int64_t posted_ns = 0;
  };
  // Waits for `p` (the wait is its exposed time) and hands what arrived to its op.
  Status Complete(Posted& p);

  const RankProgram& program_;
  Communicator& comm_;
  Watchdog& watchdog_;
  TraceRecorder& trace_;
  std::function<int64_t()> now_;
  const int64_t iteration_;
  RunOp run_;
  std::vector<uint8_t> roles_;
  std::map<Key, int64_t> last_piece_;
  std::map<Key, std::vector<const Instruction*>> a2a_;
  std::map<int64_t, Key> a2a_owner_;
  std::map<int64_t, Posted> posted_;  // [tag]
  std::map<Key, int64_t> token_slices_;  // [F] n of its token slices (-1: two different n)
  int64_t exposed_ns_ = 0, span_ns_ = 0;
  // Last: destroyed first, aborting any fiber still suspended.
  std::map<Key, std::unique_ptr<Op>> ops_;
};

}  // namespace sluice::runtime
