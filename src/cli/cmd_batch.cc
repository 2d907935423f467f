// `sluice batch`: runs one batching method over the global batches of a dataset and prints the
// micro-batches of the first batches and a summary over all of them.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>

#include "base/progress.h"
#include "batching/method.h"
#include "batching/micro_batch.h"
#include "batching/stage_cost.h"
#include "cli/cli_common.h"
#include "cli/scenario_flags.h"
#include "data/data_source.h"
#include "data/global_batcher.h"

namespace sluice::cli {
namespace {

struct BatchFlags {
  ScenarioFlags scenario;
  std::string method = "dynapipe";
  std::string recompute;  // "" = chosen by the method
  int64_t mbs = 0;
  int64_t tokens_per_micro_batch = 0;
  int64_t show = 1;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string ShapeText(const MicroBatch& mb, bool enc_dec) {
  std::string s = fmt::format("{}x{}", mb.shape.mbs, mb.shape.seqlen);
  if (enc_dec) s += fmt::format("x{}", mb.shape.dec_seqlen);
  if (mb.varlen) s += " varlen";
  return s;
}

void PrintPlan(const BatchPlan& plan, const GlobalBatch& batch, const StageCostEvaluator& eval) {
  const bool enc_dec = eval.model().is_encoder_decoder();
  fmt::print("batch {}: {} samples, {} tokens\n", batch.index, batch.samples.size(), batch.tokens);
  if (plan.outcome != PlanOutcome::kOk) {
    fmt::print("  {}: {}\n\n", PlanOutcomeName(plan.outcome), plan.infeasible_reason);
    return;
  }
  for (size_t r = 0; r < plan.replicas.size(); ++r) {
    const auto& mbs = plan.replicas[r];
    fmt::print("  replica {}: {} micro-batches, predicted {:.1f} ms (1F1B, pp {})\n", r, mbs.size(),
               PredictReplicaTime(mbs, eval.pp()).millis(), eval.pp());
    fmt::print("    {:>4} {:<18} {:>7} {:>8} {:<10} {:>10} {:>11} {:>10}\n", "mb", "shape",
               "samples", "padding", "recompute", "stage ms", "stored MB", "peak MB");
    for (size_t i = 0; i < mbs.size(); ++i) {
      const MicroBatch& mb = mbs[i];
      Bytes stored, peak;
      for (const ChunkCost& c : mb.stages) {
        stored = std::max(stored, c.stored);
        peak = std::max(peak, c.peak);
      }
      fmt::print("    {:>4} {:<18} {:>7} {:>7.1f}% {:<10} {:>10.2f} {:>11.0f} {:>10.0f}\n", i,
                 ShapeText(mb, enc_dec), mb.num_samples(), 100.0 * mb.PaddingFraction(),
                 RecomputeName(mb.recompute), mb.Bottleneck().millis(), stored.mb(), peak.mb());
    }
  }
  fmt::print("\n");
}

struct Summary {
  int64_t batches = 0, oom = 0, samples = 0;
  int64_t real_tokens = 0, padded_tokens = 0;
  double replica_time_ms = 0;      // sum over batches of the slowest replica
  double replica_imbalance = 0;    // sum over batches of max/mean - 1
  double mb_imbalance = 0;         // sum over replicas of max/mean bottleneck - 1
  int64_t replica_count = 0;
  int64_t micro_batches = 0;
  std::vector<double> plan_ms;
};

void Accumulate(const BatchPlan& plan, const StageCostEvaluator& eval, Summary* s) {
  ++s->batches;
  if (plan.outcome != PlanOutcome::kOk) {
    ++s->oom;
    return;
  }
  std::vector<double> times;
  for (const auto& mbs : plan.replicas) {
    times.push_back(PredictReplicaTime(mbs, eval.pp()).millis());
    double sum = 0, mx = 0;
    for (const MicroBatch& mb : mbs) {
      s->real_tokens += mb.real_tokens;
      s->padded_tokens += mb.padded_tokens;
      s->samples += mb.num_samples();
      const double t = mb.Bottleneck().millis();
      sum += t;
      mx = std::max(mx, t);
    }
    s->micro_batches += static_cast<int64_t>(mbs.size());
    if (!mbs.empty() && sum > 0) {
      s->mb_imbalance += mx / (sum / static_cast<double>(mbs.size())) - 1.0;
      ++s->replica_count;
    }
  }
  const double mx = *std::max_element(times.begin(), times.end());
  const double mean = std::accumulate(times.begin(), times.end(), 0.0) / times.size();
  s->replica_time_ms += mx;
  if (mean > 0) s->replica_imbalance += mx / mean - 1.0;
}

Status RunBatch(const BatchFlags& f) {
  SLUICE_ASSIGN_OR_RETURN(Scenario sc, ResolveScenarioFlags(f.scenario));
  SLUICE_ASSIGN_OR_RETURN(const StageCostEvaluator eval, MakeEvaluator(sc));
  BatchingOptions options;
  options.seed = f.scenario.seed;
  options.max_seqlen = sc.max_seqlen;
  options.micro_batch_size = f.mbs;
  options.tokens_per_micro_batch = f.tokens_per_micro_batch;
  if (!f.recompute.empty()) {
    SLUICE_ASSIGN_OR_RETURN(Recompute rc, ParseRecompute(f.recompute));
    options.recompute = rc;
  }
  fmt::print("{}\n", sc.Describe());
  fmt::print("method:   {}\n\n", f.method);

  Summary summary;
  GlobalBatch batch;
  Progress progress("planning", sc.iterations > 0 ? sc.iterations : 0, stderr,
                    /*min_total=*/8);
  int64_t shown = 0;
  const ParallelConfig& par = *sc.parallel;
  SmallInputCheck small(sc.iterations, par.dp * par.pp,
                        fmt::format("dp x pp = {}", par.dp * par.pp), 0, "");
  while ((sc.iterations == 0 || summary.batches < sc.iterations) && sc.batcher->Next(&batch)) {
    small.Add(batch);
    const auto t0 = std::chrono::steady_clock::now();
    SLUICE_ASSIGN_OR_RETURN(BatchPlan plan, RunMethod(f.method, batch.samples, eval, options));
    summary.plan_ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    if (shown < f.show) {
      progress.Clear();
      PrintPlan(plan, batch, eval);
      ++shown;
    }
    Accumulate(plan, eval, &summary);
    progress.Add();
  }
  progress.Finish();
  if (summary.batches == 0) return sc.NoBatchError(FlagFieldNamer());
  std::fflush(stdout);
  for (const std::string& w : small.Warnings()) fmt::print(stderr, "warning: {}\n", w);

  const BatcherReport& report = sc.batcher->report();
  const int64_t ok = summary.batches - summary.oom;
  fmt::print("summary over {} global batches ({} samples, {} out of memory):\n", summary.batches,
             summary.samples, summary.oom);
  if (ok > 0) {
    const double pad = summary.padded_tokens > 0
                           ? 100.0 * (summary.padded_tokens - summary.real_tokens) /
                                 static_cast<double>(summary.padded_tokens)
                           : 0.0;
    fmt::print("  padding                       {:.1f}% of allocated tokens\n", pad);
    fmt::print("  predicted iteration time      {:.1f} ms (slowest replica, mean over batches)\n",
               summary.replica_time_ms / ok);
    fmt::print("  predicted throughput          {:.0f} real tokens/s\n",
               summary.replica_time_ms > 0
                   ? static_cast<double>(summary.real_tokens) / (summary.replica_time_ms / 1e3)
                   : 0.0);
    fmt::print("  imbalance across replicas     {:.1f}% (slowest / mean - 1)\n",
               100.0 * summary.replica_imbalance / ok);
    fmt::print("  imbalance across micro-batches {:.1f}% (per replica: longest / mean - 1)\n",
               summary.replica_count > 0 ? 100.0 * summary.mb_imbalance / summary.replica_count
                                         : 0.0);
    fmt::print("  micro-batches per replica     {:.1f}\n",
               static_cast<double>(summary.micro_batches) /
                   static_cast<double>(std::max<int64_t>(1, summary.replica_count)));
  }
  fmt::print("  planning time                 {:.2f} ms per batch (median)\n",
             Median(summary.plan_ms));
  const std::string data_report = report.Summary();
  if (!data_report.empty()) fmt::print("{}", data_report);
  if (ok == 0 && summary.batches > 0) {
    return FailedPreconditionError(fmt::format(
        "method '{}' found no plan that fits memory for any batch; try more pipeline stages, "
        "tensor parallelism, ZeRO, a recompute level, or a shorter --max-seqlen",
        f.method));
  }
  return Status::Ok();
}

}  // namespace

void RegisterBatchCommands(CLI::App* app, RunState* state) {
  auto flags = std::make_shared<BatchFlags>();
  CLI::App* b = app->add_subcommand(
      "batch", "Split global batches into per-replica micro-batches with one method and report");
  AddScenarioFlags(b, &flags->scenario);
  b->add_option("--method", flags->method,
                "padding, sorted, token-budget, packing, multipack, dynapipe, hydraulis, or "
                "ASSIGNER+BATCHER (docs/batching.md)")
      ->capture_default_str();
  b->add_option("--recompute", flags->recompute,
                "none, selective or full for every micro-batch (default: the method chooses)");
  b->add_option("--mbs", flags->mbs,
                "Fixed micro-batch size of the fixed-size baselines (0 = best per batch)")
      ->check(IntegerCheck(0, kNoMaxInteger))
      ->capture_default_str();
  b->add_option("--tokens-per-micro-batch", flags->tokens_per_micro_batch,
                "token-budget: padded tokens per micro-batch (0 = best per batch)")
      ->check(IntegerCheck(0, kNoMaxInteger))
      ->capture_default_str();
  b->add_option("--show", flags->show, "Print the micro-batches of this many first batches")
      ->check(IntegerCheck(0, kNoMaxInteger))
      ->capture_default_str();
  SetHandler(b, state, [flags] { return RunBatch(*flags); });
}

}  // namespace sluice::cli
