#include "batching/test_util.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>

#include "base/paths.h"
#include "base/rng.h"
#include "cost/analytic_cost_model.h"
#include "cost/profile_table.h"
#include "cost/profiled_cost_model.h"
#include "model/model_spec.h"

#ifndef SLUICE_TEST_SHARED_DIR
#error "SLUICE_TEST_SHARED_DIR must be defined by the build (sluice_test)"
#endif

namespace sluice::testing {
namespace {

template <typename T>
T Unwrap(StatusOr<T> v, std::string_view what) {
  SLUICE_CHECK_MSG(v.ok(), fmt::format("{}: {}", what, v.status().ToString()));
  return std::move(v).value();
}

int64_t LogNormalLength(Rng& rng, double median, double sigma, int64_t lo, int64_t hi) {
  const double v = rng.LogNormal(std::log(median), sigma);
  return std::clamp<int64_t>(std::llround(v), lo, hi);
}

Sample RandomSample(Rng& rng, int64_t id, int64_t max_len, bool encoder_decoder) {
  Sample s;
  s.id = id;
  if (encoder_decoder) {
    s.input_len = LogNormalLength(rng, 180, 1.0, 1, max_len);
    s.target_len = LogNormalLength(rng, 12, 1.1, 1, max_len);
    return s;
  }
  s.input_len = LogNormalLength(rng, 180, 1.0, 1, max_len);
  if (rng.Uniform01() < 0.5) {
    s.target_len = LogNormalLength(rng, 12, 1.1, 0, max_len);
    s.target_len = std::min(s.target_len, max_len - s.input_len);
  }
  return s;
}

}  // namespace

std::string TestDataPath(const std::string& relative) {
  StatusOr<std::string> in_data = DataFile(relative);
  if (in_data.ok()) return *in_data;
  const std::string shared = std::string(SLUICE_TEST_SHARED_DIR) + "/data/" + relative;
  SLUICE_CHECK_MSG(FileExists(shared),
                   fmt::format("{} is neither in the data directory nor at {}", relative, shared));
  return shared;
}

std::unique_ptr<CostModel> LoadTestCostModel(std::string_view model, TestCost kind) {
  ModelSpec spec = Unwrap(ModelPreset(model), "model preset");
  if (kind == TestCost::kAnalytic) {
    const ClusterSpec cluster = Unwrap(ClusterPreset("a100-40g", 8), "cluster preset");
    return Unwrap(AnalyticCostModel::Create(spec, cluster.device), "analytic cost model");
  }
  std::string file;
  if (model == "gpt-6.7b") file = "profiles/a100_gpt_6.7b.json";
  if (model == "t5-11b") file = "profiles/a100_t5_11b.json";
  SLUICE_CHECK_MSG(!file.empty(), fmt::format("no profile table for model {}", model));
  LayerCostTable table = Unwrap(ReadLayerCostTable(TestDataPath(file)), "profile table");
  return Unwrap(ProfiledCostModel::Create(std::move(table), spec), "profiled cost model");
}

ParallelConfig TestParallel(int64_t dp, int64_t pp, int64_t tp, double memory_limit_mb,
                            int64_t zero, int64_t vpp) {
  ParallelConfig p;
  p.dp = dp;
  p.pp = pp;
  p.tp = tp;
  p.vpp = vpp;
  p.zero = zero;
  if (memory_limit_mb > 0) p.memory_limit = Bytes::MB(memory_limit_mb);
  return p;
}

StatusOr<std::unique_ptr<TestSetup>> TryMakeTestSetup(std::string_view model,
                                                      const ParallelConfig& parallel, TestCost kind,
                                                      const StageCostOptions& options) {
  auto setup = std::make_unique<TestSetup>();
  setup->cost = LoadTestCostModel(model, kind);
  const int64_t devices = parallel.devices();
  const int64_t n = devices <= 8 ? 8 : (devices + 7) / 8 * 8;
  setup->cluster = Unwrap(ClusterPreset("a100-40g", n), "cluster preset");
  setup->parallel = parallel;
  SLUICE_ASSIGN_OR_RETURN(
      StageCostEvaluator eval,
      StageCostEvaluator::Create(*setup->cost, parallel, setup->cluster, options));
  setup->eval.emplace(std::move(eval));
  return setup;
}

std::unique_ptr<TestSetup> MakeTestSetup(std::string_view model, const ParallelConfig& parallel,
                                         TestCost kind, const StageCostOptions& options) {
  return Unwrap(TryMakeTestSetup(model, parallel, kind, options), "stage cost evaluator");
}

std::vector<Sample> RandomBatch(uint64_t seed, int64_t n, int64_t max_len, bool encoder_decoder) {
  Rng rng(seed);
  std::vector<Sample> out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out.push_back(RandomSample(rng, i, max_len, encoder_decoder));
  return out;
}

std::vector<Sample> RandomTokenBatch(uint64_t seed, int64_t tokens, int64_t max_len,
                                     bool encoder_decoder) {
  Rng rng(seed);
  std::vector<Sample> out;
  int64_t total = 0;
  while (total < tokens) {
    out.push_back(RandomSample(rng, static_cast<int64_t>(out.size()), max_len, encoder_decoder));
    total += out.back().tokens();
  }
  return out;
}

std::vector<int64_t> SampleIdsOf(std::span<const MicroBatch> micro_batches) {
  std::vector<int64_t> ids;
  for (const MicroBatch& mb : micro_batches) {
    for (const std::vector<int64_t>& row : mb.rows) ids.insert(ids.end(), row.begin(), row.end());
  }
  return ids;
}

std::vector<int64_t> SampleIdsOf(const BatchPlan& plan) {
  std::vector<int64_t> ids;
  for (const std::vector<MicroBatch>& replica : plan.replicas) {
    const std::vector<int64_t> r = SampleIdsOf(replica);
    ids.insert(ids.end(), r.begin(), r.end());
  }
  for (const UnplacedSample& d : plan.dropped) ids.push_back(d.id);
  return ids;
}

std::vector<int64_t> SortedIds(std::span<const Sample> batch) {
  std::vector<int64_t> ids;
  ids.reserve(batch.size());
  for (const Sample& s : batch) ids.push_back(s.id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace sluice::testing
