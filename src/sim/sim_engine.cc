// The event engine's run (sim_engine.h): the hosts walking their programs, the compute stream,
// point-to-point transfers, and the events that move them (collectives and all-to-alls:
// sim_engine_collectives.cc).
#include "sim/sim_engine.h"

#include <fmt/core.h>

#include <algorithm>

namespace sluice::sim_internal {

int32_t Engine::RecordInterval(int64_t rank, int64_t instr, StreamKind stream, Duration start,
                               Duration end, int32_t pred) {
  const bool comm = stream != StreamKind::kCompute;
  std::vector<IntervalRec>& list = ranks_[rank].intervals[comm];
  const int32_t id = static_cast<int32_t>(interval_at_.size());
  interval_at_.push_back({static_cast<int32_t>(rank), comm, static_cast<int32_t>(list.size())});
  list.push_back({start, end, static_cast<int32_t>(instr), id, pred, stream});
  return id;
}

bool Engine::Readable(int32_t rank, int64_t slot) {
  const Slot& s = ranks_[rank].slots[slot];
  if (!s.live) {
    Stop(rank, fmt::format("reads slot {}, which holds no buffer (its producer never ran)",
                           SlotId(rank, slot)));
    return false;
  }
  if (s.pending) {
    Stop(rank, fmt::format("reads slot {} before the receive that writes it finished (no "
                           "recv-*-finish before the reader)",
                           SlotId(rank, slot)));
    return false;
  }
  return true;
}

bool Engine::Allocate(int32_t rank, int64_t slot, Bytes bytes, bool activation) {
  Slot& s = ranks_[rank].slots[slot];
  if (s.live) {
    Stop(rank, fmt::format("writes slot {}, which still holds a buffer", SlotId(rank, slot)));
    return false;
  }
  s = Slot{};
  s.live = true;
  s.activation = activation;
  s.counted = options_.count_buffers;
  s.bytes = bytes;
  return true;
}

Duration Engine::RunOnCompute(int32_t rank, size_t instr, Duration duration, StreamKind stream) {
  RankState& r = ranks_[rank];
  const bool by_stream = r.tail >= r.host && r.tail_interval != kNoInterval;
  const Duration start = std::max(r.tail, r.host);
  const int32_t pred = by_stream ? r.tail_interval : r.host_pred;
  r.tail = start + duration;
  r.compute += duration;
  r.tail_interval = AddInterval(rank, static_cast<int64_t>(instr), stream, start, r.tail, pred);
  return start;
}

void Engine::IssueCompute(int32_t rank, const SimOp& in) {
  RankState& r = ranks_[rank];
  const size_t pc = r.pc;
  const int32_t* inputs = Inputs(in);
  const int32_t* outputs = Outputs(in);
  const int32_t n_out = NumOutputs(in);
  for (int32_t k = 0; k < in.n_in; ++k) {
    if (!Readable(rank, inputs[k])) return;
  }
  for (int32_t k = 0; k < n_out; ++k) {
    const int32_t s = outputs[k];
    if (r.slots[s].live) {
      Stop(rank, fmt::format("writes slot {}, which still holds a buffer", SlotId(rank, s)));
      return;
    }
  }
  const ChunkMemory& c = chunks_[in.aux];
  const Duration start = RunOnCompute(rank, pc, Duration::Nanos(in.value), StreamKind::kCompute);
  const Duration end = r.tail;
  const int64_t extra = std::max<int64_t>(0, c.peak - c.stored);
  // A segmented op (plan/moe_segments.h) starts at its first piece and ends at its last.
  const bool first = in.piece & kFirstPiece, last = in.piece & kLastPiece;
  // Deltas at the start, then at the end: the compute stream's list stays in time order.
  const bool forward = in.op == OpKind::kForward;
  if (forward) {
    for (int32_t k = 0; k < in.n_in; ++k) {
      Slot& slot = r.slots[inputs[k]];
      if (slot.activation && !slot.covered) {
        slot.covered = true;
        slot.cover_chunk = in.aux;
        if (slot.counted) Mem(r, start, -slot.bytes.count(), pc);
      }
    }
  }
  for (int32_t k = 0; k < n_out; ++k) {
    const int32_t s = outputs[k];
    Allocate(rank, s, in.bytes, forward);
    Slot& slot = r.slots[s];
    slot.ready = end;
    slot.writer = r.tail_interval;
    if (slot.counted) Mem(r, start, slot.bytes.count(), pc);
  }
  switch (in.op) {
    case OpKind::kForward:
      if (first) Mem(r, start, c.peak, pc);
      if (last) {
        Mem(r, end, -c.peak, pc);
        Mem(r, end, c.stored, pc);
      }
      break;
    case OpKind::kBackward:
      if (first) Mem(r, start, extra, pc);
      if (last) {
        Mem(r, end, -extra, pc);
        Mem(r, end, -c.stored, pc);
      }
      break;
    case OpKind::kBackwardInput:
      if (first) Mem(r, start, extra, pc);
      if (last) {
        Mem(r, end, -extra, pc);
        Mem(r, end, -(c.stored - c.stored_until_w), pc);
      }
      break;
    default:  // kBackwardWeight
      if (last) Mem(r, end, -c.stored_until_w, pc);
      break;
  }
  if (last && (in.op == OpKind::kBackward || in.op == OpKind::kBackwardInput)) {
    // The stage input leaves the stored activations with them: a buffer again until freed. (A
    // segmented op read it at its first piece, so every slot is looked at.)
    if (in.n_in > 0) {
      for (int32_t k = 0; k < in.n_in; ++k) {
        Slot& slot = r.slots[inputs[k]];
        if (slot.covered && slot.cover_chunk == in.aux) {
          slot.covered = false;
          if (slot.counted) Mem(r, end, slot.bytes.count(), pc);
        }
      }
    } else {
      for (Slot& slot : r.slots) {
        if (slot.live && slot.covered && slot.cover_chunk == in.aux) {
          slot.covered = false;
          if (slot.counted) Mem(r, end, slot.bytes.count(), pc);
        }
      }
    }
  }
}

void Engine::PostP2p(int32_t rank, const SimOp& in) {
  RankState& r = ranks_[rank];
  const int stream = P2pStreamOf(in.op);
  Post post;
  post.instr = static_cast<int32_t>(r.pc);
  post.peer = in.aux;
  post.tag = in.value;
  post.posted = r.host;
  post.posted_pred = r.host_pred;
  post.bytes = in.bytes;
  if (IsSend(in.op)) {
    // Data of a send: the slots it reads, ready when their writers end.
    const int32_t* inputs = Inputs(in);
    for (int32_t k = 0; k < in.n_in; ++k) {
      const int32_t s = inputs[k];
      if (!Readable(rank, s)) return;
      const Slot& slot = r.slots[s];
      if (slot.ready >= post.ready) {
        post.ready = slot.ready;
        post.ready_pred = slot.writer;
      }
    }
  } else {
    const int32_t s = Outputs(in)[0];
    if (!Allocate(rank, s, in.bytes, in.op == OpKind::kRecvActStart)) return;
    r.slots[s].pending = true;
    post.slot = static_cast<int32_t>(s);
    // The receive's buffer is allocated in compute-stream order, where the post reaches the
    // stream (as the runtime's torch::empty on the compute stream): memory stays in program order
    // (plan/memory_rule.h).
    if (r.slots[s].counted) Mem(r, std::max(r.tail, r.host), in.bytes.count(), r.pc);
  }
  r.p2p[stream].posts.push_back(post);
  r.open.push_back({in.value, in.aux, static_cast<int32_t>(r.p2p[stream].posts.size() - 1), in.op,
                    static_cast<int8_t>(stream)});
  if (IsSend(in.op)) {
    TryStartTransfer(rank, stream);
  } else {
    TryStartTransfer(in.aux, stream == kRecvPrev ? kSendNext : kSendPrev);
  }
}

void Engine::TryStartTransfer(int32_t sender, int send_stream) {
  RankState& a = ranks_[sender];
  P2pStream& ss = a.p2p[send_stream];
  if (ss.busy || ss.head >= ss.posts.size()) return;
  Post& sp = ss.posts[ss.head];
  const int32_t receiver = static_cast<int32_t>(sp.peer);
  const int recv_stream = send_stream == kSendNext ? kRecvPrev : kRecvNext;
  RankState& b = ranks_[receiver];
  P2pStream& rs = b.p2p[recv_stream];
  if (rs.busy || rs.head >= rs.posts.size()) return;
  Post& rp = rs.posts[rs.head];
  if (rp.peer != sender || rp.tag != sp.tag) return;  // not a pair: stays unmatched
  // Start at the latest of its conditions; the first latest one is the predecessor.
  Duration start = sp.ready;
  int32_t pred = sp.ready_pred;
  auto later = [&](Duration t, int32_t p) {
    if (t > start) {
      start = t;
      pred = p;
    }
  };
  later(ss.free_at, ss.last);
  later(rs.free_at, rs.last);
  later(sp.posted, sp.posted_pred);
  later(rp.posted, rp.posted_pred);
  Transfer t;
  t.src = sender;
  t.dst = receiver;
  t.src_stream = static_cast<int8_t>(send_stream);
  t.dst_stream = static_cast<int8_t>(recv_stream);
  t.src_post = static_cast<int32_t>(ss.head);
  t.dst_post = static_cast<int32_t>(rs.head);
  t.start = start;
  t.pred = pred;
  t.bytes = static_cast<double>(sp.bytes.count());
  const bool inter = Inter(sender, receiver);
  t.ports = {Port(sender, inter, false), Port(receiver, inter, true)};
  const int32_t id = static_cast<int32_t>(transfers_.size());
  sp.transfer = rp.transfer = id;
  ss.busy = rs.busy = true;
  ++ss.head;
  ++rs.head;
  transfers_.push_back(t);
  Push(start + Link(inter).latency, EventType::kTransferData, id);
}

void Engine::OnTransferData(int32_t t, Duration now) {
  const int32_t flow = net_.Open(transfers_[t].ports, now);
  if (static_cast<size_t>(flow) >= owners_.size()) owners_.resize(flow + 1);
  owners_[flow] = {FlowOwner::Kind::kTransfer, t};
  net_.SetBytes(flow, now, transfers_[t].bytes);
  DrainChanged();
}

void Engine::DrainChanged() {
  for (int32_t flow : net_.changed()) {
    if (net_.moving(flow))
      Push(net_.Completion(flow), EventType::kFlowDone, flow, net_.version(flow));
  }
  net_.ClearChanged();
}

void Engine::OnFlowDone(int32_t flow, uint32_t version, Duration now) {
  if (!net_.moving(flow) || net_.version(flow) != version) return;  // stale
  const FlowOwner owner = owners_[flow];
  if (owner.kind == FlowOwner::Kind::kTransfer) {
    net_.Close(flow, now);
    DrainChanged();
    CompleteTransfer(owner.id, now);
    return;
  }
  if (owner.kind == FlowOwner::Kind::kAllToAll) {
    net_.Close(flow, now);
    DrainChanged();
    A2aGroup& ag = a2a_groups_[owner.id];
    if (--ag.ops[ag.next].flows_left == 0) CompleteAllToAll(owner.id, now);
    return;
  }
  Group& g = groups_[owner.id];
  Collective& c = g.colls[g.next];
  if (--c.steps_left > 0) {
    net_.Pause(flow, now);
    Push(now + g.step_latency, EventType::kCollLatency, owner.id);
    return;
  }
  net_.Close(flow, now);
  DrainChanged();
  CompleteCollective(owner.id, now);
}

void Engine::CompleteTransfer(int32_t id, Duration now) {
  transfers_[id].end = now;
  transfers_[id].done = true;
  const Transfer t = transfers_[id];  // a copy: starting the next transfers grows transfers_
  RankState& a = ranks_[t.src];
  RankState& b = ranks_[t.dst];
  P2pStream& ss = a.p2p[t.src_stream];
  P2pStream& rs = b.p2p[t.dst_stream];
  Post& sp = ss.posts[t.src_post];
  Post& rp = rs.posts[t.dst_post];
  sp.done = rp.done = true;
  const int32_t si =
      AddInterval(t.src, sp.instr, StreamOfP2p(t.src_stream), t.start, t.end, t.pred);
  const int32_t ri =
      AddInterval(t.dst, rp.instr, StreamOfP2p(t.dst_stream), t.start, t.end, t.pred);
  ss.busy = rs.busy = false;
  ss.free_at = rs.free_at = now;
  ss.last = si;
  rs.last = ri;
  Slot& slot = b.slots[rp.slot];
  slot.pending = false;
  slot.ready = now;
  slot.writer = ri;
  for (RankState* r : {&a, &b}) {
    r->comm += t.end - t.start;
    r->comm_spans.push_back({t.start, t.end});
  }
  TryStartTransfer(t.src, t.src_stream);
  if (rs.head < rs.posts.size()) {
    TryStartTransfer(static_cast<int32_t>(rs.posts[rs.head].peer),
                     t.dst_stream == kRecvPrev ? kSendNext : kSendPrev);
  }
  auto waiting = [&](int32_t rank, int32_t stream, int32_t post) {
    const RankState& r = ranks_[rank];
    return r.wait == Wait::kPost && r.wait_stream == stream && r.wait_post == post;
  };
  if (waiting(t.src, t.src_stream, t.src_post)) Resume(t.src, now, si);
  if (waiting(t.dst, t.dst_stream, t.dst_post)) Resume(t.dst, now, ri);
}

void Engine::Resume(int32_t rank, Duration now, int32_t pred) {
  RankState& r = ranks_[rank];
  // Exposed communication: the compute stream idles from max(block, tail) to now while the
  // awaited communication is in flight.
  const Duration idle_from = std::max(r.blocked_at, r.blocked_tail);
  if (r.wait == Wait::kPost) {
    const Post& p = r.p2p[r.wait_stream].posts[r.wait_post];
    const Duration from = std::max(idle_from, transfers_[p.transfer].start);
    if (now > from) r.exposed += now - from;
  } else if (r.wait == Wait::kAllToAll) {
    // Exposed from when both the compute stream idled and the all-to-all started (waiting for
    // members that have not posted yet is imbalance, not communication).
    const A2aGroup& g = a2a_groups_[r.a2a_group];
    const Duration from = std::max(idle_from, g.ops[r.wait_a2a].start);
    if (now > from) {
      r.exposed += now - from;
      r.a2a_exposed += now - from;
    }
  } else {
    std::vector<std::pair<Duration, Duration>> recent;
    for (auto it = r.coll_spans.rbegin(); it != r.coll_spans.rend() && it->second > idle_from;
         ++it) {
      recent.push_back(*it);
    }
    r.exposed += UnionWithin(recent, idle_from, now);
  }
  if (r.wait == Wait::kPost || r.wait == Wait::kAllToAll) {
    // The Finish or the all-to-all is done; OptimizerStep runs again and proceeds.
    ++r.pc;
    ++executed_;
  }
  r.wait = Wait::kRunning;
  r.host = now;
  r.host_pred = pred;
  RunHost(rank, now);
}

void Engine::RunHost(int32_t rank, Duration now) {
  RankState& r = ranks_[rank];
  r.host = std::max(r.host, now);
  const size_t size = r.size;
  while (r.pc < size && r.wait == Wait::kRunning) {
    const SimOp& in = r.ops[r.pc];
    switch (in.op) {
      case OpKind::kForward:
      case OpKind::kBackward:
      case OpKind::kBackwardInput:
      case OpKind::kBackwardWeight:
        IssueCompute(rank, in);
        if (r.wait == Wait::kStopped) return;
        break;
      case OpKind::kLoadInput: {
        const Duration start =
            RunOnCompute(rank, r.pc, Duration::Nanos(in.value), StreamKind::kCompute);
        const int32_t n_out = NumOutputs(in);
        for (int32_t k = 0; k < n_out; ++k) {
          const int32_t s = Outputs(in)[k];
          if (!Allocate(rank, s, in.bytes, false)) return;
          r.slots[s].ready = r.tail;
          r.slots[s].writer = r.tail_interval;
          if (r.slots[s].counted) Mem(r, start, in.bytes.count(), r.pc);
        }
        break;
      }
      case OpKind::kFreeBuffer: {
        const int32_t slot = Inputs(in)[0];
        Slot& s = r.slots[slot];
        if (!s.live || s.pending) {
          return Stop(rank,
                      fmt::format("frees slot {}, which {}", SlotId(rank, slot),
                                  s.live ? "a receive in flight still writes" : "holds no buffer"));
        }
        if (s.counted && !s.covered) Mem(r, std::max(r.tail, r.host), -s.bytes.count(), r.pc);
        s.live = false;
        break;
      }
      case OpKind::kSendActStart:
      case OpKind::kSendGradStart:
      case OpKind::kRecvActStart:
      case OpKind::kRecvGradStart:
        PostP2p(rank, in);
        if (r.wait == Wait::kStopped) return;
        break;
      case OpKind::kSendActFinish:
      case OpKind::kSendGradFinish:
      case OpKind::kRecvActFinish:
      case OpKind::kRecvGradFinish: {
        const OpKind start_op = StartOf(in.op);
        auto it = std::find_if(r.open.begin(), r.open.end(), [&](const OpenPost& o) {
          return o.op == start_op && o.peer == in.aux && o.tag == in.value;
        });
        if (it == r.open.end()) {
          return Stop(rank, fmt::format("waits for a {} {} rank {} with tag {} that it never "
                                        "posted",
                                        OpKindName(start_op), IsSend(in.op) ? "to" : "from", in.aux,
                                        in.value));
        }
        const OpenPost open = *it;
        r.open.erase(it);
        if (!r.p2p[open.stream].posts[open.post].done) {
          r.wait = Wait::kPost;
          r.wait_stream = open.stream;
          r.wait_post = open.post;
          r.blocked_at = r.host;
          r.blocked_tail = r.tail;
          // The op after it runs when the transfer completes: fetch it while others run.
          __builtin_prefetch(r.ops + r.pc + 1);
          return;
        }
        break;
      }
      case OpKind::kAllReduceGrad:
      case OpKind::kReduceScatterGrad:
      case OpKind::kAllGatherParams:
        PostCollective(rank, in);
        if (r.wait == Wait::kStopped) return;
        break;
      case OpKind::kAllToAllDispatch:
      case OpKind::kAllToAllCombine:
        PostAllToAll(rank);
        if (r.wait == Wait::kStopped) return;
        if (r.wait == Wait::kAllToAll) {
          __builtin_prefetch(r.ops + r.pc + 1);
          return;
        }
        break;
      case OpKind::kAllToAllWait:
        WaitAllToAll(rank, in.value);
        if (r.wait == Wait::kStopped) return;
        if (r.wait == Wait::kAllToAll) return;
        break;
      case OpKind::kOptimizerStep:
        if (r.coll_pending > 0) {
          if (r.wait != Wait::kCollectives) {
            r.wait = Wait::kCollectives;
            r.blocked_at = r.host;
            r.blocked_tail = r.tail;
          }
          __builtin_prefetch(r.ops + r.pc + 1);
          return;
        }
        RunOnCompute(rank, r.pc, Duration::Nanos(in.value), StreamKind::kCompute);
        break;
    }
    ++r.pc;
    ++executed_;
  }
  if (r.pc >= size && r.wait != Wait::kDone) {
    r.wait = Wait::kDone;
    r.host_end = r.host;
  }
}

}  // namespace sluice::sim_internal
