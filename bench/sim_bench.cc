// Simulator speed (issue #5's goals: >= 10 M simulated instructions per second on one core, and a
// 1,024-rank, 64-micro-batch plan simulated in under a second).
//
// BM_SimulateBatch/<collectives>/<recording>: one planned 65,536-token global batch of
// mixture-4task (clipped to 2048), gpt-6.7b on a100-40g:16 with the shipped A100 tables, dp 2 x
// pp 8, ZeRO-1, 1f1b, dynapipe micro-batches. Counters: instr_per_s (simulated instructions per
// CPU second of Simulate), sim_ms / sim_cpu_ms (median wall / thread CPU time of one Simulate),
// events, iteration_ms (simulated).
//
// BM_Simulate1024Ranks/<collectives>/<recording>: gpt-13b on h100-80g:1024 (analytic cost model),
// dp 128 x pp 8, ZeRO-1, 1f1b, packing rows of 2048 tokens, one row per micro-batch, a global
// batch of about 128 x 64 rows (64 micro-batches per replica). Same counters, plus
// instructions and micro_batches.
//
// "full" records the timeline (critical path, traces) and the memory timeline, as `sluice
// simulate` does; "lean" records neither (what a search that only wants the figures would use).
#include <benchmark/benchmark.h>

#include <chrono>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "batching/stage_cost.h"
#include "bench/bench_util.h"
#include "cost/cost_factory.h"
#include "data/data_source.h"
#include "data/global_batcher.h"
#include "model/cluster_spec.h"
#include "model/model_spec.h"
#include "planner/planner.h"
#include "sim/simulator.h"

namespace sluice {
namespace {

using bench::Must;

struct Planned {
  std::unique_ptr<CostModel> cost;
  ClusterSpec cluster;
  ExecutionPlan plan;
  int64_t instructions = 0;
  int64_t micro_batches = 0;
};

std::unique_ptr<Planned> Plan(const std::string& model_name, const ClusterSpec& cluster,
                              const ParallelConfig& parallel, const PlannerOptions& options,
                              const std::vector<Sample>& batch) {
  auto p = std::make_unique<Planned>();
  p->cluster = cluster;
  const ModelSpec model = Must(ModelPreset(model_name));
  p->cost = Must(MakeCostModel(model, cluster, CostModelOptions{}));
  const Planner planner = Must(Planner::Create(*p->cost, parallel, p->cluster, options));
  PlanResult r = Must(planner.Plan(batch));
  if (r.outcome != PlanOutcome::kOk) {
    std::fprintf(stderr, "benchmark set-up: plan is %s: %s\n",
                 std::string(PlanOutcomeName(r.outcome)).c_str(), r.infeasible_reason.c_str());
    std::abort();
  }
  p->plan = std::move(r.plan);
  for (const RankProgram& rp : p->plan.ranks) p->instructions += rp.instructions.size();
  for (const PlanReplica& rep : p->plan.replicas) p->micro_batches += rep.micro_batches.size();
  return p;
}

SimOptions Options(CollectiveMode mode, bool full) {
  SimOptions o;
  o.collectives = mode;
  o.record_timeline = full;
  o.record_memory = full;
  return o;
}

// CPU time of this thread, ms: the development VM's two cores are shared, so wall time is noisy.
double ThreadCpuMillis() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

void Run(benchmark::State& state, const Planned& p, const SimOptions& options) {
  std::vector<double> ms, cpu_ms;
  SimResult last;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = ThreadCpuMillis();
    StatusOr<SimResult> r = Simulate(p.plan, options);
    cpu_ms.push_back(ThreadCpuMillis() - c0);
    ms.push_back(bench::MillisSince(t0));
    if (!r.ok() || r->outcome != SimOutcome::kOk) {
      state.SkipWithError(r.ok() ? r->problem.c_str() : r.status().ToString().c_str());
      return;
    }
    last = std::move(r).value();
    benchmark::DoNotOptimize(last.iteration_time);
  }
  const double cpu = bench::Median(cpu_ms);
  state.counters["sim_ms"] = bench::Median(ms);
  state.counters["sim_cpu_ms"] = cpu;
  state.counters["instructions"] = static_cast<double>(p.instructions);
  state.counters["instr_per_s"] = static_cast<double>(p.instructions) / (cpu / 1e3);
  state.counters["events"] = static_cast<double>(last.events);
  state.counters["micro_batches"] = static_cast<double>(p.micro_batches);
  state.counters["iteration_ms"] = last.iteration_time.millis();
}

void BM_SimulateBatch(benchmark::State& state, CollectiveMode mode, bool full) {
  ParallelConfig par;
  par.dp = 2;
  par.pp = 8;
  par.zero = 1;
  par.memory_limit = Bytes::MB(36000);
  const Dataset data = Must(LoadData("mixture-4task"));
  BatcherOptions b;
  b.tokens_per_batch = 65536;
  b.max_seqlen = 2048;
  b.limit = SeqlenLimit::kTotal;
  GlobalBatcher batcher = Must(GlobalBatcher::Create(data, b));
  GlobalBatch batch;
  batcher.Next(&batch);
  PlannerOptions options;
  options.batching.max_seqlen = 2048;
  const auto p = Plan("gpt-6.7b", Must(ClusterPreset("a100-40g", 16)), par, options, batch.samples);
  Run(state, *p, Options(mode, full));
}

void BM_Simulate1024Ranks(benchmark::State& state, CollectiveMode mode, bool full) {
  ParallelConfig par;
  par.dp = 128;
  par.pp = 8;
  par.zero = 1;
  // 128 replicas x about 64 rows of 2048 tokens (packing fills them to ~77%), from the shipped
  // lengths (wrapping around).
  const std::vector<Sample> batch = bench::CutMixtureBatches(1, 128 * 64 * 1570, 2048).front();
  PlannerOptions options;
  options.method = "packing";
  options.batching.max_seqlen = 2048;
  options.batching.micro_batch_size = 1;
  options.batching.recompute = Recompute::kNone;
  options.search_order = false;
  const auto p = Plan("gpt-13b", Must(ClusterPreset("h100-80g", 1024)), par, options, batch);
  Run(state, *p, Options(mode, full));
}

void Register() {
  for (CollectiveMode mode : {CollectiveMode::kStepwise, CollectiveMode::kClosedForm}) {
    const std::string m = mode == CollectiveMode::kStepwise ? "stepwise" : "closed-form";
    for (bool full : {true, false}) {
      const std::string r = full ? "full" : "lean";
      benchmark::RegisterBenchmark(("BM_SimulateBatch/" + m + "/" + r).c_str(), BM_SimulateBatch,
                                   mode, full)
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("BM_Simulate1024Ranks/" + m + "/" + r).c_str(),
                                   BM_Simulate1024Ranks, mode, full)
          ->Unit(benchmark::kMillisecond)
          ->Iterations(3);
    }
  }
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  return sluice::bench::RunRegisteredBenchmarks(argc, argv, sluice::Register);
}
