#include "compare/compare_resolve.h"

#include <fmt/format.h>

#include <algorithm>
#include <span>
#include <utility>

#include "planner/config_search.h"

namespace sluice::compare_internal {
namespace {

// Every expert-parallel degree the search is asked for can run somewhere: an MoE model whose
// experts it divides, on at most the cluster's devices (a degree that never fits would leave
// the search with nothing to try and the report blaming memory).
Status CheckSearchEp(std::span<const int64_t> eps, const ModelSpec& model,
                     const ClusterSpec& cluster, const FieldNamer& field_name) {
  std::vector<int64_t> allowed{1};
  if (model.moe.has_value()) {
    for (int64_t e = 2; e <= std::min(model.moe->experts, cluster.num_devices()); ++e) {
      if (model.moe->experts % e == 0) allowed.push_back(e);
    }
  }
  for (const int64_t ep : eps) {
    if (std::find(allowed.begin(), allowed.end(), ep) != allowed.end()) continue;
    const std::string why =
        !model.moe.has_value()
            ? fmt::format("model '{}' is dense (expert parallelism needs an MoE model)",
                          model.name)
            : fmt::format("ep must divide moe.experts = {} of model '{}' and fit the {} devices "
                          "of cluster '{}'",
                          model.moe->experts, model.name, cluster.num_devices(), cluster.name);
    return InvalidArgumentError(fmt::format("{}: ep = {} cannot run: {} (allowed: {})",
                                            field_name("search.ep"), ep, why,
                                            fmt::join(allowed, ", ")));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<Resolved> Resolve(const CompareScenario& sc, const FieldNamer& field_name) {
  ScenarioSpec spec;
  spec.model = sc.model;
  spec.cluster = sc.cluster;
  if (sc.controlled.has_value()) {
    spec.parallel = *sc.controlled;
    spec.parallel->vpp = 1;  // the controlled comparison shares dp, pp, tp and ZeRO, not vpp
  }
  spec.memory_limit_mb = sc.memory_limit_mb;
  spec.memory_reserve_mb = sc.memory_reserve_mb;
  spec.cost = sc.cost;
  spec.flash_attention = sc.flash_attention;
  spec.data = sc.data;
  spec.samples = sc.samples;
  spec.seed = sc.seed;
  spec.tokens_per_batch = sc.tokens_per_batch;
  spec.max_seqlen = sc.max_seqlen;
  spec.long_samples = sc.long_samples;
  spec.iterations = sc.iterations;
  // The scenario's parallel configuration is its field 'controlled'.
  const FieldNamer spec_field = [&](std::string_view field) {
    return field_name(field == "parallel" ? "controlled" : field);
  };
  Resolved r;
  SLUICE_ASSIGN_OR_RETURN(r.sc, ResolveScenario(spec, spec_field));
  SLUICE_RETURN_IF_ERROR(CheckSearchEp(sc.search.ep, r.sc.model, r.sc.cluster, field_name));
  GlobalBatch batch;
  while ((sc.iterations == 0 || static_cast<int64_t>(r.batches.size()) < sc.iterations) &&
         r.sc.batcher->Next(&batch)) {
    r.batches.push_back(std::move(batch));
  }
  if (r.batches.empty()) return r.sc.NoBatchError(field_name);
  r.description =
      r.sc.Describe({.parallel = false, .batches_taken = static_cast<int64_t>(r.batches.size())});
  return r;
}

// The search's score batches among the run's (PickScoreBatches).
std::vector<GlobalBatch> ScoreBatches(const std::vector<GlobalBatch>& batches,
                                      const SearchSpace& search) {
  std::vector<GlobalBatch> out;
  for (size_t i : PickScoreBatches(batches, search.score_batches, search.score_extremes)) {
    out.push_back(batches[i]);
  }
  return out;
}

BatchingOptions ScoreBatching(const CompareScenario& sc) {
  BatchingOptions batching;
  batching.seed = sc.seed;
  batching.max_seqlen = sc.max_seqlen;
  return batching;
}

SimOptions ScenarioSim(const CompareScenario& sc) {
  SimOptions sim;
  sim.collectives =
      sc.stepwise_collectives ? CollectiveMode::kStepwise : CollectiveMode::kClosedForm;
  return sim;
}

}  // namespace sluice::compare_internal
