#include "planner/hetero.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <numeric>
#include <set>
#include <tuple>
#include <utility>

#include "base/rng.h"
#include "batching/assigners.h"
#include "cost/comm_model.h"
#include "cost/layer_work.h"
#include "model/chunk_cut.h"
#include "planner/config_search.h"

namespace sluice {
namespace {

using Clock = std::chrono::steady_clock;

// Whether one sequence of `len` tokens fits a replica of `eval` alone with pp micro-batches in
// flight at `rc`.
bool SequenceFits(const StageCostEvaluator& eval, int64_t len, Recompute rc) {
  const int64_t in_flight = eval.pp();
  if (eval.varlen_supported() && !eval.model().is_encoder_decoder()) {
    const int64_t lengths[] = {len};
    return eval.SummarizeVarlen(lengths, rc, in_flight).feasible;
  }
  return eval.Summarize(LayerShape{.mbs = 1, .seqlen = eval.Pad(len)}, rc, in_flight).feasible;
}

// The longest sequence a replica of `eval` holds alone (0: none), by bisection.
int64_t Capacity(const StageCostEvaluator& eval, Recompute rc) {
  const int64_t top = std::max<int64_t>(1, eval.model().max_position);
  if (SequenceFits(eval, top, rc)) return top;
  if (!SequenceFits(eval, 1, rc)) return 0;
  int64_t good = 1, bad = top;
  while (bad - good > 1) {
    const int64_t mid = good + (bad - good) / 2;
    (SequenceFits(eval, mid, rc) ? good : bad) = mid;
  }
  return good;
}

// The device of pipeline rank `stage` of replica `replica` in group `g`.
int64_t DeviceOf(const HeteroConfig& config, const std::vector<int64_t>& offsets, int64_t g,
                 int64_t replica, int64_t stage) {
  const ParallelConfig& p = config.groups[g];
  return offsets[g] + p.FirstDevice(replica * p.pp + stage);
}

std::string GroupName(const HeteroConfig& config, int64_t g) {
  HeteroConfig one{.groups = {config.groups[g]}};
  return fmt::format("group {} ({})", g + 1, DescribeHetero(one));
}

}  // namespace

std::vector<ReductionGroup> ReductionGroupsOf(const ModelSpec& model, const HeteroConfig& config) {
  const int64_t layers = model.layers;
  std::set<int64_t> cuts = {0, layers};
  for (const ParallelConfig& g : config.groups) {
    const int64_t per = layers / g.pp;
    for (int64_t s = 1; s < g.pp; ++s) cuts.insert(s * per);
  }
  const int64_t layer_params = AnalyticLayerParams(model, LayerKind::kEncoder, 1);
  std::vector<ReductionGroup> out;
  for (auto it = cuts.begin(); std::next(it) != cuts.end(); ++it) {
    ReductionGroup r;
    r.first_layer = *it;
    r.layers = *std::next(it) - *it;
    r.embedding = r.first_layer == 0;
    r.output_head = *std::next(it) == layers;
    r.params = r.layers * layer_params;
    if (r.embedding) r.params += AnalyticLayerParams(model, LayerKind::kEmbedding, 1);
    if (r.output_head) r.params += AnalyticLayerParams(model, LayerKind::kOutputHead, 1);
    for (size_t g = 0; g < config.groups.size(); ++g) {
      const int64_t per = layers / config.groups[g].pp;
      r.members.push_back({static_cast<int64_t>(g), per > 0 ? r.first_layer / per : 0});
    }
    out.push_back(std::move(r));
  }
  return out;
}

Duration PriceReduction(const ReductionGroup& group, const HeteroConfig& config,
                        const ClusterSpec& cluster) {
  if (config.groups.size() <= 1) return Duration::Zero();
  const std::vector<int64_t> offsets = config.DeviceOffsets();
  const AlphaBetaCommModel comm(cluster);
  int64_t cross = 0;
  std::vector<int64_t> heads;  // the cross-group ring: each member's first device
  Duration gather;
  for (const ReductionMember& m : group.members) {
    const ParallelConfig& p = config.groups[m.group];
    const int64_t copies = p.cp * p.dp;  // devices holding each tp shard of the range
    cross = std::max(cross, 2 * group.params / (p.tp * copies));
    heads.push_back(DeviceOf(config, offsets, m.group, 0, m.stage));
    if (copies > 1 && p.zero < 2) {
      // The group's own ring over its copies, where the group's devices start.
      gather = std::max(gather, comm.Collective(CollectiveKind::kAllGather,
                                                Bytes::Of(2 * group.params / p.tp),
                                                GradientRing(cluster, p, m.stage,
                                                             offsets[m.group])));
    }
  }
  return comm.Collective(CollectiveKind::kAllReduce, Bytes::Of(cross),
                         RingOverDevices(cluster, heads)) +
         gather;
}

StatusOr<HeteroPlanner> HeteroPlanner::Create(const CostModel& cost, const HeteroConfig& config,
                                              const ClusterSpec& cluster,
                                              HeteroPlannerOptions options,
                                              std::string_view source) {
  SLUICE_RETURN_IF_ERROR(CheckHeteroFits(config, cost.model(), cluster, source));
  HeteroPlanner h;
  h.config_ = config;
  h.cluster_ = cluster;
  h.options_ = std::move(options);
  const Recompute saving = h.options_.planner.batching.recompute.value_or(Recompute::kFull);
  for (size_t g = 0; g < config.groups.size(); ++g) {
    StatusOr<std::shared_ptr<const StageCostEvaluator>> eval =
        MakePlannerEvaluator(cost, config.groups[g], cluster, h.options_.planner.schedule);
    if (!eval.ok()) {
      return InvalidArgumentError(fmt::format("{}: {}: {}", source,
                                              GroupName(config, static_cast<int64_t>(g)),
                                              eval.status().message()));
    }
    h.capacities_.push_back(Capacity(**eval, saving));
    h.group_sync_.push_back(EstimateGradientSync(**eval, cluster));
    SLUICE_ASSIGN_OR_RETURN(Planner p, Planner::Create(*eval, cluster, h.options_.planner));
    h.planners_.push_back(std::move(p));
  }
  h.reductions_ = ReductionGroupsOf(cost.model(), config);
  for (ReductionGroup& r : h.reductions_) {
    r.cross_group_time = PriceReduction(r, config, cluster);
    h.cross_sync_ += r.cross_group_time;
  }
  h.pieces_ = SplitReductions(h.reductions_, cost.model(), config, cluster,
                              h.options_.overlap_pieces);
  return h;
}

HeteroDispatch HeteroPlanner::Dispatch(std::span<const Sample> batch,
                                       std::span<const double> scale) const {
  HeteroDispatch d;
  const int64_t n = static_cast<int64_t>(batch.size());
  const int64_t groups = static_cast<int64_t>(config_.groups.size());
  std::vector<int64_t> group_of_replica, pp_of_replica;
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t k = 0; k < config_.groups[g].dp; ++k) {
      group_of_replica.push_back(g);
      pp_of_replica.push_back(config_.groups[g].pp);
    }
  }
  const int64_t replicas = static_cast<int64_t>(group_of_replica.size());
  std::vector<std::vector<int64_t>> cost;  // [group][sequence]
  for (int64_t g = 0; g < groups; ++g) {
    cost.push_back(EstimateSampleCosts(batch, planners_[g].evaluator(), options_.planner.batching));
  }
  std::vector<std::vector<int64_t>> scaled = cost;  // [group][sequence]
  if (!scale.empty()) {
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t& c : scaled[g]) {
        c = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(c) * scale[g]));
      }
    }
  }
  const StageCostEvaluator& eval0 = planners_[0].evaluator();
  std::vector<int64_t> fits(static_cast<size_t>(n), 0);
  std::vector<std::vector<bool>> holds(static_cast<size_t>(n), std::vector<bool>(groups, false));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = eval0.SeqLen(batch[i]);
    for (int64_t g = 0; g < groups; ++g) {
      holds[i][g] = len <= capacities_[g];
      fits[i] += holds[i][g] ? 1 : 0;
    }
    if (fits[i] == 0) {
      std::string caps;
      for (int64_t g = 0; g < groups; ++g) {
        caps +=
            fmt::format("{}{}: {} tokens", g ? ", " : "", GroupName(config_, g), capacities_[g]);
      }
      d.reason = fmt::format(
          "sample {} of {} tokens fits no replica group (longest sequence each holds: {})",
          batch[i].id, len, caps);
      return d;
    }
  }
  d.ok = true;
  bool have = false;
  std::vector<int64_t> base(static_cast<size_t>(n));
  std::iota(base.begin(), base.end(), 0);
  const Rng root(options_.planner.batching.seed);
  for (int64_t k = 0; k < std::max<int64_t>(1, options_.shuffles); ++k) {
    std::vector<int64_t> order = base;
    Rng rng = root.Fork(static_cast<uint64_t>(k));
    for (int64_t i = n - 1; i > 0; --i) std::swap(order[i], order[rng.UniformInt(0, i)]);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t x, int64_t y) { return fits[x] < fits[y]; });
    std::vector<int64_t> sum(replicas, 0), mx(replicas, 0), count(replicas, 0);
    std::vector<int64_t> replica_of(static_cast<size_t>(n), 0);
    int64_t global = 0;
    for (int64_t i : order) {
      int64_t best = -1;
      std::tuple<int64_t, bool, int64_t> best_key;
      for (int64_t r = 0; r < replicas; ++r) {
        const int64_t g = group_of_replica[r];
        if (!holds[i][g]) continue;
        const int64_t c = scaled[g][i];
        const int64_t t = sum[r] + c + (pp_of_replica[r] - 1) * std::max(mx[r], c);
        const std::tuple<int64_t, bool, int64_t> key{std::max(global, t), count[r] > 0, t};
        if (best < 0 || key < best_key) {
          best = r;
          best_key = key;
        }
      }
      const int64_t g = group_of_replica[best];
      sum[best] += scaled[g][i];
      mx[best] = std::max(mx[best], scaled[g][i]);
      ++count[best];
      global = std::get<0>(best_key);
      replica_of[i] = best;
    }
    const bool nonempty = std::all_of(count.begin(), count.end(), [](int64_t c) { return c > 0; });
    if (!have || std::make_pair(!nonempty, global) < std::make_pair(!d.all_nonempty, d.max_time)) {
      have = true;
      d.all_nonempty = nonempty;
      d.max_time = global;
      d.replica_of = std::move(replica_of);
    }
  }
  d.group_of.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) d.group_of[i] = group_of_replica[d.replica_of[i]];
  std::vector<int64_t> sum(replicas, 0), mx(replicas, 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = d.replica_of[i];
    sum[r] += cost[group_of_replica[r]][i];
    mx[r] = std::max(mx[r], cost[group_of_replica[r]][i]);
  }
  d.group_time.assign(static_cast<size_t>(groups), 0);
  for (int64_t r = 0; r < replicas; ++r) {
    const int64_t g = group_of_replica[r];
    d.group_time[g] = std::max(d.group_time[g], sum[r] + (pp_of_replica[r] - 1) * mx[r]);
  }
  return d;
}

StatusOr<HeteroPlanResult> HeteroPlanner::Plan(std::span<const Sample> batch) const {
  return PlanRounds(batch, std::vector<double>(config_.groups.size(), 1.0),
                    std::max<int64_t>(0, options_.refine_rounds));
}

StatusOr<HeteroPlanResult> HeteroPlanner::PlanFrom(std::span<const Sample> batch,
                                                   std::span<const double> scale) const {
  std::vector<double> from(config_.groups.size(), 1.0);
  if (scale.size() == from.size()) from.assign(scale.begin(), scale.end());
  return PlanRounds(batch, std::move(from), 0);
}

StatusOr<HeteroPlanResult> HeteroPlanner::PlanRounds(std::span<const Sample> batch,
                                                     std::vector<double> scale,
                                                     int64_t rounds) const {
  const auto start = Clock::now();
  const int64_t groups = static_cast<int64_t>(config_.groups.size());
  std::optional<HeteroPlanResult> best;
  std::vector<PlanResult*> best_groups;  // in `plans`
  GroupPlans plans;
  for (int64_t round = 0; round <= rounds; ++round) {
    std::vector<PlanResult*> made;
    SLUICE_ASSIGN_OR_RETURN(HeteroPlanResult r, PlanRound(batch, scale, &plans, &made));
    const bool better =
        !best.has_value() || (r.outcome == PlanOutcome::kOk &&
                              (best->outcome != PlanOutcome::kOk || r.makespan < best->makespan));
    bool refine = r.outcome == PlanOutcome::kOk && groups > 1;
    if (refine) {
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t predicted = r.dispatch.group_time[g];
        if (predicted <= 0) {
          refine = false;
          break;
        }
        scale[g] = static_cast<double>(made[g]->makespan.nanos()) / static_cast<double>(predicted);
      }
    }
    if (better) {
      best = std::move(r);
      best_groups = std::move(made);
    }
    if (!refine) break;
  }
  if (best->outcome == PlanOutcome::kOk) {
    // Distinct entries of `plans` (one per group), moved out once no round needs them.
    for (PlanResult* g : best_groups) best->groups.push_back(std::move(*g));
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t predicted = best->dispatch.group_time[g];
      best->scale.push_back(predicted > 0 ? static_cast<double>(best->groups[g].makespan.nanos()) /
                                                static_cast<double>(predicted)
                                          : 1.0);
    }
  }
  best->planning_time = Duration::Nanos(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
  return std::move(*best);
}

std::optional<Duration> HeteroPlanner::Screen(std::span<const Sample> batch,
                                              std::span<const double> scale) const {
  // Scales of another mix (another group count) are not this one's: stage 1 unscaled.
  if (scale.size() != config_.groups.size()) scale = {};
  const HeteroDispatch d = Dispatch(batch, scale);
  if (!d.ok) return std::nullopt;
  Duration slowest;
  for (size_t g = 0; g < config_.groups.size(); ++g) {
    const double f = scale.empty() ? 1.0 : scale[g];
    slowest = std::max(
        slowest, Duration::Nanos(static_cast<int64_t>(f * static_cast<double>(d.group_time[g]))) +
                     group_sync_[g]);
  }
  return slowest + cross_sync_;
}

StatusOr<HeteroPlanResult> HeteroPlanner::PlanRound(std::span<const Sample> batch,
                                                    std::span<const double> scale,
                                                    GroupPlans* plans,
                                                    std::vector<PlanResult*>* made) const {
  HeteroPlanResult out;
  out.reductions = reductions_;
  out.pieces = pieces_;
  out.cross_sync = cross_sync_;
  out.dispatch = Dispatch(batch, scale);
  made->clear();
  const int64_t groups = static_cast<int64_t>(config_.groups.size());
  if (!out.dispatch.ok) {
    out.outcome = PlanOutcome::kOutOfMemory;
    out.infeasible_reason = out.dispatch.reason;
    return out;
  }
  out.samples.resize(static_cast<size_t>(groups));
  std::vector<std::vector<int64_t>> indices(static_cast<size_t>(groups));
  for (size_t i = 0; i < batch.size(); ++i) {
    out.samples[out.dispatch.group_of[i]].push_back(batch[i]);
    indices[out.dispatch.group_of[i]].push_back(static_cast<int64_t>(i));
  }
  Duration slowest;
  for (int64_t g = 0; g < groups; ++g) {
    if (static_cast<int64_t>(out.samples[g].size()) < config_.groups[g].dp) {
      out.outcome = PlanOutcome::kOutOfMemory;
      out.infeasible_reason =
          fmt::format("{} got {} sequences for its {} replicas", GroupName(config_, g),
                      out.samples[g].size(), config_.groups[g].dp);
      made->clear();
      return out;
    }
    std::pair<int64_t, std::vector<int64_t>> key{g, std::move(indices[g])};
    auto known = plans->find(key);
    if (known == plans->end()) {
      SLUICE_ASSIGN_OR_RETURN(PlanResult p, planners_[g].Plan(out.samples[g]));
      known = plans->emplace(std::move(key), std::move(p)).first;
    }
    const PlanResult& r = known->second;
    if (r.outcome != PlanOutcome::kOk) {
      out.outcome = r.outcome;
      out.infeasible_reason = fmt::format("{}: {}", GroupName(config_, g), r.infeasible_reason);
      made->clear();
      return out;
    }
    slowest = std::max(slowest, r.makespan + group_sync_[g]);
    made->push_back(&known->second);
  }
  out.makespan = slowest + cross_sync_;
  return out;
}

nlohmann::json HeteroPlanToJson(const HeteroPlanResult& plan, const HeteroConfig& config,
                                const ClusterSpec& cluster) {
  nlohmann::json reductions = nlohmann::json::array();
  for (const ReductionGroup& r : plan.reductions) {
    nlohmann::json members = nlohmann::json::array();
    for (const ReductionMember& m : r.members) {
      members.push_back({{"group", m.group}, {"stage", m.stage}});
    }
    reductions.push_back({{"first_layer", r.first_layer},
                          {"layers", r.layers},
                          {"embedding", r.embedding},
                          {"output_head", r.output_head},
                          {"params", r.params},
                          {"members", members},
                          {"cross_group_ms", PriceReduction(r, config, cluster).millis()}});
  }
  nlohmann::json groups = nlohmann::json::array();
  for (const PlanResult& g : plan.groups) groups.push_back(PlanToJson(g.plan));
  return {{"format", "sluice-hetero-plan/1"},
          {"replicas", HeteroConfigToJson(config)},
          {"device_offsets", config.DeviceOffsets()},
          {"reductions", reductions},
          {"cross_group_ms", plan.cross_sync.millis()},
          {"groups", groups}};
}

namespace {

// Each rank's timing in a group's simulation (RankTiming); needs `sim`'s timeline.
std::vector<RankTiming> TimingsOf(const ExecutionPlan& plan, const SimResult& sim) {
  std::vector<RankTiming> out(plan.ranks.size());
  std::vector<bool> reduced(plan.ranks.size(), false);
  std::vector<Duration> computed(plan.ranks.size());
  for (const SimInterval& iv : sim.timeline) {
    const size_t r = static_cast<size_t>(iv.rank);
    if (r >= plan.ranks.size()) continue;
    const OpKind op = plan.ranks[r].instructions[iv.instruction].op;
    if (op == OpKind::kAllReduceGrad || op == OpKind::kReduceScatterGrad) {
      out[r].reduced = std::max(out[r].reduced, iv.end);
      reduced[r] = true;
    } else if (IsCompute(op)) {
      computed[r] = std::max(computed[r], iv.end);
      if ((op == OpKind::kBackward || op == OpKind::kBackwardWeight) &&
          iv.end >= out[r].backward_end) {
        out[r].backward_start = iv.start;
        out[r].backward_end = iv.end;
      }
    }
  }
  for (size_t r = 0; r < out.size(); ++r) {
    if (!reduced[r]) out[r].reduced = computed[r];
    out[r].reduced = std::max(out[r].reduced, out[r].backward_end);
    out[r].finish = std::max(sim.ranks[r].finish, out[r].reduced);
  }
  return out;
}

}  // namespace

std::vector<ReductionGroup> SplitReductions(std::span<const ReductionGroup> ranges,
                                            const ModelSpec& model, const HeteroConfig& config,
                                            const ClusterSpec& cluster, int64_t pieces) {
  const int64_t layer_params = AnalyticLayerParams(model, LayerKind::kEncoder, 1);
  std::vector<ReductionGroup> out;
  for (const ReductionGroup& r : ranges) {
    const int64_t n = std::clamp<int64_t>(pieces, 1, std::max<int64_t>(1, r.layers));
    int64_t first = r.first_layer;
    for (int64_t k = 0; k < n; ++k) {
      ReductionGroup p = r;
      p.first_layer = first;
      p.layers = r.layers / n + (k < r.layers % n ? 1 : 0);
      first += p.layers;
      p.embedding = r.embedding && k == 0;
      p.output_head = r.output_head && k == n - 1;
      p.params = p.layers * layer_params;
      if (p.embedding) p.params += AnalyticLayerParams(model, LayerKind::kEmbedding, 1);
      if (p.output_head) p.params += AnalyticLayerParams(model, LayerKind::kOutputHead, 1);
      p.cross_group_time = PriceReduction(p, config, cluster);
      out.push_back(std::move(p));
    }
  }
  return out;
}

OverlappedSync OverlapCrossSync(std::span<const ReductionGroup> pieces, int64_t layers,
                                std::span<const std::vector<RankTiming>> timing,
                                std::span<const ParallelConfig> groups) {
  OverlappedSync out;
  auto rank_of = [&](const ReductionMember& m, int64_t d) {
    return static_cast<size_t>(d * groups[m.group].pp + m.stage);
  };
  // When member rank `t` (its stage holds [lo, hi)) has reduced the gradients of layers from
  // `first` up inside its group: the backward computes a stage's layers last to first, so layer
  // `first` is done (hi - first) / (hi - lo) into the last backward, and its in-group reduction
  // ends at most the stage's reduction lag (reduced - backward end) later.
  auto ready_at = [](const RankTiming& t, int64_t lo, int64_t hi, int64_t first) {
    const double done = static_cast<double>(hi - first) / static_cast<double>(hi - lo);
    const Duration grad =
        t.backward_start +
        Duration::Nanos(static_cast<int64_t>(done * (t.backward_end - t.backward_start).nanos()));
    return std::min(t.reduced, grad + (t.reduced - t.backward_end));
  };
  std::vector<Duration> ready(pieces.size());
  for (size_t k = 0; k < pieces.size(); ++k) {
    for (const ReductionMember& m : pieces[k].members) {
      const ParallelConfig& p = groups[m.group];
      const int64_t per = std::max<int64_t>(1, layers / p.pp);
      const int64_t lo = m.stage * per;
      const int64_t hi = m.stage == p.pp - 1 ? layers : lo + per;
      for (int64_t d = 0; d < p.dp; ++d) {
        ready[k] = std::max(ready[k], ready_at(timing[m.group][rank_of(m, d)], lo, hi,
                                               pieces[k].first_layer));
      }
    }
  }
  std::vector<size_t> order(pieces.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return ready[a] < ready[b]; });
  // One channel: the pieces' reductions one after another, each once it is ready.
  Duration channel;
  std::vector<Duration> done(pieces.size());
  for (size_t k : order) {
    channel = std::max(channel, ready[k]) + pieces[k].cross_group_time;
    done[k] = channel;
  }
  for (const std::vector<RankTiming>& g : timing) {
    for (const RankTiming& t : g) out.slowest_group = std::max(out.slowest_group, t.finish);
  }
  out.iteration_time = out.slowest_group;
  // A rank's tail after its own reduction (the optimizer step and, with ZeRO-2, the gather of
  // the updated parameters) waits for the cross-group reduction of its pieces.
  for (size_t k = 0; k < pieces.size(); ++k) {
    for (const ReductionMember& m : pieces[k].members) {
      for (int64_t d = 0; d < groups[m.group].dp; ++d) {
        const RankTiming& t = timing[m.group][rank_of(m, d)];
        out.iteration_time = std::max(out.iteration_time, done[k] + (t.finish - t.reduced));
      }
    }
  }
  out.exposed = out.iteration_time - out.slowest_group;
  return out;
}

StatusOr<HeteroSimResult> SimulateHetero(const HeteroPlanResult& plan, SimOptions options) {
  HeteroSimResult out;
  out.cross_sync = plan.cross_sync;
  const bool keep_timeline = options.record_timeline;
  options.record_timeline = true;  // the ranks' gradient-ready times
  std::vector<std::vector<RankTiming>> timing;
  std::vector<ParallelConfig> groups;
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    options.samples = plan.samples[g];
    SLUICE_ASSIGN_OR_RETURN(SimResult r, Simulate(plan.groups[g].plan, options));
    if (out.outcome == SimOutcome::kOk && !out.memory_exceeded &&
        (r.outcome != SimOutcome::kOk || r.memory_exceeded)) {
      out.outcome = r.outcome;
      out.memory_exceeded = r.memory_exceeded;
      out.problem = fmt::format("group {}: {}", g + 1,
                                r.memory_exceeded && r.problem.empty()
                                    ? fmt::format("rank {} exceeds the memory limit", r.oom_rank)
                                    : r.problem);
    }
    out.slowest_group = std::max(out.slowest_group, r.iteration_time);
    out.real_tokens += r.real_tokens;
    if (r.outcome == SimOutcome::kOk) timing.push_back(TimingsOf(plan.groups[g].plan, r));
    groups.push_back(plan.groups[g].plan.parallel);
    if (!keep_timeline) {
      r.timeline.clear();
      r.timeline.shrink_to_fit();
    }
    out.groups.push_back(std::move(r));
  }
  if (out.outcome != SimOutcome::kOk || plan.pieces.empty() || plan.groups.size() <= 1) {
    out.iteration_time = out.slowest_group + out.cross_sync;
    out.cross_exposed = out.cross_sync;
    return out;
  }
  const OverlappedSync o =
      OverlapCrossSync(plan.pieces, plan.groups[0].plan.model.layers, timing, groups);
  out.iteration_time = std::max(o.iteration_time, out.slowest_group);
  out.cross_exposed = out.iteration_time - out.slowest_group;
  return out;
}

}  // namespace sluice
