#include "batching/baseline_search.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "base/units.h"

namespace sluice {
namespace {

struct Evaluated {
  bool fits = false;
  Duration time = Duration::Infinite();
  std::vector<MicroBatch> micro_batches;
};

Evaluated Evaluate(const StageCostEvaluator& eval, const MicroBatchBuilder& build, int64_t param,
                   Recompute rc) {
  Evaluated e;
  if (!build(param, rc, &e.micro_batches)) return e;
  if (!SequenceFitsMemory(eval, e.micro_batches)) return e;
  e.fits = true;
  e.time = PredictReplicaTime(e.micro_batches, eval.pp());
  return e;
}

bool FitsUnderSomeLevel(const StageCostEvaluator& eval, const BaselineSearchSpace& space,
                        const MicroBatchBuilder& build, int64_t param) {
  // The heaviest recompute level needs the least memory; trying it first answers most queries
  // with one evaluation.
  for (auto it = space.levels.rbegin(); it != space.levels.rend(); ++it) {
    if (Evaluate(eval, build, param, *it).fits) return true;
  }
  return false;
}

std::string OutOfMemoryReason(const StageCostEvaluator& eval, const BaselineSearchSpace& space,
                              const MicroBatchBuilder& build, std::string_view method,
                              int64_t param) {
  const Recompute rc = space.levels.back();
  std::vector<MicroBatch> mbs;
  const std::string where =
      fmt::format("{}: {} {} at recompute {}", method, space.param_name, param, RecomputeName(rc));
  if (!build(param, rc, &mbs)) {
    return fmt::format(
        "{}: the cost model cannot price these micro-batches (a shape beyond its "
        "measured range or memory)",
        where);
  }
  return fmt::format("{} does not fit: {}", where, MemoryNeedReason(eval, mbs));
}

}  // namespace

std::vector<Recompute> RecomputeLevels(const BatchingOptions& options) {
  if (options.recompute) return {*options.recompute};
  return {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
}

bool PriceFixedShape(const StageCostEvaluator& eval, const BatchIndex& index, LayerShape shape,
                     MicroBatch* mb) {
  shape.mbs = static_cast<int64_t>(mb->rows.size());
  std::vector<ChunkCost> stages;
  if (!eval.EvaluateStages(shape, mb->recompute, &stages)) return false;
  mb->shape = shape;
  mb->varlen = false;
  mb->stages = std::move(stages);
  mb->real_tokens = 0;
  for (const auto& row : mb->rows) {
    for (int64_t id : row) mb->real_tokens += index(id).tokens();
  }
  mb->padded_tokens = shape.mbs * (shape.seqlen + shape.dec_seqlen);
  return true;
}

std::string MemoryNeedReason(const StageCostEvaluator& eval,
                             std::span<const MicroBatch> micro_batches) {
  const int64_t m = static_cast<int64_t>(micro_batches.size());
  double worst_ratio = -1;
  std::string worst;
  for (int64_t j = 0; j < m; ++j) {
    const MicroBatch& mb = micro_batches[j];
    for (int64_t s = 0; s < static_cast<int64_t>(mb.stages.size()); ++s) {
      const int64_t k = eval.InFlight(s, m);
      const Bytes need = mb.stages[s].stored * k + mb.stages[s].peak;
      const Bytes budget = eval.ActivationBudget(s);
      const double ratio = budget.count() > 0 ? static_cast<double>(need.count()) /
                                                    static_cast<double>(budget.count())
                                              : 1e300;
      if (need <= budget || ratio <= worst_ratio) continue;
      worst_ratio = ratio;
      const std::string dec =
          mb.shape.dec_seqlen > 0 ? fmt::format(" x decoder {}", mb.shape.dec_seqlen) : "";
      worst = fmt::format(
          "micro-batch {} ({} rows x {} tokens{}{}) needs {} on stage {} ({} in flight x {} "
          "stored + {} peak) > activation budget {} (memory limit {} - model states {})",
          j, mb.shape.mbs, mb.shape.seqlen, dec, mb.varlen ? ", varlen" : "", FormatBytes(need), s,
          k, FormatBytes(mb.stages[s].stored), FormatBytes(mb.stages[s].peak), FormatBytes(budget),
          FormatBytes(eval.memory_limit()), FormatBytes(eval.stage_states()[s].total()));
    }
  }
  if (!worst.empty()) return worst;
  return CheckSequenceMemory(eval, micro_batches);
}

ReplicaBatches SearchFastestBaseline(const StageCostEvaluator& eval,
                                     const BaselineSearchSpace& space,
                                     const MicroBatchBuilder& build, std::string_view method) {
  SLUICE_CHECK(!space.levels.empty());
  std::vector<int64_t> params;
  if (space.fixed_param > 0) {
    params.push_back(space.fixed_param);
  } else {
    SLUICE_CHECK(space.lo >= 1 && space.lo <= space.hi);
    if (!FitsUnderSomeLevel(eval, space, build, space.lo)) {
      ReplicaBatches oom;
      oom.outcome = PlanOutcome::kOutOfMemory;
      oom.infeasible_reason = OutOfMemoryReason(eval, space, build, method, space.lo);
      return oom;
    }
    // Largest parameter that fits: fits(lo) holds; find the last true of a (assumed) monotone
    // predicate over [lo, hi].
    int64_t good = space.lo;
    int64_t bad = space.hi + 1;
    if (FitsUnderSomeLevel(eval, space, build, space.hi))
      good = space.hi;
    else
      bad = space.hi;
    while (bad - good > 1) {
      const int64_t mid = good + (bad - good) / 2;
      if (FitsUnderSomeLevel(eval, space, build, mid))
        good = mid;
      else
        bad = mid;
    }
    params = space.candidates(space.lo, good);
  }

  std::optional<Evaluated> best;
  for (int64_t param : params) {
    for (Recompute rc : space.levels) {
      Evaluated e = Evaluate(eval, build, param, rc);
      if (e.fits && (!best || e.time < best->time)) best = std::move(e);
    }
  }
  ReplicaBatches out;
  if (!best) {
    out.outcome = PlanOutcome::kOutOfMemory;
    out.infeasible_reason = OutOfMemoryReason(eval, space, build, method, params.front());
    return out;
  }
  out.micro_batches = std::move(best->micro_batches);
  return out;
}

}  // namespace sluice
