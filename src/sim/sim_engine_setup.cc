// The Engine's set-up (checking the plan's structure, ports and groups) and its hand-over into a
// SimResult (deadlock report, per-rank figures, memory sweep, timeline and critical path).
#include <fmt/core.h>

#include <algorithm>
#include <limits>
#include <memory>

#include "plan/program_check.h"
#include "sim/sim_engine.h"

namespace sluice::sim_internal {

namespace {

Status PlanError(std::string what) {
  return InvalidArgumentError("simulation: plan " + std::move(what));
}

}  // namespace

Status Engine::Prepare() {
  const ParallelConfig& par = plan_.parallel;
  const int64_t n = static_cast<int64_t>(plan_.ranks.size());
  if (par.dp < 1 || par.pp < 1 || par.tp < 1 || par.vpp < 1 || n != par.dp * par.pp) {
    return PlanError(fmt::format("has {} rank programs for dp {} x pp {} (need dp * pp >= 1)", n,
                                 par.dp, par.pp));
  }
  if (static_cast<int64_t>(plan_.replicas.size()) != par.dp ||
      static_cast<int64_t>(plan_.model_states.size()) != par.pp) {
    return PlanError(
        fmt::format("has {} replicas and {} model_states entries; need dp = {} and pp = {}",
                    plan_.replicas.size(), plan_.model_states.size(), par.dp, par.pp));
  }
  if (par.devices() > plan_.cluster.num_devices() || plan_.cluster.devices_per_node < 1) {
    return PlanError(fmt::format("needs {} devices (dp x pp x tp); cluster '{}' has {}",
                                 par.devices(), plan_.cluster.name, plan_.cluster.num_devices()));
  }
  ranks_.resize(n);
  for (const Straggler& s : options_.stragglers) ranks_[s.rank].compute_factor *= s.slowdown;
  for (RankState& r : ranks_) r.compute_factor *= options_.compute_scale;
  // The memory figures of every chunk, replica after replica.
  const int64_t stages = plan_.num_stages();
  first_chunk_.resize(par.dp);
  size_t chunks = 0;
  for (int64_t d = 0; d < par.dp; ++d) {
    first_chunk_[d] = static_cast<int64_t>(chunks);
    chunks += plan_.replicas[d].micro_batches.size() * stages;
  }
  chunks_.resize(chunks);
  for (int64_t d = 0; d < par.dp; ++d) {
    ChunkMemory* out = chunks_.data() + first_chunk_[d];
    for (const PlanMicroBatch& mb : plan_.replicas[d].micro_batches) {
      // A micro-batch without its stage costs is refused when a compute op names it.
      for (int64_t s = 0; s < stages && s < static_cast<int64_t>(mb.stages.size()); ++s) {
        out[s] = {mb.stages[s].peak.count(), mb.stages[s].stored.count(),
                  mb.stages[s].stored_until_w.count()};
      }
      out += stages;
    }
  }
  node_.resize(n);
  for (int64_t r = 0; r < n; ++r) node_[r] = plan_.NodeOf(r);
  // Groups first (the work of a collective needs its ring), their errors after the programs'.
  const Status groups = BuildGroups();
  size_t total = 0;
  for (const RankProgram& p : plan_.ranks) total += p.instructions.size();
  ops_ = std::make_unique_for_overwrite<SimOp[]>(total + 1);
  slot_refs_.reserve(2 * total);
  double work_ns = 0;
  std::vector<double> memory(n, 0.0);
  size_t sends = 0;
  SimOp* op = ops_.get();
  for (int64_t r = 0; r < n; ++r) {
    ranks_[r].ops = op;
    SLUICE_RETURN_IF_ERROR(CompileRank(r, op, &work_ns, &memory[r], &sends));
    op += ranks_[r].size;
  }
  *op = {OpKind::kOptimizerStep, static_cast<int32_t>(slot_refs_.size()), 0, 0, 0, Bytes::Zero()};
  transfers_.reserve(sends);
  if (options_.record_timeline) {  // every interval belongs to one instruction
    interval_at_.reserve(total);
    for (RankState& rs : ranks_) {
      rs.intervals[0].reserve(rs.size / 2);
      rs.intervals[1].reserve(rs.size / 2);
    }
  }
  SLUICE_RETURN_IF_ERROR(groups);
  // Every event happens by the sum of all work: until the end, some compute runs, some latency
  // elapses, or some flow moves, and the flows' total rate is at least the slowest link's
  // bandwidth (max-min fairness saturates a port). Memory never exceeds the model states plus
  // every allocation and activation the program makes. Both sums are kept below 2^61 (73 years,
  // 2 EB), a quarter of int64, so no time or level the engine adds can overflow.
  constexpr double kLimit = 2305843009213693952.0;  // 2^61
  for (int64_t r = 0; r < n; ++r) {
    if (!(memory[r] < kLimit)) {
      return InvalidArgumentError(fmt::format(
          "simulation: plan rank {}'s model states, buffers and activations add up to {:.3g} "
          "bytes; allowed: at most 2^61 bytes (the plan's sizes are out of any real range)",
          r, memory[r]));
    }
  }
  if (!(work_ns < kLimit)) {
    return InvalidArgumentError(fmt::format(
        "simulation: the plan's work adds up to {:.3g} s of simulated time (compute x the "
        "scales, transfers and collectives at the links' bandwidth and latency); allowed: at "
        "most 2^61 ns (73 years), so that times fit in int64 nanoseconds",
        work_ns * 1e-9));
  }
  return Status::Ok();
}

Status Engine::CompileRank(int64_t r, SimOp* op, double* work_ns, double* memory,
                           size_t* sends) {
  const ParallelConfig& par = plan_.parallel;
  const RankProgram& p = plan_.ranks[r];
  if (p.rank != r || p.dp_index != r / par.pp || p.pp_index != r % par.pp || p.buffer_slots < 0) {
    return PlanError(fmt::format(
        "field 'ranks[{}]': rank {} dp {} pp {} buffer_slots {}; expected "
        "rank {} = dp {} * pp + pp {}",
        r, p.rank, p.dp_index, p.pp_index, p.buffer_slots, r, r / par.pp, r % par.pp));
  }
  RankState& rs = ranks_[r];
  rs.program = &p;
  rs.size = p.instructions.size();
  rs.memory.reserve(3 * p.instructions.size());
  // Slot ids index the slots directly when they are dense (buffer_slots is at most what the
  // program allocates); otherwise the ids the program names are numbered densely.
  int64_t allocations = 0;
  size_t refs = 0;
  for (const Instruction& in : p.instructions) {
    allocations += static_cast<int64_t>(in.outputs.size());
    refs += in.inputs.size() + in.outputs.size();
  }
  const bool dense = p.buffer_slots <= allocations;
  const size_t first_ref = slot_refs_.size();
  if (refs > static_cast<size_t>(std::numeric_limits<int32_t>::max()) - first_ref) {
    return PlanError(fmt::format("ranks 0..{} name more than 2^31 - 1 slots in all", r));
  }
  slot_refs_.resize(first_ref + refs);
  int32_t* slot = slot_refs_.data() + first_ref;
  rs.slot_ids.clear();
  if (!dense) {
    for (const Instruction& in : p.instructions) {
      rs.slot_ids.insert(rs.slot_ids.end(), in.inputs.begin(), in.inputs.end());
      rs.slot_ids.insert(rs.slot_ids.end(), in.outputs.begin(), in.outputs.end());
    }
    std::sort(rs.slot_ids.begin(), rs.slot_ids.end());
    rs.slot_ids.erase(std::unique(rs.slot_ids.begin(), rs.slot_ids.end()), rs.slot_ids.end());
  }
  auto slot_index = [&](int64_t s) {
    return static_cast<int32_t>(
        dense ? s
              : std::lower_bound(rs.slot_ids.begin(), rs.slot_ids.end(), s) -
                    rs.slot_ids.begin());
  };
  const int64_t stages = plan_.num_stages();
  const auto& mbs = plan_.replicas[p.dp_index].micro_batches;
  const int64_t first_chunk = first_chunk_[p.dp_index];
  const Group& g = groups_[p.pp_index];
  const double factor = rs.compute_factor;
  double work = *work_ns;
  double mem = static_cast<double>(plan_.model_states[p.pp_index].count());
  std::array<size_t, 4> posts = {};
  size_t collectives = 0;
  for (size_t i = 0; i < p.instructions.size(); ++i, ++op) {
    const Instruction& in = p.instructions[i];
    auto field = [&](std::string_view name, std::string problem) {
      return PlanError(fmt::format("field 'ranks[{}].instructions[{}].{}' ({}): {}", r, i, name,
                                   InstructionText(in), problem));
    };
    if (auto problem = CheckInstructionIndices(plan_, p, in)) {
      return field(problem->field, std::move(problem->message));
    }
    if (in.duration < Duration::Zero()) return field("ns", "negative duration");
    if (in.bytes < Bytes::Zero()) return field("bytes", "negative byte count");
    op->op = in.op;
    op->slots = static_cast<int32_t>(slot - slot_refs_.data());
    op->n_in = static_cast<int32_t>(in.inputs.size());
    op->aux = 0;
    op->value = 0;
    op->bytes = in.bytes;
    for (int64_t s : in.inputs) *slot++ = slot_index(s);
    for (int64_t s : in.outputs) *slot++ = slot_index(s);
    const double bytes = static_cast<double>(in.bytes.count());
    switch (in.op) {
      case OpKind::kForward:
      case OpKind::kBackward:
      case OpKind::kBackwardInput:
      case OpKind::kBackwardWeight: {
        if (static_cast<int64_t>(mbs[in.microbatch].stages.size()) != stages) {
          return field("mb", fmt::format("micro-batch {} lacks its {} stage costs",
                                         in.microbatch, stages));
        }
        op->aux = static_cast<int32_t>(first_chunk + in.microbatch * stages + in.stage);
        op->value = in.duration.Scaled(factor).nanos();
        op->bytes = Fp16Bytes(in.shapes);
        work += static_cast<double>(in.duration.nanos()) * factor;
        const ChunkMemory& c = chunks_[op->aux];
        mem += static_cast<double>(c.peak) + static_cast<double>(c.stored) +
               static_cast<double>(c.stored_until_w);
        break;
      }
      case OpKind::kOptimizerStep:
        op->value = in.duration.Scaled(factor).nanos();
        work += static_cast<double>(in.duration.nanos()) * factor;
        break;
      case OpKind::kLoadInput:
        op->value = in.duration.nanos();
        work += static_cast<double>(in.duration.nanos());
        break;
      case OpKind::kAllReduceGrad:
      case OpKind::kReduceScatterGrad:
      case OpKind::kAllGatherParams:
        ++collectives;
        if (g.members.size() > 1) {
          const double steps = 2.0 * static_cast<double>(g.members.size());
          work += 2 * bytes / g.min_bandwidth * 1e9 +
                  steps * static_cast<double>(g.step_latency.nanos());
        }
        break;
      case OpKind::kFreeBuffer:
        break;
      default: {  // point-to-point
        const bool inter = Inter(r, in.peer);
        const LinkSpec& link = Link(inter);
        if (link.bandwidth <= 0) {
          return PlanError(
              fmt::format("rank {} talks to rank {} over the {}-node link, whose bandwidth "
                          "in cluster '{}' is not positive",
                          r, in.peer, inter ? "inter" : "intra", plan_.cluster.name));
        }
        op->aux = static_cast<int32_t>(in.peer);
        op->value = in.tag;
        const bool start = in.op == OpKind::kSendActStart || in.op == OpKind::kSendGradStart ||
                           in.op == OpKind::kRecvActStart || in.op == OpKind::kRecvGradStart;
        if (start) {
          ++posts[P2pStreamOf(in.op)];
          const bool recv = in.op == OpKind::kRecvActStart || in.op == OpKind::kRecvGradStart;
          if (recv && in.bytes == Bytes::Zero()) op->bytes = Fp16Bytes(in.shapes);
          work += static_cast<double>(link.latency.nanos()) +
                  static_cast<double>(op->bytes.count()) / link.bandwidth * 1e9;
        }
        break;
      }
    }
    mem += static_cast<double>(op->bytes.count()) * static_cast<double>(in.outputs.size());
  }
  *work_ns = work;
  *memory = mem;
  rs.slots.resize(dense ? static_cast<size_t>(p.buffer_slots) : rs.slot_ids.size());
  for (int k = 0; k < 4; ++k) rs.p2p[k].posts.reserve(posts[k]);
  rs.comm_spans.reserve(posts[0] + posts[1] + posts[2] + posts[3] + collectives);
  rs.coll_spans.reserve(collectives);
  if (p.dp_index == 0) groups_[p.pp_index].colls.reserve(collectives);
  *sends += posts[kSendNext] + posts[kSendPrev];
  return Status::Ok();
}

Status Engine::BuildGroups() {
  const ParallelConfig& par = plan_.parallel;
  const int64_t n = static_cast<int64_t>(plan_.ranks.size());
  for (int64_t r = 0; r < n; ++r) {
    for (int k = 0; k < 4; ++k) {
      const double bw = k < 2 ? intra_.bandwidth : inter_.bandwidth;
      net_.AddPort(bw > 0 ? bw : 1.0);  // an unused link still needs a port id
    }
  }
  groups_.resize(par.pp);
  for (int64_t p = 0; p < par.pp; ++p) {
    Group& g = groups_[p];
    for (int64_t d = 0; d < par.dp; ++d) g.members.push_back(static_cast<int32_t>(d * par.pp + p));
    const int64_t m = par.dp;
    for (int64_t i = 0; m > 1 && i < m; ++i) {
      const int32_t a = g.members[i], b = g.members[(i + 1) % m];
      const bool inter = Inter(a, b);
      g.spans_nodes = g.spans_nodes || Inter(g.members[0], g.members[i]);
      if (Link(inter).bandwidth <= 0) {
        return PlanError(
            fmt::format("data-parallel group of pipeline rank {} crosses the {}-node link, "
                        "whose bandwidth in cluster '{}' is not positive",
                        p, inter ? "inter" : "intra", plan_.cluster.name));
      }
      g.ports.push_back(Port(a, inter, false));
      g.ports.push_back(Port(b, inter, true));
      g.step_latency = std::max(g.step_latency, Link(inter).latency);
      g.min_bandwidth =
          i == 0 ? Link(inter).bandwidth : std::min(g.min_bandwidth, Link(inter).bandwidth);
    }
  }
  return Status::Ok();
}

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
  std::vector<MemoryDelta> merged;
  auto by_time = [](const MemoryDelta& a, const MemoryDelta& b) { return a.time < b.time; };
  for (int64_t i = 0; i < n; ++i) {
    RankState& r = ranks_[i];
    // Both lists are (nearly) in time order; merging keeps the issue order of equal times.
    if (!std::is_sorted(r.memory.begin(), r.memory.end(), by_time)) {
      std::stable_sort(r.memory.begin(), r.memory.end(), by_time);
    }
    std::stable_sort(r.recv_memory.begin(), r.recv_memory.end(), by_time);
    merged.resize(r.memory.size() + r.recv_memory.size());
    std::merge(r.memory.begin(), r.memory.end(), r.recv_memory.begin(), r.recv_memory.end(),
               merged.begin(), by_time);
    MemorySweep m =
        SweepMemory(merged, plan_.model_states[r.program->pp_index], limit, options_.record_memory);
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
    r.recv_memory = {};
  }
  out.instructions = executed_;
  out.events = popped_;
}

Status Engine::Run(SimResult* result) {
  SLUICE_RETURN_IF_ERROR(Prepare());
  for (int32_t r = 0; r < static_cast<int32_t>(ranks_.size()); ++r) RunHost(r, Duration::Zero());
  constexpr int64_t kCancelCheckEvents = 4096;
  while (!events_.empty()) {
    const Event e = events_.Pop();
    ++popped_;
    if (popped_ % kCancelCheckEvents == 0 && options_.cancelled && options_.cancelled()) {
      return FailedPreconditionError(fmt::format(
          "simulation interrupted at simulated time {:.3f} ms after {} events", e.time * 1e-6,
          popped_));
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
                      static_cast<double>(c.bytes.count()) / static_cast<double>(g.members.size()));
        DrainChanged();
        break;
      }
      case EventType::kCollDone:
        CompleteCollective(e.a, now);
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
