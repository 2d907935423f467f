// Per-micro-batch cp (batching/dynamic_cp.h) through the planner: Megatron-Core's length rule for
// megatron-gbp's packs, the order-free memory check, the fallback to whole micro-batches, and
// determinism.
#include "batching/dynamic_cp.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "batching/test_util.h"
#include "plan/validate.h"
#include "planner/planner.h"
#include "planner/search_space.h"
#include "sim/simulator.h"

namespace sluice {
namespace {

using testing::MakeTestSetup;
using testing::TestParallel;

// A mixed batch: a few long sequences among many short ones (16K tokens per long one).
std::vector<Sample> MixedBatch() {
  std::vector<Sample> batch;
  int64_t id = 0;
  for (int i = 0; i < 3; ++i) batch.push_back(Sample{.id = id++, .input_len = 6144});
  for (int i = 0; i < 3; ++i) batch.push_back(Sample{.id = id++, .input_len = 2048});
  for (int i = 0; i < 80; ++i) batch.push_back(Sample{.id = id++, .input_len = 128 + 16 * i});
  return batch;
}

int64_t NextPowerOfTwo(int64_t x) {
  int64_t p = 1;
  while (p < x) p *= 2;
  return p;
}

StatusOr<PlanResult> PlanWith(const testing::TestSetup& setup, std::string_view method,
                              bool dynamic, DynamicCpRule rule, std::span<const Sample> batch) {
  PlannerOptions options;
  options.method = std::string(method);
  options.batching.max_seqlen = 8192;
  options.dynamic_cp = dynamic;
  options.dynamic_cp_rule = rule;
  SLUICE_ASSIGN_OR_RETURN(Planner planner,
                          Planner::Create(*setup.cost, setup.parallel, setup.cluster, options));
  return planner.Plan(batch);
}

// Megatron's rule on megatron-hybrid-cp's packs (one cp class each, MicroBatch::cp_class: the
// next power of two of ceil(L / max_seqlen_per_rank)); a pack splits into cp / class sub-groups
// (at most its samples), so a pack of long samples stays whole and a pack of short ones runs at
// a smaller cp. Without a class (other batchings), the class comes from the largest pack's
// tokens / cp. Every split is the one the rule gives; the plan validates
// and simulates within memory.
TEST(DynamicCpRuleTest, MegatronGbpSplitsEachPackByItsLongestSample) {
  ParallelConfig par = TestParallel(1, 1, 2, 36000, /*zero=*/2);
  par.cp = 4;
  auto setup = MakeTestSetup("gpt-6.7b", par, testing::TestCost::kAnalytic);
  const std::vector<Sample> batch = MixedBatch();
  StatusOr<PlanResult> r =
      PlanWith(*setup, "megatron-hybrid-cp", true, DynamicCpRule::kMegatronLength, batch);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->outcome, PlanOutcome::kOk) << r->infeasible_reason;
  EXPECT_TRUE(ValidatePlan(r->plan).ok());
  std::map<int64_t, int64_t> len;
  for (const Sample& s : batch) len[s.id] = s.input_len;
  int64_t largest = 0;
  for (const auto& rep : r->batch_plan.replicas) {
    for (const MicroBatch& mb : rep) largest = std::max(largest, mb.real_tokens);
  }
  const int64_t per_rank = (largest + par.cp - 1) / par.cp;
  int64_t split = 0, whole_long = 0;
  for (const auto& rep : r->batch_plan.replicas) {
    for (const MicroBatch& mb : rep) {
      EXPECT_GT(mb.cp_class, 0);
      int64_t need = mb.cp_class;
      int64_t by_largest = 1;
      for (const auto& row : mb.rows) {
        for (int64_t id : row) {
          by_largest = std::max(by_largest, NextPowerOfTwo((len[id] + per_rank - 1) / per_rank));
        }
      }
      // The pack cap is at least the largest pack: its class is never above that estimate's.
      EXPECT_LE(need, std::min(par.cp, by_largest));
      int64_t k = par.cp / std::min(par.cp, need);
      while (k > mb.num_samples()) k /= 2;
      // The rule's k, or whole when memory refused it (not on this batch: everything fits).
      EXPECT_EQ(mb.cp_split, std::max<int64_t>(1, k));
      split += mb.cp_split > 1;
      whole_long += need >= par.cp && mb.cp_split == 1;
    }
  }
  EXPECT_EQ(r->cp_splits, split);
  EXPECT_GT(split, 0);
  EXPECT_GT(whole_long, 0);
  StatusOr<SimResult> sim = Simulate(r->plan);
  ASSERT_TRUE(sim.ok());
  EXPECT_EQ(sim->outcome, SimOutcome::kOk);
  EXPECT_FALSE(sim->memory_exceeded);
}

// Same inputs, same plan (both rules); and the fastest rule never predicts a slower batch than
// the fixed cp, while Megatron's rule may (it splits by length, not by time).
TEST(DynamicCpRuleTest, DeterministicAndTheFastestRuleIsNeverSlower) {
  ParallelConfig par = TestParallel(1, 1, 2, 36000, /*zero=*/2);
  par.cp = 4;
  auto setup = MakeTestSetup("gpt-6.7b", par, testing::TestCost::kAnalytic);
  const std::vector<Sample> batch = MixedBatch();
  for (std::string_view method :
       {"megatron-gbp", "megatron-hybrid-cp", "global+gbpc", "hydraulis", "multipack"}) {
    EXPECT_TRUE(IsBatchingName(method)) << method;  // a scenario may name it
    StatusOr<PlanResult> fixed = PlanWith(*setup, method, false, DynamicCpRule::kFastest, batch);
    ASSERT_TRUE(fixed.ok()) << fixed.status().ToString();
    for (DynamicCpRule rule : {DynamicCpRule::kFastest, DynamicCpRule::kMegatronLength}) {
      StatusOr<PlanResult> a = PlanWith(*setup, method, true, rule, batch);
      StatusOr<PlanResult> b = PlanWith(*setup, method, true, rule, batch);
      ASSERT_TRUE(a.ok() && b.ok());
      ASSERT_EQ(a->outcome, PlanOutcome::kOk) << method << ": " << a->infeasible_reason;
      EXPECT_EQ(a->plan, b->plan) << method;
      EXPECT_EQ(a->batch_plan, b->batch_plan) << method;
      if (rule == DynamicCpRule::kFastest) {
        for (size_t d = 0; d < a->batch_plan.replicas.size(); ++d) {
          const auto& mbs = a->batch_plan.replicas[d];
          for (const MicroBatch& mb : mbs) {
            const auto it = std::find_if(fixed->batch_plan.replicas[d].begin(),
                                         fixed->batch_plan.replicas[d].end(),
                                         [&](const MicroBatch& o) { return o.rows == mb.rows; });
            ASSERT_NE(it, fixed->batch_plan.replicas[d].end()) << method;
            EXPECT_LE(mb.Bottleneck(), it->Bottleneck()) << method;
          }
        }
      }
    }
  }
}

// The order-free check: a replica passes it only when every order fits CheckSequenceMemory;
// a memory limit that holds the plan's micro-batches one at a time but not several fails it.
TEST(DynamicCpRuleTest, OrderFreeMemoryCheck) {
  ParallelConfig par = TestParallel(1, 2, 2, 36000, /*zero=*/2);
  par.cp = 4;
  auto setup = MakeTestSetup("gpt-6.7b", par, testing::TestCost::kAnalytic);
  StatusOr<PlanResult> r =
      PlanWith(*setup, "hydraulis", false, DynamicCpRule::kFastest, MixedBatch());
  ASSERT_TRUE(r.ok() && r->outcome == PlanOutcome::kOk);
  std::vector<MicroBatch> mbs = r->batch_plan.replicas[0];
  ASSERT_GE(mbs.size(), 2u);
  const bool any_order = FitsInAnyOrder(setup->evaluator(), mbs);
  // Every rotation of the order fits when the order-free check passes.
  for (size_t rot = 0; any_order && rot < mbs.size(); ++rot) {
    std::rotate(mbs.begin(), mbs.begin() + 1, mbs.end());
    EXPECT_TRUE(CheckSequenceMemory(setup->evaluator(), mbs).empty()) << rot;
  }
  // Inflating one micro-batch's stored activations to the whole budget: no order fits.
  mbs[0].stages[0].stored = setup->evaluator().ActivationBudget(0);
  EXPECT_FALSE(FitsInAnyOrder(setup->evaluator(), mbs));
  EXPECT_TRUE(FitsInAnyOrder(setup->evaluator(), std::span<const MicroBatch>()));
}

}  // namespace
}  // namespace sluice
