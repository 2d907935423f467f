// CompareScenario: what `sluice compare` compares — one model on one cluster over one dataset,
// with the methods to compare and the configuration space each of them is searched over.
//
// A scenario comes from the shared CLI flags or from a strict JSON file (docs/formats.md,
// "Compare scenario"): unknown keys, wrong types and out-of-range values are errors naming the
// file, the field and the allowed values. The defaults of every field form the embedded default
// scenario that `sluice compare` runs without flags (GPT-6.7B on 8 A100-40GB, the shipped
// mixture-4task lengths, 65,536 tokens per batch, max length 2048).
//
// The compared methods and the configuration space each is searched over (MethodSpec,
// SearchSpace, the method shorthands) are the planner's search space (planner/search_space.h).
//
// Thread safety: value types and pure functions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "model/parallel_config.h"
#include "planner/scenario.h"
#include "planner/search_space.h"

namespace sluice {

struct CompareScenario {
  std::string name = "default";
  std::string model = "gpt-6.7b";      // preset or ModelSpec JSON file
  std::string cluster = "a100-40g:8";  // PRESET:N or ClusterSpec JSON file
  std::string data = "mixture-4task";  // file or preset (docs/data-presets.md)
  int64_t samples = 0;                 // generator presets: how many (0 = default); files: first N
  std::string cost = "auto";           // auto, analytic, profiled:PATH, analytic:PATH
  bool flash_attention = false;        // analytic cost model: fused attention
  int64_t tokens_per_batch = 65536;
  int64_t max_seqlen = 2048;
  std::string long_samples = "clip";  // clip | drop
  int64_t iterations = 20;            // global batches planned and simulated; 0 = all
  double memory_limit_mb = 0;         // per device, MB (10^6 B); 0 = device memory - reserve
  // MB held back from the device's memory when no limit is given; < 0 = the default reserve
  // (model/parallel_config.h, DefaultMemoryReserve).
  double memory_reserve_mb = -1;
  uint64_t seed = 0;
  std::vector<MethodSpec> methods;    // empty = DefaultMethods()
  std::string reference = "packing";  // the method ratios are given against
  // The shared ("controlled") configuration: the best (dp, pp, tp, zero) of the method named
  // here, or a fixed configuration. vpp and the schedule stay each method's own choice. A method
  // of no single configuration (MethodKind kHetero, kDynamic) gives no controlled comparison,
  // and takes no part in one (its controlled row is not-run).
  std::string controlled_method = "sluice";
  std::optional<ParallelConfig> controlled;
  SearchSpace search;
  // Simulator: collectives step by step with link contention (the simulator's default), or
  // one closed-form α-β interval each (faster, "closed-form").
  bool stepwise_collectives = true;
  // MoE overlap rewrite (passes/moe_overlap.h: none, tutel, megatron, dw, partition, lancet,
  // lancet-megatron) applied to every planned batch of an expert-parallel configuration before it
  // is simulated;
  // empty: the plans as lowered (whole MoE ops). The configuration search does not see it.
  std::string moe_overlap;

  friend bool operator==(const CompareScenario&, const CompareScenario&) = default;
};

// The methods of `scenario` (its list, or DefaultMethods()).
std::vector<MethodSpec> ScenarioMethods(const CompareScenario& scenario);

// Checks ranges and relations that do not need the model or data: positive budgets, unique
// method names, the reference and controlled method among the methods, search lists in range.
// Errors start with `field_name` of the field ("SOURCE: field 'F'" for the `source` overload).
Status ValidateCompareScenario(const CompareScenario& scenario, const FieldNamer& field_name);
Status ValidateCompareScenario(const CompareScenario& scenario, std::string_view source);

// JSON form (docs/formats.md, "Compare scenario"). Relative model/cluster/data paths that do not
// exist from the working directory are taken relative to `base_dir` (the file's folder).
// FromJson(ToJson(s)) == s for every valid s.
StatusOr<CompareScenario> CompareScenarioFromJson(const nlohmann::json& j, std::string_view source,
                                                  std::string_view base_dir = "");
nlohmann::json CompareScenarioToJson(const CompareScenario& scenario);
// Reads a scenario file; `name` defaults to the file's stem.
StatusOr<CompareScenario> ReadCompareScenarioFile(const std::string& path);

}  // namespace sluice
