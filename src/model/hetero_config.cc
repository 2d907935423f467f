#include "model/hetero_config.h"

#include <fmt/core.h>

#include <string>
#include <vector>

#include "base/json_util.h"
#include "base/paths.h"
#include "base/split.h"

namespace sluice {

int64_t HeteroConfig::devices() const {
  int64_t n = 0;
  for (const ParallelConfig& g : groups) n += g.devices();
  return n;
}

int64_t HeteroConfig::replicas() const {
  int64_t n = 0;
  for (const ParallelConfig& g : groups) n += g.dp;
  return n;
}

std::vector<int64_t> HeteroConfig::DeviceOffsets() const {
  std::vector<int64_t> offsets;
  int64_t at = 0;
  for (const ParallelConfig& g : groups) {
    offsets.push_back(at);
    at += g.devices();
  }
  return offsets;
}

namespace {

std::string DescribeGroup(const ParallelConfig& g, bool limit) {
  std::string s = fmt::format("{} x tp {}", g.dp, g.tp);
  if (g.pp > 1) s += fmt::format(" x pp {}", g.pp);
  if (g.cp > 1) s += fmt::format(" x cp {}", g.cp);
  if (limit && g.memory_limit.has_value()) s += fmt::format(" ({:.0f} MB)", g.memory_limit->mb());
  return s;
}

}  // namespace

std::string DescribeHetero(const HeteroConfig& config) {
  // Memory limits are shown when the groups' differ.
  bool differ = false;
  for (const ParallelConfig& g : config.groups) {
    differ = differ || g.memory_limit != config.groups[0].memory_limit;
  }
  std::string s;
  for (size_t i = 0; i < config.groups.size(); ++i) {
    if (i > 0) s += " + ";
    s += DescribeGroup(config.groups[i], differ);
  }
  if (!config.groups.empty() && config.groups[0].zero > 0) {
    s += fmt::format(", ZeRO-{}", config.groups[0].zero);
  }
  return s;
}

Status CheckHeteroFits(const HeteroConfig& config, const ModelSpec& model,
                       const ClusterSpec& cluster, std::string_view source) {
  if (config.groups.empty()) {
    return InvalidArgumentError(fmt::format(
        "{}: no replica group given (expected groups separated by ';', e.g. dp=4,pp=2;dp=1,tp=8)",
        source));
  }
  if (model.is_encoder_decoder()) {
    return InvalidArgumentError(
        fmt::format("{}: heterogeneous replicas support decoder-only models; model '{}' is an "
                    "encoder-decoder (allowed: a decoder-only model such as gpt-6.7b or llama-7b)",
                    source, model.name));
  }
  std::string sum;
  for (size_t i = 0; i < config.groups.size(); ++i) {
    const ParallelConfig& g = config.groups[i];
    const std::string where = fmt::format("{}: group {}", source, i + 1);
    if (g.vpp != 1) {
      return InvalidArgumentError(fmt::format(
          "{}: field 'vpp' is {}; heterogeneous replicas run vpp = 1 (allowed: 1)", where, g.vpp));
    }
    if (g.ep != 1) {
      return InvalidArgumentError(fmt::format(
          "{}: field 'ep' is {}; heterogeneous replicas run ep = 1 (allowed: 1)", where, g.ep));
    }
    if (!g.layer_cut.empty()) {
      return InvalidArgumentError(fmt::format(
          "{}: field 'layer_cut' is given; heterogeneous replicas cut their layers evenly (the "
          "reduction groups follow the even cuts; allowed: no layer_cut)",
          where));
    }
    if (g.zero > 2) {
      return InvalidArgumentError(fmt::format(
          "{}: field 'zero' is {}; ZeRO-3's per-layer gathers are not planned across groups "
          "(allowed: 0, 1, 2)",
          where, g.zero));
    }
    if (g.zero != config.groups[0].zero) {
      return InvalidArgumentError(
          fmt::format("{}: field 'zero' is {} but group 1's is {}; the groups share one ZeRO stage "
                      "(allowed: {})",
                      where, g.zero, config.groups[0].zero, config.groups[0].zero));
    }
    SLUICE_RETURN_IF_ERROR(CheckParallelFits(g, model, &cluster, where));
    sum += fmt::format("{}{} replicas x {} devices", i > 0 ? " + " : "", g.dp,
                       g.devices_per_rank() * g.pp);
  }
  if (config.devices() != cluster.num_devices()) {
    return InvalidArgumentError(fmt::format(
        "{}: the replica groups use {} devices ({}; dp x pp x tp x cp per group) but cluster "
        "'{}' has {}; the groups must cover every device exactly (allowed: groups summing to {})",
        source, config.devices(), sum, cluster.name, cluster.num_devices(), cluster.num_devices()));
  }
  return Status::Ok();
}

StatusOr<HeteroConfig> HeteroConfigFromJson(const nlohmann::json& j, std::string_view source) {
  if (!j.is_object() || !j.contains("replicas") || !j["replicas"].is_array()) {
    return InvalidArgumentError(
        fmt::format("{}: expected an object {{\"replicas\": [ParallelConfig objects]}}, e.g. "
                    "{{\"replicas\": [{{\"dp\": 4, \"pp\": 2}}, {{\"dp\": 1, \"tp\": 8}}]}}",
                    source));
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() != "replicas") {
      return InvalidArgumentError(
          fmt::format("{}: field '{}': unknown key; allowed keys: \"replicas\"", source, it.key()));
    }
  }
  HeteroConfig config;
  const nlohmann::json& list = j["replicas"];
  for (size_t i = 0; i < list.size(); ++i) {
    SLUICE_ASSIGN_OR_RETURN(
        ParallelConfig g,
        ParallelConfigFromJson(list[i], fmt::format("{}: replicas[{}]", source, i)));
    config.groups.push_back(g);
  }
  return config;
}

nlohmann::json HeteroConfigToJson(const HeteroConfig& config) {
  nlohmann::json list = nlohmann::json::array();
  for (const ParallelConfig& g : config.groups) list.push_back(ParallelConfigToJson(g));
  return nlohmann::json{{"replicas", list}};
}

StatusOr<HeteroConfig> ResolveHetero(std::string_view spec_or_file, std::string_view source) {
  if (spec_or_file.find('=') == std::string_view::npos) {
    const std::string path(spec_or_file);
    if (!spec_or_file.empty() && FileExists(path)) {
      SLUICE_ASSIGN_OR_RETURN(nlohmann::json j, ReadJsonFile(path));
      return HeteroConfigFromJson(j, path);
    }
    return InvalidArgumentError(fmt::format(
        "{} '{}': expected replica groups separated by ';', each K=V pairs of --parallel (dp = "
        "replicas of that shape; e.g. dp=4,pp=2;dp=1,tp=8) or a JSON file; no such file",
        source, spec_or_file));
  }
  HeteroConfig config;
  int64_t index = 0;
  for (const std::string_view item : SplitOn(spec_or_file, ';')) {
    ++index;
    SLUICE_ASSIGN_OR_RETURN(
        ParallelConfig g,
        ParseParallelPairs(item, fmt::format("{}: group {} '{}'", source, index, item)));
    config.groups.push_back(g);
  }
  return config;
}

}  // namespace sluice
