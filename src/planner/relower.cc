#include "planner/relower.h"

#include <fmt/core.h>

#include <algorithm>
#include <utility>

#include "base/rng.h"

namespace sluice {
namespace {

bool IsPermutation(std::span<const int64_t> order, int64_t m) {
  if (static_cast<int64_t>(order.size()) != m) return false;
  std::vector<bool> seen(static_cast<size_t>(m), false);
  for (int64_t i : order) {
    if (i < 0 || i >= m || seen[i]) return false;
    seen[i] = true;
  }
  return true;
}

}  // namespace

StatusOr<Relowerer> Relowerer::Create(const ExecutionPlan& plan, const StageCostEvaluator& eval,
                                      const ClusterSpec& cluster, std::span<const Sample> batch,
                                      ScheduleOptions schedule, LowerOptions lower) {
  if (plan.parallel.ep > 1) {
    return FailedPreconditionError(
        "relowering: plans with ep > 1 are not relowered (an expert group's replicas run one "
        "action order)");
  }
  if (plan.parallel.cp > 1) {
    return FailedPreconditionError(
        "relowering: plans with cp > 1 are not relowered (per-micro-batch context parallelism "
        "is not recorded in the plan)");
  }
  Relowerer r;
  r.eval_ = &eval;
  r.cluster_ = cluster;
  r.method_ = plan.method;
  r.dropped_ = plan.dropped;
  r.lower_ = lower;
  for (const Sample& s : batch) {
    if (std::binary_search(plan.sample_ids.begin(), plan.sample_ids.end(), s.id)) {
      r.batch_.push_back(s);
    }
  }
  if (r.batch_.size() != plan.sample_ids.size()) {
    return FailedPreconditionError(fmt::format(
        "relowering: {} of the plan's {} samples are in the batch given",
        r.batch_.size(), plan.sample_ids.size()));
  }
  const BatchIndex index(r.batch_);
  const int64_t dp = plan.dp();
  r.replicas_.resize(static_cast<size_t>(dp));
  r.costs_.resize(static_cast<size_t>(dp));
  r.kinds_.resize(static_cast<size_t>(dp));
  r.fixed_.resize(static_cast<size_t>(dp));
  r.schedule_options_.assign(static_cast<size_t>(dp), schedule);
  for (int64_t d = 0; d < dp; ++d) {
    const PlanReplica& replica = plan.replicas[d];
    SLUICE_ASSIGN_OR_RETURN(r.kinds_[d], ParsePlanScheduleName(replica.schedule));
    if (r.kinds_[d] == ScheduleKind::kInterleaved) {
      r.schedule_options_[d].rounds = replica.schedule == kInterleavedFlexName
                                          ? InterleavedRounds::kFlexible
                                          : InterleavedRounds::kPadded;
    }
    for (size_t k = 0; k < replica.micro_batches.size(); ++k) {
      const PlanMicroBatch& pmb = replica.micro_batches[k];
      MicroBatch mb;
      mb.rows = pmb.rows;
      mb.varlen = pmb.varlen;
      mb.recompute = pmb.recompute;
      bool ok = PriceMicroBatch(eval, index, &mb);
      if (ok && !(mb.shape == pmb.shape)) {
        // A method of fixed shapes (packing's rows of max_seqlen, token-budget's buckets) pads
        // beyond the rows' lengths: the plan's shape is priced (varlen prices follow the samples).
        mb.shape = pmb.shape;
        mb.padded_tokens = mb.shape.mbs * (mb.shape.seqlen + mb.shape.dec_seqlen);
        if (!mb.varlen) {
          std::vector<ChunkCost> stages;
          ok = eval.EvaluateStages(mb.shape, mb.recompute, &stages);
          stages.resize(static_cast<size_t>(eval.pp()));
          mb.stages = std::move(stages);
        }
      }
      if (!ok) {
        return FailedPreconditionError(fmt::format(
            "relowering: micro-batch {} of replica {} cannot be priced again with the plan's "
            "shape",
            k, d));
      }
      r.replicas_[d].push_back(std::move(mb));
    }
    if (r.kinds_[d] == ScheduleKind::k1F1B) {
      r.fixed_[d] = OneFOneBOrder(eval.pp(), static_cast<int64_t>(replica.micro_batches.size()));
    }
    ScheduleCostOptions co = lower.costs;
    co.replica = d;
    SLUICE_ASSIGN_OR_RETURN(r.costs_[d], BuildScheduleCosts(r.replicas_[d], eval, cluster, co));
  }
  return r;
}

StatusOr<ScheduleResult> Relowerer::Estimate(int64_t d, std::span<const int64_t> order,
                                             ScheduleCosts* scratch) const {
  PermuteMicroBatches(costs_[d], order, scratch);
  return GenerateSchedule(kinds_[d], *scratch, schedule_options_[d]);
}

StatusOr<Duration> Relowerer::Makespan(int64_t d, std::span<const int64_t> order,
                                       ScheduleCosts* scratch) const {
  if (!fixed_[d].has_value()) {
    PermuteMicroBatches(costs_[d], order, scratch);
    return ScheduleMakespan(kinds_[d], *scratch, schedule_options_[d]);
  }
  PermuteMicroBatches(costs_[d], order, scratch);
  const ScheduleEstimate e = EstimateSchedule(*fixed_[d], *scratch);
  if (!e.completed || !e.fits_memory) return Duration::Infinite();
  return e.makespan;
}

StatusOr<ExecutionPlan> Relowerer::Lower(std::span<const std::vector<int64_t>> orders) const {
  if (static_cast<int64_t>(orders.size()) != dp()) {
    return InvalidArgumentError(
        fmt::format("relowering: {} orders for {} replicas", orders.size(), dp()));
  }
  BatchPlan batch_plan;
  batch_plan.method = method_;
  batch_plan.dropped = dropped_;
  batch_plan.replicas.resize(static_cast<size_t>(dp()));
  std::vector<Schedule> schedules(static_cast<size_t>(dp()));
  ScheduleCosts scratch;
  for (int64_t d = 0; d < dp(); ++d) {
    std::vector<int64_t> order = orders[d];
    if (order.empty()) {
      order.resize(static_cast<size_t>(size(d)));
      for (int64_t i = 0; i < size(d); ++i) order[i] = i;
    }
    if (!IsPermutation(order, size(d))) {
      return InvalidArgumentError(fmt::format(
          "relowering: the order of replica {} is not a permutation of its {} micro-batches", d,
          size(d)));
    }
    for (int64_t i : order) batch_plan.replicas[d].push_back(replicas_[d][i]);
    SLUICE_ASSIGN_OR_RETURN(ScheduleResult s, Estimate(d, order, &scratch));
    if (s.outcome != PlanOutcome::kOk) {
      return FailedPreconditionError(
          fmt::format("relowering: replica {} in this order: {}", d, s.infeasible_reason));
    }
    schedules[d] = std::move(s.schedule);
  }
  SLUICE_ASSIGN_OR_RETURN(ExecutionPlan plan,
                          LowerPlan(batch_plan, batch_, schedules, *eval_, cluster_, lower_));
  if (!levels_.empty()) ApplyLevels(orders, &plan);
  return plan;
}

void Relowerer::ApplyLevels(std::span<const std::vector<int64_t>> orders,
                            ExecutionPlan* plan) const {
  const int64_t stages = plan->num_stages();
  for (RankProgram& p : plan->ranks) {
    const int64_t d = p.dp_index;
    if (d < 0 || d >= dp() || levels_[d].empty()) continue;
    for (Instruction& in : p.instructions) {
      if (!IsCompute(in.op) || in.microbatch < 0 || in.microbatch >= size(d) || in.stage < 0 ||
          in.stage >= stages) {
        continue;
      }
      const int64_t original = orders[d].empty() ? in.microbatch : orders[d][in.microbatch];
      const std::vector<Recompute>& levels = levels_[d][original];
      if (levels.empty() || levels[in.stage] == replicas_[d][original].recompute) continue;
      in.duration = ComputeDuration(in.op, costs_[d].chunks[original][in.stage]);
      if (in.op != OpKind::kBackwardWeight) in.recompute = levels[in.stage];
    }
  }
  for (int64_t d = 0; d < dp(); ++d) {
    if (levels_[d].empty()) continue;
    for (int64_t i = 0; i < size(d); ++i) {
      const int64_t original = orders[d].empty() ? i : orders[d][i];
      const std::vector<Recompute>& levels = levels_[d][original];
      for (int64_t s = 0; s < static_cast<int64_t>(levels.size()); ++s) {
        if (levels[s] != replicas_[d][original].recompute) {
          plan->replicas[d].micro_batches[i].stages[s] = costs_[d].chunks[original][s];
        }
      }
    }
  }
}

StatusOr<Relowerer> Relowerer::WithLevelsOf(const ExecutionPlan& plan,
                                            std::span<const std::vector<int64_t>> orders) const {
  if (static_cast<int64_t>(orders.size()) != dp() || plan.dp() != dp()) {
    return InvalidArgumentError(
        fmt::format("relowering: {} orders and a plan of {} replicas for {} replicas",
                    orders.size(), plan.dp(), dp()));
  }
  const int64_t stages = plan.num_stages();
  Relowerer out = *this;
  out.levels_.assign(static_cast<size_t>(dp()), {});
  for (int64_t d = 0; d < dp(); ++d) {
    if (!IsPermutation(orders[d], size(d)) ||
        static_cast<int64_t>(plan.replicas[d].micro_batches.size()) != size(d)) {
      return InvalidArgumentError(fmt::format(
          "relowering: replica {}: the order is not a permutation of its {} micro-batches, or "
          "the plan has another number of them",
          d, size(d)));
    }
    out.levels_[d].assign(static_cast<size_t>(size(d)), {});
    for (int64_t i = 0; i < size(d); ++i) {
      const int64_t original = orders[d][i];
      const PlanMicroBatch& pmb = plan.replicas[d].micro_batches[i];
      if (pmb.rows != replicas_[d][original].rows ||
          static_cast<int64_t>(pmb.stages.size()) != stages ||
          static_cast<int64_t>(costs_[d].chunks[original].size()) != stages) {
        return InvalidArgumentError(fmt::format(
            "relowering: micro-batch {} of replica {} is not micro-batch {} of the plan this "
            "relowering was made from",
            i, d, original));
      }
      out.levels_[d][original].assign(static_cast<size_t>(stages),
                                      replicas_[d][original].recompute);
    }
  }
  // Each pair's level is its F's; the cost is the one the plan records for it.
  for (const RankProgram& p : plan.ranks) {
    const int64_t d = p.dp_index;
    if (d < 0 || d >= dp()) continue;
    for (const Instruction& in : p.instructions) {
      if (in.op != OpKind::kForward || in.microbatch < 0 || in.microbatch >= size(d) ||
          in.stage < 0 || in.stage >= stages) {
        continue;
      }
      const int64_t original = orders[d][in.microbatch];
      out.levels_[d][original][in.stage] = in.recompute;
      if (in.recompute != replicas_[d][original].recompute) {
        out.costs_[d].chunks[original][in.stage] =
            plan.replicas[d].micro_batches[in.microbatch].stages[in.stage];
      }
    }
  }
  return out;
}

int64_t Relowerer::level_changes() const {
  int64_t n = 0;
  for (size_t d = 0; d < levels_.size(); ++d) {
    for (size_t mb = 0; mb < levels_[d].size(); ++mb) {
      for (Recompute level : levels_[d][mb]) n += level != replicas_[d][mb].recompute ? 1 : 0;
    }
  }
  return n;
}

ReplicaOrderSearch::ReplicaOrderSearch(const Relowerer& relowerer, int64_t d, bool kicks)
    : relowerer_(&relowerer),
      d_(d),
      m_(relowerer.size(d)),
      kicks_(kicks),
      // Seeded by the replica and its size only, so the search stays a pure function of its
      // inputs.
      rng_(0x5eed0fd3ULL ^ (static_cast<uint64_t>(d) << 20) ^
           static_cast<uint64_t>(relowerer.size(d))) {}

StatusOr<ReplicaOrderSearch> ReplicaOrderSearch::Start(const Relowerer& relowerer, int64_t d,
                                                       std::span<const int64_t> start,
                                                       int64_t exhaustive_up_to, bool kicks) {
  if (exhaustive_up_to < 0 || exhaustive_up_to > 10) {
    return InvalidArgumentError(fmt::format(
        "order search: exhaustive_up_to = {}; allowed: 0..10", exhaustive_up_to));
  }
  if (d < 0 || d >= relowerer.dp()) {
    return InvalidArgumentError(
        fmt::format("order search: replica {}; the plan has {}", d, relowerer.dp()));
  }
  const int64_t m = relowerer.size(d);
  if (!IsPermutation(start, m)) {
    return InvalidArgumentError(fmt::format(
        "order search: the start order of replica {} is not a permutation of its {} "
        "micro-batches",
        d, m));
  }
  ReplicaOrderSearch s(relowerer, d, kicks);
  s.order_.assign(start.begin(), start.end());
  SLUICE_ASSIGN_OR_RETURN(s.start_makespan_, s.Estimate(s.order_));
  s.makespan_ = s.start_makespan_;
  if (m >= 2 && m <= exhaustive_up_to) {
    s.perm_.resize(static_cast<size_t>(m));
    for (int64_t i = 0; i < m; ++i) s.perm_[i] = i;
    s.phase_ = Phase::kExhaustive;
  } else if (m >= 2) {
    s.phase_ = Phase::kOrgan;
  }
  return s;
}

StatusOr<Duration> ReplicaOrderSearch::Estimate(const std::vector<int64_t>& order) {
  ++estimates_;
  return relowerer_->Makespan(d_, order, &scratch_);
}

Duration ReplicaOrderSearch::makespan() const {
  return phase_ == Phase::kKickDescent && kicked_makespan_ < makespan_ ? kicked_makespan_
                                                                       : makespan_;
}

OrderSearch ReplicaOrderSearch::result() const {
  OrderSearch out;
  const bool kick = phase_ == Phase::kKickDescent && kicked_makespan_ < makespan_;
  out.order = kick ? kicked_ : order_;
  out.start_makespan = start_makespan_;
  out.makespan = kick ? kicked_makespan_ : makespan_;
  out.estimates = estimates_;
  out.moves = moves_ + (kick ? 1 : 0);
  out.deadline_hit = deadline_hit_;
  return out;
}

void ReplicaOrderSearch::BeginDescent() {
  swaps_ = false;
  i_ = 0;
  j_ = 0;
  improved_ = false;
}

bool ReplicaOrderSearch::NextMove() {
  for (;;) {
    if (i_ >= m_) {
      // A sweep ended: after an improving one, insertions again; after insertions that improved
      // nothing, swaps; after swaps that improved nothing, the end.
      if (improved_ || !swaps_) {
        swaps_ = !improved_;
        improved_ = false;
        i_ = 0;
        j_ = swaps_ ? 2 : 0;
        continue;
      }
      return false;
    }
    if (!swaps_) {
      // Insertions: moving i before i - 1 = moving i - 1 after i.
      if (j_ >= m_) {
        ++i_;
        j_ = 0;
      } else if (j_ == i_ || j_ == i_ - 1) {
        ++j_;
      } else {
        return true;
      }
    } else {
      // Swaps of non-neighbours (a neighbours' swap is an insertion).
      if (j_ >= m_) {
        ++i_;
        j_ = i_ + 2;
      } else {
        return true;
      }
    }
  }
}

Status ReplicaOrderSearch::Run(int64_t max_estimates,
                               std::optional<std::chrono::steady_clock::time_point> deadline,
                               Duration stop_below) {
  deadline_hit_ = false;
  auto more = [&] {
    if (makespan() < stop_below || estimates_ >= max_estimates) return false;
    if (deadline && std::chrono::steady_clock::now() >= *deadline) {
      deadline_hit_ = true;
      return false;
    }
    return true;
  };
  while (phase_ != Phase::kDone) {
    switch (phase_) {
      case Phase::kExhaustive: {
        if (makespan_ < stop_below) return Status::Ok();
        if (perm_ != order_) {
          SLUICE_ASSIGN_OR_RETURN(Duration t, Estimate(perm_));
          if (t < makespan_) {
            order_ = perm_;
            makespan_ = t;
            ++moves_;
          }
        }
        if (!std::next_permutation(perm_.begin(), perm_.end())) phase_ = Phase::kDone;
        break;
      }
      case Phase::kOrgan: {
        // 1. The organ pipe: sorted by total time ascending (ties: the start order), the even
        // ranks forward then the odd ones backward.
        if (!more()) return Status::Ok();
        const ScheduleCosts& costs = relowerer_->costs(d_);
        std::vector<Duration> total(static_cast<size_t>(m_));
        for (int64_t i = 0; i < m_; ++i) {
          for (const ChunkCost& c : costs.chunks[i]) {
            total[i] += c.forward + c.backward_input + c.backward_weight;
          }
        }
        std::vector<int64_t> by_time = order_;
        std::stable_sort(by_time.begin(), by_time.end(),
                         [&](int64_t a, int64_t b) { return total[a] < total[b]; });
        std::vector<int64_t> organ;
        organ.reserve(static_cast<size_t>(m_));
        for (int64_t i = 0; i < m_; i += 2) organ.push_back(by_time[i]);
        for (int64_t i = (m_ - 1) - ((m_ - 1) % 2 == 0 ? 1 : 0); i >= 1; i -= 2) {
          organ.push_back(by_time[i]);
        }
        if (organ != order_) {
          SLUICE_ASSIGN_OR_RETURN(Duration t, Estimate(organ));
          if (t < makespan_) {
            order_ = std::move(organ);
            makespan_ = t;
            ++moves_;
          }
        }
        BeginDescent();
        phase_ = Phase::kDescent;
        break;
      }
      case Phase::kDescent:
      case Phase::kKickDescent: {
        // 2. Descent from the best order (or a kick's): first-improvement sweeps of insertion
        // moves (micro-batch at position i moved to position j), then of swaps (positions
        // i < j - 1 exchanged), again until neither improves.
        const bool kick = phase_ == Phase::kKickDescent;
        if (!NextMove()) {
          if (kick && kicked_makespan_ < makespan_) {
            order_ = std::move(kicked_);
            makespan_ = kicked_makespan_;
            ++moves_;  // one move counted for the whole kick
            idle_ = 0;
          }
          phase_ = Phase::kKickStart;
          break;
        }
        if (!more()) return Status::Ok();
        std::vector<int64_t>& work = kick ? kicked_ : order_;
        candidate_ = work;
        if (!swaps_) {
          const int64_t x = candidate_[i_];
          candidate_.erase(candidate_.begin() + i_);
          candidate_.insert(candidate_.begin() + j_, x);
        } else {
          std::swap(candidate_[i_], candidate_[j_]);
        }
        ++j_;
        SLUICE_ASSIGN_OR_RETURN(Duration c, Estimate(candidate_));
        Duration& t = kick ? kicked_makespan_ : makespan_;
        if (c < t) {
          work = candidate_;
          t = c;
          ++(kick ? kicked_moves_ : moves_);
          improved_ = true;
        }
        break;
      }
      case Phase::kKickStart: {
        // 3. Kicks (iterated local search): from the best order, three micro-batches moved to
        // seeded random places, then the descent again; the result is kept when shorter; until
        // 2 m kicks in a row found nothing.
        if (!kicks_ || m_ < 3 || idle_ >= 2 * m_) {
          phase_ = Phase::kDone;
          break;
        }
        if (!more()) return Status::Ok();
        ++idle_;
        kicked_ = order_;
        for (int k = 0; k < 3; ++k) {
          const int64_t i = rng_.UniformInt(0, m_ - 1);
          const int64_t x = kicked_[i];
          kicked_.erase(kicked_.begin() + i);
          kicked_.insert(kicked_.begin() + rng_.UniformInt(0, m_ - 1), x);
        }
        SLUICE_ASSIGN_OR_RETURN(kicked_makespan_, Estimate(kicked_));
        kicked_moves_ = 0;
        BeginDescent();
        phase_ = Phase::kKickDescent;
        break;
      }
      case Phase::kDone:
        break;
    }
  }
  return Status::Ok();
}

StatusOr<OrderSearch> SearchReplicaOrder(
    const Relowerer& relowerer, int64_t d, std::span<const int64_t> start, int64_t max_estimates,
    int64_t exhaustive_up_to, std::optional<std::chrono::steady_clock::time_point> deadline,
    bool kicks) {
  SLUICE_ASSIGN_OR_RETURN(ReplicaOrderSearch s,
                          ReplicaOrderSearch::Start(relowerer, d, start, exhaustive_up_to, kicks));
  SLUICE_RETURN_IF_ERROR(s.Run(max_estimates, deadline));
  return s.result();
}

}  // namespace sluice
