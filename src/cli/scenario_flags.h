// The scenario every planning subcommand starts from: model, cluster, parallel configuration,
// data, batch budget and cost model, given with the shared flags of ARCHITECTURE.md and resolved
// (validated) into the objects the planners need.
//
// Defaults (a user who gives no flag gets DynaPipe's GPT setting): --model gpt-6.7b, --cluster
// a100-40g:8, --parallel dp=2,pp=4,zero=1, --data mixture-4task, --tokens-per-batch 65536,
// --max-seqlen 2048 (clip), --iterations 20, --memory-limit = the device's memory.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "base/status.h"
#include "batching/stage_cost.h"
#include "cost/cost_model.h"
#include "data/global_batcher.h"
#include "data/sample.h"
#include "model/cluster_spec.h"
#include "model/model_spec.h"
#include "model/parallel_config.h"

namespace sluice::cli {

struct ScenarioFlags {
  std::string model = "gpt-6.7b";
  std::string cluster = "a100-40g:8";
  std::string parallel = "dp=2,pp=4,zero=1";
  std::string data = "mixture-4task";
  std::string cost = "auto";
  int64_t tokens_per_batch = 65536;
  int64_t max_seqlen = 2048;
  std::string long_samples = "clip";
  std::string iterations = "20";
  double memory_limit_mb = 0;  // 0 = --parallel's memory_limit_mb, else the device's memory
  int64_t samples = 0;         // generator presets: how many samples (0 = default)
  uint64_t seed = 0;
};

// Adds --model, --cluster, --parallel, --data, --cost, --tokens-per-batch, --max-seqlen, --long,
// --iterations, --memory-limit, --samples and --seed.
void AddScenarioFlags(CLI::App* app, ScenarioFlags* flags);

struct Scenario {
  ModelSpec model;
  ClusterSpec cluster;
  ParallelConfig parallel;
  Dataset dataset;
  std::unique_ptr<CostModel> cost;
  std::optional<StageCostEvaluator> evaluator;  // points into *cost
  std::optional<GlobalBatcher> batcher;
  int64_t iterations = 20;  // 0 = the whole dataset (one epoch)
  int64_t max_seqlen = 0;

  // A few lines naming every choice (model, devices, parallelism, memory, cost model, data).
  std::string Describe() const;
};

// Resolves and validates every flag; errors name the flag and the allowed values. `in_flight` is
// the in-flight rule of the schedule that will run the micro-batches (stage_cost.h).
StatusOr<Scenario> ResolveScenario(const ScenarioFlags& flags,
                                   InFlightPolicy in_flight = InFlightPolicy::k1F1B);

}  // namespace sluice::cli
