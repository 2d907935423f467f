// HeteroConfig: one iteration's devices split into data-parallel replicas of different shapes
// (Hydraulis' heterogeneous replicas, issue 16).
//
// A heterogeneous configuration is a list of replica groups. Group g is a ParallelConfig whose dp
// is the number of identical replicas of that shape (tp, pp, cp) and whose memory limit (or
// reserve) is the budget of that group's devices. Groups are laid out on consecutive devices in
// the order given: group g starts at the sum of the devices of the groups before it, and inside a
// group devices follow ParallelConfig's placement rule. The groups together use exactly the
// cluster's devices.
//
// The slice supported (CheckHeteroFits): decoder-only models, vpp = 1, ep = 1 and one ZeRO stage
// 0, 1 or 2 shared by every group (ZeRO-3's per-layer parameter gathers are not planned across
// groups).
//
// Text form (`--replicas`): groups separated by ';', each the K=V form of `--parallel`
// (model/parallel_config.h), e.g. "dp=4,tp=1,pp=2;dp=1,tp=8" (four tp 1 x pp 2 replicas and one
// tp 8 replica). JSON form: {"replicas": [{"dp":4,"pp":2}, {"dp":1,"tp":8}]}, each element a
// ParallelConfig JSON object (ParallelConfigFromJson).
//
// Thread safety: value types and pure functions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "model/cluster_spec.h"
#include "model/model_spec.h"
#include "model/parallel_config.h"

namespace sluice {

struct HeteroConfig {
  std::vector<ParallelConfig> groups;  // [group]: dp replicas of one shape each

  int64_t devices() const;                     // sum of the groups' devices()
  int64_t replicas() const;                    // sum of the groups' dp
  std::vector<int64_t> DeviceOffsets() const;  // [group] first device

  friend bool operator==(const HeteroConfig&, const HeteroConfig&) = default;
};

// "4 x tp 1 x pp 2 + 1 x tp 8" (cp, ZeRO and memory limits shown when set).
std::string DescribeHetero(const HeteroConfig& config);

// Whether `config` can run `model` on `cluster`: at least one group; each group passes
// CheckParallelFits with vpp = 1, ep = 1, zero <= 2 and group 1's zero; a decoder-only model; and
// the groups' devices
// sum to exactly the cluster's devices. Messages start with `source` (e.g. "--replicas") and name
// the group, the field and the allowed values.
Status CheckHeteroFits(const HeteroConfig& config, const ModelSpec& model,
                       const ClusterSpec& cluster, std::string_view source);

// The text form, or a JSON file when `spec_or_file` has no '=' and names a file. Field ranges are
// checked (ValidateParallelConfig); fitting the model and cluster is CheckHeteroFits'.
StatusOr<HeteroConfig> ResolveHetero(std::string_view spec_or_file, std::string_view source);
StatusOr<HeteroConfig> HeteroConfigFromJson(const nlohmann::json& j, std::string_view source);
nlohmann::json HeteroConfigToJson(const HeteroConfig& config);

// The K=V form of ResolveParallel (model/parallel_config.h) alone, never a file, with errors
// starting with `source`; defined beside ResolveParallel.
StatusOr<ParallelConfig> ParseParallelPairs(std::string_view spec, std::string_view source);

}  // namespace sluice
