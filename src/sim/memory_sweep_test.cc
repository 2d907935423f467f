// The memory sweep: every plan the planner accepts fits in the simulator (docs/simulator.md,
// "Memory"). Methods x schedules x configurations x seeded batches; each accepted plan is
// simulated and must end ok, with every rank's simulated peak at most the plan's memory rule
// (PredictPeakMemory), which is at most the limit. Rejections are counted by the step that made
// them (batching, schedule, lowered plan): the budgets of batching and scheduling reserve room for
// buffers, so the lowered-plan check should rarely be the one that rejects.
//
// 7 configurations x 6 schedules x 4 seeded batches x 10 methods: 1,680 planner runs, about 4 s.
#include <fmt/core.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "batching/test_util.h"
#include "data/data_source.h"
#include "data/global_batcher.h"
#include "plan/validate.h"
#include "planner/planner.h"
#include "sim/simulator.h"

namespace sluice {
namespace {

struct SweepConfig {
  const char* name;
  const char* model;
  int64_t dp, pp, tp, zero;
  double limit_mb;
  int64_t max_seqlen;
  const char* data;  // "random" (testing::RandomTokenBatch) or a data preset
  int64_t tokens;    // per global batch
};

struct SweepSchedule {
  ScheduleKind kind;
  int64_t vpp;
};

// gpt-6.7b and t5-11b on a100-40g with the profiled A100 tables.
const std::vector<SweepConfig>& Configs() {
  static const auto* configs = new std::vector<SweepConfig>{
      {"base", "gpt-6.7b", 2, 4, 1, 1, 36000, 2048, "random", 32768},
      // The tight limit: 5.8 GB of activations and buffers on the first stage.
      {"tight", "gpt-6.7b", 2, 4, 1, 1, 24000, 2048, "random", 32768},
      // Long sequences on long-tailed data.
      {"long", "gpt-6.7b", 2, 4, 1, 1, 36000, 8192, "web-code", 65536},
      {"tp2", "gpt-6.7b", 1, 4, 2, 1, 36000, 4096, "web-code", 32768},
      {"deep", "gpt-6.7b", 1, 8, 1, 1, 36000, 8192, "web-code", 65536},
      {"zero2", "gpt-6.7b", 4, 2, 1, 2, 30000, 2048, "random", 32768},
      // Encoder-decoder: the varlen methods (multipack, hydraulis) do not run it.
      {"t5", "t5-11b", 1, 8, 1, 1, 36000, 1024, "flan-like", 32768},
  };
  return *configs;
}

const std::vector<SweepSchedule>& Schedules() {
  static const auto* schedules = new std::vector<SweepSchedule>{
      {ScheduleKind::kGPipe, 1}, {ScheduleKind::k1F1B, 1},     {ScheduleKind::kInterleaved, 2},
      {ScheduleKind::kZbH1, 1},  {ScheduleKind::kAdaptive, 1}, {ScheduleKind::kAdaptive, 2},
  };
  return *schedules;
}

const std::vector<std::string>& Methods() {
  static const auto* methods = new std::vector<std::string>{
      "padding",   "packing", "multipack",          "token-budget",       "dynapipe",
      "hydraulis", "sorted",  "hydraulis+dynapipe", "balanced+multipack", "global+token-budget"};
  return *methods;
}

std::vector<uint64_t> Seeds() { return {1, 2, 3, 4}; }

// A seeded global batch of `c`.
std::vector<Sample> MakeBatch(const SweepConfig& c, uint64_t seed, bool enc_dec) {
  if (std::string(c.data) == "random") {
    return testing::RandomTokenBatch(seed, c.tokens, c.max_seqlen, enc_dec);
  }
  DataOptions data_options;
  data_options.seed = seed;
  data_options.num_samples = 4000;
  StatusOr<Dataset> data = LoadData(c.data, data_options);
  SLUICE_CHECK_MSG(data.ok(), data.status().ToString());
  BatcherOptions options;
  options.tokens_per_batch = c.tokens;
  options.max_seqlen = c.max_seqlen;
  options.limit = enc_dec ? SeqlenLimit::kEachSide : SeqlenLimit::kTotal;
  options.seed = seed;
  StatusOr<GlobalBatcher> batcher = GlobalBatcher::Create(*data, options);
  SLUICE_CHECK_MSG(batcher.ok(), batcher.status().ToString());
  GlobalBatch batch;
  SLUICE_CHECK(batcher->Next(&batch));
  return batch.samples;
}

struct Tally {
  int64_t cases = 0;        // planner runs
  int64_t unsupported = 0;  // the method does not run the model (a Status)
  int64_t accepted = 0;
  int64_t rejected_batching = 0;
  int64_t rejected_schedule = 0;
  int64_t rejected_lowered = 0;
  int64_t over_limit = 0;        // accepted plans over the limit in simulation: must stay 0
  int64_t off_rule = 0;          // simulated peak other than the plan's rule: must stay 0
  double min_headroom_mb = 1e9;  // smallest limit - simulated peak
};

TEST(MemorySweepTest, EveryAcceptedPlanFitsInTheSimulator) {
  Tally t;
  std::map<std::string, int64_t> lowered_by;  // which cases the lowered-plan check rejected
  for (const SweepConfig& c : Configs()) {
    for (const SweepSchedule& sched : Schedules()) {
      const ParallelConfig par =
          testing::TestParallel(c.dp, c.pp, c.tp, c.limit_mb, c.zero, sched.vpp);
      auto setup = testing::MakeTestSetup(c.model, par);
      StatusOr<std::shared_ptr<const StageCostEvaluator>> eval =
          MakePlannerEvaluator(*setup->cost, par, setup->cluster, sched.kind);
      ASSERT_TRUE(eval.ok()) << eval.status().ToString();
      const bool enc_dec = (*eval)->model().is_encoder_decoder();
      for (uint64_t seed : Seeds()) {
        const std::vector<Sample> batch = MakeBatch(c, seed, enc_dec);
        for (const std::string& method : Methods()) {
          const std::string name =
              fmt::format("{} {}{} {} seed {}", c.name, ScheduleKindName(sched.kind),
                          sched.vpp > 1 ? " vpp 2" : "", method, seed);
          PlannerOptions options;
          options.method = method;
          options.schedule = sched.kind;
          options.batching.max_seqlen = c.max_seqlen;
          options.batching.seed = seed;
          options.batching.hydraulis_shuffles = 8;
          StatusOr<Planner> planner = Planner::Create(*eval, setup->cluster, options);
          ASSERT_TRUE(planner.ok()) << name << ": " << planner.status().ToString();
          ++t.cases;
          StatusOr<PlanResult> plan = planner->Plan(batch);
          if (!plan.ok()) {
            // Only a method that does not run the model may refuse (varlen on encoder-decoder).
            ASSERT_EQ(plan.status().code(), StatusCode::kInvalidArgument)
                << name << ": " << plan.status().ToString();
            ++t.unsupported;
            continue;
          }
          if (plan->outcome != PlanOutcome::kOk) {
            const std::string& why = plan->infeasible_reason;
            if (why.starts_with("batching")) {
              ++t.rejected_batching;
            } else if (why.starts_with("lowered plan")) {
              ++t.rejected_lowered;
              ++lowered_by[name + ": " + why];
            } else {
              ++t.rejected_schedule;
            }
            continue;
          }
          ++t.accepted;
          SimOptions sim;
          sim.collectives = CollectiveMode::kClosedForm;
          sim.record_timeline = false;
          sim.record_memory = false;
          sim.samples = batch;
          StatusOr<SimResult> r = Simulate(plan->plan, sim);
          ASSERT_TRUE(r.ok()) << name << ": " << r.status().ToString();
          EXPECT_EQ(r->outcome, SimOutcome::kOk) << name << ": " << r->problem;
          const std::vector<Bytes> rule = PredictPeakMemory(plan->plan);
          const Bytes limit = plan->plan.memory_limit();
          bool over = r->memory_exceeded;
          for (size_t i = 0; i < rule.size(); ++i) {
            // The simulator's level is the rule's on a time axis: the same peak.
            const Bytes sim_peak = r->ranks[i].peak_memory;
            EXPECT_EQ(sim_peak, rule[i]) << name << " rank " << i;
            EXPECT_LE(rule[i], limit) << name << " rank " << i;
            if (sim_peak != rule[i]) ++t.off_rule;
            over = over || sim_peak > limit;
            t.min_headroom_mb = std::min(t.min_headroom_mb, (limit - sim_peak).mb());
          }
          if (over) ++t.over_limit;
        }
      }
    }
  }
  fmt::print(
      "memory sweep: {} planner runs, {} unsupported, {} accepted, rejected: {} batching, {} "
      "schedule, {} lowered plan; accepted plans over the limit in simulation: {}; simulated "
      "peaks other than the rule's: {}; smallest headroom {:.1f} MB\n",
      t.cases, t.unsupported, t.accepted, t.rejected_batching, t.rejected_schedule,
      t.rejected_lowered, t.over_limit, t.off_rule, t.min_headroom_mb);
  for (const auto& [name, n] : lowered_by) fmt::print("  rejected after lowering: {}\n", name);
  EXPECT_EQ(t.cases, 1680);
  EXPECT_EQ(t.over_limit, 0);
  EXPECT_EQ(t.off_rule, 0);
  // The sweep means something: most cases plan, and the budgets keep the lowered-plan check
  // a rare rejection (at most 1 in 20 of the plans that got that far).
  EXPECT_GT(t.accepted, (t.cases - t.unsupported) / 2);
  EXPECT_LE(20 * t.rejected_lowered, t.accepted + t.rejected_lowered);
}

}  // namespace
}  // namespace sluice
