// The peak memory fit of calibration.h (FitMemory, ApplyMemoryCorrection).
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "sim/simulator.h"
#include "trace/calibration.h"

namespace sluice::trace {
namespace {

Bytes Scaled(Bytes b, double scale) {
  return Bytes::Of(std::llround(static_cast<double>(b.count()) * scale));
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size();
  return m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
}

}  // namespace

void ApplyMemoryCorrection(const MemoryCorrection& m, ExecutionPlan* plan) {
  if (m.pp_rank < 0 || m.pp_rank >= static_cast<int64_t>(plan->model_states.size())) return;
  Bytes& states = plan->model_states[m.pp_rank];
  states = Bytes::Of(std::max<int64_t>(0, states.count() + std::llround(m.offset_bytes)));
  if (m.activation_scale == 1.0 || plan->pp() <= 0) return;
  for (PlanReplica& replica : plan->replicas) {
    for (PlanMicroBatch& mb : replica.micro_batches) {
      for (size_t s = 0; s < mb.stages.size(); ++s) {
        if (static_cast<int64_t>(s) % plan->pp() != m.pp_rank) continue;
        ChunkCost& c = mb.stages[s];
        c.stored = Scaled(c.stored, m.activation_scale);
        c.peak = Scaled(c.peak, m.activation_scale);
        c.stored_until_w = Scaled(c.stored_until_w, m.activation_scale);
      }
    }
  }
}

StatusOr<std::vector<int64_t>> SimulatedPeakBytes(const ExecutionPlan& plan) {
  SimOptions o;
  o.record_timeline = false;
  o.record_memory = false;
  Simulator sim(plan, o);
  SLUICE_ASSIGN_OR_RETURN(SimResult r, sim.Run());
  std::vector<int64_t> out;
  for (const RankSimStats& rank : r.ranks) out.push_back(rank.peak_memory.count());
  return out;
}

StatusOr<std::vector<MemoryCorrection>> FitMemory(
    const std::vector<ExecutionPlan>& plans, const std::vector<int64_t>& iterations,
    const std::vector<std::vector<int64_t>>& peak_bytes) {
  struct Sample {
    double rest = 0, activations = 0, measured = 0;
  };
  std::map<int64_t, std::vector<Sample>> by_pp;
  for (int64_t k : iterations) {
    if (k < 0 || k >= static_cast<int64_t>(plans.size()) ||
        k >= static_cast<int64_t>(peak_bytes.size()) || peak_bytes[k].empty()) {
      continue;
    }
    const ExecutionPlan& plan = plans[k];
    auto sim = SimulatedPeakBytes(plan);
    if (!sim.ok()) return sim.status().WithPrefix(fmt::format("the plan of iteration {}", k));
    ExecutionPlan doubled = plan;
    for (int64_t pp = 0; pp < plan.pp(); ++pp) {
      ApplyMemoryCorrection({.pp_rank = pp, .activation_scale = 2.0}, &doubled);
    }
    auto sim2 = SimulatedPeakBytes(doubled);
    if (!sim2.ok()) return sim2.status().WithPrefix(fmt::format("the plan of iteration {}", k));
    for (const RankProgram& program : plan.ranks) {
      const size_t r = static_cast<size_t>(program.rank);
      if (r >= peak_bytes[k].size() || r >= sim->size() || peak_bytes[k][r] <= 0) continue;
      const double a = static_cast<double>((*sim2)[r] - (*sim)[r]);
      by_pp[program.pp_index].push_back({static_cast<double>((*sim)[r]) - a, a,
                                         static_cast<double>(peak_bytes[k][r])});
    }
  }
  std::vector<MemoryCorrection> out;
  for (const auto& [pp, samples] : by_pp) {
    MemoryCorrection m;
    m.pp_rank = pp;
    m.samples = static_cast<int64_t>(samples.size());
    const double n = static_cast<double>(samples.size());
    double sa = 0, saa = 0, sy = 0, say = 0;
    std::vector<double> offsets;
    for (const Sample& s : samples) {
      const double y = s.measured - s.rest;
      sa += s.activations;
      saa += s.activations * s.activations;
      sy += y;
      say += s.activations * y;
      offsets.push_back(s.measured - s.rest - s.activations);
    }
    const double mean_a = sa / n;
    const double var = saa / n - mean_a * mean_a;
    bool fitted = false;
    if (samples.size() >= 2 && mean_a > 0 && var > 0 && std::sqrt(var) / mean_a >= 0.05) {
      const double scale = (say / n - mean_a * sy / n) / var;
      if (scale > 0) {
        m.activation_scale = scale;
        m.offset_bytes = sy / n - scale * mean_a;
        fitted = true;
      }
    }
    if (!fitted) m.offset_bytes = Median(offsets);
    for (const Sample& s : samples) {
      const double before = s.rest + s.activations;
      const double after =
          std::max(0.0, s.rest + m.offset_bytes) + m.activation_scale * s.activations;
      m.mean_abs_error_before += std::abs(before / s.measured - 1) / n;
      m.mean_abs_error_after += std::abs(after / s.measured - 1) / n;
    }
    out.push_back(m);
  }
  return out;
}

}  // namespace sluice::trace
