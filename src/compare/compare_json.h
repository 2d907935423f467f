// The results file of `sluice compare` (format "sluice-compare/1", docs/formats.md "Compare
// results"): the scenario, the ideal bound, and per method (own best configuration and the
// controlled comparison) the chosen configuration, the summary and every batch's record.
// Everything in CompareResult is written except the example runs (plans and timelines, which the
// HTML report shows); FromJson(ToJson(r)) == r. Reading is strict: unknown keys, wrong types or
// another format version are errors naming the file and the field.
//
// Thread safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "base/status.h"
#include "compare/compare.h"

namespace sluice {

inline constexpr const char* kCompareFormat = "sluice-compare/1";

nlohmann::json CompareResultToJson(const CompareResult& result);
StatusOr<CompareResult> CompareResultFromJson(const nlohmann::json& j, std::string_view source);

// Writes / reads the JSON file (2-space indented).
Status WriteCompareResultFile(const CompareResult& result, const std::string& path);
StatusOr<CompareResult> ReadCompareResultFile(const std::string& path);

}  // namespace sluice
