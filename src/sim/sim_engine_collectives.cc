// The event engine's collectives (sim_engine.h): a data-parallel group's collectives, matched post
// by post across its members and started in order once every member has posted; and
// expert-parallel all-to-alls, matched post by post (same splits) across the group and run as
// flows over the links.
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>

#include "sim/sim_engine.h"

namespace sluice::sim_internal {

void Engine::PostCollective(int32_t rank, const SimOp& in) {
  RankState& r = ranks_[rank];
  Group& g = groups_[r.program->pp_index];
  const size_t k = static_cast<size_t>(r.coll_posted++);
  const int64_t member = r.program->dp_index;
  if (k >= g.colls.size()) {
    Collective c;
    c.op = in.op;
    c.bytes = in.bytes;
    c.instr.assign(g.members.size(), -1);
    g.colls.push_back(std::move(c));
  }
  Collective& c = g.colls[k];
  if (c.op != in.op || c.bytes != in.bytes) {
    const int32_t other =
        g.members[std::find_if(c.instr.begin(), c.instr.end(), [](int32_t i) { return i >= 0; }) -
                  c.instr.begin()];
    --r.coll_posted;
    return Stop(rank, fmt::format("its collective #{} is {} of {} bytes, but rank {} posted {} of "
                                  "{} bytes as #{} of the data-parallel group",
                                  k, OpKindName(in.op), in.bytes.count(), other, OpKindName(c.op),
                                  c.bytes.count(), k));
  }
  c.instr[member] = static_cast<int32_t>(r.pc);
  ++c.posted;
  ++r.coll_pending;
  // The gradients are there once the compute issued before the post has run (the collective
  // stream waits for the compute stream, as ProcessGroupNCCL does).
  const bool by_stream = r.tail >= r.host && r.tail_interval != kNoInterval;
  const Duration ready = std::max(r.tail, r.host);
  if (c.posted == 1 || ready > c.ready) {
    c.ready = ready;
    c.ready_pred = by_stream ? r.tail_interval : r.host_pred;
  }
  TryStartCollective(r.program->pp_index);
}

void Engine::TryStartCollective(int32_t gi) {
  Group& g = groups_[gi];
  if (g.started || g.next >= g.colls.size()) return;
  Collective& c = g.colls[g.next];
  if (c.posted < static_cast<int64_t>(g.members.size())) return;
  g.started = true;
  c.start = c.ready;
  c.pred = c.ready_pred;
  if (g.prev_end > c.start) {
    c.start = g.prev_end;
    c.pred = g.prev_interval;
  }
  const int64_t n = g.ring;
  const CollectiveKind kind = c.op == OpKind::kAllReduceGrad       ? CollectiveKind::kAllReduce
                              : c.op == OpKind::kReduceScatterGrad ? CollectiveKind::kReduceScatter
                                                                   : CollectiveKind::kAllGather;
  if (n == 1 || options_.collectives == CollectiveMode::kClosedForm) {
    Push(c.start + comm_.Collective(kind, c.bytes, g.span), EventType::kCollDone, gi);
    return;
  }
  c.steps_left = kind == CollectiveKind::kAllReduce ? 2 * (n - 1) : n - 1;
  Push(c.start, EventType::kCollStart, gi);
}

void Engine::OnCollStart(int32_t gi, Duration now) {
  Group& g = groups_[gi];
  Collective& c = g.colls[g.next];
  c.flow = net_.Open(g.ports, now, g.weights);
  if (static_cast<size_t>(c.flow) >= owners_.size()) owners_.resize(c.flow + 1);
  owners_[c.flow] = {FlowOwner::Kind::kCollective, gi};
  DrainChanged();
  Push(now + g.step_latency, EventType::kCollLatency, gi);
}

void Engine::CompleteCollective(int32_t gi, Duration now) {
  Group& g = groups_[gi];
  Collective& c = g.colls[g.next];
  c.done = true;
  std::vector<int32_t> ids(g.members.size(), kNoInterval);
  for (size_t m = 0; m < g.members.size(); ++m) {
    RankState& r = ranks_[g.members[m]];
    ids[m] = AddInterval(g.members[m], c.instr[m], StreamKind::kCollective, c.start, now, c.pred);
    --r.coll_pending;
    r.comm += now - c.start;
    r.comm_spans.push_back({c.start, now});
    r.coll_spans.push_back({c.start, now});
  }
  g.prev_end = now;
  g.prev_interval = ids[0];
  ++g.next;
  g.started = false;
  for (size_t m = 0; m < g.members.size(); ++m) {
    const RankState& r = ranks_[g.members[m]];
    if (r.wait == Wait::kCollectives && r.coll_pending == 0) Resume(g.members[m], now, ids[m]);
  }
  TryStartCollective(gi);
}

void Engine::PostAllToAll(int32_t rank) {
  RankState& r = ranks_[rank];
  A2aGroup& g = a2a_groups_[r.a2a_group];
  const Instruction& in = r.program->instructions[r.pc];
  const size_t k = static_cast<size_t>(r.a2a_posted++);
  if (k >= g.ops.size()) {
    AllToAll a;
    a.instr.assign(g.members.size(), -1);
    g.ops.push_back(std::move(a));
  }
  AllToAll& a = g.ops[k];
  // Every member's k-th all-to-all must be the same one, and the splits must pair up.
  for (size_t m = 0; m < g.members.size(); ++m) {
    if (a.instr[m] < 0) continue;
    const Instruction& other = ranks_[g.members[m]].program->instructions[a.instr[m]];
    const size_t me = static_cast<size_t>(r.a2a_member);
    if (other.op != in.op || other.layer != in.layer || other.microbatch != in.microbatch ||
        other.chunk != in.chunk || other.chunks != in.chunks ||
        other.send_splits[me] != in.recv_splits[m] || other.recv_splits[me] != in.send_splits[m]) {
      --r.a2a_posted;
      return Stop(rank, fmt::format("its all-to-all #{} ({}, send [{}] recv [{}]) does not pair "
                                    "with rank {}'s #{} ({}, send [{}] recv [{}]) in their "
                                    "expert-parallel group",
                                    k, InstructionText(in), fmt::join(in.send_splits, ", "),
                                    fmt::join(in.recv_splits, ", "), g.members[m], k,
                                    InstructionText(other), fmt::join(other.send_splits, ", "),
                                    fmt::join(other.recv_splits, ", ")));
    }
  }
  a.instr[r.a2a_member] = static_cast<int32_t>(r.pc);
  ++a.posted;
  // The data is there once the compute issued before the post has run.
  const bool by_stream = r.tail >= r.host && r.tail_interval != kNoInterval;
  const Duration ready = std::max(r.tail, r.host);
  if (a.posted == 1 || ready > a.ready) {
    a.ready = ready;
    a.ready_pred = by_stream ? r.tail_interval : r.host_pred;
  }
  if (in.tag >= 0) {
    r.a2a_tags.push_back({in.tag, static_cast<int64_t>(k)});
  } else {
    r.wait = Wait::kAllToAll;
    r.wait_a2a = static_cast<int64_t>(k);
    r.blocked_at = r.host;
    r.blocked_tail = r.tail;
  }
  TryStartAllToAll(r.a2a_group);
}

void Engine::WaitAllToAll(int32_t rank, int64_t tag) {
  RankState& r = ranks_[rank];
  const auto it = std::find_if(r.a2a_tags.begin(), r.a2a_tags.end(),
                               [&](const auto& p) { return p.first == tag; });
  if (it == r.a2a_tags.end()) {
    return Stop(rank, fmt::format("waits for all-to-all tag {}, which it never posted", tag));
  }
  const int64_t k = it->second;
  r.a2a_tags.erase(it);
  if (a2a_groups_[r.a2a_group].ops[k].done) return;
  r.wait = Wait::kAllToAll;
  r.wait_a2a = k;
  r.blocked_at = r.host;
  r.blocked_tail = r.tail;
}

void Engine::TryStartAllToAll(int32_t gi) {
  A2aGroup& g = a2a_groups_[gi];
  if (g.started || g.next >= g.ops.size()) return;
  AllToAll& a = g.ops[g.next];
  const int64_t n = static_cast<int64_t>(g.members.size());
  if (a.posted < n) return;
  g.started = true;
  a.start = a.ready;
  a.pred = a.ready_pred;
  if (g.prev_end > a.start) {
    a.start = g.prev_end;
    a.pred = g.prev_interval;
  }
  Duration latency;
  bool spans = false;
  int64_t largest = 0;  // the most rows a member sends to the others
  for (int64_t i = 0; i < n; ++i) {
    const Instruction& in = ranks_[g.members[i]].program->instructions[a.instr[i]];
    int64_t rows = 0;
    for (int64_t j = 0; j < n; ++j) {
      if (j == i) continue;
      rows += in.send_splits[j];
      const bool inter = Inter(g.members[i], g.members[j]);
      spans = spans || inter;
      latency = std::max(latency, Link(inter).latency);
    }
    largest = std::max(largest, rows);
  }
  // A token slice's dispatch exchanges the row counts first: one more round of latencies.
  const RankState& first = ranks_[g.members[0]];
  const bool counted = !first.counted_a2a.empty() &&
                       first.counted_a2a[static_cast<size_t>(a.instr[0])] != 0;
  if (options_.collectives == CollectiveMode::kClosedForm) {
    // (n-1) latencies + the busiest member's remote bytes over the slowest link it uses: the
    // α-β all-to-all (cost/comm_model.h) with unequal splits.
    Duration d = comm_.PointToPoint(Bytes::Of(2 * plan_.model.hidden * largest), spans) +
                 comm_.PointToPoint(Bytes::Zero(), spans) * (n - 2);
    if (counted) d += comm_.PointToPoint(Bytes::Zero(), spans) * (n - 1);
    Push(a.start + d, EventType::kA2aDone, gi);
    return;
  }
  Push(a.start + latency * ((n - 1) * (counted ? 2 : 1)), EventType::kA2aStart, gi);
}

void Engine::OnAllToAllStart(int32_t gi, Duration now) {
  A2aGroup& g = a2a_groups_[gi];
  AllToAll& a = g.ops[g.next];
  const int64_t n = static_cast<int64_t>(g.members.size());
  const double row_bytes = 2.0 * static_cast<double>(plan_.model.hidden);
  for (int64_t i = 0; i < n; ++i) {
    const Instruction& in = ranks_[g.members[i]].program->instructions[a.instr[i]];
    for (int64_t j = 0; j < n; ++j) {
      if (j == i || in.send_splits[j] == 0) continue;
      const bool inter = Inter(g.members[i], g.members[j]);
      const std::array<int32_t, 2> ports = {Port(g.members[i], inter, false),
                                            Port(g.members[j], inter, true)};
      const int32_t flow = net_.Open(ports, now);
      if (static_cast<size_t>(flow) >= owners_.size()) owners_.resize(flow + 1);
      owners_[flow] = {FlowOwner::Kind::kAllToAll, gi};
      net_.SetBytes(flow, now, static_cast<double>(in.send_splits[j]) * row_bytes);
      ++a.flows_left;
    }
  }
  if (a.flows_left == 0) return CompleteAllToAll(gi, now);
  DrainChanged();
}

void Engine::CompleteAllToAll(int32_t gi, Duration now) {
  A2aGroup& g = a2a_groups_[gi];
  AllToAll& a = g.ops[g.next];
  a.done = true;
  std::vector<int32_t> ids(g.members.size(), kNoInterval);
  for (size_t m = 0; m < g.members.size(); ++m) {
    RankState& r = ranks_[g.members[m]];
    ids[m] = AddInterval(g.members[m], a.instr[m], StreamKind::kAllToAll, a.start, now, a.pred);
    r.comm += now - a.start;
    r.a2a += now - a.start;
    r.comm_spans.push_back({a.start, now});
  }
  g.prev_end = now;
  g.prev_interval = ids[0];
  ++g.next;
  g.started = false;
  const int64_t k = static_cast<int64_t>(g.next - 1);
  for (size_t m = 0; m < g.members.size(); ++m) {
    const RankState& r = ranks_[g.members[m]];
    if (r.wait == Wait::kAllToAll && r.wait_a2a == k) Resume(g.members[m], now, ids[m]);
  }
  TryStartAllToAll(gi);
}

}  // namespace sluice::sim_internal
