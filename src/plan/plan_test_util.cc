#include "plan/plan_test_util.h"

#include <fmt/core.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "base/rng.h"
#include "cost/analytic_cost_model.h"
#include "schedule/schedule_costs.h"

#ifndef SLUICE_TEST_SOURCE_DIR
#error "SLUICE_TEST_SOURCE_DIR must be defined by the build (sluice_test)"
#endif

namespace sluice::testing {
namespace {

template <typename T>
T Unwrap(StatusOr<T> v, std::string_view what) {
  SLUICE_CHECK_MSG(v.ok(), fmt::format("{}: {}", what, v.status().ToString()));
  return std::move(v).value();
}

ModelSpec Dense(std::string name, int64_t layers, int64_t hidden, int64_t heads) {
  ModelSpec m;
  m.name = std::move(name);
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.kv_heads = heads;
  m.ffn_hidden = 4 * hidden;
  m.vocab = 32000;
  m.max_position = 4096;
  return m;
}

// Micro-batches of consecutive samples of `batch` starting at `*next`.
std::vector<MicroBatch> CutReplica(const PlanCase& c, const std::vector<Sample>& batch,
                                   const StageCostEvaluator& eval, Rng& rng, size_t* next) {
  std::vector<MicroBatch> out;
  const BatchIndex index(batch);
  for (int64_t i = 0; i < c.microbatches; ++i) {
    MicroBatch mb;
    const int64_t rows = c.fixed_shapes ? 1 + i % 3 : 1 + static_cast<int64_t>(rng.Uniform01() * 4);
    for (int64_t r = 0; r < rows; ++r) mb.rows.push_back({batch[(*next)++].id});
    SLUICE_CHECK_MSG(PriceMicroBatch(eval, index, &mb), "test micro-batch cannot be priced");
    out.push_back(std::move(mb));
  }
  return out;
}

}  // namespace

ModelSpec TestGptModel() { return Dense("test-gpt", 16, 1024, 16); }

ModelSpec TestT5Model() {
  ModelSpec m = Dense("test-t5", 8, 512, 8);
  m.kind = ModelKind::kEncoderDecoder;
  m.decoder_layers = 8;
  return m;
}

std::string Describe(const PlanCase& c) {
  return fmt::format("{}{} dp{} pp{} vpp{} zero{} {} m{} seed{}{}",
                     c.encoder_decoder ? "t5" : "gpt", c.moe ? "-moe" : "", c.dp, c.pp, c.vpp,
                     c.zero, ScheduleKindName(c.kind), c.microbatches, c.seed,
                     c.ep > 1 ? fmt::format(" ep{}", c.ep) : "") +
         (c.cp > 1 ? fmt::format(" cp{}", c.cp) : "");
}

std::unique_ptr<PlanFixture> MakePlanFixture(const PlanCase& c) {
  auto f = std::make_unique<PlanFixture>();
  ModelSpec model = c.encoder_decoder ? TestT5Model() : TestGptModel();
  if (c.moe) {
    model.moe = MoeSpec{
        .experts = 4, .top_k = 2, .capacity_factor = 1.25, .layer_interval = 2};
  }
  const int64_t devices = c.dp * c.pp * c.cp;
  f->setup = std::make_unique<TestSetup>();
  f->setup->cluster =
      Unwrap(ClusterPreset("a100-40g", devices <= 8 ? 8 : (devices + 7) / 8 * 8), "cluster");
  f->setup->cost = Unwrap(AnalyticCostModel::Create(model, f->setup->cluster.device), "cost");
  f->setup->parallel = TestParallel(c.dp, c.pp, 1, c.memory_limit_mb, c.zero, c.vpp);
  f->setup->parallel.ep = c.ep;
  f->setup->parallel.cp = c.cp;
  f->setup->eval.emplace(
      Unwrap(StageCostEvaluator::Create(*f->setup->cost, f->setup->parallel, f->setup->cluster),
             "evaluator"));
  const StageCostEvaluator& eval = f->setup->evaluator();
  const int64_t n = c.dp * c.microbatches * 4 + 1;
  if (c.fixed_shapes) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t len = 64 * (1 + (i / 3) % 4);
      f->batch.push_back({i, c.encoder_decoder ? len : len - 8, c.encoder_decoder ? 16 : 8, 0});
    }
  } else {
    f->batch = RandomBatch(c.seed, n, c.encoder_decoder ? 512 : 2048, c.encoder_decoder);
  }
  Rng rng(c.seed + 17);
  size_t next = 0;
  f->batch_plan.method = "test";
  for (int64_t d = 0; d < c.dp; ++d) {
    f->batch_plan.replicas.push_back(CutReplica(c, f->batch, eval, rng, &next));
  }
  for (; next < f->batch.size(); ++next) {
    f->batch_plan.dropped.push_back({f->batch[next].id, "left out by the test fixture"});
  }
  for (int64_t d = 0; d < c.dp; ++d) {
    ScheduleCostOptions options = c.lower.costs;
    options.replica = d;
    const ScheduleCosts costs = Unwrap(
        BuildScheduleCosts(f->batch_plan.replicas[d], eval, f->setup->cluster, options), "costs");
    ScheduleResult r = Unwrap(GenerateSchedule(c.kind, costs), "schedule");
    if (r.schedule.ranks.empty()) {
      f->no_schedule = fmt::format("{}: the {} generator returned no schedule for replica {}: {}",
                                   Describe(c), ScheduleKindName(c.kind), d, r.infeasible_reason);
      return f;
    }
    f->fits = f->fits && r.outcome == PlanOutcome::kOk;
    f->schedules.push_back(std::move(r.schedule));
  }
  f->plan =
      Unwrap(LowerPlan(f->batch_plan, f->batch, f->schedules, eval, f->setup->cluster, c.lower),
             "lowering");
  return f;
}

std::string CheckGolden(const std::string& file, const std::string& actual) {
  const std::string path = std::string(SLUICE_TEST_SOURCE_DIR) + "/tests/golden/plans/" + file;
  const char* update = std::getenv("SLUICE_UPDATE_GOLDEN");
  if (update != nullptr && std::string(update) == "1") {
    std::ofstream out(path, std::ios::binary);
    out << actual;
    return out.good() ? "" : "cannot write " + path;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in.good()) return path + " is missing; run with SLUICE_UPDATE_GOLDEN=1 to create it";
  std::stringstream want;
  want << in.rdbuf();
  if (want.str() == actual) return "";
  return fmt::format(
      "{} differs from the output; if the change is intended, regenerate with "
      "SLUICE_UPDATE_GOLDEN=1\n--- golden\n{}\n--- actual\n{}",
      path, want.str(), actual);
}

}  // namespace sluice::testing
