#include "plan/lower.h"

#include <fmt/core.h>

#include <algorithm>
#include <tuple>

#include "cost/comm_model.h"
#include "schedule/dependencies.h"
#include "schedule/estimator.h"
#include "schedule/schedule_costs.h"

namespace sluice {
namespace {

constexpr Duration kMinTime = Duration::Nanos(1);  // keeps simulated events strictly ordered

// What the lowering of one replica needs, shared by its passes.
struct ReplicaContext {
  const ExecutionPlan* plan = nullptr;
  const Schedule* schedule = nullptr;
  const CommModel* comm = nullptr;
  int64_t dp_index = 0;
  int64_t m = 0;  // micro-batches
  int64_t S = 0;  // virtual stages
  int64_t pp = 1;
  std::vector<std::vector<std::vector<TensorShape>>> boundary;  // [mb][b]
  std::vector<std::vector<Duration>> p2p;  // [mb][b]: transfer time of boundary b (0 if local)
  std::vector<std::vector<Duration>> start, end;  // [rank][action index]: the replayed timeline
  bool Remote(int64_t a, int64_t b) const { return a % pp != b % pp; }
  const ChunkCost& Cost(int64_t mb, int64_t s) const {
    return plan->replicas[dp_index].micro_batches[mb].stages[s];
  }
};

// Step 1: the schedule's timeline, by the estimator's replay (the one meaning of the dependency
// rules, schedule/dependencies.h) with a link per transfer and every action and remote transfer
// at least kMinTime long.
Status Simulate(ReplicaContext& c, const ScheduleCosts& costs) {
  ScheduleTimeline t = ReplaySchedule(
      *c.schedule, costs, ReplayOptions{.channel_contention = false, .min_duration = kMinTime});
  if (!t.completed) {
    return InvalidArgumentError(fmt::format("schedule '{}' of replica {} cannot run: {}",
                                            c.schedule->name, c.dp_index, t.problem));
  }
  c.start = std::move(t.start);
  c.end = std::move(t.end);
  return Status::Ok();
}

enum class EventType : uint8_t { kSendAct, kRecvAct, kSendGrad, kRecvGrad, kReduce, kCompute };

struct Event {
  Duration time;
  int priority = 0;      // 0: transfers, 1: gradient reduction, 2: compute
  int64_t tiebreak = 0;  // transfers: tag (the same on both ranks); else a rank-local order
  EventType type = EventType::kCompute;
  int64_t mb = -1;
  int64_t stage = -1;
  int64_t action = -1;  // compute: index in the schedule's rank list
  auto Key() const { return std::tie(time, priority, tiebreak); }
};

// Step 2: every rank's computes, transfer starts and reductions in simulated-time order.
std::vector<std::vector<Event>> Events(const ReplicaContext& c) {
  std::vector<std::vector<Event>> events(c.pp);
  for (int64_t r = 0; r < c.pp; ++r) {
    const auto& list = c.schedule->ranks[r];
    for (size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      const int64_t mb = a.microbatch, s = a.stage;
      const Duration t = c.end[r][i];
      events[r].push_back({c.start[r][i], 2, static_cast<int64_t>(i), EventType::kCompute, mb, s,
                           static_cast<int64_t>(i)});
      const std::optional<BoundaryTransfer> out = ProducedBoundary(a.kind, s, c.S);
      if (out && c.Remote(s, out->to_stage)) {
        const int64_t tag = MessageTag(mb, out->boundary, out->gradient, c.S);
        events[r].push_back(
            {t, 0, tag, out->gradient ? EventType::kSendGrad : EventType::kSendAct, mb, s});
        events[out->to_stage % c.pp].push_back(
            {t, 0, tag, out->gradient ? EventType::kRecvGrad : EventType::kRecvAct, mb,
             out->to_stage});
      }
    }
  }
  if (c.plan->dp() * c.plan->parallel.cp > 1) {
    // Reductions in decreasing stage order, each once its stage's last backward is done.
    std::vector<Duration> stage_done(c.S);
    for (int64_t r = 0; r < c.pp; ++r) {
      const auto& list = c.schedule->ranks[r];
      for (size_t i = 0; i < list.size(); ++i) {
        if (list[i].kind == ActionKind::kBackward || list[i].kind == ActionKind::kBackwardWeight) {
          stage_done[list[i].stage] = std::max(stage_done[list[i].stage], c.end[r][i]);
        }
      }
    }
    for (int64_t r = 0; r < c.pp; ++r) {
      Duration t;
      int64_t order = 0;
      for (int64_t s = r + (c.S / c.pp - 1) * c.pp; s >= 0; s -= c.pp) {
        t = std::max(t, stage_done[s]);
        events[r].push_back({t, 1, order++, EventType::kReduce, -1, s});
      }
    }
  }
  for (auto& list : events) {
    std::sort(list.begin(), list.end(),
              [](const Event& a, const Event& b) { return a.Key() < b.Key(); });
  }
  return events;
}

// Step 3-5 for one rank: instructions with logical buffers, then frees and slots.
class RankAssembler {
 public:
  // `buckets[s]`: the gradient buckets of virtual stage s, fp16 bytes each.
  RankAssembler(const ReplicaContext& c, int64_t r, const std::vector<std::vector<Bytes>>& buckets)
      : c_(c),
        r_(r),
        buckets_(buckets),
        key_buf_(static_cast<size_t>(3 * c.m * c.S), -1) {}

  RankProgram Assemble(const std::vector<Event>& events) {
    for (const Event& e : events) Emit(e);
    for (Instruction& in : pending_grad_sends_) out_.push_back(std::move(in));
    pending_grad_sends_.clear();
    Instruction step;
    step.op = OpKind::kOptimizerStep;
    out_.push_back(step);
    for (const Instruction& in : gathers_) out_.push_back(in);
    RankProgram program;
    program.dp_index = c_.dp_index;
    program.pp_index = r_;
    program.rank = c_.plan->RankId(c_.dp_index, r_);
    program.instructions = FreeAndPack(&program.buffer_slots);
    return program;
  }

 private:
  enum Kind { kLoad = 0, kAct = 1, kGrad = 2 };
  int64_t Key(Kind kind, int64_t mb, int64_t b) const { return (kind * c_.m + mb) * c_.S + b; }
  int64_t NewBuffer(Kind kind, int64_t mb, int64_t b) {
    return key_buf_[Key(kind, mb, b)] = next_buffer_++;
  }
  int64_t Buffer(Kind kind, int64_t mb, int64_t b) const {
    const int64_t id = key_buf_[Key(kind, mb, b)];
    SLUICE_CHECK_MSG(id >= 0, "lowering: buffer read before it was produced");
    return id;
  }
  int64_t GlobalRank(int64_t stage) const { return c_.plan->RankId(c_.dp_index, stage % c_.pp); }

  // The transfer op `op` of micro-batch `mb` on virtual stage `stage`; its peer, tag, shapes and
  // time follow from the link (LinkOf), so no caller can mix up stages and boundaries.
  // REQUIRES: the op is a point-to-point op and `stage` has that neighbour.
  Instruction Comm(OpKind op, int64_t mb, int64_t stage, int64_t buffer) const {
    const std::optional<TransferLink> link = LinkOf(op, stage, c_.S);
    SLUICE_CHECK_MSG(link.has_value(), "lowering: a transfer without a neighbour stage");
    Instruction in;
    in.op = op;
    in.microbatch = mb;
    in.stage = stage;
    in.peer = GlobalRank(link->peer_stage);
    in.tag = MessageTag(mb, link->boundary, link->gradient, c_.S);
    in.shapes = c_.boundary[mb][link->boundary];
    const bool allocates = op == OpKind::kRecvActStart || op == OpKind::kRecvGradStart;
    (allocates ? in.outputs : in.inputs).push_back(buffer);
    in.bytes = Fp16Bytes(in.shapes);
    if (IsCommStart(op)) in.duration = c_.p2p[mb][link->boundary];
    return in;
  }

  void Emit(const Event& e) {
    const int64_t mb = e.mb, s = e.stage;
    switch (e.type) {
      case EventType::kSendAct:
        out_.push_back(Comm(OpKind::kSendActStart, mb, s, Buffer(kAct, mb, s)));
        return;
      case EventType::kRecvAct:
        out_.push_back(Comm(OpKind::kRecvActStart, mb, s, NewBuffer(kAct, mb, s - 1)));
        return;
      case EventType::kSendGrad:
        out_.push_back(Comm(OpKind::kSendGradStart, mb, s, Buffer(kGrad, mb, s - 1)));
        pending_grad_sends_.push_back(
            Comm(OpKind::kSendGradFinish, mb, s, Buffer(kGrad, mb, s - 1)));
        return;
      case EventType::kRecvGrad:
        out_.push_back(Comm(OpKind::kRecvGradStart, mb, s, NewBuffer(kGrad, mb, s)));
        return;
      case EventType::kReduce:
        EmitReduction(s);
        return;
      case EventType::kCompute:
        EmitCompute(c_.schedule->ranks[r_][e.action]);
        return;
    }
  }

  void EmitReduction(int64_t s) {
    const bool zero2 = c_.plan->parallel.zero >= 2;
    // The gradients of a position's cp ranks are reduced with the replicas': a ring of dp * cp.
    const CollectiveRing ring = GradientRing(c_.plan->cluster, c_.plan->parallel, r_);
    for (const Bytes bytes : buckets_[s]) {
      Instruction in;
      in.op = zero2 ? OpKind::kReduceScatterGrad : OpKind::kAllReduceGrad;
      in.stage = s;
      in.bucket = next_bucket_++;
      in.bytes = bytes;
      in.duration = c_.comm->Collective(
          zero2 ? CollectiveKind::kReduceScatter : CollectiveKind::kAllReduce, bytes, ring);
      out_.push_back(in);
      if (zero2) {
        in.op = OpKind::kAllGatherParams;
        in.duration = c_.comm->Collective(CollectiveKind::kAllGather, bytes, ring);
        gathers_.push_back(in);
      }
    }
  }

  void EmitCompute(const Action& a) {
    const int64_t mb = a.microbatch, s = a.stage, last = c_.S - 1;
    const PlanMicroBatch& micro = c_.plan->replicas[c_.dp_index].micro_batches[mb];
    const ChunkCost& cost = c_.Cost(mb, s);
    Instruction in;
    in.microbatch = mb;
    in.stage = s;
    if (a.kind == ActionKind::kBackwardWeight) {
      in.op = OpKind::kBackwardWeight;
      in.duration = cost.backward_weight;
      out_.push_back(in);
      return;
    }
    in.recompute = micro.recompute;
    // The stage's inputs: loaded tokens or the previous stage's activations, then labels.
    auto add_inputs = [&] {
      in.inputs.push_back(s == 0 ? Buffer(kLoad, mb, 0) : Buffer(kAct, mb, s - 1));
      if (s == last && s > 0) in.inputs.push_back(Buffer(kLoad, mb, s));
    };
    if (a.kind == ActionKind::kForward) {
      std::vector<TensorShape> load = LoadShapes(c_.plan->model, micro.shape, s, c_.S);
      if (!load.empty()) {
        Instruction li;
        li.op = OpKind::kLoadInput;
        li.microbatch = mb;
        li.stage = s;
        li.bytes = TokenBytes(load);
        li.shapes = std::move(load);
        li.outputs.push_back(NewBuffer(kLoad, mb, s));
        out_.push_back(std::move(li));
      }
      if (s > 0 && c_.Remote(s - 1, s)) {
        out_.push_back(Comm(OpKind::kRecvActFinish, mb, s, Buffer(kAct, mb, s - 1)));
      }
      in.op = OpKind::kForward;
      add_inputs();
      if (s < last) {
        in.outputs.push_back(NewBuffer(kAct, mb, s));
        in.shapes = c_.boundary[mb][s];
      }
      in.duration = cost.forward;
      out_.push_back(std::move(in));
      EmitAllToAlls(OpKind::kForward, mb, s);
      return;
    }
    for (Instruction& f : pending_grad_sends_) out_.push_back(std::move(f));
    pending_grad_sends_.clear();
    if (s < last && c_.Remote(s, s + 1)) {
      out_.push_back(Comm(OpKind::kSendActFinish, mb, s, Buffer(kAct, mb, s)));
      out_.push_back(Comm(OpKind::kRecvGradFinish, mb, s, Buffer(kGrad, mb, s)));
    }
    in.op = a.kind == ActionKind::kBackward ? OpKind::kBackward : OpKind::kBackwardInput;
    add_inputs();
    if (s < last) {
      in.inputs.push_back(Buffer(kAct, mb, s));
      in.inputs.push_back(Buffer(kGrad, mb, s));
    }
    if (s > 0) {
      in.outputs.push_back(NewBuffer(kGrad, mb, s - 1));
      in.shapes = c_.boundary[mb][s - 1];
    }
    in.duration = a.kind == ActionKind::kBackward ? cost.backward_input + cost.backward_weight
                                                  : cost.backward_input;
    const OpKind op = in.op;
    out_.push_back(std::move(in));
    EmitAllToAlls(op, mb, s);
  }

  // The MoE all-to-alls of the compute op just emitted (AllToAllsOf), each priced as the
  // alpha-beta all-to-all of this rank's sends: (n-1) latencies + the bytes it sends to the
  // other members over the slowest link of the group (the simulator's closed form).
  void EmitAllToAlls(OpKind op, int64_t mb, int64_t s) {
    const ExecutionPlan& plan = *c_.plan;
    const int64_t rank = plan.RankId(c_.dp_index, r_);
    for (Instruction& in : AllToAllsOf(plan, rank, op, mb, s)) {
      bool spans = false;
      for (int64_t g : in.group) spans = spans || plan.NodeOf(g) != plan.NodeOf(rank);
      const int64_t n = static_cast<int64_t>(in.group.size());
      in.duration = c_.comm->PointToPoint(in.bytes, spans) +
                    c_.comm->PointToPoint(Bytes::Zero(), spans) * (n - 2);
      out_.push_back(std::move(in));
    }
  }

  // Inserts a FreeBuffer after each logical buffer's last use and maps buffers to slots.
  std::vector<Instruction> FreeAndPack(int64_t* slots_used) {
    std::vector<int64_t> last_use(next_buffer_, -1);
    for (size_t i = 0; i < out_.size(); ++i) {
      for (int64_t b : out_[i].inputs) last_use[b] = static_cast<int64_t>(i);
      for (int64_t b : out_[i].outputs) last_use[b] = static_cast<int64_t>(i);
    }
    std::vector<std::vector<int64_t>> frees_after(out_.size());
    for (int64_t b = 0; b < next_buffer_; ++b) frees_after[last_use[b]].push_back(b);
    std::vector<int64_t> slot_of(next_buffer_, -1);
    std::vector<bool> slot_busy;
    std::vector<Instruction> result;
    result.reserve(out_.size() + next_buffer_);
    for (size_t i = 0; i < out_.size(); ++i) {
      Instruction& in = out_[i];
      for (int64_t& b : in.outputs) {
        const auto it = std::find(slot_busy.begin(), slot_busy.end(), false);
        const int64_t slot = it - slot_busy.begin();
        if (it == slot_busy.end()) slot_busy.push_back(true);
        slot_busy[slot] = true;
        slot_of[b] = slot;
        b = slot;
      }
      for (int64_t& b : in.inputs) b = slot_of[b];
      result.push_back(std::move(in));
      for (int64_t b : frees_after[i]) {
        Instruction f;
        f.op = OpKind::kFreeBuffer;
        f.inputs.push_back(slot_of[b]);
        slot_busy[slot_of[b]] = false;
        result.push_back(std::move(f));
      }
    }
    *slots_used = static_cast<int64_t>(slot_busy.size());
    return result;
  }

  const ReplicaContext& c_;
  const int64_t r_;
  const std::vector<std::vector<Bytes>>& buckets_;
  std::vector<int64_t> key_buf_;
  int64_t next_buffer_ = 0;
  int64_t next_bucket_ = 0;
  std::vector<Instruction> out_;
  std::vector<Instruction> pending_grad_sends_;
  std::vector<Instruction> gathers_;
};

// Buckets of each virtual stage: its fp16 gradients cut into equal parts of at most `cap`.
std::vector<std::vector<Bytes>> MakeBuckets(const StageCostEvaluator& eval, Bytes cap) {
  const ParallelConfig& par = eval.parallel();
  const std::vector<StageLayers> chunks = ChunkStageLayers(eval.model(), par);
  std::vector<std::vector<Bytes>> out(chunks.size());
  for (size_t s = 0; s < chunks.size(); ++s) {
    const int64_t bytes = 2 * ReducedGradientParams(eval.cost_model(), chunks[s], par);
    if (bytes <= 0) continue;
    const int64_t n =
        std::max<int64_t>(1, (bytes + cap.count() - 1) / std::max<int64_t>(cap.count(), 1));
    for (int64_t k = 0; k < n; ++k) {
      out[s].push_back(Bytes::Of(bytes / n + (k < bytes % n ? 1 : 0)));
    }
  }
  return out;
}

Status CheckInputs(const BatchPlan& bp, std::span<const Schedule> schedules,
                   const ParallelConfig& par) {
  if (bp.outcome != PlanOutcome::kOk) {
    return FailedPreconditionError(fmt::format("cannot lower a batch plan that is {}: {}",
                                               PlanOutcomeName(bp.outcome), bp.infeasible_reason));
  }
  if (static_cast<int64_t>(bp.replicas.size()) != par.dp ||
      static_cast<int64_t>(schedules.size()) != par.dp) {
    return InvalidArgumentError(fmt::format(
        "lowering: {} replicas and {} schedules for dp = {}; need one of each per replica",
        bp.replicas.size(), schedules.size(), par.dp));
  }
  for (int64_t d = 0; d < par.dp; ++d) {
    const Schedule& s = schedules[d];
    const int64_t m = static_cast<int64_t>(bp.replicas[d].size());
    if (s.pp != par.pp || s.vpp != par.vpp || s.num_microbatches != m) {
      return InvalidArgumentError(fmt::format(
          "lowering: schedule '{}' of replica {} has pp = {}, vpp = {}, {} micro-batches; the "
          "plan has pp = {}, vpp = {}, {} micro-batches",
          s.name, d, s.pp, s.vpp, s.num_microbatches, par.pp, par.vpp, m));
    }
    SLUICE_RETURN_IF_ERROR(
        CheckScheduleComplete(s).WithPrefix(fmt::format("lowering: replica {}", d)));
    for (int64_t i = 0; i < m; ++i) {
      const MicroBatch& mb = bp.replicas[d][i];
      const size_t pp = static_cast<size_t>(par.pp);
      if (mb.stages.size() != pp || mb.shape.mbs < 1 || mb.shape.seqlen < 1) {
        return InvalidArgumentError(fmt::format(
            "lowering: micro-batch {} of replica {} has no per-stage costs for pp = {} or an "
            "empty shape (price it with PriceMicroBatch first)",
            i, d, par.pp));
      }
    }
  }
  return Status::Ok();
}

// Expert parallelism: the all-to-alls of a group's members must pair up one by one, so the
// replicas of an ep group run the same actions in the same order on every pipeline rank.
Status CheckExpertGroups(std::span<const Schedule> schedules, const ParallelConfig& par) {
  if (par.ep <= 1) return Status::Ok();
  if (par.dp % par.ep != 0) {
    return InvalidArgumentError(fmt::format(
        "lowering: ep = {} must divide dp = {} (expert-parallel groups are ep consecutive "
        "data-parallel replicas; groups inside tensor-parallel ranks are not lowered)",
        par.ep, par.dp));
  }
  for (int64_t d = 0; d < par.dp; ++d) {
    const int64_t first = d / par.ep * par.ep;
    if (d == first || schedules[d].ranks == schedules[first].ranks) continue;
    return InvalidArgumentError(fmt::format(
        "lowering: replicas {} and {} form an expert-parallel group (ep = {}) but their "
        "schedules ('{}' with {} micro-batches, '{}' with {}) differ; the replicas of a group "
        "need the same number of micro-batches and the same action order on every pipeline rank "
        "so that their all-to-alls pair up",
        first, d, par.ep, schedules[first].name, schedules[first].num_microbatches,
        schedules[d].name, schedules[d].num_microbatches));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<ExecutionPlan> LowerPlan(const BatchPlan& batch_plan, std::span<const Sample> batch,
                                  std::span<const Schedule> schedules,
                                  const StageCostEvaluator& eval, const ClusterSpec& cluster,
                                  const LowerOptions& options) {
  const ParallelConfig& par = eval.parallel();
  SLUICE_RETURN_IF_ERROR(CheckInputs(batch_plan, schedules, par));
  SLUICE_RETURN_IF_ERROR(CheckExpertGroups(schedules, par));
  if (options.bucket_bytes.count() <= 0) {
    return InvalidArgumentError("lowering: bucket_bytes must be positive");
  }
  ExecutionPlan plan;
  plan.model = eval.model();
  plan.cluster = cluster;
  plan.parallel = par;
  plan.cost_model = eval.cost_model().Describe();
  if (par.ep > 1) plan.moe_slice_overhead = eval.cost_model().MoeSliceOverhead();
  plan.method = batch_plan.method;
  for (const Sample& s : batch) plan.sample_ids.push_back(s.id);
  std::sort(plan.sample_ids.begin(), plan.sample_ids.end());
  plan.dropped = batch_plan.dropped;
  for (const ModelStateMemory& m : eval.stage_states()) plan.model_states.push_back(m.total());
  const BatchIndex index(batch);
  const bool enc_dec = eval.model().is_encoder_decoder();
  std::vector<ScheduleCosts> costs(par.dp);
  for (int64_t d = 0; d < par.dp; ++d) {
    ScheduleCostOptions cost_options = options.costs;
    cost_options.replica = d;
    SLUICE_ASSIGN_OR_RETURN(
        costs[d], BuildScheduleCosts(batch_plan.replicas[d], eval, cluster, cost_options));
    PlanReplica replica;
    replica.schedule = schedules[d].name;
    for (size_t i = 0; i < batch_plan.replicas[d].size(); ++i) {
      const MicroBatch& mb = batch_plan.replicas[d][i];
      PlanMicroBatch pmb{mb.rows, mb.shape, mb.varlen, mb.recompute, costs[d].chunks[i], {}, {}};
      for (const std::vector<int64_t>& row : mb.varlen ? mb.rows : std::vector<std::vector<int64_t>>{}) {
        pmb.seg_lens.emplace_back();
        if (enc_dec) pmb.dec_seg_lens.emplace_back();
        for (int64_t id : row) {
          if (!index.Contains(id)) {
            return InvalidArgumentError(fmt::format(
                "lowering: replica {} micro-batch {}: sample id {} is not in the batch", d, i, id));
          }
          pmb.seg_lens.back().push_back(eval.SeqLen(index(id)));
          if (enc_dec) pmb.dec_seg_lens.back().push_back(eval.DecLen(index(id)));
        }
      }
      replica.micro_batches.push_back(std::move(pmb));
    }
    plan.replicas.push_back(std::move(replica));
  }
  const AlphaBetaCommModel comm(cluster);
  const std::vector<std::vector<Bytes>> buckets = MakeBuckets(eval, options.bucket_bytes);
  plan.ranks.resize(static_cast<size_t>(par.dp * par.pp));
  for (int64_t d = 0; d < par.dp; ++d) {  // placement first: all-to-alls name their group
    for (int64_t r = 0; r < par.pp; ++r) {
      RankProgram& p = plan.ranks[plan.RankId(d, r)];
      p.rank = plan.RankId(d, r);
      p.dp_index = d;
      p.pp_index = r;
    }
  }
  for (int64_t d = 0; d < par.dp; ++d) {
    ReplicaContext c;
    c.plan = &plan;
    c.schedule = &schedules[d];
    c.comm = &comm;
    c.dp_index = d;
    c.m = static_cast<int64_t>(plan.replicas[d].micro_batches.size());
    c.S = plan.num_stages();
    c.pp = par.pp;
    for (int64_t i = 0; i < c.m; ++i) {
      const LayerShape& shape = plan.replicas[d].micro_batches[i].shape;
      c.boundary.emplace_back();
      c.p2p.emplace_back();
      for (int64_t b = 0; b + 1 < c.S; ++b) {
        c.boundary[i].push_back(BoundaryShapes(plan.model, shape, b, plan.parallel));
        c.p2p[i].push_back(c.Remote(b, b + 1) ? std::max(costs[d].p2p[i][b], kMinTime)
                                              : Duration::Zero());
      }
    }
    SLUICE_RETURN_IF_ERROR(Simulate(c, costs[d]));
    const std::vector<std::vector<Event>> events = Events(c);
    for (int64_t r = 0; r < par.pp; ++r) {
      plan.ranks[plan.RankId(d, r)] = RankAssembler(c, r, buckets).Assemble(events[r]);
    }
  }
  return plan;
}

}  // namespace sluice
