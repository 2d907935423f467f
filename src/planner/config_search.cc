#include "planner/config_search.h"

#include <fmt/core.h>

#include <algorithm>
#include <functional>
#include <set>
#include <tuple>
#include <utility>

#include "cost/comm_model.h"
#include "model/chunk_cut.h"
#include "planner/layer_cut.h"

namespace sluice {
namespace {

std::vector<int64_t> Divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= n; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

// Better first: feasible before infeasible, then (run_tally.h) every score batch run before any
// failed, then the higher throughput (simulated when both were simulated, else estimated), then
// the key for determinism.
bool RankBefore(const CandidateScore& a, const CandidateScore& b) {
  const bool ok_a = a.state == CandidateScore::State::kOk;
  const bool ok_b = b.state == CandidateScore::State::kOk;
  if (ok_a != ok_b) return ok_a;
  if (a.complete() != b.complete()) return a.complete();
  if (a.simulated && b.simulated && a.simulated_tokens_per_s != b.simulated_tokens_per_s) {
    return a.simulated_tokens_per_s > b.simulated_tokens_per_s;
  }
  if (a.estimated_tokens_per_s != b.estimated_tokens_per_s) {
    return a.estimated_tokens_per_s > b.estimated_tokens_per_s;
  }
  return a.candidate.Key() < b.candidate.Key();
}

}  // namespace

std::string Candidate::Describe() const {
  std::string vpp = parallel.vpp > 1 ? fmt::format(" x vpp {}", parallel.vpp) : "";
  std::string cp = parallel.cp > 1 ? fmt::format(" x cp {}", parallel.cp) : "";
  std::string ep = parallel.ep > 1 ? fmt::format(" x ep {}", parallel.ep) : "";
  std::string cut = parallel.layer_cut.empty()
                        ? ""
                        : fmt::format(" (layers {})", DescribeLayerCut(parallel.layer_cut));
  std::string order = parallel.order == RankOrder::kDataInner
                          ? ""
                          : fmt::format(", order {}", RankOrderName(parallel.order));
  return fmt::format("dp {} x pp {} x tp {}{}{}{}{}, ZeRO-{}{}, {}, {}{}", parallel.dp,
                     parallel.pp, parallel.tp, cp, ep, vpp, cut, parallel.zero, order,
                     ScheduleKindName(schedule), batching, dynamic_cp ? ", dynamic cp" : "");
}

std::string Candidate::Key() const {
  // cp = 1 keeps the key it had before context parallelism (keys order ties, run_tally.h).
  // ep = 1 likewise.
  const std::string cp = parallel.cp > 1 ? fmt::format("/cp{:04d}", parallel.cp) : "";
  const std::string ep = parallel.ep > 1 ? fmt::format("/ep{:04d}", parallel.ep) : "";
  return fmt::format("{:06d}/{:06d}/{:06d}{}{}/{:04d}/{}/{}/{}", parallel.dp, parallel.pp,
                     parallel.tp, cp, ep, parallel.vpp, parallel.zero, ScheduleKindName(schedule),
                     batching) +
         (dynamic_cp ? "/dcp" : "") +
         (parallel.layer_cut.empty() ? "" : "/cut" + DescribeLayerCut(parallel.layer_cut)) +
         (parallel.order == RankOrder::kDataInner ? "" : "/pp-inner");
}

ParallelSpace EnumerateParallelConfigs(const ModelSpec& model, const ClusterSpec& cluster,
                                       const CostModel& cost, const SearchSpace& space,
                                       std::optional<Bytes> memory_limit,
                                       std::optional<Bytes> memory_reserve) {
  ParallelSpace out;
  const int64_t devices = cluster.num_devices();
  std::vector<int64_t> tps = space.tp;
  if (tps.empty()) {
    for (int64_t tp = 1; tp <= std::min(devices, cluster.devices_per_node); tp *= 2) {
      tps.push_back(tp);
    }
  }
  // cp: the listed degrees; empty: powers of two up to the devices (decoder-only models).
  std::vector<int64_t> cps = space.cp;
  if (cps.empty()) {
    cps.push_back(1);
    if (!model.is_encoder_decoder()) {
      for (int64_t cp = 2; cp <= devices; cp *= 2) cps.push_back(cp);
    }
  }
  // ep: the listed degrees; empty: powers of two up to the devices (MoE models).
  std::vector<int64_t> eps = space.ep;
  if (eps.empty()) {
    eps.push_back(1);
    if (model.moe.has_value()) {
      for (int64_t ep = 2; ep <= devices; ep *= 2) eps.push_back(ep);
    }
  }
  for (int64_t tp : tps) {
    if (!cost.SupportsTp(tp)) {
      out.skipped.push_back(
          fmt::format("tp {}: the cost model ({}) has no figures for it", tp, cost.Describe()));
      continue;
    }
    for (int64_t cp : cps) {
      for (int64_t pp : space.pp.empty() ? Divisors(devices) : space.pp) {
        for (int64_t dp = 1; dp * pp * tp * cp <= devices; ++dp) {
          if (space.all_devices && dp * pp * tp * cp != devices) continue;
          for (int64_t ep : eps) {
            for (size_t zi = 0; zi < space.zero.size(); ++zi) {
              // ZeRO shards over dp * cp: with dp * cp = 1 every stage is the same
              // configuration.
              if (dp * cp == 1 && zi > 0) break;
              ParallelConfig par;
              par.dp = dp;
              par.pp = pp;
              par.tp = tp;
              par.cp = cp;
              par.ep = ep;
              par.zero = space.zero[zi];
              par.memory_limit = memory_limit;
              par.memory_reserve = memory_reserve;
              Status fits = CheckParallelFits(par, model, &cluster, "search");
              if (!fits.ok()) {
                if (zi == 0) {
                  const std::string cp_text = cp > 1 ? fmt::format(" x cp {}", cp) : "";
                  const std::string ep_text = ep > 1 ? fmt::format(" x ep {}", ep) : "";
                  out.skipped.push_back(fmt::format("dp {} x pp {} x tp {}{}{}: {}", dp, pp, tp,
                                                    cp_text, ep_text, fits.message()));
                }
                break;
              }
              if (space.only_order.has_value() && SearchesOrder(cluster, par)) {
                par.order = *space.only_order;
              }
              out.configs.push_back(par);
              // The other device order, where it places the configuration differently.
              if (!space.only_order.has_value() && SearchesOrder(cluster, par)) {
                par.order = RankOrder::kPipelineInner;
                out.configs.push_back(par);
              }
            }
          }
        }
      }
    }
  }
  return out;
}

std::vector<Candidate> ExpandCandidates(std::span<const ParallelConfig> configs,
                                        const MethodSpec& method, const ModelSpec& model,
                                        const SearchSpace& space) {
  std::vector<Candidate> out;
  for (const ParallelConfig& base : configs) {
    for (ScheduleKind kind : method.schedules) {
      std::vector<int64_t> vpps = {1};
      if (kind == ScheduleKind::kInterleaved) {
        // vpp 1 is plain 1F1B: tried only when the method does not list 1f1b itself.
        const bool has_1f1b = std::find(method.schedules.begin(), method.schedules.end(),
                                        ScheduleKind::k1F1B) != method.schedules.end();
        vpps.clear();
        if (!has_1f1b) vpps.push_back(1);
        if (base.pp > 1) {
          for (int64_t v : space.vpp) {
            ParallelConfig par = base;
            par.vpp = v;
            if (CheckParallelFits(par, model, nullptr, "search").ok()) vpps.push_back(v);
          }
        }
      }
      for (int64_t vpp : vpps) {
        for (const std::string& batching : method.batching) {
          Candidate c;
          c.parallel = base;
          c.parallel.vpp = vpp;
          c.schedule = kind;
          c.batching = batching;
          // megatron-gbp's packs run at the fixed cp (Megatron-Core without hybrid cp).
          c.dynamic_cp = method.dynamic_cp && base.cp > 1 && batching != "megatron-gbp";
          out.push_back(std::move(c));
        }
      }
    }
  }
  return out;
}

std::vector<size_t> PickScoreBatches(std::span<const GlobalBatch> batches, int64_t first,
                                     bool extremes) {
  std::set<size_t> picked;
  const size_t n = batches.size();
  const size_t head = first <= 0 ? n : std::min(n, static_cast<size_t>(first));
  for (size_t i = 0; i < head; ++i) picked.insert(i);
  if (extremes && n > 0) {
    size_t longest = 0, densest = 0, fullest = 0;
    int64_t longest_len = -1, fullest_tokens = -1;
    double densest_work = -1;
    for (size_t i = 0; i < n; ++i) {
      int64_t len = 0, tokens = 0;
      double work = 0;
      for (const Sample& s : batches[i].samples) {
        const int64_t l = s.input_len + s.target_len;
        len = std::max(len, l);
        tokens += l;
        work += static_cast<double>(l) * static_cast<double>(l);
      }
      if (len > longest_len) longest = i, longest_len = len;
      if (work > densest_work) densest = i, densest_work = work;
      if (tokens > fullest_tokens) fullest = i, fullest_tokens = tokens;
    }
    picked.insert({longest, densest, fullest});
  }
  return std::vector<size_t>(picked.begin(), picked.end());
}

Duration EstimateGradientSync(const StageCostEvaluator& eval, const ClusterSpec& cluster) {
  const ParallelConfig& par = eval.parallel();
  const int64_t group = par.dp * par.cp;  // the cp ranks reduce with the replicas
  if (group <= 1) return Duration::Zero();
  const AlphaBetaCommModel comm(cluster);
  Duration worst;
  const std::vector<ModelStateMemory>& stages = eval.stage_states();
  for (size_t p = 0; p < stages.size(); ++p) {
    const Bytes grads = Bytes::Of(stages[p].params * 2);
    // The lowering's ring of this pipeline rank (dp * cp members).
    const CollectiveRing ring = GradientRing(cluster, par, static_cast<int64_t>(p));
    Duration t;
    if (par.zero >= 2) {
      t = comm.Collective(CollectiveKind::kReduceScatter, grads, ring) +
          comm.Collective(CollectiveKind::kAllGather, grads, ring);
    } else {
      t = comm.Collective(CollectiveKind::kAllReduce, grads, ring);
    }
    worst = std::max(worst, t);
  }
  return worst;
}

CandidateScorer::CandidateScorer(const CostModel& cost, const ClusterSpec& cluster,
                                 std::span<const GlobalBatch> batches,
                                 const BatchingOptions& batching, const SimOptions& sim)
    : cost_(&cost), cluster_(&cluster), batches_(batches), batching_(batching), sim_(sim) {}

StatusOr<std::shared_ptr<const StageCostEvaluator>> CandidateScorer::Evaluator(
    const ParallelConfig& par, ScheduleKind schedule) {
  const EvalKey key{par.dp,       par.pp,  par.tp,   par.cp,
                    par.ep,       par.vpp, par.zero, InFlightPolicyFor(schedule, par.vpp),
                    par.layer_cut};
  auto it = evaluators_.find(key);
  if (it == evaluators_.end()) {
    it = evaluators_.emplace(key, MakePlannerEvaluator(*cost_, par, *cluster_, schedule)).first;
  }
  return it->second;
}

PlannerOptions CandidateScorer::OptionsFor(const Candidate& c) const {
  PlannerOptions options;
  options.method = c.batching;
  options.schedule = c.schedule;
  options.batching = batching_;
  options.dynamic_cp = c.dynamic_cp && c.parallel.cp > 1;
  // Megatron-Core's hybrid cp splits by its length rule; sluice's batchings by the fastest
  // prediction.
  options.dynamic_cp_rule =
      c.batching == "megatron-hybrid-cp" ? DynamicCpRule::kMegatronLength : DynamicCpRule::kFastest;
  return options;
}

StatusOr<Planner> CandidateScorer::PlannerFor(const Candidate& c) {
  SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<const StageCostEvaluator> eval,
                          Evaluator(c.parallel, c.schedule));
  return Planner::Create(std::move(eval), *cluster_, OptionsFor(c));
}

StatusOr<CandidateScore> CandidateScorer::Score(const Candidate& c) {
  const std::string key = c.Key();
  if (auto it = scores_.find(key); it != scores_.end()) return it->second;
  CandidateScore score;
  score.candidate = c;
  auto eval = Evaluator(c.parallel, c.schedule);
  if (!eval.ok()) {
    // Create fails only on model states beyond the limit: the configuration checks passed.
    score.state = CandidateScore::State::kOutOfMemory;
    score.reason = eval.status().message();
    return scores_[key] = score;
  }
  const Duration sync = EstimateGradientSync(**eval, *cluster_);
  StatusOr<Planner> made = Planner::Create(*eval, *cluster_, OptionsFor(c));
  if (!made.ok()) {
    // A schedule that cannot run the configuration (ExpandCandidates makes none).
    if (made.status().code() != StatusCode::kInvalidArgument) return made.status();
    score.state = CandidateScore::State::kUnsupported;
    score.reason = made.status().message();
    return scores_[key] = score;
  }
  const Planner& planner = *made;
  RunTally tally;
  for (const GlobalBatch& batch : batches_) {
    StatusOr<PlanResult> r = planner.Plan(batch.samples);
    if (!r.ok()) {
      if (r.status().code() != StatusCode::kInvalidArgument) return r.status();
      score.state = CandidateScore::State::kUnsupported;
      score.reason = r.status().message();
      return scores_[key] = score;
    }
    score.planning_time += r->planning_time;
    if (r->outcome != PlanOutcome::kOk) {
      // A failed batch: counted (run_tally.h), the candidate still scored on the others.
      if (tally.failed == 0) {
        score.reason = fmt::format("batch {}: {}", batch.index, r->infeasible_reason);
      }
      tally.AddFailed();
      continue;
    }
    int64_t tokens = 0;
    for (const auto& replica : r->batch_plan.replicas) {
      for (const MicroBatch& mb : replica) tokens += mb.real_tokens;
    }
    score.tokens += tokens;
    score.estimated_time += r->makespan + sync;
    const std::vector<double> busy = StageComputeSeconds(r->plan);
    score.stage_busy.resize(busy.size(), 0);
    for (size_t k = 0; k < busy.size(); ++k) score.stage_busy[k] += busy[k];
    tally.AddRan(tokens, (r->makespan + sync).seconds());
  }
  score.failed_batches = tally.failed;
  if (tally.batches > 0 && tally.ran() == 0) {
    score.state = CandidateScore::State::kOutOfMemory;
  } else {
    score.estimated_tokens_per_s = tally.TokensPerSecond();
  }
  return scores_[key] = score;
}

StatusOr<CandidateScore> CandidateScorer::Simulate(const Candidate& c) {
  SLUICE_ASSIGN_OR_RETURN(CandidateScore score, Score(c));
  if (score.simulated || score.state != CandidateScore::State::kOk) return score;
  SLUICE_ASSIGN_OR_RETURN(const Planner planner, PlannerFor(c));
  SimOptions sim = sim_;
  sim.record_timeline = false;
  sim.record_memory = false;
  RunTally tally;
  std::string first_failure;
  for (const GlobalBatch& batch : batches_) {
    SLUICE_ASSIGN_OR_RETURN(PlanResult r, planner.Plan(batch.samples));
    if (r.outcome != PlanOutcome::kOk) {
      if (tally.failed == 0) {
        first_failure = fmt::format("batch {}: {}", batch.index, r.infeasible_reason);
      }
      tally.AddFailed();
      continue;
    }
    sim.samples = batch.samples;  // real tokens from the samples' own lengths
    SLUICE_ASSIGN_OR_RETURN(SimResult s, sluice::Simulate(r.plan, sim));
    if (s.outcome != SimOutcome::kOk || s.memory_exceeded) {
      if (tally.failed == 0) {
        first_failure = fmt::format(
            "batch {}: simulation {}: {}", batch.index,
            s.memory_exceeded ? "exceeds the memory limit" : std::string(SimOutcomeName(s.outcome)),
            s.problem);
      }
      tally.AddFailed();
      continue;
    }
    tally.AddRan(s.real_tokens, s.iteration_time.seconds());
  }
  score.simulated = true;
  score.failed_batches = tally.failed;
  if (tally.failed > 0) score.reason = first_failure;
  if (tally.batches > 0 && tally.ran() == 0) {
    score.state = CandidateScore::State::kOutOfMemory;
  } else {
    score.simulated_tokens_per_s = tally.TokensPerSecond();
  }
  return scores_[c.Key()] = score;
}

StatusOr<std::optional<CandidateScore>> BalanceLayerCut(CandidateScorer& scorer,
                                                        const Candidate& base) {
  const ParallelConfig& par = base.parallel;
  using Out = std::optional<CandidateScore>;
  if (par.chunks() == 1 || par.vpp > 1 || !par.layer_cut.empty()) return Out();
  const ModelSpec& model = scorer.cost().model();
  const std::vector<int64_t> even =
      ChunksFit(model, par.chunks()) ? EvenLayerCut(model, par.chunks()) : std::vector<int64_t>{};
  const int64_t all = static_cast<int64_t>(scorer.batches().size());
  auto with = [&](const std::vector<int64_t>& cut) {
    Candidate c = base;
    if (cut != even) c.parallel.layer_cut = cut;  // the even cut is the base candidate itself
    return c;
  };
  LayerCutScorer score = [&](const std::vector<int64_t>& cut) -> StatusOr<LayerCutScore> {
    SLUICE_ASSIGN_OR_RETURN(CandidateScore s, scorer.Score(with(cut)));
    LayerCutScore out;
    out.failed_batches = s.state == CandidateScore::State::kOk ? s.failed_batches : all;
    out.time = s.estimated_time;
    out.chunk_busy = s.stage_busy;
    return out;
  };
  std::vector<Sample> samples;
  for (const GlobalBatch& b : scorer.batches()) {
    samples.insert(samples.end(), b.samples.begin(), b.samples.end());
  }
  SLUICE_ASSIGN_OR_RETURN(LayerCutChoice choice,
                          ChooseLayerCut(scorer.cost(), par, samples, score));
  if (choice.cut.empty()) return Out();
  SLUICE_ASSIGN_OR_RETURN(CandidateScore s, scorer.Simulate(with(choice.cut)));
  return Out(std::move(s));
}

StatusOr<MethodSearch> SearchMethod(CandidateScorer& scorer, const std::string& method,
                                    std::span<const Candidate> candidates, int64_t simulate_top,
                                    const std::function<void()>& on_candidate,
                                    const std::function<bool()>& cancelled,
                                    bool balance_layer_cut) {
  MethodSearch out;
  out.method = method;
  for (const Candidate& c : candidates) {
    if (cancelled && cancelled()) break;
    SLUICE_ASSIGN_OR_RETURN(CandidateScore s, scorer.Score(c));
    out.ranked.push_back(std::move(s));
    if (on_candidate) on_candidate();
  }
  std::sort(out.ranked.begin(), out.ranked.end(), RankBefore);
  // Simulate the best estimates until `simulate_top` of them ran within memory (at most twice
  // as many simulations in all, four times while none fits).
  int64_t feasible = 0, tried = 0;
  for (CandidateScore& s : out.ranked) {
    if (feasible >= simulate_top || tried >= (feasible > 0 ? 2 : 4) * simulate_top ||
        (cancelled && cancelled()))
      break;
    if (s.state != CandidateScore::State::kOk) break;
    SLUICE_ASSIGN_OR_RETURN(s, scorer.Simulate(s.candidate));
    ++tried;
    if (s.complete()) ++feasible;
  }
  auto group = [](const CandidateScore& s) {
    if (s.state != CandidateScore::State::kOk) return 2;
    return s.simulated ? 0 : 1;
  };
  auto sort_ranked = [&] {
    std::sort(out.ranked.begin(), out.ranked.end(), [&](const auto& a, const auto& b) {
      if (group(a) != group(b)) return group(a) < group(b);
      return RankBefore(a, b);
    });
  };
  sort_ranked();
  if (balance_layer_cut && !out.ranked.empty() && group(out.ranked.front()) == 0 &&
      !(cancelled && cancelled())) {
    SLUICE_ASSIGN_OR_RETURN(std::optional<CandidateScore> cut,
                            BalanceLayerCut(scorer, out.ranked.front().candidate));
    if (cut.has_value()) {
      out.ranked.push_back(std::move(*cut));
      sort_ranked();
    }
  }
  if (!out.ranked.empty() && group(out.ranked.front()) == 0) {
    out.best = out.ranked.front();
    return out;
  }
  // Nothing feasible. Unsupported when every batching method of the method refused the model
  // (a property of the method and the model, not of the configuration); else the memory reason
  // of a supported candidate that shards the model the most (largest pp x tp, highest ZeRO).
  std::set<std::string> batchings, unsupported;
  for (const CandidateScore& s : out.ranked) {
    batchings.insert(s.candidate.batching);
    if (s.state == CandidateScore::State::kUnsupported) unsupported.insert(s.candidate.batching);
  }
  out.unsupported = !batchings.empty() && unsupported == batchings;
  const CandidateScore* closest = nullptr;
  auto shard = [](const CandidateScore& x) {
    return std::make_tuple(
        x.candidate.parallel.pp * x.candidate.parallel.tp * x.candidate.parallel.cp,
        x.candidate.parallel.zero);
  };
  for (const CandidateScore& s : out.ranked) {
    const bool usable = !unsupported.contains(s.candidate.batching);
    if (out.unsupported ? s.state != CandidateScore::State::kUnsupported : !usable) continue;
    if (closest == nullptr || (!out.unsupported && shard(s) > shard(*closest))) closest = &s;
  }
  if (closest != nullptr) {
    out.reason = fmt::format("{}: {}", closest->candidate.Describe(), closest->reason);
  }
  if (out.ranked.empty()) out.reason = "no configuration was tried";
  return out;
}

}  // namespace sluice
