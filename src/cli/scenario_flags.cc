#include "cli/scenario_flags.h"

#include <fmt/core.h>

#include <charconv>

#include "cli/cli_common.h"
#include "cost/cost_factory.h"
#include "data/data_source.h"

namespace sluice::cli {

void AddScenarioFlags(CLI::App* app, ScenarioFlags* f) {
  AddModelFlag(app, &f->model)->capture_default_str();
  AddClusterFlag(app, &f->cluster)->capture_default_str();
  AddParallelFlag(app, &f->parallel)->capture_default_str();
  AddDataFlag(app, &f->data)->capture_default_str();
  app->add_option("--cost", f->cost, "Cost model: auto, analytic, profiled:PATH or analytic:PATH")
      ->capture_default_str();
  AddTokensPerBatchFlag(app, &f->tokens_per_batch);
  AddMaxSeqlenFlag(app, &f->max_seqlen);
  app->add_option("--long", f->long_samples,
                  "Samples longer than --max-seqlen: clip or drop (counted either way)")
      ->capture_default_str();
  app->add_option("--iterations", f->iterations,
                  "Global batches to plan: a number, or 'all' for the whole dataset")
      ->capture_default_str();
  app->add_option("--memory-limit", f->memory_limit_mb,
                  "Per-device memory budget in MB (10^6 bytes); default: the device's memory")
      ->check(NumberCheck(0, true, 1e9, "a size in MB in (0, 1e9]"));
  app->add_option("--samples", f->samples,
                  "Generator presets: samples to generate (0 = 20000); files: first N samples")
      ->check(NumberCheck(0, false, kNoMax, "an integer >= 0"));
  AddSeedFlag(app, &f->seed);
}

StatusOr<Scenario> ResolveScenario(const ScenarioFlags& f, InFlightPolicy in_flight) {
  Scenario sc;
  SLUICE_ASSIGN_OR_RETURN(sc.model, ResolveModel(f.model));
  SLUICE_ASSIGN_OR_RETURN(sc.cluster, ResolveCluster(f.cluster));
  SLUICE_ASSIGN_OR_RETURN(sc.parallel, ResolveParallel(f.parallel));
  if (f.memory_limit_mb > 0) {
    if (sc.parallel.memory_limit.has_value()) {
      return InvalidArgumentError(
          "--memory-limit: the memory limit is also given as memory_limit_mb in --parallel; give "
          "it in one place");
    }
    sc.parallel.memory_limit = Bytes::MB(f.memory_limit_mb);
  }
  SLUICE_RETURN_IF_ERROR(CheckParallelFits(sc.parallel, sc.model, &sc.cluster, "--parallel"));
  if (f.max_seqlen > sc.model.max_position) {
    return InvalidArgumentError(fmt::format(
        "--max-seqlen: {} exceeds the max position {} of model '{}' (allowed: 1..{})",
        f.max_seqlen, sc.model.max_position, sc.model.name, sc.model.max_position));
  }
  sc.max_seqlen = f.max_seqlen;
  if (f.iterations == "all") {
    sc.iterations = 0;
  } else {
    const char* end = f.iterations.data() + f.iterations.size();
    auto [ptr, ec] = std::from_chars(f.iterations.data(), end, sc.iterations);
    if (ec != std::errc() || ptr != end || sc.iterations < 1) {
      return InvalidArgumentError(fmt::format(
          "--iterations: '{}' is not a positive integer or 'all'", f.iterations));
    }
  }
  SLUICE_ASSIGN_OR_RETURN(LongSamplePolicy policy, ParseLongSamplePolicy(f.long_samples));

  CostModelOptions cost_options;
  cost_options.kind = f.cost;
  SLUICE_ASSIGN_OR_RETURN(sc.cost, MakeCostModel(sc.model, sc.cluster, cost_options));
  StageCostOptions eval_options;
  eval_options.in_flight = in_flight;
  auto eval = StageCostEvaluator::Create(*sc.cost, sc.parallel, sc.cluster, eval_options);
  if (!eval.ok()) return InvalidArgumentError(eval.status().message());
  sc.evaluator.emplace(std::move(eval).value());

  DataOptions data_options;
  data_options.seed = f.seed;
  data_options.num_samples = f.samples;
  SLUICE_ASSIGN_OR_RETURN(sc.dataset, LoadData(f.data, data_options));
  BatcherOptions batcher_options;
  batcher_options.tokens_per_batch = f.tokens_per_batch;
  batcher_options.max_seqlen = f.max_seqlen;
  batcher_options.long_samples = policy;
  // A decoder-only model sees prompt and response as one sequence.
  batcher_options.limit =
      sc.model.is_encoder_decoder() ? SeqlenLimit::kEachSide : SeqlenLimit::kTotal;
  batcher_options.seed = f.seed;
  SLUICE_ASSIGN_OR_RETURN(GlobalBatcher batcher, GlobalBatcher::Create(sc.dataset, batcher_options));
  sc.batcher.emplace(std::move(batcher));
  return sc;
}

std::string Scenario::Describe() const {
  std::string s;
  s += fmt::format("model:    {} ({}, {} layers{})\n", model.name, ModelKindName(model.kind),
                   model.layers,
                   model.is_encoder_decoder() ? fmt::format(" + {}", model.decoder_layers) : "");
  s += fmt::format("cluster:  {} ({} devices), dp {} x pp {} x tp {}{}, ZeRO-{}, memory limit {:.0f} MB\n",
                   cluster.name, cluster.num_devices(), parallel.dp, parallel.pp, parallel.tp,
                   parallel.vpp > 1 ? fmt::format(" x vpp {}", parallel.vpp) : "", parallel.zero,
                   parallel.MemoryLimit(cluster).mb());
  s += fmt::format("cost:     {}\n", cost->Describe());
  s += fmt::format("data:     {} ({} samples), {} tokens per global batch, max seqlen {}, {}",
                   dataset.source(), dataset.size(), batcher->options().tokens_per_batch,
                   max_seqlen, iterations == 0 ? "all batches" : fmt::format("{} batches", iterations));
  return s;
}

}  // namespace sluice::cli
