#include "planner/layer_cut.h"

#include <algorithm>
#include <limits>
#include <map>

#include "model/chunk_cut.h"
#include "planner/config_search.h"

namespace sluice {
namespace {

double Seconds(const LayerCost& c) { return (c.forward + c.backward).seconds(); }

}  // namespace

LayerWeights WeighLayers(const CostModel& cost, const ParallelConfig& par,
                         std::span<const Sample> samples) {
  const ModelSpec& m = cost.model();
  const bool enc_dec = m.is_encoder_decoder();
  const int64_t total = m.layers + (enc_dec ? m.decoder_layers : 0);
  double enc = 0, dec = 0, emb = 0, head = 0;
  int64_t priced = 0;
  const int64_t cp = std::max<int64_t>(1, par.cp);
  for (const Sample& s : samples) {
    if (s.input_len < 1 || (enc_dec && s.target_len < 1)) continue;
    LayerShape shape{
        .mbs = 1, .seqlen = (s.input_len + cp - 1) / cp, .dec_seqlen = enc_dec ? s.target_len : 0};
    const LayerCost e = cost.Layer(LayerKind::kEncoder, shape, par.tp, Recompute::kNone);
    LayerCost d;
    d.feasible = true;
    if (enc_dec) d = cost.Layer(LayerKind::kDecoder, shape, par.tp, Recompute::kNone);
    const LayerCost in = cost.Layer(LayerKind::kEmbedding, shape, par.tp, Recompute::kNone);
    const LayerCost out = cost.Layer(LayerKind::kOutputHead, shape, par.tp, Recompute::kNone);
    if (!e.feasible || !d.feasible || !in.feasible || !out.feasible) continue;
    enc += Seconds(e);
    dec += Seconds(d);
    emb += Seconds(in);
    head += Seconds(out);
    ++priced;
  }
  LayerWeights w;
  if (priced == 0) {
    w.layer.assign(static_cast<size_t>(total), 1.0);
    return w;
  }
  w.layer.assign(static_cast<size_t>(m.layers), enc);
  if (enc_dec) w.layer.insert(w.layer.end(), static_cast<size_t>(m.decoder_layers), dec);
  w.embedding = emb;
  w.output_head = head;
  return w;
}

std::vector<int64_t> MinMaxLayerCut(const LayerWeights& weights, int64_t chunks) {
  const int64_t n = static_cast<int64_t>(weights.layer.size());
  SLUICE_CHECK(chunks >= 1 && chunks <= n);
  std::vector<double> prefix(static_cast<size_t>(n + 1), 0);
  for (int64_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + weights.layer[i];
  // The run [i, j) as chunk k of `chunks`.
  auto run = [&](int64_t i, int64_t j, int64_t k) {
    double t = prefix[j] - prefix[i];
    if (k == 0) t += weights.embedding;
    if (k == chunks - 1) t += weights.output_head;
    return t;
  };
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[k][j]: the lightest heaviest chunk of layers [0, j) in chunks 0..k; from[k][j] its start.
  std::vector<std::vector<double>> best(static_cast<size_t>(chunks),
                                        std::vector<double>(static_cast<size_t>(n + 1), kInf));
  std::vector<std::vector<int64_t>> from(static_cast<size_t>(chunks),
                                         std::vector<int64_t>(static_cast<size_t>(n + 1), -1));
  for (int64_t j = 1; j <= n; ++j) best[0][j] = run(0, j, 0);
  for (int64_t k = 1; k < chunks; ++k) {
    for (int64_t j = k + 1; j <= n; ++j) {
      // Latest start first: a tie keeps the earlier runs longer.
      for (int64_t i = j - 1; i >= k; --i) {
        const double t = std::max(best[k - 1][i], run(i, j, k));
        if (t < best[k][j] * (1 - 1e-12)) {
          best[k][j] = t;
          from[k][j] = i;
        }
      }
    }
  }
  std::vector<int64_t> cut(static_cast<size_t>(chunks));
  int64_t j = n;
  for (int64_t k = chunks - 1; k >= 1; --k) {
    const int64_t i = from[k][j];
    cut[k] = j - i;
    j = i;
  }
  cut[0] = j;
  return cut;
}

std::vector<double> StageComputeSeconds(const ExecutionPlan& plan) {
  std::vector<double> out(static_cast<size_t>(plan.num_stages()), 0);
  for (const RankProgram& p : plan.ranks) {
    for (const Instruction& in : p.instructions) {
      if (IsCompute(in.op) && in.stage >= 0 && in.stage < plan.num_stages()) {
        out[static_cast<size_t>(in.stage)] += in.duration.seconds();
      }
    }
  }
  return out;
}

LayerCutScorer PlannerLayerCutScorer(const CostModel& cost, const ClusterSpec& cluster,
                                     const ParallelConfig& base, const PlannerOptions& options,
                                     std::span<const GlobalBatch> batches) {
  PlannerOptions plain = options;
  plain.optimize = false;
  return [&cost, &cluster, &base, plain,
          batches](const std::vector<int64_t>& cut) -> StatusOr<LayerCutScore> {
    ParallelConfig par = base;
    par.layer_cut = cut;
    LayerCutScore out;
    const int64_t all = static_cast<int64_t>(batches.size());
    if (!CheckParallelFits(par, cost.model(), &cluster, "layer cut").ok()) {
      out.failed_batches = all;
      return out;
    }
    StatusOr<std::shared_ptr<const StageCostEvaluator>> eval =
        MakePlannerEvaluator(cost, par, cluster, plain.schedule);
    if (!eval.ok()) {  // a stage's model states alone exceed the memory limit
      out.failed_batches = all;
      return out;
    }
    const Duration sync = EstimateGradientSync(**eval, cluster);
    SLUICE_ASSIGN_OR_RETURN(Planner planner, Planner::Create(*eval, cluster, plain));
    for (const GlobalBatch& b : batches) {
      SLUICE_ASSIGN_OR_RETURN(PlanResult r, planner.Plan(b.samples));
      if (r.outcome != PlanOutcome::kOk) {
        ++out.failed_batches;
        continue;
      }
      out.time += r.makespan + sync;
      const std::vector<double> busy = StageComputeSeconds(r.plan);
      out.chunk_busy.resize(busy.size(), 0);
      for (size_t k = 0; k < busy.size(); ++k) out.chunk_busy[k] += busy[k];
    }
    return out;
  };
}

StatusOr<LayerCutScore> SimulateLayerCut(const CostModel& cost, const ClusterSpec& cluster,
                                         const ParallelConfig& base, const PlannerOptions& options,
                                         std::span<const GlobalBatch> batches,
                                         const std::vector<int64_t>& cut, const SimOptions& sim) {
  ParallelConfig par = base;
  par.layer_cut = cut;
  LayerCutScore out;
  PlannerOptions plain = options;
  plain.optimize = false;
  StatusOr<std::shared_ptr<const StageCostEvaluator>> eval =
      CheckParallelFits(par, cost.model(), &cluster, "layer cut").ok()
          ? MakePlannerEvaluator(cost, par, cluster, plain.schedule)
          : StatusOr<std::shared_ptr<const StageCostEvaluator>>(
                InvalidArgumentError("the cut does not fit"));
  if (!eval.ok()) {
    out.failed_batches = static_cast<int64_t>(batches.size());
    return out;
  }
  SLUICE_ASSIGN_OR_RETURN(Planner planner, Planner::Create(*eval, cluster, plain));
  SimOptions o = sim;
  o.record_timeline = false;
  o.record_memory = false;
  for (const GlobalBatch& b : batches) {
    SLUICE_ASSIGN_OR_RETURN(PlanResult r, planner.Plan(b.samples));
    if (r.outcome != PlanOutcome::kOk) {
      ++out.failed_batches;
      continue;
    }
    SLUICE_ASSIGN_OR_RETURN(SimResult s, Simulate(r.plan, o));
    if (s.outcome != SimOutcome::kOk) {
      ++out.failed_batches;
      continue;
    }
    out.time += s.iteration_time;
  }
  return out;
}

StatusOr<std::vector<int64_t>> PolishLayerCut(std::vector<int64_t> start, LayerCutScore start_score,
                                              const LayerCutScorer& score,
                                              const LayerCutSearchOptions& options,
                                              LayerCutScore* best, int64_t* evaluated) {
  const int64_t chunks = static_cast<int64_t>(start.size());
  std::map<std::vector<int64_t>, LayerCutScore> seen;
  seen.emplace(start, start_score);
  *evaluated = 0;
  std::vector<int64_t> current = std::move(start);
  LayerCutScore current_score = std::move(start_score);
  auto better = [&](const LayerCutScore& a, const LayerCutScore& b) {
    if (a.failed_batches != b.failed_batches) return a.failed_batches < b.failed_batches;
    return a.time.seconds() < b.time.seconds() * (1 - options.min_gain);
  };
  bool budget = true;
  while (budget) {
    std::vector<int64_t> step;
    LayerCutScore step_score = current_score;
    for (int64_t b = 0; b + 1 < chunks && budget; ++b) {
      for (const int64_t dir : {+1, -1}) {
        // dir +1: chunk b takes chunk b+1's first layer; -1: gives its last to b+1.
        std::vector<int64_t> next = current;
        next[b] += dir;
        next[b + 1] -= dir;
        if (next[b] < 1 || next[b + 1] < 1) continue;
        auto it = seen.find(next);
        if (it == seen.end()) {
          if (*evaluated >= options.max_evaluations) {
            budget = false;
            break;
          }
          SLUICE_ASSIGN_OR_RETURN(LayerCutScore s, score(next));
          ++*evaluated;
          it = seen.emplace(next, std::move(s)).first;
        }
        if (better(it->second, step_score)) {
          step = std::move(next);
          step_score = it->second;
        }
      }
    }
    if (step.empty()) break;
    current = std::move(step);
    current_score = step_score;
  }
  *best = current_score;
  return current;
}

StatusOr<LayerCutChoice> ChooseLayerCut(const CostModel& cost, const ParallelConfig& par,
                                        std::span<const Sample> samples,
                                        const LayerCutScorer& score,
                                        const LayerCutSearchOptions& options) {
  SLUICE_CHECK(options.max_evaluations >= 1);
  const ModelSpec& m = cost.model();
  const int64_t chunks = par.chunks();
  const int64_t total = m.layers + (m.is_encoder_decoder() ? m.decoder_layers : 0);
  LayerCutChoice out;
  out.even_exists = ChunksFit(m, chunks);
  if (chunks == 1 || par.vpp > 1 || total < chunks) {
    if (out.even_exists) {
      SLUICE_ASSIGN_OR_RETURN(out.even, score(EvenLayerCut(m, chunks)));
      out.chosen = out.even;
      out.evaluated = 1;
    }
    return out;
  }
  out.searched = true;
  std::map<std::vector<int64_t>, LayerCutScore> seen;
  auto eval = [&](const std::vector<int64_t>& cut) -> StatusOr<LayerCutScore> {
    auto it = seen.find(cut);
    if (it != seen.end()) return it->second;
    SLUICE_ASSIGN_OR_RETURN(LayerCutScore s, score(cut));
    seen.emplace(cut, s);
    ++out.evaluated;
    return s;
  };
  // An improvement must beat `best` by min_gain in time at the same failure count.
  auto better = [&](const LayerCutScore& a, const LayerCutScore& b) {
    if (a.failed_batches != b.failed_batches) return a.failed_batches < b.failed_batches;
    return a.time.seconds() < b.time.seconds() * (1 - options.min_gain);
  };
  LayerWeights weights = WeighLayers(cost, par, samples);
  out.seed = MinMaxLayerCut(weights, chunks);
  std::vector<int64_t> current = out.seed;
  SLUICE_ASSIGN_OR_RETURN(LayerCutScore best, eval(current));
  if (out.even_exists) {
    const std::vector<int64_t> even = EvenLayerCut(m, chunks);
    SLUICE_ASSIGN_OR_RETURN(out.even, eval(even));
    // The even cut wins unless the seed is better by min_gain: it is the default and needs no
    // layer_cut in the plan.
    if (!better(best, out.even)) {
      current = even;
      best = out.even;
    }
  }
  // Step 2b: rescale each chunk's weights by its measured compute time.
  for (int64_t refit = 0; refit < kMaxRefits && out.evaluated < options.max_evaluations; ++refit) {
    if (static_cast<int64_t>(best.chunk_busy.size()) != chunks) break;
    int64_t at = 0;
    for (int64_t k = 0; k < chunks; ++k) {
      double predicted = 0;
      for (int64_t i = at; i < at + current[k]; ++i) predicted += weights.layer[i];
      if (k == 0) predicted += weights.embedding;
      if (k == chunks - 1) predicted += weights.output_head;
      const double busy = best.chunk_busy[k];
      if (predicted > 0 && busy > 0) {
        const double f = busy / predicted;
        for (int64_t i = at; i < at + current[k]; ++i) weights.layer[i] *= f;
        if (k == 0) weights.embedding *= f;
        if (k == chunks - 1) weights.output_head *= f;
      }
      at += current[k];
    }
    std::vector<int64_t> next = MinMaxLayerCut(weights, chunks);
    if (seen.contains(next)) break;
    SLUICE_ASSIGN_OR_RETURN(LayerCutScore s, eval(next));
    if (!better(s, best)) break;
    current = std::move(next);
    best = std::move(s);
  }
  if (out.evaluated < options.max_evaluations) {
    LayerCutSearchOptions rest = options;
    rest.max_evaluations = options.max_evaluations - out.evaluated;
    int64_t calls = 0;
    SLUICE_ASSIGN_OR_RETURN(current, PolishLayerCut(current, best, eval, rest, &best, &calls));
  }
  out.chosen = best;
  if (!(out.even_exists && current == EvenLayerCut(m, chunks))) out.cut = current;
  return out;
}

}  // namespace sluice
