// Speed of the schedule library per global batch (docs/schedules.md, "Measured").
//
// Global batches of 65,536 tokens are cut from data/lengths/mixture-4task.jsonl in file order
// (lengths clipped to 2048), split by `--method dynapipe` for gpt-6.7b on a100-40g:16 with the
// profiled A100 tables, ZeRO-1, a 36,000 MB limit, dp = 2 and pp = 8, and priced per replica into
// ScheduleCosts (vpp = 1, and vpp = 2 for the interleaved and adaptive variants). Then:
//   BM_Generate/<kind>/vpp<v>      GenerateSchedule for one replica (order + estimate + memory)
//   BM_Estimate/<kind>             EstimateSchedule of a generated schedule
//   BM_OrderSearch/<kind>          SearchMicroBatchOrder for one replica (default options)
//   BM_PlanBatch/<kind>            per global batch: for each replica BuildScheduleCosts, the
//                                  order search and CheckScheduleComplete of the winner
// Each iteration takes the next replica (or batch) of a fixed set; counters give the median
// per call (p50_us), the micro-batches per replica, the candidates scored, and for the generators
// the mean estimated makespan (makespan_ms) and bubble fraction of the given order.
// Run: build-sched/bench/schedule_bench --benchmark_min_time=0.2   (RelWithDebInfo, -O2)
#include <benchmark/benchmark.h>

#include "bench/bench_util.h"
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "base/paths.h"
#include "batching/method.h"
#include "batching/stage_cost.h"
#include "cost/cost_factory.h"
#include "data/reader.h"
#include "model/cluster_spec.h"
#include "model/model_spec.h"
#include "schedule/estimator.h"
#include "schedule/generators.h"
#include "schedule/order_search.h"
#include "schedule/schedule_costs.h"

namespace sluice {
namespace {

using bench::Median;
using bench::Must;

constexpr int kBatches = 8;
constexpr int64_t kTokens = 65536;
constexpr int64_t kMaxLen = 2048;

// Everything the benchmarks share, built once in main.
struct Scenario {
  ModelSpec model;
  ClusterSpec cluster;
  ParallelConfig parallel;       // vpp = 1
  ParallelConfig parallel_vpp2;  // vpp = 2
  std::unique_ptr<CostModel> cost;
  std::unique_ptr<StageCostEvaluator> eval;
  std::unique_ptr<StageCostEvaluator> eval_vpp2;
  std::vector<BatchPlan> plans;           // per global batch
  std::vector<ScheduleCosts> costs;       // per replica of every batch, vpp = 1
  std::vector<ScheduleCosts> costs_vpp2;  // the same, vpp = 2
};

std::vector<std::vector<Sample>> CutBatches() {
  return bench::CutMixtureBatches(kBatches, kTokens, kMaxLen);
}

std::unique_ptr<Scenario> MakeScenario() {
  auto s = std::make_unique<Scenario>();
  s->model = Must(ModelPreset("gpt-6.7b"));
  s->cluster = Must(ClusterPreset("a100-40g", 16));
  s->parallel.dp = 2;
  s->parallel.pp = 8;
  s->parallel.zero = 1;
  s->parallel.memory_limit = Bytes::MB(36000);
  s->parallel_vpp2 = s->parallel;
  s->parallel_vpp2.vpp = 2;
  s->cost = Must(MakeCostModel(s->model, s->cluster, CostModelOptions{}));
  s->eval = std::make_unique<StageCostEvaluator>(
      Must(StageCostEvaluator::Create(*s->cost, s->parallel, s->cluster)));
  s->eval_vpp2 = std::make_unique<StageCostEvaluator>(
      Must(StageCostEvaluator::Create(*s->cost, s->parallel_vpp2, s->cluster)));
  for (const std::vector<Sample>& batch : CutBatches()) {
    BatchPlan plan = Must(RunMethod("dynapipe", batch, *s->eval, BatchingOptions{}));
    if (plan.outcome != PlanOutcome::kOk) {
      std::fprintf(stderr, "schedule_bench: dynapipe: %s\n", plan.infeasible_reason.c_str());
      std::abort();
    }
    for (size_t r = 0; r < plan.replicas.size(); ++r) {
      const ScheduleCostOptions options{.replica = static_cast<int64_t>(r)};
      s->costs.push_back(Must(BuildScheduleCosts(plan.replicas[r], *s->eval, s->cluster, options)));
      s->costs_vpp2.push_back(
          Must(BuildScheduleCosts(plan.replicas[r], *s->eval_vpp2, s->cluster, options)));
    }
    s->plans.push_back(std::move(plan));
  }
  return s;
}

double MicrosSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

double MeanMicroBatches(const std::vector<ScheduleCosts>& costs) {
  double n = 0;
  for (const ScheduleCosts& c : costs) n += static_cast<double>(c.num_microbatches());
  return n / static_cast<double>(costs.size());
}

void BM_Generate(benchmark::State& state, const Scenario* s, ScheduleKind kind, int vpp) {
  const std::vector<ScheduleCosts>& all = vpp == 1 ? s->costs : s->costs_vpp2;
  std::vector<double> us;
  double oom = 0, makespan = 0, bubble = 0;
  size_t k = 0;
  for (auto _ : state) {
    const ScheduleCosts& c = all[k++ % all.size()];
    const auto t0 = std::chrono::steady_clock::now();
    ScheduleResult r = Must(GenerateSchedule(kind, c));
    us.push_back(MicrosSince(t0));
    oom += r.outcome == PlanOutcome::kOk ? 0 : 1;
    makespan += r.estimate.makespan.millis();
    bubble += r.estimate.bubble_fraction;
  }
  const double n = static_cast<double>(us.size());
  state.counters["p50_us"] = Median(us);
  state.counters["micro_batches"] = MeanMicroBatches(all);
  state.counters["oom_share"] = oom / n;
  state.counters["makespan_ms"] = makespan / n;  // given order, mean over replicas
  state.counters["bubble"] = bubble / n;
}

void BM_Estimate(benchmark::State& state, const Scenario* s, ScheduleKind kind) {
  std::vector<Schedule> schedules;
  for (const ScheduleCosts& c : s->costs)
    schedules.push_back(Must(GenerateSchedule(kind, c)).schedule);
  std::vector<double> us;
  size_t k = 0;
  for (auto _ : state) {
    const size_t i = k++ % schedules.size();
    const auto t0 = std::chrono::steady_clock::now();
    ScheduleEstimate e = EstimateSchedule(schedules[i], s->costs[i]);
    us.push_back(MicrosSince(t0));
    benchmark::DoNotOptimize(e.makespan);
  }
  state.counters["p50_us"] = Median(us);
  state.counters["micro_batches"] = MeanMicroBatches(s->costs);
}

void BM_OrderSearch(benchmark::State& state, const Scenario* s, ScheduleKind kind,
                    int64_t shuffles) {
  OrderSearchOptions options;
  options.shuffles = shuffles;
  std::vector<double> us;
  double candidates = 0, gain = 0;
  size_t k = 0;
  for (auto _ : state) {
    const ScheduleCosts& c = s->costs[k++ % s->costs.size()];
    const auto t0 = std::chrono::steady_clock::now();
    OrderSearchResult r = Must(SearchMicroBatchOrder(kind, c, options));
    us.push_back(MicrosSince(t0));
    candidates += static_cast<double>(r.candidates);
    if (r.outcome == PlanOutcome::kOk && !r.given_makespan.is_infinite()) {
      gain += 1.0 - r.result.estimate.makespan.micros() / r.given_makespan.micros();
    }
  }
  const double n = static_cast<double>(us.size());
  state.counters["p50_us"] = Median(us);
  state.counters["candidates"] = candidates / n;
  state.counters["makespan_gain"] = gain / n;  // mean relative gain over the given order
  state.counters["micro_batches"] = MeanMicroBatches(s->costs);
}

void BM_PlanBatch(benchmark::State& state, const Scenario* s, ScheduleKind kind) {
  std::vector<double> us;
  size_t k = 0;
  for (auto _ : state) {
    const BatchPlan& plan = s->plans[k++ % s->plans.size()];
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t r = 0; r < plan.replicas.size(); ++r) {
      const ScheduleCosts costs = Must(BuildScheduleCosts(plan.replicas[r], *s->eval, s->cluster,
                                                          {.replica = static_cast<int64_t>(r)}));
      OrderSearchResult best = Must(SearchMicroBatchOrder(kind, costs));
      if (best.outcome == PlanOutcome::kOk && !CheckScheduleComplete(best.result.schedule).ok()) {
        state.SkipWithError("incomplete schedule");
        return;
      }
      benchmark::DoNotOptimize(best.order.data());
    }
    us.push_back(MicrosSince(t0));
  }
  state.counters["p50_us"] = Median(us);
}

void Register(const Scenario* s) {
  for (ScheduleKind kind : AllScheduleKinds()) {
    const std::string name(ScheduleKindName(kind));
    for (int vpp : {1, 2}) {
      if (!SupportsVpp(kind, vpp) || (vpp == 1 && kind == ScheduleKind::kInterleaved)) continue;
      benchmark::RegisterBenchmark(fmt::format("BM_Generate/{}/vpp{}", name, vpp).c_str(),
                                   BM_Generate, s, kind, vpp)
          ->Unit(benchmark::kMicrosecond);
    }
  }
  for (ScheduleKind kind : {ScheduleKind::k1F1B, ScheduleKind::kAdaptive, ScheduleKind::kZbH1}) {
    const std::string name(ScheduleKindName(kind));
    benchmark::RegisterBenchmark(("BM_Estimate/" + name).c_str(), BM_Estimate, s, kind)
        ->Unit(benchmark::kMicrosecond);
    for (int64_t shuffles : {0, 1, 3}) {
      benchmark::RegisterBenchmark(
          fmt::format("BM_OrderSearch/{}/shuffles{}", name, shuffles).c_str(), BM_OrderSearch, s,
          kind, shuffles)
          ->Unit(benchmark::kMicrosecond);
    }
    benchmark::RegisterBenchmark(("BM_PlanBatch/" + name).c_str(), BM_PlanBatch, s, kind)
        ->Unit(benchmark::kMicrosecond);
  }
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  const std::unique_ptr<sluice::Scenario> scenario = sluice::MakeScenario();
  sluice::Register(scenario.get());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
