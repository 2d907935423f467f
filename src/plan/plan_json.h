// The file forms of an ExecutionPlan: JSON ("format": "sluice-plan/1", docs/formats.md) and the
// same document as MessagePack (msgpack.org, the field-standard binary JSON), written and read
// directly without a JSON tree (plan_msgpack.cc): about 10x faster than JSON, for per-iteration
// hand-off.
//
// Both are complete (everything ValidatePlan and the runtime need) and round-trip exactly:
// PlanFromJson(PlanToJson(p)) == p for every plan the lowering produces. Readers are strict:
// unknown keys, wrong types and out-of-range values are errors of the form
// "<source>: field 'ranks[3].instructions[17].peer': <problem>". Readers check types and ranges
// only; whether the plan can run is ValidatePlan's job.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "plan/execution_plan.h"

namespace sluice {

// Ranges the readers accept (docs/formats.md): bytes and nanoseconds in [0, 2^50] (1.1 PB,
// 13 days), indices, lengths and counts in [0, 2^31].
inline constexpr int64_t kPlanMaxAmount = int64_t{1} << 50;
inline constexpr int64_t kPlanMaxIndex = int64_t{1} << 31;
// Keys of a micro-batch's per-stage cost object, in ChunkCost's field order.
inline constexpr std::string_view kPlanCostKeys[6] = {"forward_ns",         "backward_input_ns",
                                                      "backward_weight_ns", "stored_bytes",
                                                      "peak_bytes",         "stored_until_w_bytes"};

nlohmann::json PlanToJson(const ExecutionPlan& plan);
StatusOr<ExecutionPlan> PlanFromJson(const nlohmann::json& j, std::string_view source);

// Compact JSON text (indent < 0) or indented by `indent` spaces.
std::string PlanToJsonText(const ExecutionPlan& plan, int indent = -1);
StatusOr<ExecutionPlan> PlanFromJsonText(std::string_view text, std::string_view source);

// MessagePack encoding of the same document (plan_msgpack.cc), written and read directly without
// a JSON tree; the reader takes any encoding of the document (nlohmann's to_msgpack included).
std::vector<uint8_t> PlanToMsgpack(const ExecutionPlan& plan);
StatusOr<ExecutionPlan> PlanFromMsgpack(std::span<const uint8_t> bytes, std::string_view source);

// Writes JSON, or MessagePack when `path` ends in ".msgpack".
Status WritePlanFile(const ExecutionPlan& plan, const std::string& path);
// Reads either form: a file whose first non-blank byte is '{' is JSON, anything else MessagePack.
StatusOr<ExecutionPlan> ReadPlanFile(const std::string& path);

}  // namespace sluice
