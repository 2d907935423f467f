#include "compare/compare_run.h"

#include <fmt/core.h>

#include <algorithm>
#include <utility>

namespace sluice {
namespace {

// The memory or deadlock failure of a simulation as a record's outcome and reason.
void RecordSimFailure(const SimResult& s, BatchRecord* rec) {
  rec->outcome = s.outcome == SimOutcome::kDeadlock ? BatchOutcome::kDeadlock
                                                    : BatchOutcome::kSimOutOfMemory;
  rec->reason = s.memory_exceeded
                    ? fmt::format("rank {} exceeds the memory limit at instruction {}: {}",
                                  s.oom_rank, s.oom_instruction, s.problem)
                    : s.problem;
}

void CountMicroBatches(const PlanResult& plan, BatchRecord* rec) {
  for (const auto& replica : plan.batch_plan.replicas) {
    rec->micro_batches += static_cast<int64_t>(replica.size());
    for (const MicroBatch& mb : replica) {
      rec->real_tokens += mb.real_tokens;
      rec->padded_tokens += mb.padded_tokens;
    }
  }
}

}  // namespace

std::vector<Sample> PlacedSamples(const PlanResult& plan, std::span<const Sample> batch) {
  const BatchIndex index(batch);
  std::vector<Sample> out;
  for (const auto& replica : plan.batch_plan.replicas) {
    for (const MicroBatch& mb : replica) {
      for (const auto& row : mb.rows) {
        for (int64_t id : row) out.push_back(index(id));
      }
    }
  }
  return out;
}

BatchRecord StartRecord(const GlobalBatch& batch, const PlanResult& plan) {
  BatchRecord rec;
  rec.batch = batch.index;
  rec.tokens = batch.tokens;
  rec.planning_ms = plan.planning_time.millis();
  rec.cp_splits = plan.cp_splits;
  if (plan.outcome != PlanOutcome::kOk) {
    rec.outcome = BatchOutcome::kOutOfMemory;
    rec.reason = plan.infeasible_reason;
  }
  return rec;
}

StatusOr<BatchRun> SimulateHomogeneous(PlanResult plan, const Planner& planner,
                                       const GlobalBatch& batch, SimOptions sim,
                                       const FlopCounter& flops, int64_t devices,
                                       const std::function<void(ExecutionPlan*)>& adjust,
                                       bool keep_example) {
  BatchRun out;
  out.rec = StartRecord(batch, plan);
  if (plan.outcome != PlanOutcome::kOk) return out;
  BatchRecord& rec = out.rec;
  CountMicroBatches(plan, &rec);
  sim.samples = batch.samples;  // real tokens from the samples' own lengths
  sim.record_timeline = keep_example;
  if (adjust) adjust(&plan.plan);
  SLUICE_ASSIGN_OR_RETURN(SimResult s, Simulate(plan.plan, sim));
  if (s.outcome != SimOutcome::kOk || s.memory_exceeded) {
    RecordSimFailure(s, &rec);
    return out;
  }
  rec.iteration_ms = s.iteration_time.millis();
  double bubble = 0, comm = 0, a2a = 0, exposed_a2a = 0;
  for (const RankSimStats& rank : s.ranks) {
    bubble += rank.bubble.seconds();
    comm += rank.exposed_comm.seconds();
    a2a += rank.all_to_all.millis();
    exposed_a2a += rank.exposed_all_to_all.millis();
    rec.peak_memory_mb = std::max(rec.peak_memory_mb, rank.peak_memory.mb());
  }
  const double denom = static_cast<double>(s.ranks.size()) * s.iteration_time.seconds();
  rec.bubble = denom > 0 ? bubble / denom : 0;
  rec.comm = denom > 0 ? comm / denom : 0;
  if (!s.ranks.empty()) {
    rec.all_to_all_ms = a2a / static_cast<double>(s.ranks.size());
    rec.exposed_all_to_all_ms = exposed_a2a / static_cast<double>(s.ranks.size());
  }
  out.account = AccountBatch(plan, s, planner.evaluator(), batch.samples, flops, devices);
  out.placed = PlacedSamples(plan, batch.samples);
  if (keep_example) out.example = ExampleRun{std::move(plan.plan), std::move(s)};
  return out;
}

StatusOr<BatchRun> SimulateHeteroBatch(const HeteroPlanner& planner, const HeteroPlanResult& plan,
                                       const GlobalBatch& batch, SimOptions sim,
                                       const FlopCounter& flops, int64_t devices) {
  BatchRun out;
  BatchRecord& rec = out.rec;
  rec.batch = batch.index;
  rec.tokens = batch.tokens;
  rec.planning_ms = plan.planning_time.millis();
  if (plan.outcome != PlanOutcome::kOk) {
    rec.outcome = BatchOutcome::kOutOfMemory;
    rec.reason = plan.infeasible_reason;
    return out;
  }
  sim.record_timeline = false;
  SLUICE_ASSIGN_OR_RETURN(HeteroSimResult s, SimulateHetero(plan, sim));
  if (s.outcome != SimOutcome::kOk || s.memory_exceeded) {
    rec.outcome = s.outcome == SimOutcome::kDeadlock ? BatchOutcome::kDeadlock
                                                     : BatchOutcome::kSimOutOfMemory;
    rec.reason = s.problem;
    return out;
  }
  const double iteration = s.iteration_time.seconds();
  rec.iteration_ms = s.iteration_time.millis();
  double bubble = 0, comm = 0, rank_time = 0, group_seconds = 0;
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    const PlanResult& gp = plan.groups[g];
    const SimResult& gs = s.groups[g];
    const ParallelConfig& p = planner.config().groups[g];
    CountMicroBatches(gp, &rec);
    // Each rank: its own bubble and exposed comm, plus the time after its group's iteration:
    // waiting for the slowest group (bubble), then the exposed cross-group reduction (comm).
    const double wait = (s.slowest_group - gs.iteration_time).seconds();
    // Weighted by the rank's devices (tp x cp differ between groups).
    const double w = static_cast<double>(p.devices_per_rank());
    for (const RankSimStats& rank : gs.ranks) {
      bubble += w * (rank.bubble.seconds() + wait);
      comm += w * (rank.exposed_comm.seconds() + s.cross_exposed.seconds());
      rank_time += w * iteration;
      rec.peak_memory_mb = std::max(rec.peak_memory_mb, rank.peak_memory.mb());
    }
    BatchAccount a = AccountBatch(gp, gs, planner.group_planner(static_cast<int64_t>(g)).evaluator(),
                                  plan.samples[g], flops, p.devices());
    group_seconds += a.device_seconds;
    out.account.Add(a);
    std::vector<Sample> placed = PlacedSamples(gp, plan.samples[g]);
    out.placed.insert(out.placed.end(), placed.begin(), placed.end());
  }
  // The devices' time beyond the groups' own iterations: the cross-group reduction left exposed
  // after the slowest group (communication), and every faster group waiting for the slowest
  // (imbalance).
  const double total = static_cast<double>(devices) * iteration;
  const double exposed = static_cast<double>(devices) * s.cross_exposed.seconds();
  out.account.device_seconds = total;
  out.account.comm += exposed;
  out.account.imbalance += std::max(0.0, total - group_seconds - exposed);
  rec.bubble = rank_time > 0 ? bubble / rank_time : 0;
  rec.comm = rank_time > 0 ? comm / rank_time : 0;
  return out;
}

}  // namespace sluice
