#include "compare/compare_scenario.h"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <set>

#include "base/json_util.h"
#include "base/paths.h"
#include "data/data_source.h"
#include "passes/moe_overlap.h"

namespace sluice {
namespace {

constexpr int64_t kMaxDegree = 1 << 20;

std::string ExistingPath(const std::string& value, std::string_view base_dir) {
  if (base_dir.empty() || value.empty() || value.front() == '/' || FileExists(value)) return value;
  const std::string joined = fmt::format("{}/{}", base_dir, value);
  return FileExists(joined) ? joined : value;
}

Status ReadIntList(JsonObjectReader& r, std::string_view key, int64_t min, int64_t max,
                   std::vector<int64_t>* out) {
  const nlohmann::json* v = r.Child(key);
  if (v == nullptr) return Status::Ok();
  if (!v->is_array()) return r.Error(key, "must be an array of integers");
  out->clear();
  for (const nlohmann::json& e : *v) {
    if (!e.is_number_integer() || e.get<int64_t>() < min || e.get<int64_t>() > max) {
      return r.Error(key, fmt::format("every entry must be an integer in [{}, {}]", min, max));
    }
    out->push_back(e.get<int64_t>());
  }
  std::sort(out->begin(), out->end());
  out->erase(std::unique(out->begin(), out->end()), out->end());
  return Status::Ok();
}

std::vector<std::string_view> ScheduleNames() {
  std::vector<std::string_view> names;
  for (ScheduleKind k : AllScheduleKinds()) names.push_back(ScheduleKindName(k));
  return names;
}

StatusOr<MethodSpec> MethodFromJson(const nlohmann::json& j, std::string_view source,
                                    const std::string& path) {
  if (j.is_string())
    return MethodSpecFor(j.get<std::string>(), fmt::format("{}: {}", source, path));
  JsonObjectReader r(j, std::string(source), path);
  SLUICE_RETURN_IF_ERROR(r.status());
  MethodSpec spec;
  SLUICE_RETURN_IF_ERROR(r.String("name", &spec.name));
  std::string kind;
  SLUICE_RETURN_IF_ERROR(r.OptionalString("kind", &kind));
  if (!kind.empty()) {
    SLUICE_ASSIGN_OR_RETURN(spec.kind,
                            ParseMethodKind(kind, fmt::format("{}: {}.kind", source, path)));
  }
  bool dynamic_cp = false;
  const bool dynamic_cp_given = r.Child("dynamic_cp") != nullptr;
  SLUICE_RETURN_IF_ERROR(r.OptionalBool("dynamic_cp", &dynamic_cp));
  const nlohmann::json* batching = r.Child("batching");
  if (batching == nullptr) {
    SLUICE_ASSIGN_OR_RETURN(MethodSpec base, MethodSpecFor(spec.name, source));
    spec.batching = base.batching;
    spec.schedules = base.schedules;
    if (kind.empty()) spec.kind = base.kind;
    spec.dynamic_cp = base.dynamic_cp;
  } else {
    if (!batching->is_array() || batching->empty()) {
      return r.Error("batching", "must be a non-empty array of batching method names");
    }
    for (const nlohmann::json& b : *batching) {
      if (!b.is_string() || !IsBatchingName(b.get<std::string>())) {
        return r.Error("batching",
                       "every entry must be a batching method (padding, sorted, "
                       "token-budget, packing, multipack, dynapipe, hydraulis or "
                       "ASSIGNER+BATCHER, docs/batching.md)");
      }
      spec.batching.push_back(b.get<std::string>());
    }
    spec.schedules = AllScheduleKinds();
  }
  if (const nlohmann::json* schedules = r.Child("schedules")) {
    const std::vector<std::string_view> allowed = ScheduleNames();
    if (!schedules->is_array() || schedules->empty()) {
      return r.Error("schedules",
                     fmt::format("must be a non-empty array of {}", JoinAllowed(allowed)));
    }
    spec.schedules.clear();
    for (const nlohmann::json& s : *schedules) {
      StatusOr<ScheduleKind> kind = s.is_string() ? ParseScheduleKind(s.get<std::string>())
                                                  : InvalidArgumentError("not a string");
      if (!kind.ok()) {
        return r.Error("schedules",
                       fmt::format("every entry must be one of {}", JoinAllowed(allowed)));
      }
      if (std::find(spec.schedules.begin(), spec.schedules.end(), *kind) == spec.schedules.end()) {
        spec.schedules.push_back(*kind);
      }
    }
  }
  if (dynamic_cp_given) spec.dynamic_cp = dynamic_cp;
  SLUICE_RETURN_IF_ERROR(r.Finish());
  return spec;
}

nlohmann::json MethodToJson(const MethodSpec& m) {
  nlohmann::json schedules = nlohmann::json::array();
  for (ScheduleKind k : m.schedules) schedules.push_back(std::string(ScheduleKindName(k)));
  nlohmann::json j = {{"name", m.name}, {"batching", m.batching}, {"schedules", schedules}};
  if (m.kind != MethodKind::kHomogeneous) j["kind"] = std::string(MethodKindName(m.kind));
  if (m.dynamic_cp) j["dynamic_cp"] = true;
  return j;
}

}  // namespace

std::vector<MethodSpec> ScenarioMethods(const CompareScenario& scenario) {
  return scenario.methods.empty() ? DefaultMethods() : scenario.methods;
}

Status ValidateCompareScenario(const CompareScenario& s, std::string_view source) {
  return ValidateCompareScenario(s, FileFieldNamer(std::string(source)));
}

Status ValidateCompareScenario(const CompareScenario& s, const FieldNamer& field_name) {
  auto bad = [&](std::string_view field, std::string problem) {
    return InvalidArgumentError(fmt::format("{}: {}", field_name(field), problem));
  };
  // The name is the output folder of the scenario under --scenario-dir: one plain folder name.
  if (s.name.empty() || s.name == "." || s.name == ".." ||
      std::any_of(s.name.begin(), s.name.end(), [](char c) {
        return c == '/' || c == '\\' || static_cast<unsigned char>(c) < 0x20;
      })) {
    return bad("name", fmt::format("'{}' is not allowed; allowed: a folder name (not empty, '.' "
                                   "or '..'; no '/', '\\' or control characters)",
                                   s.name));
  }
  if (s.tokens_per_batch < 1) return bad("tokens_per_batch", "must be >= 1");
  if (s.max_seqlen < 1) return bad("max_seqlen", "must be >= 1");
  if (s.iterations < 0) return bad("iterations", "must be a positive integer or \"all\"");
  if (s.samples < 0 || s.samples > kMaxSamples) {
    return bad("samples", fmt::format("must be in [0, {}] (0 = the default)", kMaxSamples));
  }
  if (!std::isfinite(s.memory_limit_mb) || s.memory_limit_mb < 0 || s.memory_limit_mb > 1e9) {
    return bad("memory_limit_mb",
               "must be in (0, 1e9] MB, or 0 for the device's memory less the reserve");
  }
  if (!std::isfinite(s.memory_reserve_mb) || s.memory_reserve_mb > 1e9 ||
      (s.memory_reserve_mb < 0 && s.memory_reserve_mb != -1)) {
    return bad("memory_reserve_mb", "must be in [0, 1e9] MB (or absent for the default reserve)");
  }
  if (s.seed > static_cast<uint64_t>(INT64_MAX)) {
    return bad("seed", fmt::format("{} is out of range; allowed: 0..{}", s.seed, INT64_MAX));
  }
  if (s.long_samples != "clip" && s.long_samples != "drop") {
    return bad("long", "must be \"clip\" or \"drop\"");
  }
  const std::vector<MethodSpec> methods = ScenarioMethods(s);
  std::set<std::string> names;
  for (const MethodSpec& m : methods) {
    if (m.name.empty() || m.batching.empty() || m.schedules.empty()) {
      return bad("methods",
                 fmt::format("method '{}' needs a name, batching and schedules", m.name));
    }
    if (!names.insert(m.name).second) {
      return bad("methods", fmt::format("method '{}' is listed twice", m.name));
    }
  }
  std::vector<std::string_view> listed(names.begin(), names.end());
  if (!names.contains(s.reference)) {
    return bad("reference", fmt::format("'{}' is not one of the methods ({})", s.reference,
                                        JoinAllowed(listed)));
  }
  if (!s.controlled.has_value() && !names.contains(s.controlled_method)) {
    return bad("controlled", fmt::format("'{}' is not one of the methods ({}); give a method or "
                                         "a parallel configuration",
                                         s.controlled_method, JoinAllowed(listed)));
  }
  if (s.controlled.has_value()) {
    SLUICE_RETURN_IF_ERROR(ValidateParallelConfig(*s.controlled, field_name("controlled")));
  }
  const SearchSpace& q = s.search;
  for (int64_t z : q.zero) {
    if (z < 0 || z > 3) return bad("search.zero", "entries must be in [0, 3]");
  }
  if (q.zero.empty()) return bad("search.zero", "must not be empty");
  for (int64_t e : q.ep) {
    if (e < 1) return bad("search.ep", "entries must be >= 1");
  }
  if (!s.moe_overlap.empty()) {
    StatusOr<passes::MoeOverlap> overlap =
        passes::ParseMoeOverlap(s.moe_overlap, field_name("moe_overlap"));
    if (!overlap.ok()) return overlap.status();
  }
  for (int64_t v : q.vpp) {
    if (v < 2) return bad("search.vpp", "entries must be >= 2 (vpp 1 is the plain schedules)");
  }
  if (q.score_batches < 0 || q.score_batches > 64) {
    return bad("search.score_batches", "must be in [1, 64], or \"all\" (0)");
  }
  if (q.simulate_top < 1 || q.simulate_top > 64) {
    return bad("search.simulate_top", "must be in [1, 64]");
  }
  return Status::Ok();
}

StatusOr<CompareScenario> CompareScenarioFromJson(const nlohmann::json& j, std::string_view source,
                                                  std::string_view base_dir) {
  JsonObjectReader r(j, std::string(source));
  SLUICE_RETURN_IF_ERROR(r.status());
  CompareScenario s;
  SLUICE_RETURN_IF_ERROR(r.OptionalString("name", &s.name));
  SLUICE_RETURN_IF_ERROR(r.OptionalString("model", &s.model));
  SLUICE_RETURN_IF_ERROR(r.OptionalString("cluster", &s.cluster));
  SLUICE_RETURN_IF_ERROR(r.OptionalString("data", &s.data));
  s.model = ExistingPath(s.model, base_dir);
  s.cluster = ExistingPath(s.cluster, base_dir);
  s.data = ExistingPath(s.data, base_dir);
  SLUICE_RETURN_IF_ERROR(r.OptionalInt("samples", &s.samples, 0, kMaxSamples));
  SLUICE_RETURN_IF_ERROR(r.OptionalString("cost", &s.cost));
  SLUICE_RETURN_IF_ERROR(r.OptionalBool("flash_attention", &s.flash_attention));
  SLUICE_RETURN_IF_ERROR(
      r.OptionalInt("tokens_per_batch", &s.tokens_per_batch, 1, int64_t{1} << 40));
  SLUICE_RETURN_IF_ERROR(r.OptionalInt("max_seqlen", &s.max_seqlen, 1, int64_t{1} << 30));
  static constexpr std::array<std::string_view, 2> kLong = {"clip", "drop"};
  SLUICE_RETURN_IF_ERROR(r.OptionalEnum("long", &s.long_samples, kLong));
  if (const nlohmann::json* it = r.Child("iterations")) {
    if (it->is_string() && it->get<std::string>() == "all") {
      s.iterations = 0;
    } else if (it->is_number_integer() && it->get<int64_t>() >= 1) {
      s.iterations = it->get<int64_t>();
    } else {
      return r.Error("iterations", "must be a positive integer or \"all\"");
    }
  }
  SLUICE_RETURN_IF_ERROR(r.OptionalDouble("memory_limit_mb", &s.memory_limit_mb, 0, 1e9));
  SLUICE_RETURN_IF_ERROR(r.OptionalDouble("memory_reserve_mb", &s.memory_reserve_mb, 0, 1e9));
  int64_t seed = 0;
  SLUICE_RETURN_IF_ERROR(r.OptionalInt("seed", &seed, 0, INT64_MAX));
  s.seed = static_cast<uint64_t>(seed);
  if (const nlohmann::json* methods = r.Child("methods")) {
    if (!methods->is_array() || methods->empty()) {
      return r.Error("methods",
                     "must be a non-empty array of method names or objects "
                     "{\"name\", \"batching\", \"schedules\"}");
    }
    for (size_t i = 0; i < methods->size(); ++i) {
      SLUICE_ASSIGN_OR_RETURN(MethodSpec m,
                              MethodFromJson((*methods)[i], source, fmt::format("methods[{}]", i)));
      s.methods.push_back(std::move(m));
    }
  }
  SLUICE_RETURN_IF_ERROR(r.OptionalString("reference", &s.reference));
  SLUICE_RETURN_IF_ERROR(r.OptionalString("moe_overlap", &s.moe_overlap));
  if (const nlohmann::json* c = r.Child("controlled")) {
    if (c->is_string()) {
      s.controlled_method = c->get<std::string>();
    } else {
      SLUICE_ASSIGN_OR_RETURN(
          ParallelConfig par,
          ParallelConfigFromJson(*c, fmt::format("{}: field 'controlled'", source)));
      s.controlled = par;
    }
  }
  if (const nlohmann::json* search = r.Child("search")) {
    JsonObjectReader q(*search, std::string(source), "search");
    SLUICE_RETURN_IF_ERROR(q.status());
    SLUICE_RETURN_IF_ERROR(ReadIntList(q, "tp", 1, kMaxDegree, &s.search.tp));
    SLUICE_RETURN_IF_ERROR(ReadIntList(q, "pp", 1, kMaxDegree, &s.search.pp));
    SLUICE_RETURN_IF_ERROR(ReadIntList(q, "cp", 1, kMaxDegree, &s.search.cp));
    SLUICE_RETURN_IF_ERROR(ReadIntList(q, "ep", 1, kMaxDegree, &s.search.ep));
    SLUICE_RETURN_IF_ERROR(ReadIntList(q, "zero", 0, 3, &s.search.zero));
    SLUICE_RETURN_IF_ERROR(ReadIntList(q, "vpp", 2, kMaxDegree, &s.search.vpp));
    SLUICE_RETURN_IF_ERROR(q.OptionalBool("all_devices", &s.search.all_devices));
    if (const nlohmann::json* n = q.Child("score_batches")) {
      if (n->is_string() && n->get<std::string>() == "all") {
        s.search.score_batches = 0;
      } else if (n->is_number_integer() && n->get<int64_t>() >= 1 && n->get<int64_t>() <= 64) {
        s.search.score_batches = n->get<int64_t>();
      } else {
        return q.Error("score_batches", "must be an integer in [1, 64] or \"all\"");
      }
    }
    SLUICE_RETURN_IF_ERROR(q.OptionalBool("score_extremes", &s.search.score_extremes));
    SLUICE_RETURN_IF_ERROR(q.OptionalInt("simulate_top", &s.search.simulate_top, 1, 64));
    std::string cut = s.search.balance_layer_cut ? "balanced" : "even";
    static constexpr std::array<std::string_view, 2> kCuts = {"even", "balanced"};
    SLUICE_RETURN_IF_ERROR(q.OptionalEnum("layer_cut", &cut, kCuts));
    s.search.balance_layer_cut = cut == "balanced";
    std::string orders = s.search.only_order.has_value()
                             ? std::string(RankOrderName(*s.search.only_order))
                             : "both";
    static constexpr std::array<std::string_view, 3> kOrders = {"both", "tp-cp-dp-pp",
                                                                "tp-cp-pp-dp"};
    SLUICE_RETURN_IF_ERROR(q.OptionalEnum("orders", &orders, kOrders));
    s.search.only_order.reset();
    if (orders == "tp-cp-dp-pp") s.search.only_order = RankOrder::kDataInner;
    if (orders == "tp-cp-pp-dp") s.search.only_order = RankOrder::kPipelineInner;
    SLUICE_RETURN_IF_ERROR(q.Finish());
  }
  if (const nlohmann::json* sim = r.Child("simulator")) {
    JsonObjectReader q(*sim, std::string(source), "simulator");
    SLUICE_RETURN_IF_ERROR(q.status());
    std::string mode = s.stepwise_collectives ? "stepwise" : "closed-form";
    static constexpr std::array<std::string_view, 2> kModes = {"closed-form", "stepwise"};
    SLUICE_RETURN_IF_ERROR(q.OptionalEnum("collectives", &mode, kModes));
    s.stepwise_collectives = mode == "stepwise";
    SLUICE_RETURN_IF_ERROR(q.Finish());
  }
  SLUICE_RETURN_IF_ERROR(r.Finish());
  SLUICE_RETURN_IF_ERROR(ValidateCompareScenario(s, source));
  return s;
}

nlohmann::json CompareScenarioToJson(const CompareScenario& s) {
  nlohmann::json j = {{"name", s.name},
                      {"model", s.model},
                      {"cluster", s.cluster},
                      {"data", s.data},
                      {"samples", s.samples},
                      {"cost", s.cost},
                      {"flash_attention", s.flash_attention},
                      {"tokens_per_batch", s.tokens_per_batch},
                      {"max_seqlen", s.max_seqlen},
                      {"long", s.long_samples},
                      {"memory_limit_mb", s.memory_limit_mb},
                      {"seed", s.seed},
                      {"reference", s.reference}};
  if (s.memory_reserve_mb >= 0) j["memory_reserve_mb"] = s.memory_reserve_mb;
  if (s.iterations == 0) {
    j["iterations"] = "all";
  } else {
    j["iterations"] = s.iterations;
  }
  if (!s.methods.empty()) {
    nlohmann::json methods = nlohmann::json::array();
    for (const MethodSpec& m : s.methods) methods.push_back(MethodToJson(m));
    j["methods"] = methods;
  }
  if (s.controlled.has_value()) {
    j["controlled"] = ParallelConfigToJson(*s.controlled);
  } else {
    j["controlled"] = s.controlled_method;
  }
  j["search"] = {{"tp", s.search.tp},
                 {"pp", s.search.pp},
                 {"zero", s.search.zero},
                 {"vpp", s.search.vpp},
                 {"all_devices", s.search.all_devices},
                 {"score_extremes", s.search.score_extremes},
                 {"simulate_top", s.search.simulate_top}};
  // cp is written only when it is not the default {1}: older results keep their bytes.
  if (s.search.cp != std::vector<int64_t>{1}) j["search"]["cp"] = s.search.cp;
  if (s.search.ep != std::vector<int64_t>{1}) j["search"]["ep"] = s.search.ep;  // likewise
  if (s.search.balance_layer_cut) j["search"]["layer_cut"] = "balanced";  // likewise
  if (s.search.only_order.has_value()) {  // likewise
    j["search"]["orders"] = RankOrderName(*s.search.only_order);
  }
  if (!s.moe_overlap.empty()) j["moe_overlap"] = s.moe_overlap;
  if (s.search.score_batches == 0) {
    j["search"]["score_batches"] = "all";
  } else {
    j["search"]["score_batches"] = s.search.score_batches;
  }
  j["simulator"] = {{"collectives", s.stepwise_collectives ? "stepwise" : "closed-form"}};
  return j;
}

StatusOr<CompareScenario> ReadCompareScenarioFile(const std::string& path) {
  SLUICE_ASSIGN_OR_RETURN(nlohmann::json j, ReadJsonFile(path));
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash);
  std::string stem = slash == std::string::npos ? path : path.substr(slash + 1);
  if (const size_t dot = stem.rfind('.'); dot != std::string::npos && dot > 0) {
    stem = stem.substr(0, dot);
  }
  if (j.is_object() && !j.contains("name")) j["name"] = stem;
  return CompareScenarioFromJson(j, path, dir);
}

}  // namespace sluice
