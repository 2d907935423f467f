// MakeCostModel: picks and builds the cost model a run plans with.
//
// `CostModelOptions::kind` chooses:
//   "auto"           the shipped profile table of this model (data/profiles/, same model name
//                    and layer shape) when the device is a100-40g, the hardware it was measured
//                    on; otherwise "analytic".
//   "profiled:PATH"  the layer-cost-table/1 file at PATH; an error when it does not profile the
//                    model.
//   "analytic"       AnalyticCostModel on the cluster's device with factors fitted to the shipped
//                    GPT-6.7B table (data/profiles/a100_gpt_6.7b.json, ~0.2 s) when it is found,
//                    else DefaultLayerFactors.
//   "analytic:PATH"  AnalyticCostModel with factors fitted to the table at PATH, assumed measured
//                    on the cluster's device; the table must profile the model or a preset.
// The returned model's Describe() says which answered and from what.
//
// Thread safety: pure function; the returned model is immutable.
#pragma once

#include <memory>
#include <string>

#include "base/status.h"
#include "cost/cost_model.h"
#include "model/cluster_spec.h"
#include "model/model_spec.h"

namespace sluice {

struct CostModelOptions {
  std::string kind = "auto";     // "auto" | "profiled:PATH" | "analytic" | "analytic:PATH"
  bool flash_attention = false;  // analytic work and memory with fused attention
};

// The shipped tables, relative to the data directory: "profiles/a100_gpt_6.7b.json", ...
inline constexpr const char* kShippedProfileTables[] = {"profiles/a100_gpt_6.7b.json",
                                                        "profiles/a100_t5_11b.json"};

StatusOr<std::unique_ptr<CostModel>> MakeCostModel(const ModelSpec& model,
                                                   const ClusterSpec& cluster,
                                                   const CostModelOptions& options);

}  // namespace sluice
