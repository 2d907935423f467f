// The Engine's set-up: checking the plan's structure and compiling it into the engine's flat
// program (SimOp), the ranks' state, the ports and the data-parallel groups, with the bounds on
// the plan's total work and memory.
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <set>
#include <unordered_map>

#include "plan/program_check.h"
#include "sim/sim_engine.h"

#include "plan/moe_segments.h"

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
    return PlanError(fmt::format(
        "has {} rank programs for dp {} x pp {} (need dp * pp = {} programs, dp, pp, tp and vpp "
        ">= 1)",
        n, par.dp, par.pp, par.dp * par.pp));
  }
  if (static_cast<int64_t>(plan_.replicas.size()) != par.dp ||
      static_cast<int64_t>(plan_.model_states.size()) != par.pp) {
    return PlanError(
        fmt::format("has {} replicas and {} model_states entries; need dp = {} and pp = {}",
                    plan_.replicas.size(), plan_.model_states.size(), par.dp, par.pp));
  }
  if (par.devices() > plan_.cluster.num_devices() || plan_.cluster.devices_per_node < 1) {
    return PlanError(fmt::format("needs {} devices (dp x pp x tp x cp); cluster '{}' has {}",
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
  BuildA2aGroups();
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
  *op = {OpKind::kOptimizerStep, 0, static_cast<int32_t>(slot_refs_.size()), 0, 0, 0,
         Bytes::Zero()};
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

Status Engine::CompileRank(int64_t r, SimOp* op, double* work_ns, double* memory, size_t* sends) {
  const ParallelConfig& par = plan_.parallel;
  const RankProgram& p = plan_.ranks[r];
  if (p.rank != r || p.dp_index != r / par.pp || p.pp_index != r % par.pp || p.buffer_slots < 0) {
    return PlanError(
        fmt::format("field 'ranks[{}]': rank {} dp {} pp {} buffer_slots {}; expected "
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
              : std::lower_bound(rs.slot_ids.begin(), rs.slot_ids.end(), s) - rs.slot_ids.begin());
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
  const std::vector<uint8_t> roles = PieceRoles(p);
  {  // Token slices: a forward whose attention segment is sliced; its sliced dispatches.
    std::set<std::pair<int64_t, int64_t>> partitioned;
    for (const Instruction& in : p.instructions) {
      if (in.op == OpKind::kForward && IsTokenSlice(in)) {
        partitioned.insert({in.microbatch, in.stage});
      }
    }
    rs.counted_a2a.clear();
    if (!partitioned.empty()) {
      rs.counted_a2a.assign(p.instructions.size(), 0);
      std::set<std::pair<int64_t, int64_t>> forward_done;
      for (size_t i = 0; i < p.instructions.size(); ++i) {
        const Instruction& in = p.instructions[i];
        if (in.op == OpKind::kForward && in.segment >= 0 &&
            (roles[i] & kLastPiece) != 0) {
          forward_done.insert({in.microbatch, in.stage});
        }
        const std::pair<int64_t, int64_t> key{in.microbatch, in.stage};
        if (in.op == OpKind::kAllToAllDispatch && in.chunks > 0 && partitioned.count(key) > 0 &&
            forward_done.count(key) == 0) {
          rs.counted_a2a[i] = 1;
        }
      }
    }
  }
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
    op->piece = roles[i];
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
          return field(
              "mb", fmt::format("micro-batch {} lacks its {} stage costs", in.microbatch, stages));
        }
        op->aux = static_cast<int32_t>(first_chunk + in.microbatch * stages + in.stage);
        op->value = in.duration.Scaled(factor).nanos();
        // The buffer its outputs allocate (none: the shapes are not needed).
        op->bytes = in.outputs.empty() ? Bytes::Zero() : Fp16Bytes(in.shapes);
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
        if (g.ring > 1) {
          const double steps = 2.0 * static_cast<double>(g.ring);
          work += 2 * bytes / g.min_bandwidth * 1e9 +
                  steps * static_cast<double>(g.step_latency.nanos());
        }
        break;
      case OpKind::kFreeBuffer:
        break;
      case OpKind::kAllToAllWait:
        if (rs.a2a_group < 0) {
          return field("op", "an all-to-all wait in a plan without expert-parallel groups");
        }
        op->value = in.tag;
        break;
      case OpKind::kAllToAllDispatch:
      case OpKind::kAllToAllCombine: {
        // CheckInstructionIndices bounded the group and the splits; the engine pairs the
        // members' splits as they post.
        if (rs.a2a_group < 0 ||
            !std::equal(in.group.begin(), in.group.end(), a2a_groups_[rs.a2a_group].members.begin(),
                        a2a_groups_[rs.a2a_group].members.end())) {
          return field("group",
                       fmt::format("[{}] is not the rank's expert-parallel group{}",
                                   fmt::join(in.group, ", "),
                                   rs.a2a_group < 0
                                       ? " (the plan has none: ep must be > 1 and divide dp)"
                                       : fmt::format(" [{}]", fmt::join(
                                                                  a2a_groups_[rs.a2a_group].members,
                                                                  ", "))));
        }
        for (size_t j = 0; j < in.group.size(); ++j) {
          if (in.send_splits[j] < 0 || in.recv_splits[j] < 0) {
            return field("send", "negative split");
          }
          const double bytes_j = 2.0 * static_cast<double>(in.send_splits[j]) *
                                 static_cast<double>(plan_.model.hidden);
          const LinkSpec& link = Link(Inter(r, in.group[j]));
          if (in.group[j] == r || in.send_splits[j] == 0) continue;
          if (link.bandwidth <= 0) {
            return field("group", fmt::format("rank {} is reached over a link without "
                                              "bandwidth in cluster '{}'",
                                              in.group[j], plan_.cluster.name));
          }
          work += static_cast<double>(link.latency.nanos()) + bytes_j / link.bandwidth * 1e9;
        }
        break;
      }
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

void Engine::BuildA2aGroups() {
  const ParallelConfig& par = plan_.parallel;
  if (par.ep <= 1 || par.dp % par.ep != 0) return;
  // Group pp_index * (dp / ep) + dp_index / ep: ep consecutive replicas (EpGroupOf's order).
  for (int64_t p = 0; p < par.pp; ++p) {
    for (int64_t first = 0; first < par.dp; first += par.ep) {
      A2aGroup g;
      for (int64_t j = 0; j < par.ep; ++j) {
        const int64_t rank = (first + j) * par.pp + p;
        ranks_[rank].a2a_group = static_cast<int32_t>(a2a_groups_.size());
        ranks_[rank].a2a_member = static_cast<int32_t>(j);
        g.members.push_back(static_cast<int32_t>(rank));
      }
      a2a_groups_.push_back(std::move(g));
    }
  }
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
    g.span = GradientRing(plan_.cluster, par, p);
    g.ring = g.span.members;
    if (g.ring <= 1) continue;
    const CollectiveRing& span = g.span;
    for (const bool inter : {false, true}) {
      if ((inter ? span.spans_nodes : span.intra_hops) && Link(inter).bandwidth <= 0) {
        return PlanError(
            fmt::format("data-parallel group of pipeline rank {} crosses the {}-node link, "
                        "whose bandwidth in cluster '{}' is not positive",
                        p, inter ? "inter" : "intra", plan_.cluster.name));
      }
    }
    std::unordered_map<int32_t, size_t> index;  // port -> its place in g.ports
    auto add = [&](int32_t port, double w) {
      const auto [it, fresh] = index.emplace(port, g.ports.size());
      if (fresh) {
        g.ports.push_back(port);
        g.weights.push_back(w);
      } else {
        g.weights[it->second] = std::min(1.0, g.weights[it->second] + w);
      }
    };
    auto add_both = [&](int32_t rank, bool inter, double w) {
      add(Port(rank, inter, false), w);
      add(Port(rank, inter, true), w);
    };
    // A member's ports stand for its cp devices' ports, as its programme does for theirs.
    if (span.spans_nodes && span.crossing_shares > 1) {
      // NCCL's channels leave each node through the NICs of all its ring devices: every
      // member's inter-node ports carry 1/c of a step's bytes (c the fewest ring devices on a
      // node), and its intra-node ports the ring's hops inside its node.
      const double share = 1.0 / static_cast<double>(span.crossing_shares);
      for (const int32_t member : g.members) {
        add_both(member, true, share);
        add_both(member, false, 1.0);
      }
    } else {
      // One share per crossing: each hop between members takes its two ends' ports, on the
      // link between their first devices' nodes;
      for (int64_t i = 0; m > 1 && i < m; ++i) {
        const int32_t a = g.members[i], b = g.members[(i + 1) % m];
        const bool inter = Inter(a, b);
        add(Port(a, inter, false), 1.0);
        add(Port(b, inter, true), 1.0);
      }
      for (const int32_t member : g.members) {
        const int64_t first = par.FirstDevice(member);
        const int64_t last = first + (par.cp - 1) * par.tp;  // its last ring device
        // a member whose ring devices straddle nodes crosses inside itself;
        if (plan_.cluster.NodeOfDevice(first) != plan_.cluster.NodeOfDevice(last)) {
          add_both(member, true, 1.0);
        }
        // and its cp devices' hops within a node are on the intra-node link.
        if (par.cp > 1 && span.intra_hops) add_both(member, false, 1.0);
      }
    }
    g.step_latency = Link(span.spans_nodes).latency;
    g.min_bandwidth = comm_.RingBandwidth(span);
  }
  return Status::Ok();
}

}  // namespace sluice::sim_internal
