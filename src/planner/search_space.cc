#include "planner/search_space.h"

#include <fmt/core.h>

#include "base/json_util.h"
#include "batching/method.h"

namespace sluice {
namespace {

std::vector<ScheduleKind> MegatronSchedules() {
  return {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved};
}

}  // namespace

std::string_view MethodKindName(MethodKind kind) {
  switch (kind) {
    case MethodKind::kHomogeneous:
      return "homogeneous";
    case MethodKind::kHetero:
      return "hetero";
    case MethodKind::kDynamic:
      return "dynamic";
  }
  return "?";
}

StatusOr<MethodKind> ParseMethodKind(std::string_view name, std::string_view source) {
  for (MethodKind k : {MethodKind::kHomogeneous, MethodKind::kHetero, MethodKind::kDynamic}) {
    if (name == MethodKindName(k)) return k;
  }
  return InvalidArgumentError(fmt::format(
      "{}: unknown method kind '{}' (allowed: homogeneous, hetero, dynamic)", source, name));
}

bool IsBatchingName(std::string_view name) {
  const size_t plus = name.find('+');
  if (plus == std::string_view::npos) {
    for (const MethodInfo& m : ListMethods()) {
      if (m.name == name) return true;
    }
    return false;
  }
  // The global assigner is RunMethod's own (it composes with some batchers only; RunMethod says
  // which).
  const std::string_view assigner = name.substr(0, plus);
  return (assigner == "global" || MakeAssigner(assigner).ok()) &&
         MakeMicroBatcher(name.substr(plus + 1)).ok();
}

std::vector<std::string> KnownMethodNames() {
  return {"packing",   "token-budget", "multipack", "dynapipe",    "hydraulis",
          "sluice",    "padding",      "sorted",    "megatron-gbp", "sluice-hetero",
          "sluice-dynamic"};
}

std::vector<MethodSpec> DefaultMethods() {
  std::vector<MethodSpec> methods;
  for (const char* name :
       {"packing", "token-budget", "multipack", "dynapipe", "hydraulis", "sluice"}) {
    methods.push_back(*MethodSpecFor(name, "default"));
  }
  return methods;
}

StatusOr<MethodSpec> MethodSpecFor(std::string_view name, std::string_view source) {
  MethodSpec spec;
  spec.name = std::string(name);
  if (name == "padding" || name == "sorted" || name == "token-budget" || name == "packing" ||
      name == "multipack") {
    spec.batching = {std::string(name)};
    spec.schedules = MegatronSchedules();
  } else if (name == "megatron-gbp") {
    // Megatron-Core's global batch packing at a fixed cp, and with its hybrid (dynamic) cp:
    // packs by cp class, each sample's cp by its length (batching/dynamic_cp.h).
    spec.batching = {"megatron-gbp", "megatron-hybrid-cp"};
    spec.schedules = MegatronSchedules();
    spec.dynamic_cp = true;
  } else if (name == "dynapipe") {
    spec.batching = {"dynapipe"};
    spec.schedules = {ScheduleKind::k1F1B, ScheduleKind::kAdaptive};
  } else if (name == "hydraulis") {
    spec.batching = {"hydraulis"};
    spec.schedules = {ScheduleKind::k1F1B};
  } else if (name == "sluice" || name == "sluice-dynamic") {
    // global+gbp(c): megatron-gbp's packs (by cp class), with sluice's choice of each
    // micro-batch's cp.
    spec.batching = {"dynapipe", "hydraulis",  "hydraulis+dynapipe", "multipack", "token-budget",
                     "packing",  "global+gbp", "global+gbpc"};
    spec.schedules = AllScheduleKinds();
    spec.dynamic_cp = true;
    if (name == "sluice-dynamic") spec.kind = MethodKind::kDynamic;
  } else if (name == "sluice-hetero") {
    spec.kind = MethodKind::kHetero;
    spec.batching = {"hydraulis"};
    spec.schedules = {ScheduleKind::k1F1B};
  } else if (IsBatchingName(name)) {
    spec.batching = {std::string(name)};
    spec.schedules = AllScheduleKinds();
  } else {
    std::vector<std::string> known = KnownMethodNames();
    std::vector<std::string_view> allowed(known.begin(), known.end());
    return InvalidArgumentError(fmt::format(
        "{}: unknown method '{}' (allowed: {}, or any batching method ASSIGNER+BATCHER of "
        "docs/batching.md)",
        source, name, JoinAllowed(allowed)));
  }
  return spec;
}

}  // namespace sluice
