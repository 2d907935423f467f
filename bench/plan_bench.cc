// Speed of plan generation, validation and serialisation per global batch (docs/formats.md,
// "Execution plan": measured figures).
//
// Global batches of 65,536 tokens are cut from data/lengths/mixture-4task.jsonl in file order
// (lengths clipped to 2048) and split by `--method dynapipe` for gpt-6.7b on a100-40g with the
// profiled A100 tables, ZeRO-1, a 36,000 MB limit and pp = 8, with dp = 2 (16 devices) or dp = 1
// (8 devices). The micro-batching itself is batching_bench's subject and runs outside the timing.
//   BM_PlanIteration/<kind>/vpp<v>/dp<d>   per global batch, one core: for each replica
//       BuildScheduleCosts + SearchMicroBatchOrder (default options) + reorder, then LowerPlan
//       and ValidatePlan of the whole plan. Counters: p50_ms (the goal: <= 5 ms), and the
//       medians of the phases search_ms, lower_ms, validate_ms; instructions per plan.
//   BM_PlanJson/dp<d> / BM_PlanMsgpack/dp<d>   write + read of the adaptive plan of each batch:
//       p50 write_ms, read_ms, and size_kb.
// Each iteration takes the next batch of a fixed set of 8. Run:
//   build-plan/bench/plan_bench --benchmark_min_time=0.5
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
#include "plan/lower.h"
#include "plan/plan_json.h"
#include "plan/validate.h"
#include "schedule/generators.h"
#include "schedule/order_search.h"
#include "schedule/schedule_costs.h"

namespace sluice {
namespace {

using bench::Median;
using bench::MillisSince;
using bench::Must;

constexpr int kBatches = 8;
constexpr int64_t kTokens = 65536;
constexpr int64_t kMaxLen = 2048;

std::vector<std::vector<Sample>> CutBatches() {
  return bench::CutMixtureBatches(kBatches, kTokens, kMaxLen);
}

// One configuration: its evaluator and the dynapipe BatchPlans of the batches.
struct Scenario {
  ClusterSpec cluster;
  ParallelConfig parallel;
  std::unique_ptr<CostModel> cost;
  std::unique_ptr<StageCostEvaluator> eval;
  std::vector<std::vector<Sample>> batches;
  std::vector<BatchPlan> plans;
};

std::unique_ptr<Scenario> MakeScenario(int64_t dp, int64_t vpp) {
  auto s = std::make_unique<Scenario>();
  const ModelSpec model = Must(ModelPreset("gpt-6.7b"));
  s->cluster = Must(ClusterPreset("a100-40g", 8 * dp));
  s->parallel.dp = dp;
  s->parallel.pp = 8;
  s->parallel.vpp = vpp;
  s->parallel.zero = 1;
  s->parallel.memory_limit = Bytes::MB(36000);
  s->cost = Must(MakeCostModel(model, s->cluster, CostModelOptions{}));
  s->eval = std::make_unique<StageCostEvaluator>(
      Must(StageCostEvaluator::Create(*s->cost, s->parallel, s->cluster)));
  s->batches = CutBatches();
  for (const std::vector<Sample>& batch : s->batches) {
    BatchPlan plan = Must(RunMethod("dynapipe", batch, *s->eval, BatchingOptions{}));
    if (plan.outcome != PlanOutcome::kOk) {
      std::fprintf(stderr, "plan_bench: dynapipe: %s\n", plan.infeasible_reason.c_str());
      std::abort();
    }
    s->plans.push_back(std::move(plan));
  }
  return s;
}

// The order search of every replica, its winning schedule, and the batch plan reordered to it.
struct Searched {
  BatchPlan plan;
  std::vector<Schedule> schedules;
};

Searched Search(const Scenario& s, const BatchPlan& plan, ScheduleKind kind) {
  Searched out;
  out.plan = plan;
  for (size_t r = 0; r < plan.replicas.size(); ++r) {
    const ScheduleCostOptions options{.replica = static_cast<int64_t>(r)};
    const ScheduleCosts costs =
        Must(BuildScheduleCosts(plan.replicas[r], *s.eval, s.cluster, options));
    OrderSearchResult best = Must(SearchMicroBatchOrder(kind, costs));
    for (size_t i = 0; i < best.order.size(); ++i) {
      out.plan.replicas[r][i] = plan.replicas[r][best.order[i]];
    }
    out.schedules.push_back(std::move(best.result.schedule));
  }
  return out;
}

void BM_PlanIteration(benchmark::State& state, const Scenario* s, ScheduleKind kind) {
  std::vector<double> total, search, lower, validate;
  double instructions = 0, micro_batches = 0;
  size_t k = 0;
  for (auto _ : state) {
    const size_t b = k++ % s->plans.size();
    const auto t0 = std::chrono::steady_clock::now();
    const Searched searched = Search(*s, s->plans[b], kind);
    const double t_search = MillisSince(t0);
    const auto t1 = std::chrono::steady_clock::now();
    StatusOr<ExecutionPlan> plan =
        LowerPlan(searched.plan, s->batches[b], searched.schedules, *s->eval, s->cluster);
    const double t_lower = MillisSince(t1);
    if (!plan.ok()) {
      state.SkipWithError(plan.status().message().c_str());
      return;
    }
    const auto t2 = std::chrono::steady_clock::now();
    const Status valid = ValidatePlan(*plan);
    const double t_validate = MillisSince(t2);
    total.push_back(MillisSince(t0));
    if (!valid.ok()) {
      state.SkipWithError(valid.message().c_str());
      return;
    }
    search.push_back(t_search);
    lower.push_back(t_lower);
    validate.push_back(t_validate);
    for (const RankProgram& p : plan->ranks)
      instructions += static_cast<double>(p.instructions.size());
    for (const auto& r : plan->replicas)
      micro_batches += static_cast<double>(r.micro_batches.size());
  }
  const double n = static_cast<double>(total.size());
  state.counters["p50_ms"] = Median(total);
  state.counters["search_ms"] = Median(search);
  state.counters["lower_ms"] = Median(lower);
  state.counters["validate_ms"] = Median(validate);
  state.counters["instructions"] = instructions / n;
  state.counters["micro_batches"] = micro_batches / n;
}

void BM_PlanFile(benchmark::State& state, const Scenario* s, bool binary) {
  std::vector<ExecutionPlan> plans;
  for (size_t b = 0; b < s->plans.size(); ++b) {
    const Searched searched = Search(*s, s->plans[b], ScheduleKind::kAdaptive);
    plans.push_back(
        Must(LowerPlan(searched.plan, s->batches[b], searched.schedules, *s->eval, s->cluster)));
  }
  std::vector<double> write, read;
  double bytes = 0;
  size_t k = 0;
  for (auto _ : state) {
    const ExecutionPlan& plan = plans[k++ % plans.size()];
    const auto t0 = std::chrono::steady_clock::now();
    bool same = false;
    if (binary) {
      const std::vector<uint8_t> data = PlanToMsgpack(plan);
      write.push_back(MillisSince(t0));
      const auto t1 = std::chrono::steady_clock::now();
      StatusOr<ExecutionPlan> back = PlanFromMsgpack(data, "bench");
      read.push_back(MillisSince(t1));
      same = back.ok() && *back == plan;
      bytes += static_cast<double>(data.size());
    } else {
      const std::string data = PlanToJsonText(plan);
      write.push_back(MillisSince(t0));
      const auto t1 = std::chrono::steady_clock::now();
      StatusOr<ExecutionPlan> back = PlanFromJsonText(data, "bench");
      read.push_back(MillisSince(t1));
      same = back.ok() && *back == plan;
      bytes += static_cast<double>(data.size());
    }
    if (!same) {
      state.SkipWithError("the plan did not round-trip");
      return;
    }
  }
  state.counters["write_ms"] = Median(write);
  state.counters["read_ms"] = Median(read);
  state.counters["size_kb"] = bytes / static_cast<double>(write.size()) / 1e3;
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  using sluice::ScheduleKind;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  std::vector<std::unique_ptr<sluice::Scenario>> scenarios;
  for (int64_t dp : {2, 1}) {
    for (int64_t vpp : {1, 2}) {
      scenarios.push_back(sluice::MakeScenario(dp, vpp));
      const sluice::Scenario* s = scenarios.back().get();
      for (ScheduleKind kind : sluice::AllScheduleKinds()) {
        if (!sluice::SupportsVpp(kind, vpp) || (vpp == 1 && kind == ScheduleKind::kInterleaved) ||
            kind == ScheduleKind::kGPipe) {
          continue;
        }
        benchmark::RegisterBenchmark(
            fmt::format("BM_PlanIteration/{}/vpp{}/dp{}", sluice::ScheduleKindName(kind), vpp, dp)
                .c_str(),
            sluice::BM_PlanIteration, s, kind)
            ->Unit(benchmark::kMillisecond);
      }
      if (vpp == 1) {
        benchmark::RegisterBenchmark(fmt::format("BM_PlanJson/dp{}", dp).c_str(),
                                     sluice::BM_PlanFile, s, false)
            ->Unit(benchmark::kMillisecond);
        benchmark::RegisterBenchmark(fmt::format("BM_PlanMsgpack/dp{}", dp).c_str(),
                                     sluice::BM_PlanFile, s, true)
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
