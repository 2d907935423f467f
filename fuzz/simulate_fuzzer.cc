// libFuzzer target for the simulator (sim/simulator.h) driven by a plan file, as `sluice simulate`
// drives it: the bytes are read as a sluice-plan/1 JSON document (or MessagePack when the first
// byte is not '{'), and a plan that was read is simulated whether or not it passes ValidatePlan
// (`sluice simulate` warns and simulates anyway). Any plan must give a SimResult or a Status,
// never a crash or a hang, and the writers of a result (summary table, JSON, Chrome trace) must
// take it. For plans that pass ValidatePlan the simulator must agree with the validator: no
// deadlock (the static replay proved there is none) and, counting no buffers, every rank's peak
// memory equal to PredictPeakMemory's. A valid plan with expert parallelism is also rewritten by
// every MoE overlap pass (passes/moe_overlap.h, as `sluice simulate --moe-overlap all` does): a
// pass gives a record or a Status; a rejected rewrite leaves the plan as it was, and a kept one is
// valid and simulates without deadlock.
//
// Cost is bounded by capping the plan: at most kMaxRanks programs and kMaxInstructions
// instructions in all (the engine's work is linear in instructions, times the ring length for
// stepwise collectives), so every input simulates in milliseconds.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string_view>

#include "passes/moe_overlap.h"
#include "plan/plan_json.h"
#include "plan/validate.h"
#include "sim/chrome_trace.h"
#include "sim/simulator.h"
#include "sim/summary.h"

namespace {

constexpr size_t kMaxRanks = 64;
constexpr size_t kMaxInstructions = 4096;

bool SmallEnough(const sluice::ExecutionPlan& plan) {
  if (plan.ranks.size() > kMaxRanks) return false;
  size_t total = 0;
  for (const sluice::RankProgram& p : plan.ranks) total += p.instructions.size();
  return total <= kMaxInstructions;
}

void Simulate(const sluice::ExecutionPlan& plan, bool closed_form) {
  if (!SmallEnough(plan)) return;
  sluice::SimOptions options;
  options.collectives =
      closed_form ? sluice::CollectiveMode::kClosedForm : sluice::CollectiveMode::kStepwise;
  sluice::StatusOr<sluice::SimResult> run = sluice::Simulate(plan, options);
  if (!run.ok()) return;
  const sluice::SimResult& r = *run;
  if (r.ranks.size() != plan.ranks.size()) std::abort();
  for (const sluice::RankSimStats& s : r.ranks) {
    if (s.finish > r.iteration_time) std::abort();
  }
  (void)sluice::FormatSimSummary(plan, r);
  (void)sluice::SimResultToJson(plan, r).dump();
  (void)sluice::ChromeTraceJson(plan, r);
  if (!sluice::ValidatePlan(plan).ok()) return;
  // A valid plan: the simulator agrees with the validator.
  if (r.outcome == sluice::SimOutcome::kDeadlock) std::abort();
  options.count_buffers = false;
  options.record_timeline = false;
  sluice::StatusOr<sluice::SimResult> bare = sluice::Simulate(plan, options);
  if (!bare.ok()) std::abort();
  // The rule without buffers, as the simulation above counts (PredictPeakMemory's default counts
  // buffers since the memory rule took them in).
  const std::vector<sluice::Bytes> predicted =
      sluice::PredictPeakMemory(plan, sluice::MemoryRuleOptions{.count_buffers = false});
  for (size_t k = 0; k < predicted.size(); ++k) {
    if (bare->ranks[k].peak_memory != predicted[k]) std::abort();
  }
  if (plan.parallel.ep <= 1 || !plan.model.moe.has_value()) return;
  for (int k = 0; k <= static_cast<int>(sluice::passes::MoeOverlap::kLancetMegatron); ++k) {
    sluice::ExecutionPlan next = plan;
    sluice::StatusOr<sluice::passes::PassRecord> record =
        sluice::passes::MoeOverlapPass(static_cast<sluice::passes::MoeOverlap>(k)).Run(&next);
    if (!record.ok()) continue;
    if (!record->rejected.empty() || !record->changed) {
      if (!(next == plan)) std::abort();
      continue;
    }
    if (!sluice::ValidatePlan(next).ok()) std::abort();
    if (!SmallEnough(next)) continue;  // slices multiply the instructions
    sluice::StatusOr<sluice::SimResult> rewritten = sluice::Simulate(next, options);
    if (!rewritten.ok() || rewritten->outcome == sluice::SimOutcome::kDeadlock) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool closed_form = (size % 2) == 1;
  if (data[0] == '{') {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    sluice::StatusOr<sluice::ExecutionPlan> plan = sluice::PlanFromJsonText(text, "fuzz.json");
    if (plan.ok()) Simulate(*plan, closed_form);
  } else {
    sluice::StatusOr<sluice::ExecutionPlan> plan =
        sluice::PlanFromMsgpack(std::span<const uint8_t>(data, size), "fuzz.msgpack");
    if (plan.ok()) Simulate(*plan, closed_form);
  }
  return 0;
}
