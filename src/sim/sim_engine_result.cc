// The Engine's event loop (Engine::Run) and its hand-over into a SimResult: deadlock report,
// per-rank figures, memory sweep, critical path and timeline.
#include <fmt/core.h>

#include <algorithm>

#include "sim/sim_engine.h"

namespace sluice::sim_internal {

std::string Engine::WaitReason(int32_t rank) const {
  const RankState& r = ranks_[rank];
  switch (r.wait) {
    case Wait::kStopped:
      return r.stop_reason;
    case Wait::kCollectives: {
      const Group& g = groups_[r.program->pp_index];
      std::string missing;
      if (g.next < g.colls.size()) {
        const Collective& c = g.colls[g.next];
        for (size_t m = 0; m < g.members.size(); ++m) {
          if (c.instr[m] < 0)
            missing += fmt::format("{}{}", missing.empty() ? "" : ", ", g.members[m]);
        }
      }
      return fmt::format(
          "waits for its {} collective(s); the group's next one{}", r.coll_pending,
          missing.empty() ? " never completes" : " is not posted by rank(s) " + missing);
    }
    case Wait::kAllToAll: {
      const A2aGroup& g = a2a_groups_[r.a2a_group];
      const AllToAll& a = g.ops[r.wait_a2a];
      std::string missing;
      for (size_t m = 0; m < g.members.size(); ++m) {
        if (a.instr[m] < 0) {
          missing += fmt::format("{}{}", missing.empty() ? "" : ", ", g.members[m]);
        }
      }
      return fmt::format("waits for all-to-all #{} of its expert-parallel group{}",
                         r.wait_a2a,
                         missing.empty() ? ", which never completes"
                                         : ", which rank(s) " + missing + " never post");
    }
    case Wait::kPost: {
      const Post& p = r.p2p[r.wait_stream].posts[r.wait_post];
      const bool send = r.wait_stream == kSendNext || r.wait_stream == kSendPrev;
      const int peer_stream = send ? (r.wait_stream == kSendNext ? kRecvPrev : kRecvNext)
                                   : (r.wait_stream == kRecvPrev ? kSendNext : kSendPrev);
      const P2pStream& ps = ranks_[p.peer].p2p[peer_stream];
      std::string peer_next =
          ps.head < ps.posts.size()
              ? fmt::format("its next {} on that stream is tag {} with rank {}",
                            send ? "receive" : "send", ps.posts[ps.head].tag,
                            ps.posts[ps.head].peer)
              : fmt::format("it has posted no further {} there", send ? "receive" : "send");
      return fmt::format("waits for the {} of tag {} {} rank {}, which rank {} has not matched: {}",
                         send ? "send" : "receive", p.tag, send ? "to" : "from", p.peer, p.peer,
                         peer_next);
    }
    default:
      return "";
  }
}

void Engine::Finish(SimResult* result) {
  const int64_t n = static_cast<int64_t>(ranks_.size());
  SimResult& out = *result;
  out.ranks.resize(n);
  // Deadlock: a rank whose host did not end, or whose transfers / collectives never completed.
  for (int64_t i = 0; i < n; ++i) {
    const RankState& r = ranks_[i];
    BlockedRank b;
    b.rank = i;
    if (r.wait != Wait::kDone) {
      b.instruction = static_cast<int64_t>(r.pc);
      b.text = InstructionText(r.program->instructions[r.pc]) + ": " + WaitReason(i);
    } else {
      for (int s = 0; s < 4 && b.text.empty(); ++s) {
        const P2pStream& st = r.p2p[s];
        if (st.head < st.posts.size()) {
          b.instruction = st.posts[st.head].instr;
          b.text = fmt::format("{}: never matched by rank {} (the program ended without it)",
                               InstructionText(r.program->instructions[b.instruction]),
                               st.posts[st.head].peer);
        }
      }
      if (b.text.empty() && r.coll_pending > 0) {
        b.instruction = static_cast<int64_t>(r.pc) - 1;
        b.text = fmt::format("{} collective(s) never completed", r.coll_pending);
      }
    }
    if (!b.text.empty()) out.blocked.push_back(std::move(b));
  }
  // Per-rank figures.
  Duration iteration;
  for (int64_t i = 0; i < n; ++i) {
    RankState& r = ranks_[i];
    RankSimStats& s = out.ranks[i];
    Duration finish = r.tail;
    for (const auto& span : r.comm_spans) finish = std::max(finish, span.second);
    s.finish = finish;
    s.compute = r.compute;
    s.comm = r.comm;
    if (r.wait == Wait::kDone) {
      r.exposed += UnionWithin(r.comm_spans, std::max(r.host_end, r.tail), finish);
    }
    s.exposed_comm = r.exposed;
    s.all_to_all = r.a2a;
    s.exposed_all_to_all = r.a2a_exposed;
    iteration = std::max(iteration, finish);
  }
  out.iteration_time = iteration;
  for (RankSimStats& s : out.ranks) {
    s.bubble = std::max(Duration::Zero(), iteration - s.compute - s.exposed_comm);
  }
  // Memory.
  const Bytes limit = plan_.memory_limit();
  if (options_.record_memory) out.memory.resize(n);
  Duration oom_time = Duration::Infinite();
  auto by_time = [](const MemoryDelta& a, const MemoryDelta& b) { return a.time < b.time; };
  for (int64_t i = 0; i < n; ++i) {
    RankState& r = ranks_[i];
    // Nearly in time order already; a stable sort keeps the issue order of equal times.
    if (!std::is_sorted(r.memory.begin(), r.memory.end(), by_time)) {
      std::stable_sort(r.memory.begin(), r.memory.end(), by_time);
    }
    MemorySweep m = SweepMemory(r.memory, plan_.model_states[r.program->pp_index], limit,
                                options_.record_memory);
    out.ranks[i].peak_memory = m.peak;
    out.ranks[i].peak_instruction = m.peak_instruction;
    if (m.first_over_time >= 0 || m.peak > limit) {
      out.memory_exceeded = true;
      const Duration t = Duration::Nanos(std::max<int64_t>(m.first_over_time, 0));
      if (t < oom_time) {
        oom_time = t;
        out.oom_rank = i;
        out.oom_instruction = m.first_over_instruction;
      }
    }
    if (options_.record_memory) out.memory[i] = std::move(m.points);
    r.memory = {};
  }
  out.instructions = executed_;
  out.events = popped_;
}

Status Engine::Run(SimResult* result) {
  SLUICE_RETURN_IF_ERROR(Prepare());
  for (int32_t r = 0; r < static_cast<int32_t>(ranks_.size()); ++r) RunHost(r, Duration::Zero());
  constexpr int64_t kCancelCheckEvents = 512;
  while (!events_.empty()) {
    const Event e = events_.Pop();
    ++popped_;
    if (popped_ % kCancelCheckEvents == 0 && options_.cancelled && options_.cancelled()) {
      return FailedPreconditionError(
          fmt::format("simulation interrupted at simulated time {:.3f} ms after {} events",
                      e.time * 1e-6, popped_));
    }
    const Duration now = Duration::Nanos(e.time);
    switch (e.type) {
      case EventType::kTransferData:
        OnTransferData(e.a, now);
        break;
      case EventType::kFlowDone:
        OnFlowDone(e.a, e.b, now);
        break;
      case EventType::kCollStart:
        OnCollStart(e.a, now);
        break;
      case EventType::kCollLatency: {
        Group& g = groups_[e.a];
        Collective& c = g.colls[g.next];
        net_.SetBytes(c.flow, now,
                      static_cast<double>(c.bytes.count()) / static_cast<double>(g.ring));
        DrainChanged();
        break;
      }
      case EventType::kCollDone:
        CompleteCollective(e.a, now);
        break;
      case EventType::kA2aStart:
        OnAllToAllStart(e.a, now);
        break;
      case EventType::kA2aDone:
        CompleteAllToAll(e.a, now);
        break;
    }
  }
  Finish(result);
  if (options_.record_timeline) FinishTimeline(result);
  return Status::Ok();
}

namespace {

bool IntervalBefore(const IntervalRec& a, const IntervalRec& b) {
  return a.start != b.start ? a.start < b.start : a.id < b.id;
}

// Sorts intervals by (start, id), a total order. They come nearly sorted (a rank's transfers and
// collectives are recorded as they end, and they overlap little), so an insertion sort does it in
// about one pass; one that would move more than a few places per interval gives way to
// std::sort.
void SortByStart(std::vector<IntervalRec>& list) {
  const size_t n = list.size();
  size_t budget = 8 * n + 64;
  for (size_t i = 1; i < n; ++i) {
    if (!IntervalBefore(list[i], list[i - 1])) continue;
    const IntervalRec x = list[i];
    size_t j = i;
    for (; j > 0 && IntervalBefore(x, list[j - 1]) && budget > 0; --j, --budget) {
      list[j] = list[j - 1];
    }
    list[j] = x;
    if (budget == 0) {
      std::sort(list.begin(), list.end(), IntervalBefore);
      return;
    }
  }
}

}  // namespace

void Engine::FinishTimeline(SimResult* result) {
  // The critical path ends at the interval with the latest end (the earliest created among ties)
  // and follows `pred` back. Predecessors always end no later than their successors start, and
  // an interval is never its own predecessor; the bound guards against a cycle all the same.
  const IntervalRec* last = nullptr;
  for (const RankState& rs : ranks_) {
    for (const std::vector<IntervalRec>& list : rs.intervals) {
      for (const IntervalRec& iv : list) {
        if (last == nullptr || iv.end > last->end || (iv.end == last->end && iv.id < last->id)) {
          last = &iv;
        }
      }
    }
  }
  std::vector<SimInterval>& path = result->critical_path;
  for (int32_t id = last != nullptr ? last->id : kNoInterval, guard = 0;
       id != kNoInterval && guard <= static_cast<int32_t>(interval_at_.size()); ++guard) {
    const IntervalAt at = interval_at_[id];
    const IntervalRec& iv = ranks_[at.rank].intervals[at.comm][at.index];
    path.push_back({at.rank, iv.instruction, iv.stream, iv.start, iv.end});
    id = iv.pred;
  }
  std::reverse(path.begin(), path.end());
  // The timeline: rank after rank, each by (start, creation): its two lists merged.
  result->timeline.reserve(interval_at_.size());
  for (size_t r = 0; r < ranks_.size(); ++r) {
    std::array<std::vector<IntervalRec>, 2>& lists = ranks_[r].intervals;
    for (std::vector<IntervalRec>& list : lists) SortByStart(list);
    auto put = [&](const IntervalRec& iv) {
      result->timeline.push_back(
          {static_cast<int64_t>(r), iv.instruction, iv.stream, iv.start, iv.end});
    };
    auto a = lists[0].begin(), b = lists[1].begin();
    while (a != lists[0].end() && b != lists[1].end()) put(IntervalBefore(*b, *a) ? *b++ : *a++);
    for (; a != lists[0].end(); ++a) put(*a);
    for (; b != lists[1].end(); ++b) put(*b);
    lists = {};
  }
}

}  // namespace sluice::sim_internal
