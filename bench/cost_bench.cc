// Speed of cost-model lookups: the batching DP calls Layer() O(N^2) times per global batch.
// Prints ns per lookup for the profiled model (GPT encoder layer: 2-D grid; T5 decoder layer:
// 3-D grid) and the analytic model, and the time of a full fit of the GPT table.
#include <benchmark/benchmark.h>

#include "bench/bench_util.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "base/paths.h"
#include "base/rng.h"
#include "cost/analytic_cost_model.h"
#include "cost/cost_fit.h"
#include "cost/profile_table.h"
#include "cost/profiled_cost_model.h"
#include "model/cluster_spec.h"
#include "model/model_spec.h"

namespace sluice {
namespace {

using bench::Must;

// The presets the shipped tables profile, and the device they were measured on.
ModelSpec Gpt() { return *ModelPreset("gpt-6.7b"); }
ModelSpec T5() { return *ModelPreset("t5-11b"); }
DeviceSpec A100() { return ClusterPreset("a100-40g", 8)->device; }

LayerCostTable LoadTable(const char* relative) {
  StatusOr<std::string> path = DataFile(relative);
  StatusOr<LayerCostTable> t =
      path.ok() ? ReadLayerCostTable(*path) : StatusOr<LayerCostTable>(path.status());
  if (!t.ok()) {
    std::fprintf(stderr, "%s\n", t.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(t).value();
}

// Shapes a batching DP asks about: random (mbs, seqlen[, dec_seqlen]) mostly inside the grid.
std::vector<LayerShape> Shapes(bool decoder) {
  Rng rng(7);
  std::vector<LayerShape> shapes(4096);
  for (LayerShape& s : shapes) {
    s.seqlen = rng.UniformInt(16, 2048);
    s.dec_seqlen = decoder ? rng.UniformInt(16, 512) : 0;
    s.mbs = rng.UniformInt(1, 8);
  }
  return shapes;
}

void RunLookups(benchmark::State& state, const CostModel& model, LayerKind kind, bool decoder) {
  const std::vector<LayerShape> shapes = Shapes(decoder);
  size_t i = 0;
  int64_t feasible = 0;
  for (auto _ : state) {
    const LayerCost c = model.Layer(kind, shapes[i], 2, Recompute::kSelective);
    feasible += c.feasible ? 1 : 0;
    benchmark::DoNotOptimize(c);
    i = (i + 1) & (shapes.size() - 1);
  }
  state.counters["feasible_share"] =
      static_cast<double>(feasible) / static_cast<double>(state.iterations());
}

void BM_ProfiledGptEncoder(benchmark::State& state) {
  const std::unique_ptr<ProfiledCostModel> model =
      Must(ProfiledCostModel::Create(LoadTable("profiles/a100_gpt_6.7b.json"), Gpt()));
  RunLookups(state, *model, LayerKind::kEncoder, false);
}
BENCHMARK(BM_ProfiledGptEncoder);

void BM_ProfiledT5Decoder(benchmark::State& state) {
  const std::unique_ptr<ProfiledCostModel> model =
      Must(ProfiledCostModel::Create(LoadTable("profiles/a100_t5_11b.json"), T5()));
  RunLookups(state, *model, LayerKind::kDecoder, true);
}
BENCHMARK(BM_ProfiledT5Decoder);

void BM_ProfiledGridOnly(benchmark::State& state) {
  // The bare interpolation (no I/W split), to separate it from the analytic FLOP count.
  const LayerCostTable table = LoadTable("profiles/a100_t5_11b.json");
  const TableConfig& c = *table.Find(2, Recompute::kSelective);
  ProfiledCostModel::Grid g;
  g.dims = 2;
  g.metrics = 1;
  for (const CostRow& row : c.forward_ms[0]) g.axes[0].push_back(row.seqlen);
  g.axes[1] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048};
  g.values.assign(g.axes[0].size() * g.axes[1].size(), 1.0);
  const std::vector<LayerShape> shapes = Shapes(false);
  size_t i = 0;
  double out = 0;
  for (auto _ : state) {
    int64_t point[2] = {shapes[i].seqlen, shapes[i].mbs};
    benchmark::DoNotOptimize(g.Lookup(point, &out));
    i = (i + 1) & (shapes.size() - 1);
  }
}
BENCHMARK(BM_ProfiledGridOnly);

void BM_AnalyticGptEncoder(benchmark::State& state) {
  const std::unique_ptr<AnalyticCostModel> model = Must(AnalyticCostModel::Create(Gpt(), A100()));
  RunLookups(state, *model, LayerKind::kEncoder, false);
}
BENCHMARK(BM_AnalyticGptEncoder);

void BM_AnalyticT5Decoder(benchmark::State& state) {
  const std::unique_ptr<AnalyticCostModel> model = Must(AnalyticCostModel::Create(T5(), A100()));
  RunLookups(state, *model, LayerKind::kDecoder, true);
}
BENCHMARK(BM_AnalyticT5Decoder);

void BM_FitGptTable(benchmark::State& state) {
  const LayerCostTable table = LoadTable("profiles/a100_gpt_6.7b.json");
  for (auto _ : state) {
    StatusOr<FitReport> r = FitAnalyticToTable(table, Gpt(), A100());
    benchmark::DoNotOptimize(r);
  }
}
BENCHMARK(BM_FitGptTable)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace
}  // namespace sluice
