// Shared fixtures for the batching tests (test-only; linked into batching_test).
//
// - TestSetup: a cost model (the A100 profile tables for gpt-6.7b and t5-11b, or the analytic
//   model for any preset), an a100-40g cluster large enough for the parallel configuration, and
//   the StageCostEvaluator over them. Built once per test; the evaluator points into the setup,
//   so keep the setup alive (it is returned in a unique_ptr and never moves).
// - Seeded random global batches of decoder-only or encoder-decoder samples, lognormal lengths
//   like the DynaPipe reference's synthetic data (input median 180, target median 12), with ids
//   0..n-1 and no sample longer than max_len.
// - Helpers that list the sample ids of plans.
//
// Failures to load a fixture abort the test binary with the Status message (programmer or
// checkout error, not a test outcome). Thread safety: none needed; each test builds its own.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "batching/method.h"
#include "batching/micro_batch.h"
#include "batching/stage_cost.h"
#include "cost/cost_model.h"
#include "data/sample.h"
#include "model/cluster_spec.h"
#include "model/parallel_config.h"

namespace sluice::testing {

enum class TestCost {
  kProfiled,  // the A100 tables (gpt-6.7b, t5-11b only)
  kAnalytic,  // AnalyticCostModel with default factors on a100-40g (any preset)
};

struct TestSetup {
  std::unique_ptr<CostModel> cost;
  ClusterSpec cluster;
  ParallelConfig parallel;
  std::optional<StageCostEvaluator> eval;

  const StageCostEvaluator& evaluator() const { return *eval; }
};

// The shipped file `relative` under data/ (e.g. "profiles/a100_gpt_6.7b.json"): the data
// directory first, then the shared checkout beside the source tree. Aborts when neither has it.
std::string TestDataPath(const std::string& relative);

// A cost model for a model preset. Aborts on failure.
std::unique_ptr<CostModel> LoadTestCostModel(std::string_view model, TestCost kind);

// A parallel config: the degrees given, ZeRO-`zero`, memory limit in MB (10^6 B; 0 = device).
ParallelConfig TestParallel(int64_t dp, int64_t pp, int64_t tp = 1, double memory_limit_mb = 36000,
                            int64_t zero = 1, int64_t vpp = 1);

// Setup for `model` under `parallel` on a100-40g (8 devices per node, as many nodes as needed).
// Aborts when the evaluator cannot be created.
std::unique_ptr<TestSetup> MakeTestSetup(std::string_view model, const ParallelConfig& parallel,
                                         TestCost kind = TestCost::kProfiled,
                                         const StageCostOptions& options = {});
// Like MakeTestSetup, but returns the evaluator's Status instead of aborting.
StatusOr<std::unique_ptr<TestSetup>> TryMakeTestSetup(std::string_view model,
                                                      const ParallelConfig& parallel,
                                                      TestCost kind = TestCost::kProfiled,
                                                      const StageCostOptions& options = {});

// `n` samples with ids 0..n-1. Decoder-only: input lognormal(median 180, sigma 1), target 0 for
// half of them and lognormal(median 12, sigma 1.1) for the rest, input + target <= max_len.
// Encoder-decoder: input and target each lognormal as above, each <= max_len. All lengths >= 1
// (input) and >= 0 (target); encoder-decoder targets >= 1.
std::vector<Sample> RandomBatch(uint64_t seed, int64_t n, int64_t max_len, bool encoder_decoder);
// Samples drawn as RandomBatch until their tokens reach `tokens` (the last one may overshoot).
std::vector<Sample> RandomTokenBatch(uint64_t seed, int64_t tokens, int64_t max_len,
                                     bool encoder_decoder);

// The sample ids in `micro_batches` (row order), and of a plan (replica order), plus dropped.
std::vector<int64_t> SampleIdsOf(std::span<const MicroBatch> micro_batches);
std::vector<int64_t> SampleIdsOf(const BatchPlan& plan);
// The ids of `batch`, sorted.
std::vector<int64_t> SortedIds(std::span<const Sample> batch);

}  // namespace sluice::testing
