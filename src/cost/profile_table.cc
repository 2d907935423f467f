#include "cost/profile_table.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "base/json_util.h"
#include "model/moe_json.h"

namespace sluice {
namespace {

constexpr std::string_view kStageNames[] = {"encoder", "decoder", "postprocess", "moe_encoder"};
constexpr std::string_view kMoePartNames[] = {"route", "dispatch", "experts", "combine",
                                              "experts_sliced"};
constexpr int64_t kMaxSlices = 4096;
constexpr std::string_view kKindNames[] = {"decoder-only", "encoder-decoder"};
constexpr std::string_view kRecomputeNames[] = {"none", "selective", "full"};
constexpr int64_t kMaxMbs = int64_t{1} << 24;
constexpr int64_t kMaxSeqlen = int64_t{1} << 24;
constexpr int64_t kMaxTp = 4096;
constexpr int64_t kMaxWidth = int64_t{1} << 24;
constexpr double kMaxValue = 1e12;   // ms or MB: keeps Duration/Bytes far from overflow
constexpr double kMaxParamMb = 1e9;  // 5e14 parameters per layer: keeps 16 B/param in int64

Status FieldError(std::string_view source, std::string_view path, std::string_view problem) {
  return InvalidArgumentError(fmt::format("{}: field '{}': {}", source, path, problem));
}

std::string Describe(const nlohmann::json& v) {
  return v.is_null() ? "null" : fmt::format("{} {}", v.type_name(), JsonPreview(v));
}

// The stages a table of `model` may list (decoder rows only for encoder-decoder models, MoE
// layer rows only for tables of MoE models).
std::vector<std::string_view> AllowedStages(const TableModel& model, bool with_postprocess) {
  std::vector<std::string_view> out = {kStageNames[0]};
  if (model.kind == ModelKind::kEncoderDecoder) out.push_back(kStageNames[1]);
  if (model.moe.has_value()) out.push_back(kStageNames[3]);
  if (with_postprocess) out.push_back(kStageNames[2]);
  return out;
}

int StageIndex(std::string_view name) {
  for (int i = 0; i < kNumTableStages; ++i) {
    if (kStageNames[i] == name) return i;
  }
  return -1;
}

// The value of a JSON number that is whole and within [lo, hi] (2 and 2.0 alike).
bool IntegerIn(const nlohmann::json& v, int64_t lo, int64_t hi, int64_t* out) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) return false;
    *out = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    *out = v.get<int64_t>();
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!(std::floor(d) == d && std::fabs(d) <= static_cast<double>(hi))) return false;
    *out = static_cast<int64_t>(d);
  } else {
    return false;
  }
  return *out >= lo && *out <= hi;
}

// Reads an array of positive integers (strictly ascending) at `path`.
Status ReadMbs(const nlohmann::json& a, std::string_view source, const std::string& path,
               std::vector<int64_t>* out) {
  if (!a.is_array() || a.empty()) {
    return FieldError(
        source, path,
        fmt::format("must be a non-empty array of micro-batch sizes, got {}", Describe(a)));
  }
  out->reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const nlohmann::json& v = a[i];
    const std::string at = fmt::format("{}[{}]", path, i);
    int64_t m = 0;
    if (!IntegerIn(v, 1, kMaxMbs, &m)) {
      return FieldError(source, at,
                        fmt::format("must be an integer in [1, {}], got {}", kMaxMbs, Describe(v)));
    }
    if (!out->empty() && m <= out->back()) {
      return FieldError(source, at,
                        fmt::format("micro-batch sizes must be strictly ascending: got {} after {}",
                                    m, out->back()));
    }
    out->push_back(m);
  }
  return Status::Ok();
}

Status ReadValues(const nlohmann::json& a, std::string_view source, const std::string& path,
                  size_t expected, std::vector<double>* out) {
  if (!a.is_array()) {
    return FieldError(source, path,
                      fmt::format("must be an array of numbers, got {}", Describe(a)));
  }
  if (a.size() != expected) {
    return FieldError(source, path,
                      fmt::format("must have one value per micro-batch size: {} in 'mbs', {} here",
                                  expected, a.size()));
  }
  out->reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const nlohmann::json& v = a[i];
    const double x = v.is_number() ? v.get<double>() : 0.0;
    if (!v.is_number() || !std::isfinite(x) || x <= 0 || x > kMaxValue) {
      return FieldError(source, fmt::format("{}[{}]", path, i),
                        fmt::format("must be a positive finite number (at most {:g}), got {}",
                                    kMaxValue, Describe(v)));
    }
    out->push_back(x);
  }
  return Status::Ok();
}

// One series: an array of rows. `pair_keys`: rows are keyed by enc_seqlen + dec_seqlen.
Status ReadSeries(const nlohmann::json& a, std::string_view source, const std::string& path,
                  bool pair_keys, CostSeries* out) {
  if (!a.is_array()) {
    return FieldError(source, path, fmt::format("must be an array of rows, got {}", Describe(a)));
  }
  std::set<std::pair<int64_t, int64_t>> keys;
  for (size_t k = 0; k < a.size(); ++k) {
    const std::string at = fmt::format("{}[{}]", path, k);
    JsonObjectReader r(a[k], std::string(source), at);
    SLUICE_RETURN_IF_ERROR(r.status());
    CostRow row;
    std::string key_field = "seqlen";
    if (pair_keys) {
      SLUICE_RETURN_IF_ERROR(r.Int("enc_seqlen", &row.seqlen, 1, kMaxSeqlen));
      SLUICE_RETURN_IF_ERROR(r.Int("dec_seqlen", &row.dec_seqlen, 1, kMaxSeqlen));
      key_field = "dec_seqlen";
    } else {
      SLUICE_RETURN_IF_ERROR(r.Int("seqlen", &row.seqlen, 1, kMaxSeqlen));
    }
    const nlohmann::json* mbs = r.Child("mbs");
    if (mbs == nullptr) return r.Error("mbs", "is required (an array of micro-batch sizes)");
    SLUICE_RETURN_IF_ERROR(ReadMbs(*mbs, source, r.FieldPath("mbs"), &row.mbs));
    const nlohmann::json* value = r.Child("value");
    if (value == nullptr) return r.Error("value", "is required (an array of numbers)");
    SLUICE_RETURN_IF_ERROR(
        ReadValues(*value, source, r.FieldPath("value"), row.mbs.size(), &row.value));
    SLUICE_RETURN_IF_ERROR(r.Finish());
    if (!keys.emplace(row.seqlen, row.dec_seqlen).second) {
      return r.Error(key_field, pair_keys
                                    ? fmt::format("duplicate row for enc_seqlen {}, dec_seqlen {}",
                                                  row.seqlen, row.dec_seqlen)
                                    : fmt::format("duplicate row for seqlen {}", row.seqlen));
    }
    out->push_back(std::move(row));
  }
  return Status::Ok();
}

// time_ms: keys "<stage>_forward" / "<stage>_backward".
Status ReadTimes(const nlohmann::json& j, std::string_view source, const std::string& path,
                 const TableModel& model, TableConfig* config) {
  if (!j.is_object()) {
    return FieldError(source, path, fmt::format("must be an object, got {}", Describe(j)));
  }
  std::vector<std::string> allowed_keys;
  for (std::string_view stage : AllowedStages(model, /*with_postprocess=*/true)) {
    allowed_keys.push_back(fmt::format("{}_forward", stage));
    allowed_keys.push_back(fmt::format("{}_backward", stage));
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    const std::string at = fmt::format("{}.{}", path, key);
    bool known = false;
    for (const std::string& a : allowed_keys) known = known || a == key;
    if (!known) {
      std::vector<std::string_view> views(allowed_keys.begin(), allowed_keys.end());
      return FieldError(
          source, at, fmt::format("unknown stage key; allowed keys here: {}", JoinAllowed(views)));
    }
    const size_t cut = key.rfind('_');
    const int stage = StageIndex(std::string_view(key).substr(0, cut));
    const bool forward = key.substr(cut + 1) == "forward";
    const bool pair = stage == static_cast<int>(TableStage::kDecoder);
    CostSeries* series = forward ? &config->forward_ms[stage] : &config->backward_ms[stage];
    SLUICE_RETURN_IF_ERROR(ReadSeries(*it, source, at, pair, series));
  }
  return Status::Ok();
}

// stored_activation_mb / peak_activation_mb: keys "encoder" (and "decoder").
Status ReadMemory(const nlohmann::json& j, std::string_view source, const std::string& path,
                  const TableModel& model, std::array<CostSeries, kNumTableStages>* out) {
  if (!j.is_object()) {
    return FieldError(source, path, fmt::format("must be an object, got {}", Describe(j)));
  }
  const std::vector<std::string_view> allowed = AllowedStages(model, /*with_postprocess=*/false);
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string at = fmt::format("{}.{}", path, it.key());
    bool known = false;
    for (std::string_view a : allowed) known = known || a == it.key();
    if (!known) {
      return FieldError(
          source, at,
          fmt::format("unknown stage key; allowed keys here: {}", JoinAllowed(allowed)));
    }
    const int stage = StageIndex(it.key());
    SLUICE_CHECK(stage >= 0 && stage < kNumTableStages);  // `allowed` holds table stages only
    SLUICE_RETURN_IF_ERROR(ReadSeries(
        *it, source, at, stage == static_cast<int>(TableStage::kDecoder), &(*out)[stage]));
  }
  return Status::Ok();
}

Status ReadParams(const nlohmann::json& j, std::string_view source, const std::string& path,
                  const TableModel& model, TableConfig* config) {
  if (!j.is_object()) {
    return FieldError(source, path, fmt::format("must be an object, got {}", Describe(j)));
  }
  std::vector<std::string_view> allowed = {"embedding"};
  for (std::string_view s : AllowedStages(model, /*with_postprocess=*/false)) allowed.push_back(s);
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string at = fmt::format("{}.{}", path, it.key());
    bool known = false;
    for (std::string_view a : allowed) known = known || a == it.key();
    if (!known) {
      return FieldError(source, at,
                        fmt::format("unknown key; allowed keys here: {}", JoinAllowed(allowed)));
    }
    const nlohmann::json& v = *it;
    const double x = v.is_number() ? v.get<double>() : 0.0;
    if (!v.is_number() || !std::isfinite(x) || x <= 0 || x > kMaxParamMb) {
      return FieldError(source, at,
                        fmt::format("must be a positive number of MB (10^6 bytes), at most {:g}, "
                                    "got {}",
                                    kMaxParamMb, Describe(v)));
    }
    if (it.key() == "embedding") {
      config->embedding_param_mb = x;
    } else {
      config->param_mb[StageIndex(it.key())] = x;
    }
  }
  return Status::Ok();
}

Status ReadModel(const nlohmann::json& j, std::string_view source, TableModel* model) {
  JsonObjectReader r(j, std::string(source), "model");
  SLUICE_RETURN_IF_ERROR(r.status());
  SLUICE_RETURN_IF_ERROR(r.String("name", &model->name));
  std::string kind;
  SLUICE_RETURN_IF_ERROR(r.Enum("kind", &kind, kKindNames));
  model->kind = kind == kKindNames[1] ? ModelKind::kEncoderDecoder : ModelKind::kDecoderOnly;
  SLUICE_RETURN_IF_ERROR(r.Int("hidden", &model->hidden, 1, kMaxWidth));
  SLUICE_RETURN_IF_ERROR(r.Int("heads", &model->heads, 1, kMaxWidth));
  SLUICE_RETURN_IF_ERROR(r.OptionalInt("kv_channels", &model->kv_channels, 1, kMaxWidth));
  SLUICE_RETURN_IF_ERROR(r.Int("ffn_hidden", &model->ffn_hidden, 1, kMaxWidth));
  if (const nlohmann::json* moe = r.Child("moe")) {
    if (model->kind != ModelKind::kDecoderOnly) {
      return r.Error("moe", "MoE layer tables describe decoder-only models only");
    }
    SLUICE_ASSIGN_OR_RETURN(model->moe, MoeSpecFromJson(*moe, source, r.FieldPath("moe")));
  }
  if (const nlohmann::json* stages = r.Child("profiled_stages")) {
    if (!stages->is_array()) {
      return r.Error("profiled_stages",
                     fmt::format("must be an array of strings, got {}", Describe(*stages)));
    }
    for (size_t i = 0; i < stages->size(); ++i) {
      if (!(*stages)[i].is_string()) {
        return FieldError(source, fmt::format("model.profiled_stages[{}]", i),
                          fmt::format("must be a string, got {}", Describe((*stages)[i])));
      }
      model->profiled_stages.push_back((*stages)[i].get<std::string>());
    }
  }
  return r.Finish();
}

Status ReadConfig(const nlohmann::json& j, std::string_view source, const std::string& path,
                  const TableModel& model, TableConfig* config) {
  JsonObjectReader r(j, std::string(source), path);
  SLUICE_RETURN_IF_ERROR(r.status());
  SLUICE_RETURN_IF_ERROR(r.Int("tp", &config->tp, 1, kMaxTp));
  std::string rc;
  SLUICE_RETURN_IF_ERROR(r.Enum("recompute", &rc, kRecomputeNames));
  SLUICE_ASSIGN_OR_RETURN(config->recompute, ParseRecompute(rc));
  const nlohmann::json* times = r.Child("time_ms");
  if (times == nullptr) return r.Error("time_ms", "is required (an object of stage series)");
  SLUICE_RETURN_IF_ERROR(ReadTimes(*times, source, r.FieldPath("time_ms"), model, config));
  if (const nlohmann::json* m = r.Child("stored_activation_mb")) {
    SLUICE_RETURN_IF_ERROR(ReadMemory(*m, source, r.FieldPath("stored_activation_mb"), model,
                                      &config->stored_activation_mb));
  }
  if (const nlohmann::json* m = r.Child("peak_activation_mb")) {
    SLUICE_RETURN_IF_ERROR(ReadMemory(*m, source, r.FieldPath("peak_activation_mb"), model,
                                      &config->peak_activation_mb));
  }
  if (const nlohmann::json* p = r.Child("param_mb")) {
    SLUICE_RETURN_IF_ERROR(ReadParams(*p, source, r.FieldPath("param_mb"), model, config));
  }
  return r.Finish();
}

// moe_parts: {"slices": n, "time_ms": {"<part>_forward": rows, "<part>_backward": rows}}.
Status ReadMoeParts(const nlohmann::json& j, std::string_view source, const TableModel& model,
                    MoePartsTable* out) {
  JsonObjectReader r(j, std::string(source), "moe_parts");
  SLUICE_RETURN_IF_ERROR(r.status());
  if (!model.moe.has_value()) {
    return FieldError(source, "moe_parts",
                      "only tables of MoE models have MoE layer parts (model.moe is absent)");
  }
  SLUICE_RETURN_IF_ERROR(r.Int("slices", &out->slices, 2, kMaxSlices));
  const nlohmann::json* times = r.Child("time_ms");
  if (times == nullptr) return r.Error("time_ms", "is required (an object of part series)");
  const std::string path = r.FieldPath("time_ms");
  if (!times->is_object()) {
    return FieldError(source, path, fmt::format("must be an object, got {}", Describe(*times)));
  }
  std::vector<std::string> allowed;
  for (std::string_view part : kMoePartNames) {
    allowed.push_back(fmt::format("{}_forward", part));
    allowed.push_back(fmt::format("{}_backward", part));
  }
  for (auto it = times->begin(); it != times->end(); ++it) {
    const std::string at = fmt::format("{}.{}", path, it.key());
    int index = -1;
    for (size_t i = 0; i < allowed.size(); ++i) {
      if (allowed[i] == it.key()) index = static_cast<int>(i);
    }
    if (index < 0) {
      std::vector<std::string_view> views(allowed.begin(), allowed.end());
      return FieldError(source, at,
                        fmt::format("unknown part key; allowed keys here: {}", JoinAllowed(views)));
    }
    CostSeries* series =
        index % 2 == 0 ? &out->forward_ms[index / 2] : &out->backward_ms[index / 2];
    SLUICE_RETURN_IF_ERROR(ReadSeries(*it, source, at, /*pair_keys=*/false, series));
  }
  return r.Finish();
}

nlohmann::json SeriesToJson(const CostSeries& series, bool pair_keys) {
  nlohmann::json out = nlohmann::json::array();
  for (const CostRow& row : series) {
    nlohmann::json r = nlohmann::json::object();
    if (pair_keys) {
      r["enc_seqlen"] = row.seqlen;
      r["dec_seqlen"] = row.dec_seqlen;
    } else {
      r["seqlen"] = row.seqlen;
    }
    r["mbs"] = row.mbs;
    r["value"] = row.value;
    out.push_back(std::move(r));
  }
  return out;
}

Status Mismatch(const LayerCostTable& t, const ModelSpec& m, std::string_view field,
                const std::string& table_value, const std::string& model_value) {
  return InvalidArgumentError(fmt::format(
      "{}: field '{}': the table profiles {} but model '{}' has {} (the table fits only a model "
      "of the same layer shape)",
      t.path, field, table_value, m.name, model_value));
}

}  // namespace

Status CheckTableMatchesModel(const LayerCostTable& t, const ModelSpec& m) {
  const TableModel& tm = t.model;
  if (tm.kind != m.kind) {
    return Mismatch(t, m, "model.kind", std::string(ModelKindName(tm.kind)),
                    std::string(ModelKindName(m.kind)));
  }
  if (tm.hidden != m.hidden) {
    return Mismatch(t, m, "model.hidden", std::to_string(tm.hidden), std::to_string(m.hidden));
  }
  if (tm.heads != m.heads) {
    return Mismatch(t, m, "model.heads", std::to_string(tm.heads), std::to_string(m.heads));
  }
  const int64_t table_head_dim = tm.kv_channels > 0 ? tm.kv_channels : tm.hidden / tm.heads;
  if (table_head_dim != m.HeadDim()) {
    return Mismatch(t, m, "model.kv_channels", fmt::format("head width {}", table_head_dim),
                    fmt::format("head width {}", m.HeadDim()));
  }
  if (tm.ffn_hidden != m.ffn_hidden) {
    return Mismatch(t, m, "model.ffn_hidden", std::to_string(tm.ffn_hidden),
                    std::to_string(m.ffn_hidden));
  }
  const int64_t kv = m.kv_heads > 0 ? m.kv_heads : m.heads;
  if (kv != m.heads) {
    return Mismatch(t, m, "model.heads", "multi-head attention",
                    fmt::format("grouped-query attention with {} kv heads", kv));
  }
  if (m.mlp != MlpKind::kGelu) {
    return Mismatch(t, m, "model", "a two-matrix (GELU/ReLU) MLP", "a SwiGLU MLP");
  }
  auto describe = [&](const std::optional<MoeSpec>& moe, int64_t ffn) -> std::string {
    if (!moe.has_value()) return "a dense model";
    return fmt::format(
        "MoE layers of {} experts, top-{}, capacity factor {:g}, expert width {}", moe->experts,
        moe->top_k, moe->capacity_factor, moe->expert_ffn_hidden > 0 ? moe->expert_ffn_hidden : ffn);
  };
  // The rows measure one dense and one MoE layer, whatever the interval between MoE layers: a
  // table serves any interval (ProfiledCostModel requires the rows the model's mix needs).
  auto normalised = [](std::optional<MoeSpec> moe, int64_t ffn) {
    if (moe.has_value() && moe->expert_ffn_hidden == 0) moe->expert_ffn_hidden = ffn;
    if (moe.has_value()) moe->layer_interval = 1;
    if (moe.has_value()) moe->drop_policy = MoeDropPolicy::kChoice;  // routing, not cost
    return moe;
  };
  if (normalised(tm.moe, tm.ffn_hidden) != normalised(m.moe, m.ffn_hidden)) {
    return Mismatch(t, m, "model.moe", describe(tm.moe, tm.ffn_hidden),
                    describe(m.moe, m.ffn_hidden));
  }
  return Status::Ok();
}

std::string_view TableStageName(TableStage stage) { return kStageNames[static_cast<int>(stage)]; }

std::string_view MoePartName(MoePart part) { return kMoePartNames[static_cast<int>(part)]; }

std::optional<Duration> MoeSliceOverhead(const LayerCostTable& table) {
  if (!table.moe_parts.has_value()) return std::nullopt;
  const MoePartsTable& p = *table.moe_parts;
  const auto e = static_cast<size_t>(MoePart::kExperts);
  const auto s = static_cast<size_t>(MoePart::kExpertsSliced);
  // (seqlen, mbs) -> value, per series.
  auto points = [](const CostSeries& series) {
    std::map<std::pair<int64_t, int64_t>, double> out;
    for (const CostRow& row : series) {
      for (size_t i = 0; i < row.mbs.size(); ++i) out[{row.seqlen, row.mbs[i]}] = row.value[i];
    }
    return out;
  };
  const auto ef = points(p.forward_ms[e]), eb = points(p.backward_ms[e]);
  const auto sf = points(p.forward_ms[s]), sb = points(p.backward_ms[s]);
  std::vector<double> per_piece;
  for (const auto& [key, sliced_f] : sf) {
    if (ef.count(key) == 0 || eb.count(key) == 0 || sb.count(key) == 0) continue;
    per_piece.push_back(((sliced_f - ef.at(key)) + (sb.at(key) - eb.at(key))) /
                        (2.0 * static_cast<double>(p.slices)));
  }
  if (per_piece.empty()) return std::nullopt;
  std::sort(per_piece.begin(), per_piece.end());
  const size_t n = per_piece.size();
  const double median =
      n % 2 == 1 ? per_piece[n / 2] : (per_piece[n / 2 - 1] + per_piece[n / 2]) / 2.0;
  return Duration::Millis(std::max(0.0, median));
}

const TableConfig* LayerCostTable::Find(int64_t tp, Recompute rc) const {
  for (const TableConfig& c : configs) {
    if (c.tp == tp && c.recompute == rc) return &c;
  }
  return nullptr;
}

StatusOr<LayerCostTable> LayerCostTableFromJson(const nlohmann::json& j, std::string_view source) {
  JsonObjectReader r(j, std::string(source));
  SLUICE_RETURN_IF_ERROR(r.status());
  LayerCostTable table;
  table.path = std::string(source);
  std::string format;
  SLUICE_RETURN_IF_ERROR(r.String("format", &format));
  if (format != kLayerCostTableFormat) {
    return r.Error("format", fmt::format("must be '{}', got '{}'", kLayerCostTableFormat, format));
  }
  SLUICE_RETURN_IF_ERROR(r.String("measured_on", &table.measured_on));
  SLUICE_RETURN_IF_ERROR(r.String("source", &table.provenance));
  SLUICE_RETURN_IF_ERROR(r.OptionalString("layout", &table.layout));
  const nlohmann::json* model = r.Child("model");
  if (model == nullptr) return r.Error("model", "is required (an object describing the model)");
  SLUICE_RETURN_IF_ERROR(ReadModel(*model, source, &table.model));
  const nlohmann::json* tables = r.Child("tables");
  if (tables == nullptr || !tables->is_array() || tables->empty()) {
    return r.Error("tables", fmt::format("is required (a non-empty array of per-(tp, recompute) "
                                         "entries), got {}",
                                         tables == nullptr ? "nothing" : Describe(*tables)));
  }
  for (size_t i = 0; i < tables->size(); ++i) {
    const std::string path = fmt::format("tables[{}]", i);
    TableConfig config;
    SLUICE_RETURN_IF_ERROR(ReadConfig((*tables)[i], source, path, table.model, &config));
    if (table.Find(config.tp, config.recompute) != nullptr) {
      return FieldError(source, path,
                        fmt::format("duplicate entry for tp {}, recompute '{}'", config.tp,
                                    RecomputeName(config.recompute)));
    }
    table.configs.push_back(std::move(config));
  }
  if (const nlohmann::json* parts = r.Child("moe_parts")) {
    table.moe_parts.emplace();
    SLUICE_RETURN_IF_ERROR(ReadMoeParts(*parts, source, table.model, &*table.moe_parts));
  }
  SLUICE_RETURN_IF_ERROR(r.Finish());
  return table;
}

StatusOr<LayerCostTable> ReadLayerCostTable(const std::string& path) {
  SLUICE_ASSIGN_OR_RETURN(nlohmann::json j, ReadJsonFile(path));
  return LayerCostTableFromJson(j, path);
}

nlohmann::json LayerCostTableToJson(const LayerCostTable& table) {
  nlohmann::json j = nlohmann::json::object();
  j["format"] = kLayerCostTableFormat;
  j["measured_on"] = table.measured_on;
  j["source"] = table.provenance;
  if (!table.layout.empty()) j["layout"] = table.layout;
  nlohmann::json m = nlohmann::json::object();
  m["name"] = table.model.name;
  m["kind"] = ModelKindName(table.model.kind);
  m["hidden"] = table.model.hidden;
  m["heads"] = table.model.heads;
  if (table.model.kv_channels > 0) m["kv_channels"] = table.model.kv_channels;
  m["ffn_hidden"] = table.model.ffn_hidden;
  if (table.model.moe.has_value()) m["moe"] = MoeSpecToJson(*table.model.moe);
  if (!table.model.profiled_stages.empty()) m["profiled_stages"] = table.model.profiled_stages;
  j["model"] = std::move(m);
  nlohmann::json tables = nlohmann::json::array();
  for (const TableConfig& c : table.configs) {
    nlohmann::json t = nlohmann::json::object();
    t["tp"] = c.tp;
    t["recompute"] = RecomputeName(c.recompute);
    nlohmann::json times = nlohmann::json::object();
    nlohmann::json stored = nlohmann::json::object();
    nlohmann::json peak = nlohmann::json::object();
    nlohmann::json params = nlohmann::json::object();
    for (int s = 0; s < kNumTableStages; ++s) {
      const std::string name(kStageNames[s]);
      const bool pair = s == static_cast<int>(TableStage::kDecoder);
      if (!c.forward_ms[s].empty()) times[name + "_forward"] = SeriesToJson(c.forward_ms[s], pair);
      if (!c.backward_ms[s].empty()) {
        times[name + "_backward"] = SeriesToJson(c.backward_ms[s], pair);
      }
      if (!c.stored_activation_mb[s].empty()) {
        stored[name] = SeriesToJson(c.stored_activation_mb[s], pair);
      }
      if (!c.peak_activation_mb[s].empty()) {
        peak[name] = SeriesToJson(c.peak_activation_mb[s], pair);
      }
      if (c.param_mb[s].has_value()) params[name] = *c.param_mb[s];
    }
    if (c.embedding_param_mb.has_value()) params["embedding"] = *c.embedding_param_mb;
    t["time_ms"] = std::move(times);
    if (!stored.empty()) t["stored_activation_mb"] = std::move(stored);
    if (!peak.empty()) t["peak_activation_mb"] = std::move(peak);
    if (!params.empty()) t["param_mb"] = std::move(params);
    tables.push_back(std::move(t));
  }
  j["tables"] = std::move(tables);
  if (table.moe_parts.has_value()) {
    const MoePartsTable& p = *table.moe_parts;
    nlohmann::json times = nlohmann::json::object();
    for (int k = 0; k < kNumMoeParts; ++k) {
      const std::string name(kMoePartNames[k]);
      if (!p.forward_ms[k].empty()) times[name + "_forward"] = SeriesToJson(p.forward_ms[k], false);
      if (!p.backward_ms[k].empty()) {
        times[name + "_backward"] = SeriesToJson(p.backward_ms[k], false);
      }
    }
    j["moe_parts"] = {{"slices", p.slices}, {"time_ms", std::move(times)}};
  }
  return j;
}

}  // namespace sluice
