// The search space of the configuration search (config_search.h): a compared method
// (MethodSpec) and the configurations each method is searched over (SearchSpace).
//
// A compared method (MethodSpec) is a label, the batching methods it may use (RunMethod names,
// batching/method.h) and the pipeline schedules it may run; the search picks the best
// (batching, schedule, parallel configuration) among them. The single names carry the
// schedules their systems offer (docs/compare.md): the Megatron-style baselines (padding,
// sorted, token-budget, packing, multipack, megatron-gbp) gpipe, 1f1b and interleaved; dynapipe 1f1b and
// adaptive; hydraulis 1f1b; `sluice` (sluice's best combination) every schedule with the batching
// methods dynapipe, hydraulis, hydraulis+dynapipe, multipack, token-budget and packing, so it is
// at least as fast as any of those methods' own best. Any other RunMethod name (e.g.
// "balanced+dynapipe") runs every schedule.
//
// Two names are not one homogeneous configuration (MethodKind): `sluice-hetero` searches
// heterogeneous replicas (planner/hetero.h: 2-shape mixes, each group planned by hydraulis with
// 1f1b) and `sluice-dynamic` chooses, per global batch, among the best strategies found for the
// data (homogeneous configurations of `sluice`'s space and heterogeneous mixes), with the cost
// of switching between them (compare/compare_dynamic.h). Neither is in the default list.
//
// Thread safety: value types and pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "model/parallel_config.h"
#include "schedule/generators.h"

namespace sluice {

// What a compared method runs: one configuration (the search's Candidate), heterogeneous
// replicas, or a per-batch choice among strategies.
enum class MethodKind { kHomogeneous, kHetero, kDynamic };
// "homogeneous" | "hetero" | "dynamic" (scenario and results files).
std::string_view MethodKindName(MethodKind kind);
StatusOr<MethodKind> ParseMethodKind(std::string_view name, std::string_view source);

struct MethodSpec {
  std::string name;                   // label in tables and reports, unique in a scenario
  MethodKind kind = MethodKind::kHomogeneous;
  std::vector<std::string> batching;  // RunMethod names tried, e.g. {"dynapipe"}
  std::vector<ScheduleKind> schedules;
  // Per-micro-batch cp (batching/dynamic_cp.h) on its cp > 1 candidates: `sluice` and
  // `sluice-dynamic` (the fastest split), `megatron-gbp` (its megatron-hybrid-cp batching only:
  // Megatron-Core's length rule).
  bool dynamic_cp = false;

  friend bool operator==(const MethodSpec&, const MethodSpec&) = default;
};

// The configuration space searched per method. Empty lists mean "every value that fits".
struct SearchSpace {
  std::vector<int64_t> tp;             // tensor-parallel degrees (default: powers of two up to
                                       // the devices of one node that the cost model supports)
  std::vector<int64_t> pp;             // pipeline degrees (default: every divisor that fits)
  std::vector<int64_t> cp = {1};       // context-parallel degrees (ring attention); {1} keeps
                                       // searches as they were; empty: powers of two that fit
                                       // (decoder-only models)
  std::vector<int64_t> ep = {1};       // expert-parallel degrees (MoE models; ep divides the
                                       // experts and dp x tp); {1} keeps searches as they were;
                                       // empty: powers of two that fit
  std::vector<int64_t> zero = {1, 2};  // ZeRO stages (ZeRO-3's per-layer gathers are not
                                       // modelled by the plan, so it is not searched by default)
  std::vector<int64_t> vpp = {2};      // virtual stages tried with the interleaved schedule
  bool all_devices = true;             // only configurations that use every device
  // Global batches each candidate is scored on (PickScoreBatches): the first `score_batches`
  // of the run (0 = every batch of the run), plus, when `score_extremes`, the batch holding the
  // longest sample, the one with the most attention work and the one with the most tokens.
  int64_t score_batches = 2;
  bool score_extremes = true;
  int64_t simulate_top = 3;            // candidates per method simulated after the fast estimate
  // "layer_cut": "balanced": each method's best simulated pipeline also gets the layer cut
  // search (planner/layer_cut.h, SearchMethod); "even" (the default): every chunk the same
  // number of layers.
  bool balance_layer_cut = false;
  // The device order (model/parallel_config.h, RankOrder): absent = both, the second only for
  // the configurations they place differently (SearchesOrder: pp > 1, dp > 1, more than one
  // node); else that order for every configuration they place differently (the others keep the
  // default, which places them the same).
  std::optional<RankOrder> only_order;

  friend bool operator==(const SearchSpace&, const SearchSpace&) = default;
};

// The names MethodSpecFor accepts as shorthands, in the default order, and the default list:
// packing, token-budget, multipack, dynapipe, hydraulis, sluice (megatron-gbp, sluice-hetero and
// sluice-dynamic are named, not default).
std::vector<std::string> KnownMethodNames();
std::vector<MethodSpec> DefaultMethods();
// The spec of a shorthand or of any RunMethod name (single or ASSIGNER+BATCHER). Errors list the
// allowed names.
StatusOr<MethodSpec> MethodSpecFor(std::string_view name, std::string_view source);
// Whether `name` is a RunMethod name (batching/method.h): a single method or ASSIGNER+BATCHER.
bool IsBatchingName(std::string_view name);

}  // namespace sluice
