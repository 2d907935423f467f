// The calibration file (calibration.h, docs/formats.md): CalibrationToJson, and the reader that
// validates every field and names it in its errors.
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/json_util.h"
#include "trace/calibration.h"

namespace sluice::trace {

std::string CalibrationToJson(const Calibration& c) {
  nlohmann::json j;
  j["format"] = "sluice-calibration/2";
  j["source"] = c.source;
  j["ops"] = nlohmann::json::array();
  for (const OpCorrection& o : c.ops) {
    j["ops"].push_back({{"stage", o.stage},
                        {"op", o.op},
                        {"scale", o.scale},
                        {"offset_us", o.offset_us},
                        {"per_token_ns", o.per_token_ns},
                        {"per_attention_ns", o.per_attention_ns},
                        {"per_row_us", o.per_row_us},
                        {"per_recomputed_token_ns", o.per_recomputed_token_ns},
                        {"samples", o.samples},
                        {"error_before", o.mean_abs_error_before},
                        {"error_after", o.mean_abs_error_after}});
  }
  if (c.link.fitted) {
    j["link"] = {{"latency_us", c.link.latency_us},
                 {"bandwidth_gb_per_s", c.link.bandwidth_gb_per_s},
                 {"samples", c.link.samples}};
  }
  if (c.iteration.samples > 0) {
    j["iteration"] = {{"offset_us", c.iteration.offset_us}, {"samples", c.iteration.samples}};
  }
  if (!c.memory.empty()) {
    j["memory"] = nlohmann::json::array();
    for (const MemoryCorrection& m : c.memory) {
      j["memory"].push_back({{"pp_rank", m.pp_rank},
                             {"offset_bytes", m.offset_bytes},
                             {"activation_scale", m.activation_scale},
                             {"samples", m.samples},
                             {"error_before", m.mean_abs_error_before},
                             {"error_after", m.mean_abs_error_after}});
    }
  }
  return j.dump(1) + "\n";
}

StatusOr<Calibration> CalibrationFromJson(std::string_view text, std::string_view source) {
  SLUICE_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(text, source));
  JsonObjectReader r(j, std::string(source));
  SLUICE_RETURN_IF_ERROR(r.status());
  Calibration c;
  static constexpr std::string_view kFormats[] = {"sluice-calibration/2", "sluice-calibration/1"};
  std::string format;
  SLUICE_RETURN_IF_ERROR(r.Enum("format", &format, kFormats));
  const bool v2 = format == kFormats[0];
  SLUICE_RETURN_IF_ERROR(r.OptionalString("source", &c.source));
  const nlohmann::json* ops = r.Child("ops");
  if (ops == nullptr || !ops->is_array()) return r.Error("ops", "expected an array");
  std::vector<std::string> names;
  for (int k = 0; k < kNumOpKinds; ++k) names.emplace_back(OpKindName(static_cast<OpKind>(k)));
  std::vector<std::string_view> fitted;
  for (const std::string& n : names) {
    if (IsCalibratedOp(*OpKindFromName(n))) fitted.push_back(n);
  }
  for (size_t i = 0; i < ops->size(); ++i) {
    JsonObjectReader o((*ops)[i], std::string(source), fmt::format("ops[{}]", i));
    SLUICE_RETURN_IF_ERROR(o.status());
    OpCorrection oc;
    SLUICE_RETURN_IF_ERROR(o.Int("stage", &oc.stage, -1, 1'000'000));
    SLUICE_RETURN_IF_ERROR(o.Enum("op", &oc.op, fitted));
    SLUICE_RETURN_IF_ERROR(o.Double("scale", &oc.scale, 0, 1e6));
    SLUICE_RETURN_IF_ERROR(o.Double("offset_us", &oc.offset_us, 0, 1e12));
    if (v2) {  // "/1" has the scale and the offset only: the other fields are unknown there
      SLUICE_RETURN_IF_ERROR(o.OptionalDouble("per_token_ns", &oc.per_token_ns, 0, 1e12));
      SLUICE_RETURN_IF_ERROR(o.OptionalDouble("per_attention_ns", &oc.per_attention_ns, 0, 1e12));
      SLUICE_RETURN_IF_ERROR(o.OptionalDouble("per_row_us", &oc.per_row_us, 0, 1e12));
      SLUICE_RETURN_IF_ERROR(
          o.OptionalDouble("per_recomputed_token_ns", &oc.per_recomputed_token_ns, 0, 1e12));
    }
    SLUICE_RETURN_IF_ERROR(o.OptionalInt("samples", &oc.samples, 0, INT64_MAX));
    SLUICE_RETURN_IF_ERROR(o.OptionalDouble("error_before", &oc.mean_abs_error_before, 0, 1e12));
    SLUICE_RETURN_IF_ERROR(o.OptionalDouble("error_after", &oc.mean_abs_error_after, 0, 1e12));
    SLUICE_RETURN_IF_ERROR(o.Finish());
    c.ops.push_back(oc);
  }
  if (const nlohmann::json* link = r.Child("link")) {
    JsonObjectReader l(*link, std::string(source), "link");
    SLUICE_RETURN_IF_ERROR(l.status());
    c.link.fitted = true;
    SLUICE_RETURN_IF_ERROR(l.Double("latency_us", &c.link.latency_us, 0, 1e9));
    SLUICE_RETURN_IF_ERROR(l.Double("bandwidth_gb_per_s", &c.link.bandwidth_gb_per_s, 1e-9, 1e9));
    SLUICE_RETURN_IF_ERROR(l.OptionalInt("samples", &c.link.samples, 0, INT64_MAX));
    SLUICE_RETURN_IF_ERROR(l.Finish());
  }
  if (const nlohmann::json* it = v2 ? r.Child("iteration") : nullptr) {
    JsonObjectReader l(*it, std::string(source), "iteration");
    SLUICE_RETURN_IF_ERROR(l.status());
    SLUICE_RETURN_IF_ERROR(l.Double("offset_us", &c.iteration.offset_us, -1e12, 1e12));
    SLUICE_RETURN_IF_ERROR(l.Int("samples", &c.iteration.samples, 1, INT64_MAX));
    SLUICE_RETURN_IF_ERROR(l.Finish());
  }
  if (const nlohmann::json* mem = v2 ? r.Child("memory") : nullptr) {
    if (!mem->is_array()) return r.Error("memory", "expected an array");
    for (size_t i = 0; i < mem->size(); ++i) {
      JsonObjectReader o((*mem)[i], std::string(source), fmt::format("memory[{}]", i));
      SLUICE_RETURN_IF_ERROR(o.status());
      MemoryCorrection m;
      SLUICE_RETURN_IF_ERROR(o.Int("pp_rank", &m.pp_rank, 0, 1'000'000));
      SLUICE_RETURN_IF_ERROR(o.Double("offset_bytes", &m.offset_bytes, -1e15, 1e15));
      SLUICE_RETURN_IF_ERROR(o.Double("activation_scale", &m.activation_scale, 1e-6, 1e6));
      SLUICE_RETURN_IF_ERROR(o.OptionalInt("samples", &m.samples, 0, INT64_MAX));
      SLUICE_RETURN_IF_ERROR(o.OptionalDouble("error_before", &m.mean_abs_error_before, 0, 1e12));
      SLUICE_RETURN_IF_ERROR(o.OptionalDouble("error_after", &m.mean_abs_error_after, 0, 1e12));
      SLUICE_RETURN_IF_ERROR(o.Finish());
      c.memory.push_back(m);
    }
  }
  SLUICE_RETURN_IF_ERROR(r.Finish());
  return c;
}

StatusOr<Calibration> ReadCalibrationFile(const std::string& path) {
  SLUICE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return CalibrationFromJson(text, path);
}

}  // namespace sluice::trace
