#include "model/cluster_spec.h"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>

#include "base/json_util.h"
#include "base/paths.h"
#include "model/spec_util.h"

namespace sluice {
namespace {

using model_internal::CheckIntRange;
using model_internal::CheckPositive;
using model_internal::DivideForJson;
using model_internal::FieldError;
using model_internal::JoinNames;
using model_internal::NumberJson;
using model_internal::ReadPositive;

// JSON units: field value x scale = the struct's unit.
constexpr double kTeraFlops = 1e12;  // peak_tflops -> FLOP/s
constexpr double kGigaBytes = 1e9;   // *_gb_per_s -> bytes/s (decimal, as datasheets give it)

// Upper bounds far above any real device; they keep every product in range.
constexpr int64_t kMaxNodes = 100000;
constexpr int64_t kMaxDevicesPerNode = 1024;
constexpr double kMaxTflops = 1e6;
constexpr double kMaxMemoryGib = 1e6;
constexpr double kMaxGbPerS = 1e6;
constexpr double kMaxLatencyUs = 1e6;
// Lower bounds: slower devices and links than these make a transfer or a layer take longer than
// the int64 nanoseconds of Duration can count (1e-15 GB/s overflowed into "negative" times).
constexpr double kMinTflops = 1e-3;  // 1 GFLOP/s
constexpr double kMinGbPerS = 1e-3;  // 1 MB/s

// OK when lo <= value <= hi (finite); else "must be a number in [lo, hi], got value".
Status CheckRange(std::string_view source, std::string_view field, double value, double lo,
                  double hi) {
  if (std::isfinite(value) && value >= lo && value <= hi) return Status::Ok();
  return FieldError(source, field,
                    fmt::format("must be a number in [{}, {}], got {}", lo, hi, value));
}

constexpr int64_t kPresetDevicesPerNode = 8;

struct DevicePreset {
  DeviceSpec device;
  int64_t devices_per_node = kPresetDevicesPerNode;
  LinkSpec intra_node;
  LinkSpec inter_node;
  RingCrossing ring_crossing = RingCrossing::kAllMembers;
};

constexpr std::array<std::string_view, 2> kRingCrossingNames = {"all-members", "one-connection"};

std::vector<DevicePreset> DevicePresets() {
  std::vector<DevicePreset> presets;

  // NVIDIA A100-SXM4-40GB (A100 datasheet): 312 TFLOP/s dense BF16/FP16 tensor core, 40 GiB
  // HBM2 at 1555 GB/s. Node = AWS p4d.24xlarge, where data/profiles was measured.
  DevicePreset a100_40;
  a100_40.device = {"a100-40g", 312e12, Bytes::GiB(40), 1555e9};
  // NVLink 3 through NVSwitch: 600 GB/s per GPU both directions together = 300 GB/s each way
  // (A100 datasheet). Latency: a few us, NCCL's small-message cost on NVLink (modelling choice).
  a100_40.intra_node = {300e9, Duration::Micros(3)};
  // p4d.24xlarge: 400 Gbps EFA per node (4 x 100 Gbps; AWS instance page) shared by 8 GPUs =
  // 50 Gbps = 6.25 GB/s per GPU. Latency: EFA (SRD) messages cost ~10-20 us through NCCL's
  // aws-ofi-nccl plugin; 15 us is the middle (modelling choice).
  a100_40.inter_node = {6.25e9, Duration::Micros(15)};
  presets.push_back(a100_40);

  // NVIDIA A100-SXM4-80GB (A100 datasheet): 312 TFLOP/s, 80 GiB HBM2e at 2039 GB/s. Node = AWS
  // p4de.24xlarge: the same NVLink 3 and 400 Gbps EFA as p4d, so the same links.
  DevicePreset a100_80 = a100_40;
  a100_80.device = {"a100-80g", 312e12, Bytes::GiB(80), 2039e9};
  presets.push_back(a100_80);

  // NVIDIA H100 SXM5 80GB (H100 datasheet): 989 TFLOP/s dense BF16/FP16 (1979 with sparsity),
  // 80 GiB HBM3 at 3.35 TB/s. Node = NVIDIA DGX H100.
  DevicePreset h100;
  h100.device = {"h100-80g", 989e12, Bytes::GiB(80), 3350e9};
  // NVLink 4 through NVSwitch: 900 GB/s per GPU both directions = 450 GB/s each way (datasheet).
  h100.intra_node = {450e9, Duration::Micros(3)};
  // DGX H100: one ConnectX-7 400 Gb/s NDR InfiniBand port per GPU (DGX H100 user guide) =
  // 50 GB/s per GPU. Latency: 10 us, NCCL's small-message cost over InfiniBand (modelling choice).
  h100.inter_node = {50e9, Duration::Micros(10)};
  presets.push_back(h100);

  // One CPU core per rank, ranks on one host talking over loopback Gloo: what `sluice train`
  // runs on by default. Measured on the project's 2-core VM (2026-11-22, docs/profiling.md,
  // the same figures as examples/cluster-cpu-2.json): fp32 torch::mm 1024^3 on one thread
  // 0.17 TFLOP/s, Tensor::copy_ of 256 MB 12.9 GB/s, a 4 GiB budget per rank (not a hardware
  // figure), Gloo send/recv between two processes 2 ms one way and 1.7 GB/s of fp32 bytes at
  // 16 MB, halved because plans count fp16 bytes. Across hosts: 1 Gbit/s Ethernet = 0.125 GB/s
  // with the same latency (modelling choice, not measured).
  DevicePreset cpu;
  cpu.device = {"cpu", 0.17e12, Bytes::GiB(4), 12.9e9};
  cpu.intra_node = {0.85e9, Duration::Micros(2000)};
  cpu.inter_node = {0.125e9, Duration::Micros(2000)};
  // Gloo's ring collectives send each hop over one TCP connection.
  cpu.ring_crossing = RingCrossing::kOneConnection;
  presets.push_back(cpu);
  return presets;
}

std::optional<DevicePreset> FindDevicePreset(std::string_view name) {
  for (DevicePreset& preset : DevicePresets()) {
    if (preset.device.name == name) return std::move(preset);
  }
  return std::nullopt;
}

Status ValidateLink(const LinkSpec& link, bool used, std::string_view source,
                    std::string_view field) {
  const std::string bandwidth = fmt::format("{}.bandwidth_gb_per_s", field);
  const double gb_per_s = link.bandwidth / kGigaBytes;
  if (used) {
    SLUICE_RETURN_IF_ERROR(CheckRange(source, bandwidth, gb_per_s, kMinGbPerS, kMaxGbPerS));
  } else if (!(link.bandwidth >= 0 && gb_per_s <= kMaxGbPerS)) {
    return FieldError(source, bandwidth,
                      fmt::format("must be a number in [0, {}], got {}", kMaxGbPerS, gb_per_s));
  }
  const double us = link.latency.micros();
  if (!(us >= 0 && us <= kMaxLatencyUs)) {
    return FieldError(source, fmt::format("{}.latency_us", field),
                      fmt::format("must be a number in [0, {}], got {}", kMaxLatencyUs, us));
  }
  return Status::Ok();
}

StatusOr<DeviceSpec> DeviceFromJson(const nlohmann::json& j, std::string_view source) {
  JsonObjectReader r(j, std::string(source), "device");
  SLUICE_RETURN_IF_ERROR(r.status());
  DeviceSpec device;
  SLUICE_RETURN_IF_ERROR(r.String("name", &device.name));
  double tflops = 0;
  double gib = 0;
  double hbm = 0;
  SLUICE_RETURN_IF_ERROR(ReadPositive(r, "peak_tflops", /*required=*/true, kMaxTflops, &tflops));
  SLUICE_RETURN_IF_ERROR(ReadPositive(r, "memory_gib", /*required=*/true, kMaxMemoryGib, &gib));
  SLUICE_RETURN_IF_ERROR(ReadPositive(r, "hbm_gb_per_s", /*required=*/true, kMaxGbPerS, &hbm));
  SLUICE_RETURN_IF_ERROR(r.Finish());
  device.peak_flops = tflops * kTeraFlops;
  device.memory = Bytes::GiB(gib);
  device.hbm_bandwidth = hbm * kGigaBytes;
  return device;
}

StatusOr<LinkSpec> LinkFromJson(const nlohmann::json& j, std::string_view source,
                                std::string_view field) {
  JsonObjectReader r(j, std::string(source), std::string(field));
  SLUICE_RETURN_IF_ERROR(r.status());
  double gb_per_s = 0;
  double us = 0;
  SLUICE_RETURN_IF_ERROR(
      ReadPositive(r, "bandwidth_gb_per_s", /*required=*/true, kMaxGbPerS, &gb_per_s));
  SLUICE_RETURN_IF_ERROR(r.Double("latency_us", &us, 0, kMaxLatencyUs));
  SLUICE_RETURN_IF_ERROR(r.Finish());
  return LinkSpec{gb_per_s * kGigaBytes, Duration::Micros(us)};
}

nlohmann::json LinkToJson(const LinkSpec& link) {
  return {{"bandwidth_gb_per_s", NumberJson(DivideForJson(link.bandwidth, kGigaBytes))},
          {"latency_us", NumberJson(static_cast<double>(link.latency.nanos()) / 1e3)}};
}

// Reads `field` into *link. Absent keeps the preset's link, or is an error when the link is used
// and no preset supplied one.
Status ReadLink(JsonObjectReader& r, std::string_view field, bool used, bool have_default,
                std::string_view source, LinkSpec* link) {
  if (const nlohmann::json* j = r.Child(field)) {
    SLUICE_ASSIGN_OR_RETURN(*link, LinkFromJson(*j, source, field));
  } else if (used && !have_default) {
    return r.Error(field,
                   fmt::format("is required when {} (an object with bandwidth_gb_per_s "
                               "and latency_us)",
                               field == "intra_node" ? "devices_per_node > 1" : "nodes > 1"));
  }
  return Status::Ok();
}

}  // namespace

std::string_view RingCrossingName(RingCrossing crossing) {
  return crossing == RingCrossing::kOneConnection ? "one-connection" : "all-members";
}

CollectiveRing RingOverDevices(const ClusterSpec& cluster, std::span<const int64_t> devices) {
  CollectiveRing ring;
  ring.members = std::max<int64_t>(1, static_cast<int64_t>(devices.size()));
  // Devices per node, counted in one pass over the nodes in order (a ring's devices come in
  // placement order, so its nodes do: a planner's lowering calls this for every rank).
  std::vector<int64_t> nodes;
  nodes.reserve(devices.size());
  for (const int64_t device : devices) nodes.push_back(cluster.NodeOfDevice(device));
  if (!std::is_sorted(nodes.begin(), nodes.end())) std::sort(nodes.begin(), nodes.end());
  int64_t fewest = std::numeric_limits<int64_t>::max(), most = 0, distinct = 0;
  for (size_t i = 0; i < nodes.size();) {
    size_t j = i;
    while (j < nodes.size() && nodes[j] == nodes[i]) ++j;
    fewest = std::min(fewest, static_cast<int64_t>(j - i));
    most = std::max(most, static_cast<int64_t>(j - i));
    ++distinct;
    i = j;
  }
  ring.spans_nodes = distinct > 1;
  ring.intra_hops = most > 1;
  if (ring.spans_nodes && cluster.ring_crossing == RingCrossing::kAllMembers) {
    ring.crossing_shares = fewest;
  }
  return ring;
}

Status ValidateClusterSpec(const ClusterSpec& spec, std::string_view source) {
  const DeviceSpec& d = spec.device;
  SLUICE_RETURN_IF_ERROR(CheckRange(source, "device.peak_tflops", d.peak_flops / kTeraFlops,
                                    kMinTflops, kMaxTflops));
  SLUICE_RETURN_IF_ERROR(CheckPositive(source, "device.memory_gib", d.memory.gib(), kMaxMemoryGib));
  SLUICE_RETURN_IF_ERROR(CheckRange(source, "device.hbm_gb_per_s", d.hbm_bandwidth / kGigaBytes,
                                    kMinGbPerS, kMaxGbPerS));
  SLUICE_RETURN_IF_ERROR(CheckIntRange(source, "nodes", spec.nodes, 1, kMaxNodes));
  SLUICE_RETURN_IF_ERROR(
      CheckIntRange(source, "devices_per_node", spec.devices_per_node, 1, kMaxDevicesPerNode));
  SLUICE_RETURN_IF_ERROR(
      ValidateLink(spec.intra_node, spec.devices_per_node > 1, source, "intra_node"));
  return ValidateLink(spec.inter_node, spec.nodes > 1, source, "inter_node");
}

StatusOr<ClusterSpec> ClusterSpecFromJson(const nlohmann::json& j, std::string_view source) {
  JsonObjectReader r(j, std::string(source));
  SLUICE_RETURN_IF_ERROR(r.status());
  ClusterSpec spec;
  SLUICE_RETURN_IF_ERROR(r.String("name", &spec.name));
  const nlohmann::json* device = r.Child("device");
  const std::string allowed_devices = fmt::format(
      "a device preset name ({}) or an object with name, peak_tflops, memory_gib and "
      "hbm_gb_per_s",
      JoinNames(DevicePresetNames()));
  if (device == nullptr) return r.Error("device", fmt::format("is required ({})", allowed_devices));
  bool have_preset_links = false;
  if (device->is_string()) {
    std::optional<DevicePreset> preset = FindDevicePreset(device->get<std::string>());
    if (!preset.has_value()) {
      return r.Error("device", fmt::format("unknown device preset {} (allowed: {})",
                                           device->dump(-1, ' ', false,
                                                        nlohmann::json::error_handler_t::replace),
                                           allowed_devices));
    }
    spec.device = preset->device;
    spec.devices_per_node = preset->devices_per_node;
    spec.intra_node = preset->intra_node;
    spec.inter_node = preset->inter_node;
    spec.ring_crossing = preset->ring_crossing;
    have_preset_links = true;
  } else if (device->is_object()) {
    SLUICE_ASSIGN_OR_RETURN(spec.device, DeviceFromJson(*device, source));
  } else {
    return r.Error("device",
                   fmt::format("must be {}, got a {}", allowed_devices, device->type_name()));
  }
  SLUICE_RETURN_IF_ERROR(r.OptionalInt("nodes", &spec.nodes, 1, kMaxNodes));
  SLUICE_RETURN_IF_ERROR(
      r.OptionalInt("devices_per_node", &spec.devices_per_node, 1, kMaxDevicesPerNode));
  SLUICE_RETURN_IF_ERROR(ReadLink(r, "intra_node", spec.devices_per_node > 1, have_preset_links,
                                  source, &spec.intra_node));
  SLUICE_RETURN_IF_ERROR(
      ReadLink(r, "inter_node", spec.nodes > 1, have_preset_links, source, &spec.inter_node));
  std::string crossing(RingCrossingName(spec.ring_crossing));
  SLUICE_RETURN_IF_ERROR(r.OptionalEnum("ring_crossing", &crossing, kRingCrossingNames));
  spec.ring_crossing =
      crossing == "one-connection" ? RingCrossing::kOneConnection : RingCrossing::kAllMembers;
  SLUICE_RETURN_IF_ERROR(r.Finish());
  SLUICE_RETURN_IF_ERROR(ValidateClusterSpec(spec, source));
  return spec;
}

nlohmann::json ClusterSpecToJson(const ClusterSpec& spec) {
  nlohmann::json j = {
      {"name", spec.name},
      {"device",
       {{"name", spec.device.name},
        {"peak_tflops", NumberJson(DivideForJson(spec.device.peak_flops, kTeraFlops))},
        {"memory_gib", NumberJson(spec.device.memory.gib())},
        {"hbm_gb_per_s", NumberJson(DivideForJson(spec.device.hbm_bandwidth, kGigaBytes))}}},
      {"nodes", spec.nodes},
      {"devices_per_node", spec.devices_per_node},
  };
  // A link left at zero (unused: one device per node, or one node) is left out, as it was read.
  if (spec.intra_node != LinkSpec{}) j["intra_node"] = LinkToJson(spec.intra_node);
  if (spec.inter_node != LinkSpec{}) j["inter_node"] = LinkToJson(spec.inter_node);
  // Written only when it is not the default, which a device object (as written) reads back as.
  if (spec.ring_crossing != RingCrossing::kAllMembers) {
    j["ring_crossing"] = std::string(RingCrossingName(spec.ring_crossing));
  }
  return j;
}

std::vector<std::string> DevicePresetNames() {
  std::vector<std::string> names;
  for (const DevicePreset& preset : DevicePresets()) names.push_back(preset.device.name);
  return names;
}

StatusOr<ClusterSpec> ClusterPreset(std::string_view device, int64_t n) {
  std::optional<DevicePreset> preset = FindDevicePreset(device);
  if (!preset.has_value()) {
    return NotFoundError(fmt::format("unknown device preset '{}' (presets: {})", device,
                                     JoinNames(DevicePresetNames())));
  }
  const int64_t per_node = preset->devices_per_node;
  const std::string name = fmt::format("{}:{}", device, n);
  if (n < 1 || n > per_node * kMaxNodes) {
    return InvalidArgumentError(fmt::format("cluster '{}': the device count must be in [1, {}]",
                                            name, per_node * kMaxNodes));
  }
  if (n > per_node && n % per_node != 0) {
    return InvalidArgumentError(fmt::format(
        "cluster '{}': {} devices do not fill whole nodes of {} (allowed: 1 to {} devices on one "
        "node, or a multiple of {}, e.g. {} or {})",
        name, n, per_node, per_node, per_node, n / per_node * per_node,
        (n / per_node + 1) * per_node));
  }
  ClusterSpec spec;
  spec.name = name;
  spec.device = preset->device;
  spec.nodes = n <= per_node ? 1 : n / per_node;
  spec.devices_per_node = n <= per_node ? n : per_node;
  spec.intra_node = preset->intra_node;
  spec.inter_node = preset->inter_node;
  spec.ring_crossing = preset->ring_crossing;
  return spec;
}

StatusOr<ClusterSpec> ResolveCluster(std::string_view preset_or_file) {
  if (FindDevicePreset(preset_or_file).has_value()) {
    return ClusterPreset(preset_or_file, kPresetDevicesPerNode);
  }
  const size_t colon = preset_or_file.rfind(':');
  if (colon != std::string_view::npos) {
    const std::string_view device = preset_or_file.substr(0, colon);
    if (FindDevicePreset(device).has_value()) {
      const std::optional<int64_t> n =
          model_internal::ParseDecimal(preset_or_file.substr(colon + 1));
      if (!n.has_value()) {
        return InvalidArgumentError(
            fmt::format("--cluster '{}': N in PRESET:N must be a positive integer, got '{}'",
                        preset_or_file, preset_or_file.substr(colon + 1)));
      }
      return ClusterPreset(device, *n);
    }
  }
  const std::string path(preset_or_file);
  if (!FileExists(path)) {
    return NotFoundError(fmt::format(
        "--cluster '{}': not PRESET:N and no such file (presets: {}; e.g. a100-40g:16, or a JSON "
        "ClusterSpec file, see docs/formats.md)",
        preset_or_file, JoinNames(DevicePresetNames())));
  }
  SLUICE_ASSIGN_OR_RETURN(nlohmann::json j, ReadJsonFile(path));
  return ClusterSpecFromJson(j, path);
}

}  // namespace sluice
