#include "runtime/segmented_ops.h"

#include <ATen/Parallel.h>
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <exception>
#include <set>
#include <stdexcept>
#include <utility>

#include "plan/instruction.h"
#include "plan/moe_segments.h"
#include "runtime/moe.h"

namespace sluice::runtime {

SegmentedOps::Key SegmentedOps::KeyOf(const Instruction& in) {
  const int cls = in.op == OpKind::kForward ? 0 : (in.op == OpKind::kBackwardWeight ? 2 : 1);
  return {cls, in.microbatch, in.stage};
}

StatusOr<std::vector<at::Tensor>> TokenSlicedForward(
    const Chunk& chunk, const ModelSpec& model, int64_t n, const MicroBatchInputs& mb,
    const std::vector<at::Tensor>& inputs, const at::Tensor& labels, bool selective,
    WeightGradTape* tape, ExpertExchange* exchange, bool last, MoeContext* moe) {
  const int64_t rows = mb.tokens.size(0);
  if (!chunk.has_moe() || n > rows) {
    return InvalidArgumentError(fmt::format(
        "the op is cut into {} token slices, but its micro-batch has {} rows{}", n, rows,
        chunk.has_moe() ? "" : " and its stage no MoE layer"));
  }
  MoePartition partition(n, rows);
  const auto N = static_cast<size_t>(n);
  std::vector<MicroBatchInputs> mbs;
  std::vector<std::vector<at::Tensor>> ins(N), outs(N);
  std::vector<at::Tensor> labs(N);
  std::vector<MoeContext> ctx(N);
  int64_t start = 0;
  for (size_t k = 0; k < N; ++k) {
    const int64_t len = SplitPart(rows, static_cast<int64_t>(k), n);
    mbs.push_back(SliceRows(mb, start, len));
    for (const at::Tensor& x : inputs) ins[k].push_back(x.narrow(0, start, len));
    if (labels.defined()) labs[k] = labels.narrow(0, start, len);
    ctx[k].exchange = exchange;
    ctx[k].partition = &partition;
    ctx[k].slice = static_cast<int64_t>(k);
    start += len;
  }
  RunTokenSlices(n, [&](int64_t c, const std::function<void()>& park) {
    const auto k = static_cast<size_t>(c);
    ctx[k].park = park;
    if (tape != nullptr) tape->set_segment(0);
    outs[k] = chunk.Forward(ins[k], labs[k], mbs[k], selective, tape, &ctx[k]);
  });
  moe->aux_loss = partition.AuxLoss(model, mb.loss_scale);
  moe->assignments = partition.assignments();
  moe->dropped = partition.dropped();
  std::vector<at::Tensor> joined;
  for (size_t j = 0; j < outs.front().size(); ++j) {
    std::vector<at::Tensor> parts;
    for (const auto& o : outs) parts.push_back(o.at(j));
    joined.push_back(last ? at::stack(parts).sum() : at::cat(parts));
  }
  return joined;
}

Status AttachAllToAlls(const RankProgram& program, const std::vector<int64_t>& ep_group,
                       SegmentedOps& segmented,
                       std::map<int64_t, std::vector<const Instruction*>>* a2a_of,
                       std::map<int64_t, int64_t>* last_backward) {
  auto Key = [](const Instruction& in) { return std::make_pair(in.microbatch, in.stage); };
  // Slices: token slices (a sliced segment before or after the experts: the forward
  // partition) in forward ops only, not replayed; capacity slices of the expert segments and
  // their all-to-alls (Tutel's) in F and B only: a split backward takes its weight gradients
  // from a tape the sliced experts do not write.
  std::set<std::pair<int64_t, int64_t>> token_sliced;
  for (size_t i = 0; i < program.instructions.size(); ++i) {
    const Instruction& in = program.instructions[i];
    if (in.chunks <= 0 || !IsCompute(in.op)) continue;
    if (IsTokenSlice(in)) {
      if (in.op != OpKind::kForward || in.recompute == Recompute::kFull) {
        return FailedPreconditionError(fmt::format(
            "instruction {} ({}) is a token slice ({} of {}) of a {}{}: the runtime runs the "
            "forward partition's token slices (--moe-overlap partition, lancet) in forward ops "
            "that are not replayed (docs/moe.md, \"Token slices\")",
            i, InstructionText(in), in.chunk, in.chunks, OpKindName(in.op),
            in.recompute == Recompute::kFull ? " with recompute full" : ""));
      }
      token_sliced.insert(Key(in));
      continue;
    }
    if (in.op == OpKind::kForward && token_sliced.count(Key(in)) > 0) continue;
    if (in.op != OpKind::kForward && in.op != OpKind::kBackward) {
      return FailedPreconditionError(fmt::format(
          "instruction {} ({}) is a capacity slice ({} of {}) of a {}: the runtime runs "
          "sliced experts in forward and backward ops only, not in a split backward (a "
          "zero-bubble schedule's I and W take the experts' weight gradients from a tape "
          "that sliced experts do not write); use a 1F1B-style schedule with --moe-overlap "
          "tutel (docs/moe.md)",
          i, InstructionText(in), in.chunk, in.chunks, OpKindName(in.op)));
    }
  }
  int64_t owner = -1;
  std::set<std::pair<int64_t, int64_t>> forward_done;
  for (size_t i = 0; i < program.instructions.size(); ++i) {
    const Instruction& in = program.instructions[i];
    const auto idx = static_cast<int64_t>(i);
    if (IsCompute(in.op) && in.op != OpKind::kForward) {
      (*last_backward)[in.stage] = idx;
    }
    if (IsCompute(in.op) && in.segment >= 0) {
      segmented.AddPiece(in, idx);
      if (in.op == OpKind::kForward && (segmented.Role(idx) & kLastPiece) != 0) {
        forward_done.insert(Key(in));
      }
      owner = -1;
      continue;
    }
    if (IsAllToAll(in.op)) {
      if (ep_group != in.group) {
        return InvalidArgumentError(fmt::format(
            "instruction {} ({}): group [{}], but this rank's expert-parallel group is [{}]", i,
            InstructionText(in), fmt::join(in.group, ", "), fmt::join(ep_group, ", ")));
      }
      const Instruction* c = owner >= 0 ? &program.instructions[owner] : nullptr;
      if (c != nullptr && c->microbatch == in.microbatch && c->stage == in.stage &&
          in.tag < 0) {
        (*a2a_of)[owner].push_back(&in);
        continue;
      }
      segmented.AddAllToAll(in, idx, forward_done.count(Key(in)) > 0);
      continue;
    }
    if (IsCompute(in.op) && in.op != OpKind::kBackwardWeight) {
      owner = idx;
      if (in.op == OpKind::kForward) forward_done.insert(Key(in));
    } else if (in.op != OpKind::kFreeBuffer) {
      owner = -1;
    }
  }
  return Status::Ok();
}

SegmentedOps::SegmentedOps(const RankProgram& program, Communicator& comm, Watchdog& watchdog,
                           TraceRecorder& trace, std::function<int64_t()> now, int64_t iteration,
                           RunOp run)
    : program_(program),
      comm_(comm),
      watchdog_(watchdog),
      trace_(trace),
      now_(std::move(now)),
      iteration_(iteration),
      run_(std::move(run)),
      roles_(PieceRoles(program)) {}

void SegmentedOps::AddPiece(const Instruction& in, int64_t index) {
  if (in.op != OpKind::kBackwardWeight) last_piece_[KeyOf(in)] = index;
  if (in.op == OpKind::kForward && IsTokenSlice(in)) {
    auto [it, added] = token_slices_.emplace(KeyOf(in), in.chunks);
    if (!added && it->second != in.chunks) it->second = -1;
  }
}

std::unique_ptr<Fiber> NewComputeFiber(std::function<void()> body) {
  return std::make_unique<Fiber>([body = std::move(body)] {
    at::init_num_threads();  // this thread's OpenMP team: the process's torch::set_num_threads
    body();
  });
}

void RunTokenSlices(
    int64_t n, const std::function<void(int64_t slice, const std::function<void()>& park)>& body) {
  PlanExchange::OpState* state = PlanExchange::Bound();
  if (state == nullptr || state->channel == nullptr || state->channel->fiber == nullptr) {
    throw std::runtime_error("token slices run in a segmented op's fiber");
  }
  SegmentChannel& ch = *state->channel;
  Fiber* const op_fiber = ch.fiber;
  std::vector<std::unique_ptr<Fiber>> fibers;
  for (int64_t c = 0; c < n; ++c) {
    fibers.push_back(NewComputeFiber([state, c, &body, &fibers] {
      PlanExchange::Bind(state);
      body(c, [c, &fibers] { fibers[static_cast<size_t>(c)]->Suspend(); });
    }));
  }
  for (;;) {
    const int64_t chunk = ch.piece_chunk;
    if (chunk >= n) {
      throw std::runtime_error(fmt::format("a piece of slice {} of an op cut into {}", chunk, n));
    }
    ch.slice_piece = false;
    for (int64_t c = chunk >= 0 ? chunk : 0; c < (chunk >= 0 ? chunk + 1 : n); ++c) {
      Fiber& f = *fibers[static_cast<size_t>(c)];
      if (f.finished()) {
        if (chunk >= 0) {
          throw std::runtime_error(
              fmt::format("slice {} has run its last segment; the plan has another piece of it", c));
        }
        continue;
      }
      ch.fiber = &f;
      f.Resume();
      ch.fiber = op_fiber;
      if (f.error()) std::rethrow_exception(f.error());
      if (!ch.awaiting.empty()) {
        const int64_t t = ch.awaiting.front();
        throw std::runtime_error(fmt::format(
            "token slice {} needs {} complete before this piece",
            c, InstructionText(*(*state->list)[static_cast<size_t>(t)])));
      }
    }
    bool done = true;
    for (const auto& f : fibers) done = done && f->finished();
    if (done) return;
    ch.yielded = true;
    op_fiber->Suspend();
    ch.yielded = false;
  }
}

void SegmentedOps::AddAllToAll(const Instruction& in, int64_t index, bool forward_done) {
  const Key key{forward_done ? 1 : 0, in.microbatch, in.stage};
  a2a_[key].push_back(&in);
  a2a_owner_[index] = key;
}

Status SegmentedOps::Piece(const Instruction& in, int64_t index) {
  const Key key = KeyOf(in);
  const uint8_t role = Role(index);
  Op* op = nullptr;
  if ((role & kFirstPiece) != 0) {
    if (in.segment != 0) {
      return InvalidArgumentError(fmt::format(
          "the op's first piece is segment {}; the runtime runs a segmented op's segments in "
          "order from 0",
          in.segment));
    }
    auto made = std::make_unique<Op>();
    op = made.get();
    op->whole = in;
    op->whole.segment = -1;
    op->whole.chunk = -1;
    const auto slices = token_slices_.find(key);
    op->whole.chunks = slices == token_slices_.end() ? 0 : slices->second;
    if (op->whole.chunks < 0) {
      return InvalidArgumentError(
          "the op's token slices are not one cut: its segments are cut into different numbers "
          "of slices (the runtime cuts a partitioned forward's rows once)");
    }
    const Instruction& last = program_.instructions.at(static_cast<size_t>(last_piece_.at(key)));
    op->whole.outputs = last.outputs;
    op->whole.shapes = last.shapes;
    const auto a2a = a2a_.find(key);
    const std::vector<const Instruction*>* list = a2a == a2a_.end() ? nullptr : &a2a->second;
    op->a2a.channel = &op->channel;
    op->fiber = NewComputeFiber([this, op, list] {
      PlanExchange::Bind(&op->a2a);
      try {
        op->status = run_(op->whole, list);
      } catch (const FiberAborted&) {
        throw;
      } catch (const std::exception& e) {
        op->status = InternalError(e.what());
      }
    });
    op->channel.fiber = op->fiber.get();
    if (!ops_.emplace(key, std::move(made)).second) {
      return InvalidArgumentError("this op is already running (a second first piece)");
    }
  } else {
    const auto it = ops_.find(key);
    if (it == ops_.end()) {
      return InvalidArgumentError("a piece of an op that is not running (its first piece?)");
    }
    op = it->second.get();
    const bool more_slices = op->chunks > 0 && op->chunk + 1 < op->chunks;
    const int64_t want_segment = more_slices ? op->segment : op->segment + 1;
    const int64_t want_chunk = more_slices ? op->chunk + 1 : (in.chunks > 0 ? 0 : -1);
    if (in.segment != want_segment || in.chunk != want_chunk) {
      return InvalidArgumentError(fmt::format(
          "segment {}{} after segment {}{}: the runtime runs a segmented op's segments, and the "
          "slices of each, in order",
          in.segment, in.chunks > 0 ? fmt::format(" slice {}", in.chunk) : "", op->segment,
          op->chunks > 0 ? fmt::format(" slice {}", op->chunk) : ""));
    }
    for (const int64_t t : op->channel.awaiting) {
      if (op->a2a.results.count(t) > 0) continue;
      const Instruction* need = (*op->a2a.list)[static_cast<size_t>(t)];
      bool queued = false;
      for (const auto& r : op->channel.posts) queued = queued || r.ticket == t;
      return InvalidArgumentError(fmt::format(
          "segment {}{} needs {} complete before it ({})", in.segment,
          in.chunks > 0 ? fmt::format(" slice {}", in.chunk) : "", InstructionText(*need),
          queued ? "not posted yet" : "posted, not waited for"));
    }
  }
  op->segment = in.segment;
  op->chunk = in.chunk;
  op->chunks = in.chunks;
  op->channel.slice_piece = in.chunks > 0;
  op->channel.piece_chunk = in.chunks > 0 ? in.chunk : -1;
  op->fiber->Resume();
  if (op->fiber->error()) std::rethrow_exception(op->fiber->error());
  if (op->fiber->finished()) {
    const Status s = op->status;
    ops_.erase(key);
    SLUICE_RETURN_IF_ERROR(s);
    if ((role & kLastPiece) == 0) {
      return InvalidArgumentError(fmt::format(
          "the op completed at segment {}, but the plan has more pieces of it (does the plan's "
          "model match?)",
          in.segment));
    }
    return Status::Ok();
  }
  if ((role & kLastPiece) != 0 || (op->channel.awaiting.empty() && !op->channel.yielded)) {
    return InvalidArgumentError(
        fmt::format("the op did not complete at its last piece (segment {}): it waits for another "
                    "all-to-all (does the plan's model match?)",
                    in.segment));
  }
  return Status::Ok();
}

Status SegmentedOps::PostAllToAll(const Instruction& in, int64_t index, int64_t* bytes) {
  const auto it = ops_.find(a2a_owner_.at(index));
  if (it == ops_.end() || it->second->channel.posts.empty() ||
      it->second->channel.posts.front().in != &in) {
    return InvalidArgumentError(
        fmt::format("the MoE op this all-to-all belongs to has not reached it ({})",
                    it == ops_.end() ? "the op is not running"
                    : it->second->channel.posts.empty()
                        ? "it has handed over no all-to-all to post"
                        : "its next is " + InstructionText(*it->second->channel.posts.front().in)));
  }
  Op& op = *it->second;
  SegmentChannel::Request req = std::move(op.channel.posts.front());
  op.channel.posts.pop_front();
  Posted p;
  p.op = &op;
  p.in = &in;
  p.rows = std::move(req.rows);
  p.ticket = req.ticket;
  p.posted_ns = now_();
  std::vector<int64_t> send = req.send_splits.empty() ? in.send_splits : req.send_splits;
  std::vector<int64_t> recv = req.recv_splits.empty() ? in.recv_splits : req.recv_splits;
  *bytes = in.bytes.count();
  if (req.counts.defined()) {
    // A token slice of a dispatch: the members' row counts first (blocking: its time is exposed).
    at::Tensor got = torch::empty_like(req.counts);
    const std::vector<int64_t> ones(static_cast<size_t>(req.counts.size(0)), 1);
    SLUICE_ASSIGN_OR_RETURN(Communicator::Handle h,
                            comm_.AllToAllEp(got, req.counts, ones, ones));
    SLUICE_ASSIGN_OR_RETURN(const int64_t waited,
                            AwaitAllToAll(comm_, watchdog_, trace_, in, h, p.posted_ns,
                                          iteration_, now_, /*record=*/false));
    exposed_ns_ += waited;
    recv = RowSums(got);
    op.a2a.counts[p.ticket] = got;
  }
  if (!req.send_splits.empty()) {  // a token slice moves what its routing gave
    int64_t rows = 0;
    for (const int64_t r : send) rows += r;
    *bytes = rows * p.rows.size(1) * p.rows.element_size();
  }
  int64_t total = 0;
  for (const int64_t r : recv) total += r;
  p.out = torch::empty({total, p.rows.size(1)}, p.rows.options());
  SLUICE_ASSIGN_OR_RETURN(p.handle, comm_.AllToAllEp(p.out, p.rows, recv, send));
  if (in.tag < 0) return Complete(p);
  if (!posted_.emplace(in.tag, std::move(p)).second) {
    return InvalidArgumentError(fmt::format("all-to-all tag {} is already in flight", in.tag));
  }
  return Status::Ok();
}

Status SegmentedOps::Wait(const Instruction& in) {
  auto it = posted_.find(in.tag);
  if (it == posted_.end()) {
    return InvalidArgumentError(fmt::format("no posted all-to-all has tag {}", in.tag));
  }
  Posted p = std::move(it->second);
  posted_.erase(it);
  return Complete(p);
}

Status SegmentedOps::Complete(Posted& p) {
  SLUICE_ASSIGN_OR_RETURN(
      const int64_t waited,
      AwaitAllToAll(comm_, watchdog_, trace_, *p.in, p.handle, p.posted_ns, iteration_, now_));
  exposed_ns_ += waited;
  span_ns_ += now_() - p.posted_ns;
  p.op->a2a.results[p.ticket] = p.out;
  return Status::Ok();
}

}  // namespace sluice::runtime
