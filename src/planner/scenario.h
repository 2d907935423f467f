// Scenario: what a run plans over — model, cluster, parallel configuration (when one is fixed),
// memory limit, cost model, dataset and the global batches cut from it — resolved once from plain
// values (ScenarioSpec) for every caller: the `sluice` subcommands map their flags onto a spec,
// `sluice compare` maps its scenario (compare_scenario.h) onto one.
//
// Errors name the spec's field through a FieldNamer: by default "FILE: field 'model'" (or
// "field 'model'" without a file); the CLI passes a namer that maps a field to its flag
// ("--model"). This library never names a flag itself.
//
// Memory limit: given either as `memory_limit_mb` or as the parallel configuration's
// memory_limit_mb, never both (InvalidArgument: "give it in one place"); wherever it is given, it
// must not exceed the memory of one device of the cluster, and it is the budget as given. Absent:
// the device's memory less a reserve (model/parallel_config.h, MemoryBudget): `memory_reserve_mb`
// or the parallel configuration's memory_reserve_mb (one place), else DefaultMemoryReserve. A
// reserve given together with a limit is an error (it would be ignored).
//
// Thread safety: ResolveScenario is a pure function of its inputs (it reads files); a Scenario is
// used by one thread (its batcher advances).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "base/units.h"
#include "cost/cost_model.h"
#include "data/data_loss.h"
#include "data/global_batcher.h"
#include "data/sample.h"
#include "model/cluster_spec.h"
#include "model/model_spec.h"
#include "model/parallel_config.h"

namespace sluice {

// The values a scenario is given as. Field names (for FieldNamer) in comments.
struct ScenarioSpec {
  std::string model = "gpt-6.7b";          // 'model': preset or ModelSpec JSON file
  std::string cluster = "a100-40g:8";      // 'cluster': PRESET:N or ClusterSpec JSON file
  std::optional<ParallelConfig> parallel;  // 'parallel': the configuration run; absent = none
  double memory_limit_mb = 0;              // 'memory_limit_mb': per device, MB; 0 = not given
  double memory_reserve_mb = -1;           // 'memory_reserve_mb': MB held back; < 0 = not given
  std::string cost = "auto";               // 'cost': auto, analytic, profiled:PATH, analytic:PATH
  bool flash_attention = false;            // 'flash_attention': analytic cost model option
  std::string data = "mixture-4task";      // 'data': lengths file or preset
  int64_t samples = 0;                     // 'samples': generator presets: how many; files: first N
  uint64_t seed = 0;                       // 'seed': generators and the batcher's shuffle
  int64_t tokens_per_batch = 65536;        // 'tokens_per_batch': global batch budget, >= 1
  int64_t max_seqlen = 2048;               // 'max_seqlen': 1 .. the model's max_position
  std::string long_samples = "clip";       // 'long': clip | drop
  int64_t iterations = 20;                 // 'iterations': global batches to run; 0 = all
};

// Names a spec field in an error message: "FILE: field 'model'", or "--model" in the CLI.
using FieldNamer = std::function<std::string(std::string_view field)>;
// "SOURCE: field 'F'", or "field 'F'" when `source` is empty.
FieldNamer FileFieldNamer(std::string source);

struct ScenarioDescribeOptions {
  // Name the parallel configuration (when there is one) on the cluster line; `sluice compare`
  // shows its shared configuration in its tables instead.
  bool parallel = true;
  // The global batches the caller took up front, when it did: they are named with the
  // long-sample rule. Else the iteration count is named.
  std::optional<int64_t> batches_taken;
};

// A resolved scenario. Owns the cost model (evaluators built on it point into it: keep the
// Scenario alive, and do not move the CostModel out).
struct Scenario {
  ModelSpec model;
  ClusterSpec cluster;
  // spec.parallel, its memory_limit set to `memory_limit`; absent when the spec had none.
  std::optional<ParallelConfig> parallel;
  std::optional<Bytes> memory_limit;    // the limit given (either place); absent: see below
  std::optional<Bytes> memory_reserve;  // the reserve given (either place); absent = the default
  std::unique_ptr<CostModel> cost;
  Dataset dataset;
  std::optional<GlobalBatcher> batcher;  // always set by ResolveScenario
  LongSamplePolicy long_samples = LongSamplePolicy::kClip;
  int64_t tokens_per_batch = 0;
  int64_t max_seqlen = 0;
  int64_t iterations = 0;  // 0 = the whole dataset (one epoch)

  // The per-device budget planners respect: memory_limit, else the device's memory less the
  // reserve (MemoryBudget, the rule of ParallelConfig::MemoryLimit).
  Bytes MemoryLimit() const { return MemoryBudget(memory_limit, memory_reserve, cluster.device); }
  // What MemoryLimit() holds back from the device's memory: 0 with an explicit limit.
  Bytes MemoryReserve() const {
    return memory_limit.has_value() ? Bytes::Zero() : cluster.device.memory - MemoryLimit();
  }
  // What the length limits cost the dataset (data/data_loss.h).
  DataLoss Loss() const { return DataLossOf(*batcher); }
  // A few lines naming every choice: model, cluster (and the parallel configuration), memory
  // limit, cost model, data, and what the length limits cost the data (Loss()).
  std::string Describe(const ScenarioDescribeOptions& options = {}) const;
  // "FIELD: 'DATA' yields no global batch of N tokens: WHY" (DataLoss::WhyNoBatch), for a run that
  // got none; `field_name` names the data field.
  Status NoBatchError(const FieldNamer& field_name) const;
};

// Warnings about an input too small for a run's figures to say much (printed to stderr, never
// errors): fewer global batches than the iterations asked for, fewer samples in all than
// `min_run_samples`, and batches with fewer samples than `min_batch_samples` (a fixed
// configuration's replicas x the micro-batches that fill its pipeline: some replica or stage
// then idles). Feed it every batch of the run (Add), then ask Warnings().
class SmallInputCheck {
 public:
  // `iterations`: batches asked for (0 = all). `min_batch_samples`, `min_run_samples`: 0 = no
  // check; `batch_what` and `run_what` say where the numbers come from ("dp x pp = 8",
  // "the 8 devices").
  SmallInputCheck(int64_t iterations, int64_t min_batch_samples, std::string batch_what,
                  int64_t min_run_samples, std::string run_what);
  void Add(const GlobalBatch& batch);
  std::vector<std::string> Warnings() const;

 private:
  int64_t iterations_;
  int64_t min_batch_samples_;
  std::string batch_what_;
  int64_t min_run_samples_;
  std::string run_what_;
  int64_t batches_ = 0;
  int64_t samples_ = 0;
  int64_t small_batches_ = 0;
  int64_t smallest_ = 0;
};

// Resolves and validates `spec` (see above): the model and cluster, the memory limit, the
// parallel configuration against both (CheckParallelFits), max_seqlen against the model, the
// cost model, the dataset and a GlobalBatcher over it (decoder-only models limit input + target
// to max_seqlen, encoder-decoder models each side). Errors (InvalidArgument, NotFound) start with
// `field_name` of the field at fault.
StatusOr<Scenario> ResolveScenario(const ScenarioSpec& spec, const FieldNamer& field_name);

}  // namespace sluice
