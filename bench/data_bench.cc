// Reading and batching speed of the data layer: the shipped 30,000-sample mixture (JSON Lines),
// a generator preset, and cutting the mixture into 65,536-token global batches.
#include <benchmark/benchmark.h>

#include "data/data_source.h"
#include "data/global_batcher.h"

namespace sluice {
namespace {

void BM_LoadMixture(benchmark::State& state) {
  for (auto _ : state) {
    StatusOr<Dataset> d = LoadData("mixture-4task");
    if (!d.ok()) state.SkipWithError(d.status().ToString().c_str());
    benchmark::DoNotOptimize(d);
  }
  state.SetItemsProcessed(state.iterations() * 30000);
}
BENCHMARK(BM_LoadMixture)->Unit(benchmark::kMillisecond);

void BM_GenerateWebCode(benchmark::State& state) {
  DataOptions options;
  options.num_samples = 20000;
  for (auto _ : state) {
    StatusOr<Dataset> d = LoadData("web-code", options);
    benchmark::DoNotOptimize(d);
  }
  state.SetItemsProcessed(state.iterations() * 20000);
}
BENCHMARK(BM_GenerateWebCode)->Unit(benchmark::kMillisecond);

void BM_GlobalBatchesOfMixture(benchmark::State& state) {
  StatusOr<Dataset> d = LoadData("mixture-4task");
  if (!d.ok()) {
    state.SkipWithError(d.status().ToString().c_str());
    return;
  }
  BatcherOptions options;
  options.tokens_per_batch = 65536;
  options.max_seqlen = 2048;
  for (auto _ : state) {
    StatusOr<GlobalBatcher> b = GlobalBatcher::Create(*d, options);
    GlobalBatch batch;
    int64_t n = 0;
    while (b->Next(&batch)) ++n;
    benchmark::DoNotOptimize(n);
  }
}
BENCHMARK(BM_GlobalBatchesOfMixture)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace sluice

BENCHMARK_MAIN();
