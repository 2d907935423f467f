// Resolving a compare scenario (compare.cc's first phase): the scenario spec with the controlled
// configuration, its global batches taken up front, the search's score batches and the batching
// and simulation options every run of the comparison shares. Internal to src/compare/.
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "batching/method.h"
#include "compare/compare_scenario.h"
#include "data/global_batcher.h"
#include "planner/scenario.h"
#include "planner/search_space.h"
#include "sim/simulator.h"

namespace sluice::compare_internal {

// What the scenario resolves to: the resolved scenario (its parallel configuration is the fixed
// controlled one, when given) and the global batches of the run, taken up front.
struct Resolved {
  Scenario sc;
  std::vector<GlobalBatch> batches;
  std::string description;
};

// Resolves `sc` and takes its batches; checks that every expert-parallel degree the search asks
// for can run (an MoE model whose experts it divides, on at most the cluster's devices).
// Errors name the scenario's fields through `field_name`.
StatusOr<Resolved> Resolve(const CompareScenario& sc, const FieldNamer& field_name);
// The search's score batches among the run's (PickScoreBatches).
std::vector<GlobalBatch> ScoreBatches(const std::vector<GlobalBatch>& batches,
                                      const SearchSpace& search);
// The batching options the search scores with, and the simulation options of every run.
BatchingOptions ScoreBatching(const CompareScenario& sc);
SimOptions ScenarioSim(const CompareScenario& sc);

}  // namespace sluice::compare_internal
