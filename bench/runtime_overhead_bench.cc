// runtime_overhead_bench: what the executor costs on top of plain libtorch, at pp = 1 (issue #7:
// "an iteration at pp = 1 takes within 5% of a plain libtorch training step on the same
// micro-batches"). Built only with libtorch.
//
// The planner makes pp = 1 plans for a few global batches (no recomputation). Two copies of the
// model (same seed) then train on them, alternating batch by batch so that machine noise hits
// both alike:
//   executor  runtime::Executor::Run on the plan (a one-rank job: its own TCPStore on --port,
//             Gloo group, watchdog thread, trace recording, as `sluice train` runs a rank);
//   plain     a hand-written loop over the same micro-batches: LayoutMicroBatch +
//             BuildMicroBatchInputs, Chunk::Forward, loss.backward(), then AdamW.step() and the
//             gradients dropped (what the executor does after its step).
// Both include building the inputs from the token source. Prints the per-iteration medians, the
// ratio executor / plain, and the ratio of the totals. The first round is warm-up.
//
// Usage: runtime_overhead_bench [--model gpt-tiny] [--data mixture-4task] [--method dynapipe]
//        [--cluster a100-40g:1] [--cost auto] [--batches 4] [--rounds 5]
//        [--tokens-per-batch 4096] [--max-seqlen 512] [--threads 1] [--port 29650]
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <memory>
#include <vector>

#include "bench/bench_util.h"
#include "cost/cost_factory.h"
#include "data/data_source.h"
#include "data/global_batcher.h"
#include "model/cluster_spec.h"
#include "model/model_spec.h"
#include "model/parallel_config.h"
#include "planner/planner.h"
#include "runtime/batch_layout.h"
#include "runtime/comm.h"
#include "runtime/executor.h"
#include "runtime/layout.h"
#include "runtime/model.h"
#include "runtime/token_source.h"
#include "runtime/torch_pch.h"
#include "runtime/trace_recorder.h"

namespace sluice::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  std::string model = "gpt-tiny";
  std::string data = "mixture-4task";
  std::string method = "dynapipe";
  std::string cluster = "a100-40g:1";
  std::string cost = "auto";
  int64_t batches = 4;
  int64_t rounds = 5;
  int64_t tokens_per_batch = 4096;
  int64_t max_seqlen = 512;
  int64_t threads = 1;
  int port = 29650;
  uint64_t seed = 0;
};

struct Batch {
  ExecutionPlan plan;
  std::vector<Sample> samples;
  runtime::SampleTable table;
  int64_t tokens = 0;
};

std::unique_ptr<torch::optim::AdamW> MakeAdamW(const runtime::ModelShard& shard) {
  return std::make_unique<torch::optim::AdamW>(
      shard.Parameters(), torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).weight_decay(0.01));
}

// One training step on `b` without the executor: returns the summed loss.
double PlainStep(const ModelSpec& model, runtime::ModelShard& shard, torch::optim::AdamW& optimizer,
                 const runtime::TokenSource& tokens, const Batch& b) {
  const int64_t labels = Must(runtime::GlobalLabelTokens(b.plan, b.table));
  const runtime::Chunk& chunk = shard.chunk(0);
  double loss_sum = 0;
  for (const PlanMicroBatch& mb : b.plan.replicas.at(0).micro_batches) {
    const runtime::MicroBatchLayout layout = Must(runtime::LayoutMicroBatch(model, mb, b.table));
    const runtime::MicroBatchInputs in =
        runtime::BuildMicroBatchInputs(model, layout, tokens, 1.0 / static_cast<double>(labels));
    std::vector<at::Tensor> inputs = {in.tokens};
    if (model.is_encoder_decoder()) inputs.push_back(in.dec_tokens);
    const std::vector<at::Tensor> out =
        chunk.Forward(inputs, in.labels, in, mb.recompute == Recompute::kSelective);
    out.at(0).backward();
    loss_sum += out[0].item<double>();
  }
  optimizer.step();
  for (const at::Tensor& p : shard.Parameters()) {
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
  }
  return loss_sum;
}

int Run(const Flags& f) {
  at::set_num_threads(static_cast<int>(f.threads));
  const ModelSpec model = Must(ResolveModel(f.model));
  const ClusterSpec cluster = Must(ResolveCluster(f.cluster));
  const ParallelConfig par = Must(ResolveParallel("pp=1"));
  CostModelOptions cost_options;
  cost_options.kind = f.cost;
  const std::unique_ptr<CostModel> cost = Must(MakeCostModel(model, cluster, cost_options));
  PlannerOptions po;
  po.method = f.method;
  po.batching.seed = f.seed;
  po.batching.max_seqlen = f.max_seqlen;
  po.batching.recompute = Recompute::kNone;
  const Planner planner = Must(Planner::Create(*cost, par, cluster, po));
  DataOptions data_options;
  data_options.seed = f.seed;
  const Dataset dataset = Must(LoadData(f.data, data_options));
  BatcherOptions bo;
  bo.tokens_per_batch = f.tokens_per_batch;
  bo.max_seqlen = f.max_seqlen;
  bo.limit = model.is_encoder_decoder() ? SeqlenLimit::kEachSide : SeqlenLimit::kTotal;
  bo.seed = f.seed;
  GlobalBatcher batcher = Must(GlobalBatcher::Create(dataset, bo));
  std::vector<Batch> batches;
  GlobalBatch gb;
  int64_t micro_batches = 0;
  while (static_cast<int64_t>(batches.size()) < f.batches && batcher.Next(&gb)) {
    PlanResult r = Must(planner.Plan(gb.samples));
    if (r.outcome != PlanOutcome::kOk) continue;
    Batch b;
    b.plan = std::move(r.plan);
    b.samples = gb.samples;
    b.table = runtime::MakeSampleTable(b.samples);
    b.tokens = gb.tokens;
    micro_batches += static_cast<int64_t>(b.plan.replicas.at(0).micro_batches.size());
    batches.push_back(std::move(b));
  }
  if (batches.empty()) {
    std::fprintf(stderr, "no global batch could be planned\n");
    return 1;
  }

  // The executor's one-rank job.
  runtime::DistEnv env;
  env.master_port = f.port;
  auto exec_shard = Must(runtime::ModelShard::Create(model, 1, 1, 0, f.seed));
  auto plain_shard = Must(runtime::ModelShard::Create(model, 1, 1, 0, f.seed));
  auto comm =
      Must(runtime::Communicator::Create(env, par, runtime::WordEmbeddingRanks(model, 1, 1, {}),
                                         runtime::Backend::kGloo, std::chrono::seconds(60)));
  auto watchdog = Must(runtime::Watchdog::Start(env, std::chrono::seconds(60)));
  auto exec_opt = MakeAdamW(*exec_shard);
  auto plain_opt = MakeAdamW(*plain_shard);
  const runtime::TokenSource tokens(model.vocab, f.seed);
  runtime::TraceRecorder trace(0, 0, 0);
  runtime::Executor executor(exec_shard.get(), comm.get(), exec_opt.get(), watchdog.get(), &trace,
                             &tokens, Clock::now());

  fmt::print(
      "model {} ({} parameters), pp = 1, {} batches x {} rounds ({} micro-batches per "
      "round, {} tokens per batch), method {}, {} intra-op thread(s)\n",
      model.name, exec_shard->NumParameters(), batches.size(), f.rounds, micro_batches,
      f.tokens_per_batch, f.method, at::get_num_threads());
  std::vector<double> exec_ms, plain_ms;
  double exec_loss = 0, plain_loss = 0;
  for (int64_t round = 0; round < f.rounds; ++round) {
    for (size_t i = 0; i < batches.size(); ++i) {
      const int64_t iteration =
          round * static_cast<int64_t>(batches.size()) + static_cast<int64_t>(i);
      // Alternate which runs first.
      for (int k = 0; k < 2; ++k) {
        const bool exec_turn = (k == 0) == (iteration % 2 == 0);
        const Clock::time_point t0 = Clock::now();
        if (exec_turn) {
          const runtime::IterationResult r =
              Must(executor.Run(batches[i].plan, batches[i].table, iteration));
          if (round > 0) exec_ms.push_back(MillisSince(t0));
          exec_loss = r.loss;
        } else {
          plain_loss = PlainStep(model, *plain_shard, *plain_opt, tokens, batches[i]);
          if (round > 0) plain_ms.push_back(MillisSince(t0));
        }
      }
    }
  }
  watchdog->Finish();
  double exec_total = 0, plain_total = 0;
  for (const double v : exec_ms) exec_total += v;
  for (const double v : plain_ms) plain_total += v;
  const double em = Median(exec_ms), pm = Median(plain_ms);
  fmt::print("{:<10} {:>14} {:>14} {:>12}\n", "path", "median ms/iter", "total ms", "last loss");
  fmt::print("{:<10} {:>14.2f} {:>14.1f} {:>12.5f}\n", "executor", em, exec_total, exec_loss);
  fmt::print("{:<10} {:>14.2f} {:>14.1f} {:>12.5f}\n", "plain", pm, plain_total, plain_loss);
  fmt::print("executor / plain: median {:.4f}, total {:.4f} ({} timed iterations each)\n", em / pm,
             exec_total / plain_total, exec_ms.size());
  return 0;
}

}  // namespace
}  // namespace sluice::bench

int main(int argc, char** argv) {
  sluice::bench::Flags f;
  CLI::App app{"Executor overhead at pp = 1 against a plain libtorch training step"};
  app.add_option("--model", f.model, "Model preset or JSON file")->capture_default_str();
  app.add_option("--data", f.data, "Lengths file or preset")->capture_default_str();
  app.add_option("--method", f.method, "Batching method")->capture_default_str();
  app.add_option("--cluster", f.cluster, "Cluster the planner prices (preset:N or JSON)")
      ->capture_default_str();
  app.add_option("--cost", f.cost, "Cost model the planner uses (auto, profiled:FILE, ...)")
      ->capture_default_str();
  app.add_option("--batches", f.batches, "Global batches")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--rounds", f.rounds, "Passes over the batches (the first is warm-up)")
      ->check(CLI::Range(int64_t{2}, int64_t{1000}))
      ->capture_default_str();
  app.add_option("--tokens-per-batch", f.tokens_per_batch, "Global batch token budget")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-seqlen", f.max_seqlen, "Longest sequence")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--threads", f.threads, "Intra-op threads")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--port", f.port, "TCPStore port of the one-rank job")
      ->check(CLI::Range(1, 65535))
      ->capture_default_str();
  app.add_option("--seed", f.seed, "Seed")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  return sluice::bench::Run(f);
}
