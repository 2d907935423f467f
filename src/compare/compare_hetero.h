// The heterogeneous row of `sluice compare` (MethodKind::kHetero, `sluice-hetero`): the 2-shape
// mixes of planner/hetero.h that lie in the scenario's search space, searched on the same score
// batches as every other method, and the best one run on every batch.
//
// The mixes: EnumerateHeteroMixes for each ZeRO stage 1 or 2 of the space (ZeRO 0 and 3 are not
// enumerated), kept when every group's tp, pp and cp are in the space's lists (an empty list:
// any). The search (SearchHetero) plans every mix on the score batches, ranks them by the
// planner's estimate, simulates the `simulate_top` best and keeps the fastest simulated one;
// each group is planned by a kHetero method's first batching method and first schedule
// (hydraulis, 1f1b for `sluice-hetero`), and by hydraulis with 1f1b for any other method (the
// mixes of `sluice-dynamic`).
//
// Internal to compare/ (compare.cc, compare_dynamic.cc).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "compare/compare_scenario.h"
#include "data/global_batcher.h"
#include "model/hetero_config.h"
#include "planner/hetero.h"
#include "planner/scenario.h"
#include "planner/search_space.h"
#include "sim/simulator.h"

namespace sluice {

// The mixes of the space (see the header).
std::vector<HeteroConfig> HeteroMixesOf(const Scenario& sc, const SearchSpace& space);

// The heterogeneous planner's options for `method` on scenario `cs` (its seed and max length).
HeteroPlannerOptions HeteroOptionsFor(const MethodSpec& method, const CompareScenario& cs);

struct HeteroChoice {
  HeteroSearch search;              // every mix, ranked (SearchHetero)
  std::optional<HeteroConfig> best;  // absent: none ran the score batches within memory
  std::string reason;                // why none
  int64_t feasible = 0;              // mixes that planned every score batch
  int64_t simulated = 0;
};
// Searches the mixes of the space on `score`. Errors: bugs only.
StatusOr<HeteroChoice> SearchHeteroMixes(const Scenario& sc, const CompareScenario& cs,
                                         const MethodSpec& method,
                                         std::span<const GlobalBatch> score, const SimOptions& sim);

}  // namespace sluice
