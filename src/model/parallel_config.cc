#include "model/parallel_config.h"

#include <fmt/core.h>

#include <algorithm>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "base/json_util.h"
#include "base/paths.h"
#include "base/split.h"
#include "model/chunk_cut.h"
#include "model/hetero_config.h"
#include "model/spec_util.h"

namespace sluice {
namespace {

using model_internal::CheckIntRange;
using model_internal::Divisors;
using model_internal::FieldError;
using model_internal::JoinInts;

// Degrees up to 2^20 keep dp*pp*tp (< 2^60) and pp*vpp inside int64; dp*pp*tp*cp is checked
// against kMaxDevices.
constexpr int64_t kMaxDegree = int64_t{1} << 20;
constexpr int64_t kMaxZero = 3;
constexpr int64_t kMaxDevices = int64_t{1} << 60;
constexpr double kMaxMemoryLimitMb = 1e9;  // 10^9 MB = 1 PB

constexpr std::string_view kKeys[] = {
    "dp",       "pp", "tp", "cp", "ep", "vpp", "zero", "memory_limit_mb", "memory_reserve_mb",
    "layer_cut", "order"};

constexpr std::string_view kOrders = "tp-cp-dp-pp, tp-cp-pp-dp";

std::optional<RankOrder> ParseOrder(std::string_view name) {
  if (name == "tp-cp-dp-pp") return RankOrder::kDataInner;
  if (name == "tp-cp-pp-dp") return RankOrder::kPipelineInner;
  return std::nullopt;
}

// The degree field called `key`, or nullptr for "zero" and the memory keys.
int64_t* Degree(ParallelConfig& config, std::string_view key) {
  if (key == "dp") return &config.dp;
  if (key == "pp") return &config.pp;
  if (key == "tp") return &config.tp;
  if (key == "cp") return &config.cp;
  if (key == "ep") return &config.ep;
  if (key == "vpp") return &config.vpp;
  return nullptr;
}

// Whether tp can split `model`'s attention heads and MLP widths; *why is the reason it cannot.
bool TpFits(int64_t tp, const ModelSpec& model, std::string* why) {
  if (model.heads % tp != 0) {
    *why = fmt::format("tp = {} does not divide heads = {}", tp, model.heads);
    return false;
  }
  if (model.kv_heads % tp != 0 && tp % model.kv_heads != 0) {
    *why = fmt::format("tp = {} and kv_heads = {}: neither divides the other", tp, model.kv_heads);
    return false;
  }
  if (model.ffn_hidden % tp != 0) {
    *why = fmt::format("tp = {} does not divide ffn_hidden = {}", tp, model.ffn_hidden);
    return false;
  }
  if (model.moe.has_value() && model.moe->expert_ffn_hidden % tp != 0) {
    *why = fmt::format("tp = {} does not divide moe.expert_ffn_hidden = {}", tp,
                       model.moe->expert_ffn_hidden);
    return false;
  }
  return true;
}

Status CheckChunks(const ParallelConfig& config, const ModelSpec& model, std::string_view source) {
  const int64_t chunks = config.chunks();
  if (!config.layer_cut.empty()) {
    // ValidateParallelConfig checked the count and each entry's range.
    int64_t sum = 0;
    for (const int64_t n : config.layer_cut) sum += n;
    const int64_t total = model.layers + (model.is_encoder_decoder() ? model.decoder_layers : 0);
    if (sum == total) return Status::Ok();
    return FieldError(
        source, "layer_cut",
        fmt::format("model '{}': the {} chunks hold {} layers, but the model has {} ({}; every "
                    "chunk at least 1)",
                    model.name, chunks, sum, total,
                    model.is_encoder_decoder() ? fmt::format("layers + decoder_layers = {} + {}",
                                                             model.layers, model.decoder_layers)
                                               : fmt::format("layers = {}", model.layers)));
  }
  if (!model.is_encoder_decoder()) {
    if (chunks <= model.layers && model.layers % chunks == 0) return Status::Ok();
    return InvalidArgumentError(
        fmt::format("{}: model '{}': pp*vpp = {} {} layers = {} (allowed: {})", source, model.name,
                    chunks, chunks > model.layers ? "exceeds" : "does not divide", model.layers,
                    JoinInts(Divisors(model.layers))));
  }
  // Encoder-decoder: model/chunk_cut.h's rules.
  if (ChunksFit(model, chunks)) return Status::Ok();
  return InvalidArgumentError(fmt::format(
      "{}: model '{}': pp*vpp = {} cannot split the encoder-decoder model: pp*vpp must be 1, "
      "divide layers + decoder_layers = {} + {}, or be even with pp*vpp/2 dividing both stacks "
      "(allowed: {})",
      source, model.name, chunks, model.layers, model.decoder_layers,
      JoinInts(AllowedChunkCounts(model))));
}

Status CheckTp(const ParallelConfig& config, const ModelSpec& model, std::string_view source) {
  std::string why;
  if (TpFits(config.tp, model, &why)) return Status::Ok();
  std::vector<int64_t> allowed;
  std::string ignored;
  for (int64_t tp : Divisors(model.heads)) {
    if (TpFits(tp, model, &ignored)) allowed.push_back(tp);
  }
  return InvalidArgumentError(fmt::format("{}: model '{}': {} (allowed tp: {})", source, model.name,
                                          why, JoinInts(allowed)));
}

Status CheckEp(const ParallelConfig& config, const ModelSpec& model, std::string_view source) {
  if (config.ep == 1) return Status::Ok();
  if (!model.moe.has_value()) {
    return InvalidArgumentError(fmt::format(
        "{}: model '{}': ep = {} needs an MoE model, and this one is dense (allowed ep: 1)", source,
        model.name, config.ep));
  }
  // Expert-parallel groups are ep consecutive data-parallel replicas (plan/lower.h): groups
  // inside tensor-parallel ranks are not lowered.
  if (model.moe->experts % config.ep == 0 && config.dp % config.ep == 0) return Status::Ok();
  return InvalidArgumentError(fmt::format(
      "{}: model '{}': ep = {} must divide both moe.experts = {} and dp = {} (expert-parallel "
      "groups are ep data-parallel replicas) (allowed ep: {})",
      source, model.name, config.ep, model.moe->experts, config.dp,
      JoinInts(Divisors(std::gcd(model.moe->experts, config.dp)))));
}

Status CheckCp(const ParallelConfig& config, const ModelSpec& model, std::string_view source) {
  if (config.cp == 1 || !model.is_encoder_decoder()) return Status::Ok();
  return InvalidArgumentError(
      fmt::format("{}: model '{}': cp = {} needs a decoder-only model; context parallelism of "
                  "encoder-decoder models is not supported (allowed cp: 1)",
                  source, model.name, config.cp));
}

Status CheckCluster(const ParallelConfig& config, const ClusterSpec& cluster,
                    std::string_view source) {
  if (config.devices() > cluster.num_devices()) {
    if (config.cp == 1) {
      return InvalidArgumentError(fmt::format(
          "{}: cluster '{}': dp*pp*tp = {}*{}*{} = {} devices, but the cluster has {}", source,
          cluster.name, config.dp, config.pp, config.tp, config.devices(), cluster.num_devices()));
    }
    return InvalidArgumentError(fmt::format(
        "{}: cluster '{}': dp*pp*tp*cp = {}*{}*{}*{} = {} devices, but the cluster has {}", source,
        cluster.name, config.dp, config.pp, config.tp, config.cp, config.devices(),
        cluster.num_devices()));
  }
  if (config.memory_limit.has_value() && *config.memory_limit > cluster.device.memory) {
    return FieldError(source, "memory_limit_mb",
                      fmt::format("{:.0f} MB exceeds the {:.0f} MB of memory of device '{}' in "
                                  "cluster '{}'",
                                  config.memory_limit->mb(), cluster.device.memory.mb(),
                                  cluster.device.name, cluster.name));
  }
  if (config.memory_reserve.has_value() && *config.memory_reserve >= cluster.device.memory) {
    return FieldError(
        source, "memory_reserve_mb",
        fmt::format("{:.0f} MB leaves nothing of the {:.0f} MB of memory of device "
                    "'{}' in cluster '{}' (allowed: 0..{:.0f})",
                    config.memory_reserve->mb(), cluster.device.memory.mb(), cluster.device.name,
                    cluster.name, cluster.device.memory.mb() - 1));
  }
  return Status::Ok();
}

Status CheckMemoryLimit(Bytes limit, std::string_view source) {
  return model_internal::CheckPositive(source, "memory_limit_mb", limit.mb(), kMaxMemoryLimitMb);
}

Status CheckMemoryReserve(Bytes reserve, std::string_view source) {
  if (reserve.mb() >= 0 && reserve.mb() <= kMaxMemoryLimitMb) return Status::Ok();
  return FieldError(
      source, "memory_reserve_mb",
      fmt::format("must be a number in [0, {:.0f}] MB, got {}", kMaxMemoryLimitMb, reserve.mb()));
}

}  // namespace

std::string_view RankOrderName(RankOrder order) {
  return order == RankOrder::kDataInner ? "tp-cp-dp-pp" : "tp-cp-pp-dp";
}

CollectiveRing GradientRing(const ClusterSpec& cluster, const ParallelConfig& par, int64_t pp_index,
                            int64_t first_device) {
  std::vector<int64_t> devices;
  devices.reserve(static_cast<size_t>(par.dp * par.cp));
  for (int64_t d = 0; d < par.dp; ++d) {
    const int64_t rank = d * par.pp + pp_index;
    for (int64_t c = 0; c < par.cp; ++c) {
      devices.push_back(first_device + par.FirstDevice(rank) + c * par.tp);
    }
  }
  return RingOverDevices(cluster, devices);
}

int64_t NodeOfRank(const ClusterSpec& cluster, const ParallelConfig& par, int64_t rank,
                   int64_t first_device) {
  return cluster.NodeOfDevice(first_device + par.FirstDevice(rank));
}

bool RanksCrossNodes(const ClusterSpec& cluster, const ParallelConfig& par, int64_t a, int64_t b,
                     int64_t first_device) {
  const int64_t da = first_device + par.FirstDevice(a), db = first_device + par.FirstDevice(b);
  for (int64_t j = 0; j < par.devices_per_rank(); ++j) {
    if (cluster.NodeOfDevice(da + j) != cluster.NodeOfDevice(db + j)) return true;
  }
  return false;
}

bool SearchesOrder(const ClusterSpec& cluster, const ParallelConfig& par) {
  return par.pp > 1 && par.dp > 1 && cluster.nodes > 1;
}

Bytes ParallelConfig::MemoryLimit(const ClusterSpec& cluster) const {
  return MemoryBudget(memory_limit, memory_reserve, cluster.device);
}

Bytes DefaultMemoryReserve(const DeviceSpec& device) {
  const Bytes reserve = Bytes::GiB(2) + Bytes::Of(device.memory.count() / 20);
  return std::min(reserve, Bytes::Of(device.memory.count() / 2));
}

Bytes MemoryBudget(std::optional<Bytes> limit, std::optional<Bytes> reserve,
                   const DeviceSpec& device) {
  if (limit.has_value()) return *limit;
  return device.memory - reserve.value_or(DefaultMemoryReserve(device));
}

Status ValidateParallelConfig(const ParallelConfig& config, std::string_view source) {
  const std::pair<std::string_view, int64_t> degrees[] = {{"dp", config.dp}, {"pp", config.pp},
                                                          {"tp", config.tp}, {"cp", config.cp},
                                                          {"ep", config.ep}, {"vpp", config.vpp}};
  for (const auto& [key, degree] : degrees) {
    SLUICE_RETURN_IF_ERROR(CheckIntRange(source, key, degree, 1, kMaxDegree));
  }
  if (config.dp * config.pp * config.tp > kMaxDevices / config.cp) {
    return FieldError(source, "cp",
                      fmt::format("dp*pp*tp*cp exceeds 2^60 devices (cp = {})", config.cp));
  }
  SLUICE_RETURN_IF_ERROR(CheckIntRange(source, "zero", config.zero, 0, kMaxZero));
  if (!config.layer_cut.empty()) {
    if (static_cast<int64_t>(config.layer_cut.size()) != config.chunks()) {
      return FieldError(
          source, "layer_cut",
          fmt::format("has {} entries, but pp*vpp = {}*{} = {} chunks need one each",
                      config.layer_cut.size(), config.pp, config.vpp, config.chunks()));
    }
    for (const int64_t n : config.layer_cut) {
      SLUICE_RETURN_IF_ERROR(CheckIntRange(source, "layer_cut", n, 1, kMaxDegree));
    }
  }
  if (config.memory_limit.has_value()) {
    SLUICE_RETURN_IF_ERROR(CheckMemoryLimit(*config.memory_limit, source));
  }
  if (config.memory_reserve.has_value()) {
    SLUICE_RETURN_IF_ERROR(CheckMemoryReserve(*config.memory_reserve, source));
    if (config.memory_limit.has_value()) {
      return FieldError(source, "memory_reserve_mb",
                        "applies only without memory_limit_mb (an explicit limit is the budget "
                        "as given); give one of them");
    }
  }
  return Status::Ok();
}

Status CheckParallelFits(const ParallelConfig& config, const ModelSpec& model,
                         const ClusterSpec* cluster, std::string_view source) {
  SLUICE_RETURN_IF_ERROR(ValidateParallelConfig(config, source));
  SLUICE_RETURN_IF_ERROR(ValidateModelSpec(model, fmt::format("model '{}'", model.name)));
  SLUICE_RETURN_IF_ERROR(CheckChunks(config, model, source));
  SLUICE_RETURN_IF_ERROR(CheckTp(config, model, source));
  SLUICE_RETURN_IF_ERROR(CheckEp(config, model, source));
  SLUICE_RETURN_IF_ERROR(CheckCp(config, model, source));
  if (cluster == nullptr) return Status::Ok();
  SLUICE_RETURN_IF_ERROR(ValidateClusterSpec(*cluster, fmt::format("cluster '{}'", cluster->name)));
  return CheckCluster(config, *cluster, source);
}

StatusOr<ParallelConfig> ParallelConfigFromJson(const nlohmann::json& j, std::string_view source) {
  JsonObjectReader r(j, std::string(source));
  SLUICE_RETURN_IF_ERROR(r.status());
  ParallelConfig config;
  for (std::string_view key : kKeys) {
    if (int64_t* degree = Degree(config, key)) {
      SLUICE_RETURN_IF_ERROR(r.OptionalInt(key, degree, 1, kMaxDegree));
    }
  }
  SLUICE_RETURN_IF_ERROR(r.OptionalInt("zero", &config.zero, 0, kMaxZero));
  if (const nlohmann::json* order = r.Child("order")) {
    const std::optional<RankOrder> o =
        order->is_string() ? ParseOrder(order->get<std::string>()) : std::nullopt;
    if (!o.has_value()) {
      return r.Error("order", fmt::format("must be one of {} (innermost first), got {}", kOrders,
                                          order->dump(-1, ' ', false,
                                                      nlohmann::json::error_handler_t::replace)));
    }
    config.order = *o;
  }
  if (const nlohmann::json* cut = r.Child("layer_cut")) {
    if (!cut->is_array() || cut->empty() || cut->size() > static_cast<size_t>(kMaxDegree)) {
      return r.Error("layer_cut", "must be a non-empty array of integers, one per chunk");
    }
    for (const nlohmann::json& n : *cut) {
      if (!n.is_number_integer()) {
        return r.Error("layer_cut",
                       fmt::format("must hold integers (layers per chunk), got {}", n.dump()));
      }
      config.layer_cut.push_back(n.get<int64_t>());
    }
  }
  double mb = 0;
  SLUICE_RETURN_IF_ERROR(model_internal::ReadPositive(r, "memory_limit_mb", /*required=*/false,
                                                      kMaxMemoryLimitMb, &mb));
  if (mb > 0) config.memory_limit = Bytes::MB(mb);
  if (r.Child("memory_reserve_mb") != nullptr) {
    double reserve = 0;
    SLUICE_RETURN_IF_ERROR(r.Double("memory_reserve_mb", &reserve, 0, kMaxMemoryLimitMb));
    config.memory_reserve = Bytes::MB(reserve);
  }
  SLUICE_RETURN_IF_ERROR(r.Finish());
  SLUICE_RETURN_IF_ERROR(ValidateParallelConfig(config, source));
  return config;
}

nlohmann::json ParallelConfigToJson(const ParallelConfig& config) {
  nlohmann::json j = {{"dp", config.dp}, {"pp", config.pp},   {"tp", config.tp},
                      {"ep", config.ep}, {"vpp", config.vpp}, {"zero", config.zero}};
  if (config.cp != 1) j["cp"] = config.cp;
  if (!config.layer_cut.empty()) j["layer_cut"] = config.layer_cut;
  if (config.order != RankOrder::kDataInner) j["order"] = RankOrderName(config.order);
  if (config.memory_limit.has_value()) {
    j["memory_limit_mb"] = model_internal::NumberJson(config.memory_limit->mb());
  }
  if (config.memory_reserve.has_value()) {
    j["memory_reserve_mb"] = model_internal::NumberJson(config.memory_reserve->mb());
  }
  return j;
}

StatusOr<ParallelConfig> ResolveParallel(std::string_view spec_or_file) {
  const std::string source = fmt::format("--parallel '{}'", spec_or_file);
  if (spec_or_file.find('=') == std::string_view::npos) {
    const std::string path(spec_or_file);
    if (!spec_or_file.empty() && FileExists(path)) {
      SLUICE_ASSIGN_OR_RETURN(nlohmann::json j, ReadJsonFile(path));
      return ParallelConfigFromJson(j, path);
    }
    return InvalidArgumentError(fmt::format(
        "{}: expected K=V pairs separated by commas (keys {}; e.g. dp=2,pp=4) or a JSON file; "
        "no such file",
        source, JoinAllowed(kKeys)));
  }
  return ParseParallelPairs(spec_or_file, source);
}

StatusOr<ParallelConfig> ParseParallelPairs(std::string_view spec_or_file,
                                            std::string_view source) {
  const std::string allowed = JoinAllowed(kKeys);
  ParallelConfig config;
  std::set<std::string, std::less<>> seen;
  for (const std::string_view item : SplitOn(spec_or_file, ',')) {
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      return InvalidArgumentError(
          fmt::format("{}: '{}' is not K=V (keys {}; e.g. dp=2,pp=4)", source, item, allowed));
    }
    const std::string_view key = item.substr(0, eq);
    const std::string_view value = item.substr(eq + 1);
    bool known = false;
    for (std::string_view k : kKeys) known = known || k == key;
    if (!known) {
      return FieldError(source, key, fmt::format("unknown key; allowed keys: {}", allowed));
    }
    if (!seen.emplace(key).second) return FieldError(source, key, "is given twice");
    if (key == "order") {
      const std::optional<RankOrder> o = ParseOrder(value);
      if (!o.has_value()) {
        return FieldError(source, key,
                          fmt::format("must be one of {} (innermost first), got '{}'", kOrders,
                                      value));
      }
      config.order = *o;
      continue;
    }
    if (key == "layer_cut") {
      for (const std::string_view part : SplitOn(value, '+')) {
        const std::optional<int64_t> n = model_internal::ParseDecimal(part);
        if (!n.has_value()) {
          return FieldError(source, key,
                            fmt::format("must be layers per chunk joined by '+' (e.g. "
                                        "layer_cut=9+8+8+7), got '{}'",
                                        value));
        }
        SLUICE_RETURN_IF_ERROR(CheckIntRange(source, key, *n, 1, kMaxDegree));
        config.layer_cut.push_back(*n);
        if (config.layer_cut.size() > static_cast<size_t>(kMaxDegree)) {
          return FieldError(source, key, "has more entries than any pipeline has chunks");
        }
      }
      continue;
    }
    int64_t* degree = Degree(config, key);
    const int64_t lo = key == "zero" || key == "memory_reserve_mb" ? 0 : 1;
    const int64_t hi = degree != nullptr ? kMaxDegree
                       : key == "zero"   ? kMaxZero
                                         : static_cast<int64_t>(kMaxMemoryLimitMb);
    const std::optional<int64_t> n = model_internal::ParseDecimal(value);
    if (!n.has_value()) {
      return FieldError(source, key,
                        fmt::format("must be an integer in [{}, {}], got '{}'", lo, hi, value));
    }
    SLUICE_RETURN_IF_ERROR(CheckIntRange(source, key, *n, lo, hi));
    if (degree != nullptr) {
      *degree = *n;
    } else if (key == "zero") {
      config.zero = *n;
    } else if (key == "memory_reserve_mb") {
      config.memory_reserve = Bytes::MB(static_cast<double>(*n));
    } else {
      config.memory_limit = Bytes::MB(static_cast<double>(*n));
    }
  }
  SLUICE_RETURN_IF_ERROR(ValidateParallelConfig(config, source));
  return config;
}

}  // namespace sluice
