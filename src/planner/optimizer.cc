#include "planner/optimizer.h"

#include <fmt/core.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <set>
#include <utility>

#include "base/rng.h"
#include "passes/gradient_bucketing.h"
#include "passes/reorder.h"
#include "plan/validate.h"

namespace sluice {
namespace {

using passes::PlanPass;
using Candidate = std::shared_ptr<const PlanPass>;

// Index of `position` in the rank's compute ops, or -1.
int64_t ComputeOrdinal(const std::vector<int64_t>& computes, int64_t position) {
  const auto it = std::lower_bound(computes.begin(), computes.end(), position);
  return it != computes.end() && *it == position ? it - computes.begin() : -1;
}

// The Start of rank `rank` with tag `tag` and the given op, or -1.
int64_t FindStart(const RankProgram& p, OpKind op, int64_t tag) {
  for (size_t i = 0; i < p.instructions.size(); ++i) {
    if (p.instructions[i].op == op && p.instructions[i].tag == tag) return static_cast<int64_t>(i);
  }
  return -1;
}

OpKind PeerStartOf(OpKind op) {
  switch (op) {
    case OpKind::kSendActStart:
      return OpKind::kRecvActStart;
    case OpKind::kRecvActStart:
      return OpKind::kSendActStart;
    case OpKind::kSendGradStart:
      return OpKind::kRecvGradStart;
    default:
      return OpKind::kSendGradStart;
  }
}

// Hoists of the Start at (rank, i): by one, and to before the nearest Finish or compute op
// before it.
void AddHoists(const ExecutionPlan& plan, int64_t rank, int64_t i, std::vector<Candidate>* out) {
  if (i <= 0) return;
  out->push_back(std::make_shared<passes::HoistStartPass>(rank, i, 1));
  const std::vector<Instruction>& p = plan.ranks[rank].instructions;
  for (int64_t j = i - 1; j >= 0; --j) {
    if (IsCommFinish(p[j].op) || IsCompute(p[j].op)) {
      if (i - j > 1) out->push_back(std::make_shared<passes::HoistStartPass>(rank, i, i - j));
      break;
    }
  }
}

// Candidates from the critical path of `sim` (see the header), without duplicates.
std::vector<Candidate> Candidates(const ExecutionPlan& plan, const SimResult& sim,
                                  const std::shared_ptr<const passes::RecomputePricer>& pricer) {
  std::vector<Candidate> all;
  bool collective = false;
  std::vector<std::vector<int64_t>> computes(plan.ranks.size());
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    computes[r] = passes::ComputePositions(plan.ranks[r]);
  }
  for (const SimInterval& iv : sim.critical_path) {
    const RankProgram& program = plan.ranks[iv.rank];
    const Instruction& in = program.instructions[iv.instruction];
    if (IsCompute(in.op)) {
      const std::vector<int64_t>& c = computes[iv.rank];
      const int64_t k = ComputeOrdinal(c, iv.instruction);
      const int64_t n = static_cast<int64_t>(c.size());
      if (k > 0) all.push_back(std::make_shared<passes::MoveComputePass>(iv.rank, k, k - 1));
      if (k + 1 < n) all.push_back(std::make_shared<passes::MoveComputePass>(iv.rank, k, k + 1));
      if (pricer != nullptr && in.op != OpKind::kBackwardWeight &&
          in.recompute != Recompute::kNone) {
        all.push_back(std::make_shared<passes::RecomputePass>(
            pricer, program.dp_index, in.microbatch, in.stage, Recompute::kNone));
        if (in.recompute == Recompute::kFull) {
          all.push_back(std::make_shared<passes::RecomputePass>(
              pricer, program.dp_index, in.microbatch, in.stage, Recompute::kSelective));
        }
      }
      for (int64_t j = k + 1; j < n; ++j) {  // the rank's next W, to just before this op
        if (program.instructions[c[j]].op == OpKind::kBackwardWeight) {
          all.push_back(std::make_shared<passes::MoveComputePass>(iv.rank, j, k));
          break;
        }
      }
    } else if (IsCommStart(in.op)) {
      AddHoists(plan, iv.rank, iv.instruction, &all);
      const int64_t peer = FindStart(plan.ranks[in.peer], PeerStartOf(in.op), in.tag);
      if (peer >= 0) AddHoists(plan, in.peer, peer, &all);
    } else if (IsCollective(in.op)) {
      collective = true;
    }
  }
  if (collective) {
    Bytes largest;
    for (const RankProgram& p : plan.ranks) {
      for (const Instruction& in : p.instructions) {
        if (IsCollective(in.op)) largest = std::max(largest, in.bytes);
      }
    }
    if (largest.count() > 1) {
      all.push_back(std::make_shared<passes::BucketGradientsPass>(Bytes::Of(largest.count() * 2)));
      all.push_back(std::make_shared<passes::BucketGradientsPass>(Bytes::Of(largest.count() / 2)));
    }
  }
  std::vector<Candidate> unique;
  std::set<std::string> seen;
  for (Candidate& c : all) {
    if (seen.insert(c->Describe()).second) unique.push_back(std::move(c));
  }
  return unique;
}

// Makes *to equal `from` again after a candidate was tried on it: only what differs is copied
// (a pass rewrites one rank, or a few), so the buffers of the rest are neither freed nor
// allocated. Exact: afterwards *to == from.
void RestoreFrom(const ExecutionPlan& from, ExecutionPlan* to) {
  if (to->ranks.size() != from.ranks.size()) {
    *to = from;
    return;
  }
  for (size_t r = 0; r < from.ranks.size(); ++r) {
    if (to->ranks[r] != from.ranks[r]) to->ranks[r] = from.ranks[r];
  }
  if (to->replicas != from.replicas) to->replicas = from.replicas;
  if (to->model_states != from.model_states) to->model_states = from.model_states;
  if (to->sample_ids != from.sample_ids) to->sample_ids = from.sample_ids;
  if (to->dropped != from.dropped) to->dropped = from.dropped;
  if (!(to->model == from.model) || !(to->cluster == from.cluster) ||
      !(to->parallel == from.parallel) || to->cost_model != from.cost_model ||
      to->method != from.method) {
    *to = from;
  }
}

Status CheckOptions(const OptimizerOptions& o) {
  if (o.max_steps < 0) {
    return InvalidArgumentError(
        fmt::format("optimizer: max_steps = {}; allowed: 0 or more", o.max_steps));
  }
  if (o.budget <= Duration::Zero()) {
    return InvalidArgumentError("optimizer: budget must be positive (milliseconds > 0)");
  }
  if (!(o.beta > 0) || !std::isfinite(o.beta)) {
    return InvalidArgumentError(fmt::format("optimizer: beta = {}; allowed: > 0", o.beta));
  }
  return Status::Ok();
}

}  // namespace

std::string_view OptimizerSearchName(OptimizerSearch search) {
  return search == OptimizerSearch::kMcmc ? "mcmc" : "greedy";
}

StatusOr<OptimizeResult> OptimizePlan(const ExecutionPlan& plan, const OptimizerOptions& options) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  SLUICE_RETURN_IF_ERROR(CheckOptions(options));
  SLUICE_RETURN_IF_ERROR(ValidatePlan(plan, ValidateOptions{.grid_context = 2}));
  SimOptions sim = options.sim;
  sim.record_timeline = true;
  sim.record_memory = false;
  OptimizeResult result;
  result.plan = plan;
  SLUICE_ASSIGN_OR_RETURN(SimResult base, Simulate(plan, sim));
  result.before = result.after = base.iteration_time;
  auto elapsed = [&] {
    return Duration::Nanos(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
  };
  if (base.outcome != SimOutcome::kOk) {
    result.wall = elapsed();
    return result;
  }
  Rng rng(options.seed);
  ExecutionPlan current = plan;
  Duration current_time = base.iteration_time;
  std::vector<passes::PassRecord> current_path;
  // First, with a pricer: the whole-plan recompute placement, the one bulk move (it changes many
  // (micro-batch, stage) pairs at once, which single moves would take many steps to reach).
  if (options.pricer != nullptr && options.max_steps > 0) {
    ExecutionPlan next = current;
    SLUICE_ASSIGN_OR_RETURN(passes::PassRecord record,
                            passes::RecomputePlacementPass(options.pricer).Run(&next));
    if (record.changed) {
      SLUICE_ASSIGN_OR_RETURN(SimResult r, Simulate(next, sim));
      ++result.simulations;
      if (r.outcome == SimOutcome::kOk && r.iteration_time < current_time) {
        ++result.accepted;
        current = std::move(next);
        current_time = r.iteration_time;
        base = std::move(r);
        current_path.push_back(std::move(record));
        result.after = current_time;
        result.plan = current;
        result.applied = current_path;
      }
    } else if (!record.rejected.empty()) {
      ++result.invalid;
    }
  }
  // Then the MoE overlap rewrites, each on the same plan; the shortest is kept if shorter.
  if (!options.moe_overlaps.empty() && options.max_steps > 0) {
    const ExecutionPlan start = current;
    for (const passes::MoeOverlap overlap : options.moe_overlaps) {
      ExecutionPlan next = start;
      SLUICE_ASSIGN_OR_RETURN(
          passes::PassRecord record,
          passes::MoeOverlapPass(overlap, options.moe_overlap_options).Run(&next));
      if (!record.changed) {
        if (!record.rejected.empty()) ++result.invalid;
        continue;
      }
      SLUICE_ASSIGN_OR_RETURN(SimResult r, Simulate(next, sim));
      ++result.simulations;
      if (r.outcome == SimOutcome::kOk && r.iteration_time < current_time) {
        ++result.accepted;
        current = std::move(next);
        current_time = r.iteration_time;
        base = std::move(r);
        result.applied = current_path;
        result.applied.push_back(std::move(record));
        result.after = current_time;
        result.plan = current;
      }
    }
    current_path = result.applied;
  }
  std::vector<Candidate> pool = Candidates(current, base, options.pricer);
  // The candidates are tried on `next`, a copy of `current` kept between steps: after a refused
  // or rejected candidate only what the pass changed is copied back (RestoreFrom).
  ExecutionPlan next = current;
  while (result.simulations < options.max_steps && !pool.empty()) {
    if (elapsed() >= options.budget) {
      result.budget_hit = true;
      break;
    }
    const int64_t pick = rng.UniformInt(0, static_cast<int64_t>(pool.size()) - 1);
    const Candidate candidate = pool[pick];
    pool.erase(pool.begin() + pick);
    SLUICE_ASSIGN_OR_RETURN(passes::PassRecord record, candidate->Run(&next));
    if (!record.changed) {
      if (!record.rejected.empty()) ++result.invalid;
      RestoreFrom(current, &next);
      continue;
    }
    SLUICE_ASSIGN_OR_RETURN(SimResult r, Simulate(next, sim));
    ++result.simulations;
    if (r.outcome != SimOutcome::kOk) {
      RestoreFrom(current, &next);
      continue;
    }
    const double gain_pct = 100.0 * static_cast<double>((current_time - r.iteration_time).nanos()) /
                            static_cast<double>(std::max<int64_t>(current_time.nanos(), 1));
    bool accept = r.iteration_time < current_time;
    if (!accept && options.search == OptimizerSearch::kMcmc) {
      const double p =
          std::exp(options.beta * std::log(static_cast<double>(result.simulations) + 1) * gain_pct);
      accept = rng.Uniform01() < p;
    }
    if (!accept) {
      RestoreFrom(current, &next);
      continue;
    }
    ++result.accepted;
    current = next;
    current_time = r.iteration_time;
    current_path.push_back(std::move(record));
    pool = Candidates(current, r, options.pricer);
    if (current_time < result.after) {
      result.after = current_time;
      result.plan = current;
      result.applied = current_path;
    }
  }
  result.wall = elapsed();
  return result;
}

}  // namespace sluice
