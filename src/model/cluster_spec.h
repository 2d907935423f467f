// ClusterSpec: the devices a model trains on and the links between them.
//
// A cluster is `nodes` x `devices_per_node` identical devices. Devices in one node talk over
// the intra-node link (NVLink), across nodes over the inter-node link (InfiniBand/EFA); each
// link is given as per-device, per-direction bandwidth and a latency, the alpha-beta model's
// parameters. `ring_crossing` says how a ring collective's traffic leaves a node (NCCL spreads
// it over the NICs of all the ring's devices there, Gloo sends it over one connection). The device presets (a100-40g, a100-80g, h100-80g, cpu) and the source of each of
// their numbers are in cluster_spec.cc and docs/formats.md.
//
// Thread safety: value types.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "base/units.h"

namespace sluice {

struct DeviceSpec {
  std::string name;              // e.g. "a100-40g"
  double peak_flops = 0;         // dense bf16/fp16 tensor-core FLOP/s
  Bytes memory;                  // device memory
  double hbm_bandwidth = 0;      // bytes/s

  friend bool operator==(const DeviceSpec&, const DeviceSpec&) = default;
};

struct LinkSpec {
  double bandwidth = 0;          // bytes/s per device per direction
  Duration latency;              // one message's fixed cost (alpha)

  friend bool operator==(const LinkSpec&, const LinkSpec&) = default;
};

// How the inter-node traffic of a ring collective (all-reduce, reduce-scatter, all-gather) leaves
// a node.
enum class RingCrossing {
  // NCCL: a collective runs one ring per channel, and the channels leave a node through the NICs
  // of different GPUs, so the traffic between nodes moves over the inter-node share of every
  // device of the ring on the node. A ring of 8 GPUs per node on p4d (4 x 100 Gbps EFA) crosses
  // at the node's 50 GB/s, not at one GPU's 6.25 GB/s (nccl-tests' ring bus bandwidth across
  // nodes is the node's network bandwidth; doc/PERFORMANCE.md).
  kAllMembers,
  // Gloo: one connection per ring hop, so a crossing moves over one device's share.
  kOneConnection,
};
std::string_view RingCrossingName(RingCrossing crossing);  // "all-members", "one-connection"

struct ClusterSpec {
  std::string name;              // e.g. "a100-40g:16"
  DeviceSpec device;
  int64_t nodes = 1;
  int64_t devices_per_node = 8;
  LinkSpec intra_node;           // within a node
  LinkSpec inter_node;           // between nodes: each device's share
  RingCrossing ring_crossing = RingCrossing::kAllMembers;

  int64_t num_devices() const { return nodes * devices_per_node; }
  // The node of device `device`: nodes are runs of devices_per_node consecutive devices.
  int64_t NodeOfDevice(int64_t device) const { return device / devices_per_node; }

  friend bool operator==(const ClusterSpec&, const ClusterSpec&) = default;
};

// Device placement: model/parallel_config.h (NodeOfRank, RanksCrossNodes).

// Where a ring collective runs: its member count, whether it crosses nodes, how many devices'
// inter-node shares one crossing moves over (1, or under RingCrossing::kAllMembers the fewest
// devices the ring has on any of its nodes: a ring of 16 GPUs on two nodes of 8 crosses over 8
// shares, one of 2 GPUs on two nodes over 1), and whether it has hops inside a node (some node
// holds two or more of its devices).
struct CollectiveRing {
  int64_t members = 1;
  bool spans_nodes = false;
  int64_t crossing_shares = 1;
  bool intra_hops = false;

  friend bool operator==(const CollectiveRing&, const CollectiveRing&) = default;
};
// The ring through `devices` (one device per member). An empty span is a ring of one.
CollectiveRing RingOverDevices(const ClusterSpec& cluster, std::span<const int64_t> devices);

// Checks every field: positive finite device numbers, nodes >= 1, devices_per_node >= 1, link
// latencies >= 0, and a positive bandwidth on each link that is used (intra_node when
// devices_per_node > 1, inter_node when nodes > 1). Messages use the JSON field names.
Status ValidateClusterSpec(const ClusterSpec& spec, std::string_view source);

// JSON form (docs/formats.md, "ClusterSpec"); units are in the field names: peak_tflops
// (10^12 FLOP/s), memory_gib (2^30 bytes), hbm_gb_per_s and bandwidth_gb_per_s (10^9 bytes/s),
// latency_us (microseconds). "device" may also be a preset name, whose links then become the
// defaults of intra_node and inter_node. FromJson(ToJson(spec)) == spec for every valid spec.
StatusOr<ClusterSpec> ClusterSpecFromJson(const nlohmann::json& j, std::string_view source);
nlohmann::json ClusterSpecToJson(const ClusterSpec& spec);

// Device presets: a100-40g, a100-80g, h100-80g (with their usual node links) and cpu (one CPU
// core per rank over loopback Gloo, `sluice train`'s default target).
std::vector<std::string> DevicePresetNames();
// `n` devices of a preset, 8 per node: 1 <= n <= 8 is one node of n devices, a larger n must be a
// multiple of 8. The cluster is named "<device>:<n>". Unknown device: NotFound listing presets.
StatusOr<ClusterSpec> ClusterPreset(std::string_view device, int64_t n);
// `--cluster PRESET:N|FILE`: "a100-40g:16", "a100-40g" (= 8 devices), else a JSON ClusterSpec
// file. Errors list the presets.
StatusOr<ClusterSpec> ResolveCluster(std::string_view preset_or_file);

}  // namespace sluice
