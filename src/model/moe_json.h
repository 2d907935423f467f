// MoeSpec's JSON form (the `moe` object of a ModelSpec, docs/formats.md), for the readers of
// other formats that embed it (the layer-cost-table/1 `model.moe` of a table of MoE layers).
//
// Thread safety: stateless functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>

#include "base/status.h"
#include "model/model_spec.h"

namespace sluice {

// Reads an `moe` object (experts required; top_k, capacity_factor, layer_interval and
// expert_ffn_hidden optional, with MoeSpec's defaults); errors name `source` and the field as
// `path`.<key>. Checks each field's range, not its relation to a model's layer count.
StatusOr<MoeSpec> MoeSpecFromJson(const nlohmann::json& j, std::string_view source,
                                  std::string_view path);

// Writes every field; MoeSpecFromJson reads it back to an equal MoeSpec.
nlohmann::json MoeSpecToJson(const MoeSpec& moe);

}  // namespace sluice
