// ParallelConfig: how one training job splits the model and the data over devices.
//
// dp data-parallel replicas x pp pipeline stages x tp tensor-parallel ranks x cp context-parallel
// ranks = devices used. cp splits every micro-batch's sequences over cp devices (ring attention
// with load-balanced causal chunks, cost/context_parallel.h); decoder-only models only. One
// pipeline position (a plan rank, rank = dp_index * pp + pp_index) holds tp * cp consecutive
// devices, tp innermost; `order` says how the positions lie on the devices (RankOrder below).
// ep (expert parallelism) groups ep consecutive data-parallel replicas that hold different experts
// of an MoE layer, and must divide dp. vpp is the number of virtual (interleaved) stages per device. zero is the
// ZeRO stage (0: replicated states, 1: optimizer states sharded over dp, 2: + gradients,
// 3: + parameters).
//
// Memory: MemoryLimit() is the one per-device budget that planners, the plan validator and the
// simulator respect. An explicit memory_limit is a budget the user already chose and is used as
// given; without one, the budget is the device's memory less a reserve for what the plan does not
// hold (CUDA context, NCCL buffers, allocator fragmentation): memory_reserve when given, else
// DefaultMemoryReserve. A configuration gives at most one of the two.
//
// Thread safety: value type.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "base/units.h"
#include "model/cluster_spec.h"
#include "model/model_spec.h"

namespace sluice {

// How the dp x pp positions lie on the devices, Megatron-Core's --order notation (innermost
// first). The position (dp_index, pp_index) takes the tp * cp devices of block
//   kDataInner ("tp-cp-dp-pp", Megatron-Core's and torchtitan's default: pp outermost):
//     pp_index * dp + dp_index: the replicas of one pipeline stage are neighbours, so the
//     gradient ring of a stage stays inside a node as far as it can and the pipeline's
//     point-to-point transfers are what cross nodes;
//   kPipelineInner ("tp-cp-pp-dp": dp outermost): dp_index * pp + pp_index: a replica's stages
//     are neighbours, its transfers stay inside a node and the gradient rings cross nodes.
// The default is kDataInner: a stage's gradients (GB per iteration) outweigh the activations a
// stage boundary moves (MB per micro-batch) on every model of this repository; the other order
// is there for the configurations where they do not (sluice compare's search tries both where
// they place differently: SearchesOrder).
enum class RankOrder { kDataInner, kPipelineInner };
std::string_view RankOrderName(RankOrder order);  // "tp-cp-dp-pp", "tp-cp-pp-dp"

struct ParallelConfig {
  int64_t dp = 1;
  int64_t pp = 1;
  int64_t tp = 1;
  int64_t ep = 1;
  int64_t vpp = 1;                       // virtual stages per device (interleaved schedules)
  int64_t cp = 1;                        // context-parallel ranks per micro-batch (ring attention)
  int64_t zero = 0;                      // ZeRO stage 0..3
  std::optional<Bytes> memory_limit;     // per-device budget; absent = device memory - reserve
  std::optional<Bytes> memory_reserve;   // without memory_limit; absent = DefaultMemoryReserve
  // Layers of each of the pp * vpp chunks, in chunk (pipeline) order, over the concatenated stack
  // [encoder layers; decoder layers] (model/chunk_cut.h); empty: the even cut. Megatron-LM's
  // uneven pipeline split (--decoder-first/last-pipeline-num-layers, T5's split rank) and
  // DeepSpeed's partition_method; the planner's balanced cut (planner/layer_cut.h).
  std::vector<int64_t> layer_cut;
  RankOrder order = RankOrder::kDataInner;

  int64_t devices() const { return dp * pp * tp * cp; }
  // Devices of one pipeline position (one plan rank): tp * cp.
  int64_t devices_per_rank() const { return tp * cp; }
  // Pipeline chunks the layers are cut into: pp * vpp.
  int64_t chunks() const { return pp * vpp; }
  // The device block of plan rank `rank` (see RankOrder): its devices are
  // [block * tp * cp, (block + 1) * tp * cp) past the configuration's first device.
  int64_t DeviceBlock(int64_t rank) const {
    if (order == RankOrder::kPipelineInner) return rank;
    return (rank % pp) * dp + rank / pp;
  }
  // The plan rank whose device block is `block` (DeviceBlock's inverse).
  int64_t RankOfBlock(int64_t block) const {
    if (order == RankOrder::kPipelineInner) return block;
    return (block % dp) * pp + block / dp;
  }
  // The first device of plan rank `rank` (past the configuration's first device).
  int64_t FirstDevice(int64_t rank) const { return DeviceBlock(rank) * devices_per_rank(); }
  // The budget planners, the validator and the simulator respect (MemoryBudget).
  Bytes MemoryLimit(const ClusterSpec& cluster) const;

  friend bool operator==(const ParallelConfig&, const ParallelConfig&) = default;
};

// The reserve held back from a device's memory when no memory limit is given: 2 GiB for what
// every process holds outside the plan (the CUDA context, about 0.3-0.6 GB with lazy module
// loading; NCCL communicator buffers, several hundred MB per process group; cuBLAS/cuDNN
// workspaces) plus 5% of the device's memory for the caching allocator's fragmentation; at most
// half the device's memory. A100-40GB: 4 GiB, a budget of 36 GiB (38,655 MB); 80 GB devices:
// 6 GiB, a budget of 74 GiB.
Bytes DefaultMemoryReserve(const DeviceSpec& device);
// The per-device budget: `limit` when given; else device.memory less `reserve` (absent:
// DefaultMemoryReserve(device)). REQUIRES: a reserve below the device's memory.
Bytes MemoryBudget(std::optional<Bytes> limit, std::optional<Bytes> reserve,
                   const DeviceSpec& device);

// The ring that reduces the gradients of pipeline rank `pp_index` (and gathers its ZeRO
// parameters): dp * cp members, the cp ranks of every replica in dp order, tensor-parallel copy
// 0 of each (device = FirstDevice(rank) + cp_index * tp, rank = dp_index * pp + pp_index: the
// placement of plan/execution_plan.h). The one rule the lowering, the passes, the planners and
// the simulator price gradient collectives by. `first_device`: where the configuration's devices
// start (a replica group of a heterogeneous configuration; 0 otherwise).
// REQUIRES: 0 <= pp_index < par.pp.
CollectiveRing GradientRing(const ClusterSpec& cluster, const ParallelConfig& par,
                            int64_t pp_index, int64_t first_device = 0);

// Device placement, the one rule every planner, lowering and simulator uses: the node of plan
// rank `rank` is the node of its first device (ParallelConfig::FirstDevice), and the
// point-to-point traffic of ranks a and b (device FirstDevice(a) + j to FirstDevice(b) + j for
// every j < tp * cp) crosses nodes when any such pair does.
int64_t NodeOfRank(const ClusterSpec& cluster, const ParallelConfig& par, int64_t rank,
                   int64_t first_device = 0);
bool RanksCrossNodes(const ClusterSpec& cluster, const ParallelConfig& par, int64_t a, int64_t b,
                     int64_t first_device = 0);
// Whether the two orders place `par` differently on `cluster` in a way a link sees: pp > 1,
// dp > 1 and more than one node. Searches try both orders only there.
bool SearchesOrder(const ClusterSpec& cluster, const ParallelConfig& par);

// Field ranges only: each degree in [1, 2^20], zero in [0, 3], memory limit in (0, 10^9] MB
// (10^6 bytes), memory reserve in [0, 10^9] MB, not both a limit and a reserve; layer_cut empty
// or pp * vpp entries, each in [1, 2^20].
Status ValidateParallelConfig(const ParallelConfig& config, std::string_view source);
// Whether `config` can run `model` on `cluster`:
//   - without a layer_cut, pp*vpp chunks divide the layers evenly. Encoder-decoder models:
//     pp*vpp == 1 (one chunk holds both stacks), pp*vpp is even with pp*vpp/2 dividing both
//     stacks (encoder on the first half of the chunks, decoder on the second), or pp*vpp divides
//     layers + decoder_layers (equal runs of the concatenated stack); model/chunk_cut.h;
//   - with one, its entries sum to layers + decoder_layers;
//   - tp divides heads and ffn_hidden (and moe->expert_ffn_hidden), and kv_heads % tp == 0 or
//     tp % kv_heads == 0;
//   - ep > 1 only for MoE models, and ep divides moe->experts and dp;
//   - cp > 1 only for decoder-only models;
//   - with a cluster: dp*pp*tp*cp <= devices, memory_limit <= the device's memory, memory_reserve
//     < the device's memory.
// Messages name `source`, the model or cluster, and list the allowed values. `cluster` may be
// null when the devices are not known yet.
Status CheckParallelFits(const ParallelConfig& config, const ModelSpec& model,
                         const ClusterSpec* cluster, std::string_view source);

// JSON form: {"dp":2,"pp":4,"tp":1,"ep":1,"vpp":1,"zero":1,"memory_limit_mb":36000}; every key is
// optional (degrees default to 1, zero to 0, no memory limit, the default reserve); "cp" is
// written only when it is not 1, so files of configurations without context parallelism are
// unchanged, "layer_cut" (an array of pp * vpp integers) only when it is given, and "order"
// ("tp-cp-dp-pp" or "tp-cp-pp-dp", RankOrder) only when it is not the default;
// memory_limit_mb and memory_reserve_mb are MB (10^6 bytes, as in the profile tables) and may be
// fractional. FromJson(ToJson(config)) == config for every valid config.
StatusOr<ParallelConfig> ParallelConfigFromJson(const nlohmann::json& j, std::string_view source);
nlohmann::json ParallelConfigToJson(const ParallelConfig& config);
// `--parallel K=V,...|FILE`: keys dp, pp, tp, cp, ep, vpp, zero, memory_limit_mb, memory_reserve_mb
// with plain decimal integer values, layer_cut with '+'-separated ones (layer_cut=9+8+8+7) and
// order (tp-cp-dp-pp or tp-cp-pp-dp); unspecified = 1 (zero = 0, no memory limit, the even cut,
// order tp-cp-dp-pp). An unknown key is an error listing
// the allowed keys; a key given twice, a value that is not an integer or is out of range is an
// error naming the key. An argument without '=' that names an existing file is read as JSON.
// An argument with '=' never touches the file system.
StatusOr<ParallelConfig> ResolveParallel(std::string_view spec_or_file);

}  // namespace sluice
