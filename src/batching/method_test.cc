// Property tests over every batching method through RunMethod: each sample exactly once, the
// memory rule on every replica, determinism for a seed, and infeasibility as an outcome.
#include "batching/method.h"

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "batching/test_util.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using testing::MakeTestSetup;
using testing::RandomTokenBatch;
using testing::SampleIdsOf;
using testing::SortedIds;
using testing::TestParallel;

// Every method offered for a model family, and a few compositions.
std::vector<std::string> MethodsFor(bool encoder_decoder) {
  std::vector<std::string> methods;
  for (const MethodInfo& m : ListMethods()) {
    // megatron-gbp and megatron-hybrid-cp pack decoder-only THD rows
    if (encoder_decoder && (m.name == "megatron-gbp" || m.name == "megatron-hybrid-cp")) continue;
    methods.push_back(m.name);
  }
  methods.push_back("hydraulis+dynapipe");
  methods.push_back("balanced+sorted");
  methods.push_back("global+token-budget");
  methods.push_back("contiguous+dynapipe");
  return methods;
}

void ExpectValid(const BatchPlan& plan, std::span<const Sample> batch,
                 const StageCostEvaluator& eval, const std::string& what) {
  ASSERT_EQ(plan.outcome, PlanOutcome::kOk) << what << ": " << plan.infeasible_reason;
  ASSERT_EQ(static_cast<int64_t>(plan.replicas.size()), eval.parallel().dp) << what;
  std::vector<int64_t> ids = SampleIdsOf(plan);
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, SortedIds(batch)) << what << ": every sample exactly once";
  for (size_t r = 0; r < plan.replicas.size(); ++r) {
    EXPECT_EQ(CheckSequenceMemory(eval, plan.replicas[r]), "") << what << " replica " << r;
  }
  EXPECT_TRUE(ValidateBatchPlan(plan, batch, eval).ok()) << what;
}

struct Case {
  const char* model;
  int64_t dp, pp, tp;
  int64_t max_len;
  int64_t tokens;
};

class MethodPropertyTest : public ::testing::TestWithParam<Case> {};

TEST_P(MethodPropertyTest, EverySampleOnceMemoryFitsDeterministic) {
  const Case c = GetParam();
  auto setup = MakeTestSetup(c.model, TestParallel(c.dp, c.pp, c.tp));
  const StageCostEvaluator& eval = setup->evaluator();
  const bool enc_dec = eval.model().is_encoder_decoder();
  for (uint64_t seed : {1u, 2u, 3u}) {
    const std::vector<Sample> batch = RandomTokenBatch(seed, c.tokens, c.max_len, enc_dec);
    BatchingOptions options;
    options.seed = seed;
    options.max_seqlen = c.max_len;
    for (const std::string& method : MethodsFor(enc_dec)) {
      const std::string what = fmt::format("{} {} seed {}", c.model, method, seed);
      StatusOr<BatchPlan> a = RunMethod(method, batch, eval, options);
      ASSERT_TRUE(a.ok()) << what << ": " << a.status().ToString();
      ExpectValid(*a, batch, eval, what);
      StatusOr<BatchPlan> b = RunMethod(method, batch, eval, options);
      ASSERT_TRUE(b.ok());
      EXPECT_EQ(*a, *b) << what << ": not deterministic";
      EXPECT_EQ(a->method, method);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Configs, MethodPropertyTest,
    ::testing::Values(Case{"gpt-6.7b", 2, 4, 1, 2048, 65536}, Case{"gpt-6.7b", 1, 8, 1, 4096, 32768},
                      Case{"gpt-6.7b", 2, 2, 4, 1024, 32768}, Case{"t5-11b", 2, 8, 1, 1024, 32768},
                      Case{"t5-11b", 1, 4, 2, 512, 16384}),
    [](const ::testing::TestParamInfo<Case>& info) {
      return fmt::format("{}_dp{}_pp{}_tp{}_L{}", info.param.model[0] == 'g' ? "gpt" : "t5",
                         info.param.dp, info.param.pp, info.param.tp, info.param.max_len);
    });

TEST(MethodTest, ImpossibleMemoryIsAnOutcomeNotAnError) {
  // A 20,000 MB budget holds an 8-stage GPT-6.7B's model states but leaves less than the
  // transient peak of one 8k-token layer (about 15.6 GB at any recompute level).
  auto setup = MakeTestSetup("gpt-6.7b", TestParallel(1, 8, 1, 20000));
  const StageCostEvaluator& eval = setup->evaluator();
  std::vector<Sample> batch = {{0, 8000, 0, 0}, {1, 8100, 0, 0}};
  BatchingOptions options;
  options.max_seqlen = 8192;
  for (const std::string& method : {"padding", "packing", "dynapipe", "hydraulis"}) {
    StatusOr<BatchPlan> plan = RunMethod(method, batch, eval, options);
    ASSERT_TRUE(plan.ok()) << method << ": " << plan.status().ToString();
    EXPECT_EQ(plan->outcome, PlanOutcome::kOutOfMemory) << method;
    EXPECT_FALSE(plan->infeasible_reason.empty()) << method;
  }
}

TEST(MethodTest, UnknownNamesListTheAllowedOnes) {
  auto setup = MakeTestSetup("gpt-6.7b", TestParallel(1, 8));
  std::vector<Sample> batch = {{0, 100, 0, 0}};
  StatusOr<BatchPlan> r = RunMethod("dinopipe", batch, setup->evaluator(), {});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("'dynapipe'"));
  EXPECT_THAT(r.status().message(), HasSubstr("ASSIGNER+BATCHER"));
  r = RunMethod("fancy+dynapipe", batch, setup->evaluator(), {});
  EXPECT_THAT(r.status().message(), HasSubstr("unknown assigner 'fancy'"));
  r = RunMethod("balanced+fancy", batch, setup->evaluator(), {});
  EXPECT_THAT(r.status().message(), HasSubstr("unknown micro-batcher 'fancy'"));
  r = RunMethod("global+packing", batch, setup->evaluator(), {});
  EXPECT_THAT(r.status().message(), HasSubstr("dynapipe, token-budget, gbp and gbpc only"));
}

TEST(MethodTest, MegatronGbpRejectsEncoderDecoder) {
  auto setup = MakeTestSetup("t5-11b", TestParallel(2, 8));
  std::vector<Sample> batch = {{0, 100, 20, 0}};
  StatusOr<BatchPlan> r = RunMethod("megatron-gbp", batch, setup->evaluator(), {});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("decoder-only"));
}

TEST(MethodTest, DynaPipeBeatsPackingOnLongTailedBatch) {
  // The point of the subsystem: on a long-tailed batch at max length 4096 the dynamic plan's
  // predicted replica time is below the packing baseline's (both at their best settings).
  auto setup = MakeTestSetup("gpt-6.7b", TestParallel(2, 4));
  const StageCostEvaluator& eval = setup->evaluator();
  const std::vector<Sample> batch = RandomTokenBatch(11, 65536, 4096, false);
  BatchingOptions options;
  options.max_seqlen = 4096;
  auto time_of = [&](const std::string& method) {
    StatusOr<BatchPlan> plan = RunMethod(method, batch, eval, options);
    EXPECT_TRUE(plan.ok() && plan->outcome == PlanOutcome::kOk) << method;
    Duration worst;
    for (const auto& mbs : plan->replicas) worst = std::max(worst, PredictReplicaTime(mbs, 4));
    return worst;
  };
  EXPECT_LT(time_of("dynapipe"), time_of("packing"));
  EXPECT_LT(time_of("dynapipe"), time_of("padding"));
}

}  // namespace
}  // namespace sluice
