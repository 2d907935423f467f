// Planning latency of the batching methods per global batch (docs/batching-dynapipe.md).
//
// Global batches are cut from data/lengths/*.jsonl in file order (token budget, lengths clipped
// to the max sequence length; mixture-4task: ~137 samples per 65,536 tokens, gcide-define: ~530),
// or drawn from the DynaPipe reference's synthetic lognormal lengths (input median 180, target
// median 12: ~200 samples per 65,536 tokens), and planned on a100-40g with the
// profiled A100 tables, ZeRO-1, a 36,000 MB limit, dp = 2 and pp = 8:
//   BM_DynaPipe/<model>/<tokens>/<max len>/<data>   order + candidates + DP + KK over dp
//   BM_DynaPipePhase/...                             one phase alone (order, candidates, solve)
//   BM_Method/<method>/...                           the other methods (assigner + batcher)
// Each iteration plans the next batch of a fixed set, so the time is the mean over batches;
// counters give the per-batch median (p50_ms), samples, micro-batches, candidate runs, t_max
// values and DP runs. Run: build-batch-rel/bench/batching_bench --benchmark_filter=DynaPipe
#include <benchmark/benchmark.h>

#include "bench/bench_util.h"
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "base/paths.h"
#include "base/rng.h"
#include "batching/assigners.h"
#include "batching/baselines.h"
#include "batching/dynapipe_batcher.h"
#include "batching/hydraulis.h"
#include "batching/karmarkar_karp.h"
#include "batching/method.h"
#include "batching/ordering.h"
#include "batching/stage_cost.h"
#include "cost/cost_factory.h"
#include "data/reader.h"
#include "model/cluster_spec.h"
#include "model/model_spec.h"

namespace sluice {
namespace {

using bench::LengthsPath;
using bench::Median;
using bench::Must;

constexpr int kBatches = 8;

// Everything one configuration needs, built once per benchmark run.
struct Scenario {
  ModelSpec model;
  ClusterSpec cluster;
  ParallelConfig parallel;
  std::unique_ptr<CostModel> cost;
  std::unique_ptr<StageCostEvaluator> eval;
  std::vector<std::vector<Sample>> batches;
  std::string label;  // which cost model answered ("profiled" or "analytic")
};

Sample Clip(Sample s, int64_t max_len, bool encdec) {
  s.input_len = std::clamp<int64_t>(s.input_len, 1, max_len);
  s.target_len = encdec ? std::clamp<int64_t>(s.target_len, 1, max_len)
                        : std::min(s.target_len, max_len - s.input_len);
  return s;
}

// `kBatches` global batches of `tokens` (clipped) tokens each.
std::vector<std::vector<Sample>> CutBatches(const std::string& data, int64_t tokens,
                                            int64_t max_len, bool encdec) {
  std::vector<Sample> stream;
  if (data == "lognormal") {
    Rng rng(1);
    for (int64_t i = 0; i < 40 * tokens / 100; ++i) {
      Sample s{.id = i};
      s.input_len = std::llround(rng.LogNormal(std::log(180.0), 1.0));
      s.target_len = std::llround(rng.LogNormal(std::log(12.0), 1.1));
      stream.push_back(s);
    }
  } else {
    stream = Must(ReadLengthsFile(LengthsPath(data))).samples();
  }
  std::vector<std::vector<Sample>> out;
  std::vector<Sample> cur;
  int64_t have = 0;
  for (size_t i = 0; out.size() < kBatches; i = (i + 1) % stream.size()) {
    Sample s = Clip(stream[i], max_len, encdec);
    s.id = static_cast<int64_t>(cur.size());
    have += s.tokens();
    cur.push_back(s);
    if (have >= tokens) {
      out.push_back(std::move(cur));
      cur.clear();
      have = 0;
    }
  }
  return out;
}

std::unique_ptr<Scenario> MakeScenario(const std::string& model, int64_t tokens, int64_t max_len,
                                       const std::string& data) {
  auto s = std::make_unique<Scenario>();
  s->model = Must(ModelPreset(model));
  s->cluster = Must(ClusterPreset("a100-40g", 16));
  s->parallel.dp = 2;
  s->parallel.pp = 8;
  s->parallel.zero = 1;
  s->parallel.memory_limit = Bytes::MB(36000);
  s->cost = Must(MakeCostModel(s->model, s->cluster, CostModelOptions{}));
  s->eval = std::make_unique<StageCostEvaluator>(
      Must(StageCostEvaluator::Create(*s->cost, s->parallel, s->cluster)));
  s->batches = CutBatches(data, tokens, max_len, s->model.is_encoder_decoder());
  const std::string describe = s->cost->Describe();
  s->label = describe.substr(0, describe.find(':'));
  return s;
}

struct Args {
  const char* model;
  int64_t tokens;
  int64_t max_len;
  const char* data;  // a file of data/lengths/ without .jsonl, or "lognormal"
};
constexpr Args kArgs[] = {
    {"gpt-6.7b", 65536, 2048, "mixture-4task"},
    {"gpt-6.7b", 65536, 2048, "lognormal"},
    {"gpt-6.7b", 65536, 2048, "gcide-define"},
    {"gpt-6.7b", 1 << 20, 8192, "mixture-4task"},
    {"t5-11b", 65536, 2048, "mixture-4task"},
    {"t5-11b", 65536, 2048, "lognormal"},
    {"t5-11b", 65536, 2048, "gcide-define"},
    // The T5 table stops at 4096 (tp = 1), and a 2400 + 4096 sample does not fit pp = 8.
    {"t5-11b", 1 << 20, 2048, "mixture-4task"},
};

std::string Label(const Args& a) {
  return fmt::format("{}/{}/{}/{}", a.model, a.tokens, a.max_len, a.data);
}

void BM_DynaPipe(benchmark::State& state, Args args, Duration thinning) {
  const auto s = MakeScenario(args.model, args.tokens, args.max_len, args.data);
  const auto batcher = MakeDynaPipeBatcher();
  BatchingOptions options;
  options.tmax_thinning = thinning;
  std::vector<double> ms;
  double samples = 0, micro = 0, predicted = 0;
  size_t k = 0;
  for (auto _ : state) {
    const std::vector<Sample>& batch = s->batches[k++ % s->batches.size()];
    const auto t0 = std::chrono::steady_clock::now();
    ReplicaBatches global = Must(batcher->Build(batch, *s->eval, options, s->parallel.dp));
    BatchPlan plan = Must(DistributeMicroBatches(std::move(global), batch, *s->eval, options));
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    if (plan.outcome != PlanOutcome::kOk) {
      state.SkipWithError(plan.infeasible_reason.c_str());
      return;
    }
    samples += static_cast<double>(batch.size());
    Duration slowest;
    for (const auto& r : plan.replicas) {
      micro += static_cast<double>(r.size());
      slowest = std::max(slowest, PredictReplicaTime(r, s->parallel.pp));
    }
    predicted += slowest.millis();
  }
  const double n = static_cast<double>(ms.size());
  state.SetLabel(s->label);
  state.counters["p50_ms"] = Median(ms);
  state.counters["samples"] = samples / n;
  state.counters["micro_batches"] = micro / n;
  state.counters["predicted_iter_ms"] = predicted / n;
}

// One phase alone, for the breakdown; counters describe the DP's search.
void BM_DynaPipePhase(benchmark::State& state, Args args, int phase) {
  const auto s = MakeScenario(args.model, args.tokens, args.max_len, args.data);
  std::vector<std::vector<Sample>> ordered(s->batches.size());
  std::vector<SplitCandidates> cands(s->batches.size());
  for (size_t b = 0; b < s->batches.size(); ++b) {
    for (int64_t i : OrderSamples(s->batches[b], *s->eval, SampleOrder::kAuto)) {
      ordered[b].push_back(s->batches[b][i]);
    }
    cands[b] = BuildSplitCandidates(ordered[b], *s->eval, std::nullopt);
  }
  const SplitObjective objective{s->parallel.pp, s->parallel.vpp, s->parallel.dp};
  double candidates = 0, values = 0, runs = 0;
  size_t k = 0;
  for (auto _ : state) {
    const size_t b = k++ % s->batches.size();
    if (phase == 0) {
      benchmark::DoNotOptimize(OrderSamples(s->batches[b], *s->eval, SampleOrder::kAuto));
    } else if (phase == 1) {
      benchmark::DoNotOptimize(BuildSplitCandidates(ordered[b], *s->eval, std::nullopt));
    } else {
      const SplitSolution sol = SolveConsecutiveSplit(cands[b], objective);
      values += static_cast<double>(sol.tmax_values);
      runs += static_cast<double>(sol.dp_runs);
    }
    candidates += static_cast<double>(cands[b].num_candidates());
  }
  const double n = static_cast<double>(k);
  state.counters["candidates"] = candidates / n;
  if (phase == 2) {
    state.counters["tmax_values"] = values / n;
    state.counters["dp_runs"] = runs / n;
  }
}

// Every method through RunMethod (method.h), on the same batches: planning latency per global
// batch and the predicted iteration time of the plan (slowest replica, 1F1B estimate).
const char* const kMethods[] = {"padding",   "sorted",   "token-budget", "packing",
                                "multipack", "dynapipe", "hydraulis",    "hydraulis+dynapipe"};

void BM_Method(benchmark::State& state, std::string method, Args args) {
  const auto s = MakeScenario(args.model, args.tokens, args.max_len, args.data);
  const BatchingOptions options;
  std::vector<double> ms;
  double oom = 0, predicted_ms = 0;
  size_t k = 0;
  for (auto _ : state) {
    const std::vector<Sample>& batch = s->batches[k++ % s->batches.size()];
    const auto t0 = std::chrono::steady_clock::now();
    StatusOr<BatchPlan> plan = RunMethod(method, batch, *s->eval, options);
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    if (!plan.ok()) {
      state.SkipWithError(plan.status().ToString().c_str());
      return;
    }
    if (plan->outcome != PlanOutcome::kOk) {
      oom += 1;
      continue;
    }
    Duration worst;
    for (const auto& mbs : plan->replicas) {
      worst = std::max(worst, PredictReplicaTime(mbs, s->eval->pp()));
    }
    predicted_ms += worst.millis();
  }
  const double n = static_cast<double>(ms.size());
  state.counters["p50_ms"] = Median(ms);
  state.counters["oom_share"] = oom / n;
  state.counters["predicted_iter_ms"] = n > oom ? predicted_ms / (n - oom) : 0.0;
}

void Register() {
  for (const Args& a : kArgs) {
    benchmark::RegisterBenchmark(("BM_DynaPipe/" + Label(a)).c_str(), BM_DynaPipe, a,
                                 Duration::Zero())
        ->Unit(benchmark::kMillisecond);
    if (a.tokens == 65536 && std::string(a.data) == "mixture-4task") {
      benchmark::RegisterBenchmark(("BM_DynaPipeThinned5ms/" + Label(a)).c_str(), BM_DynaPipe, a,
                                   Duration::Millis(5))
          ->Unit(benchmark::kMillisecond);
    }
    const char* phases[] = {"order", "candidates", "solve"};
    for (int p = 0; p < 3; ++p) {
      benchmark::RegisterBenchmark(
          ("BM_DynaPipePhase/" + std::string(phases[p]) + "/" + Label(a)).c_str(), BM_DynaPipePhase,
          a, p)
          ->Unit(benchmark::kMillisecond);
    }
  }
  for (const char* m : kMethods) {
    for (const Args& a : kArgs) {
      if (std::string(a.data) != "mixture-4task") continue;
      if (std::string(m) == "hydraulis" && std::string(a.model) == "t5-11b") {
        continue;  // varlen packing is decoder-only
      }
      benchmark::RegisterBenchmark(("BM_Method/" + std::string(m) + "/" + Label(a)).c_str(),
                                   BM_Method, std::string(m), a)
          ->Unit(benchmark::kMillisecond);
    }
  }
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  return sluice::bench::RunRegisteredBenchmarks(argc, argv, sluice::Register);
}
