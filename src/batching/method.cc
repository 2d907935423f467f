#include "batching/method.h"

#include <fmt/core.h>

#include <functional>

#include "base/json_util.h"
#include "batching/assigners.h"
#include "batching/baselines.h"
#include "batching/dynapipe_batcher.h"
#include "batching/hydraulis.h"
#include "batching/karmarkar_karp.h"
#include "batching/megatron_gbp.h"

namespace sluice {
namespace {

constexpr std::string_view kGlobal = "global";

struct Entry {
  std::string_view name;
  std::string_view description;
};

constexpr Entry kAssigners[] = {
    {"contiguous", "Megatron's data-parallel sampler: replica r takes the r-th equal slice"},
    {"balanced", "LPT on each sample's estimated cost a*s^2 + b*s"},
    {"hydraulis", "Hydraulis stage 1: seeded randomised greedy min-max of sum f(s) + (pp-1) max f"},
    {"global", "DynaPipe: micro-batch the whole batch, then Karmarkar-Karp over replicas "
               "(with dynapipe, token-budget, gbp or gbpc only)"},
};

constexpr Entry kBatchers[] = {
    {"padding", "pad every sample to max_seqlen, fixed micro-batch size"},
    {"sorted", "sort by length, fixed micro-batch size, pad to each micro-batch's max"},
    {"token-budget", "fairseq max_tokens: greedy cut by padded tokens"},
    {"packing", "Megatron/DeepSpeed pack-dataset: next-fit into max_seqlen rows, full attention"},
    {"multipack", "first-fit-decreasing into max_seqlen rows (varlen attention, decoder-only)"},
    {"dynapipe", "order samples, exact consecutive-split DP with t_max enumeration"},
    {"hydraulis", "Hydraulis stage 2: v balanced varlen micro-batches under a token cap"},
    {"gbp", "Megatron-Core global batch packing: work-balanced THD packs of the whole batch "
            "(with the global assigner)"},
    {"gbpc", "gbp by cp class: a pack holds samples of one cp class (Megatron-Core's hybrid cp; "
             "with the global assigner)"},
};

constexpr Entry kMethods[] = {
    {"padding", "contiguous+padding"},
    {"sorted", "contiguous+sorted"},
    {"token-budget", "contiguous+token-budget"},
    {"packing", "contiguous+packing"},
    {"multipack", "contiguous+multipack"},
    {"dynapipe", "global+dynapipe"},
    {"hydraulis", "hydraulis+hydraulis"},
    {"megatron-gbp", "global+gbp"},
    {"megatron-hybrid-cp", "global+gbpc"},
};

template <size_t N>
std::vector<std::string_view> Names(const Entry (&entries)[N]) {
  std::vector<std::string_view> names;
  for (const Entry& e : entries) names.push_back(e.name);
  return names;
}

template <size_t N>
std::vector<MethodInfo> Infos(const Entry (&entries)[N]) {
  std::vector<MethodInfo> out;
  for (const Entry& e : entries) out.push_back({std::string(e.name), std::string(e.description)});
  return out;
}

// Splits "A+B" or expands a single name; the error lists what is allowed.
Status SplitMethod(std::string_view method, std::string* assigner, std::string* batcher) {
  const size_t plus = method.find('+');
  if (plus == std::string_view::npos) {
    for (const Entry& e : kMethods) {
      if (e.name == method) return SplitMethod(e.description, assigner, batcher);
    }
    return InvalidArgumentError(fmt::format(
        "--method: unknown method '{}' (allowed: {}, or ASSIGNER+BATCHER with assigners {} and "
        "batchers {})",
        method, JoinAllowed(Names(kMethods)), JoinAllowed(Names(kAssigners)),
        JoinAllowed(Names(kBatchers))));
  }
  *assigner = std::string(method.substr(0, plus));
  *batcher = std::string(method.substr(plus + 1));
  return Status::Ok();
}

}  // namespace

std::vector<MethodInfo> ListMethods() { return Infos(kMethods); }
std::vector<MethodInfo> ListAssigners() { return Infos(kAssigners); }
std::vector<MethodInfo> ListMicroBatchers() { return Infos(kBatchers); }

StatusOr<std::unique_ptr<Assigner>> MakeAssigner(std::string_view name) {
  if (name == "contiguous") return MakeContiguousAssigner();
  if (name == "balanced") return MakeBalancedAssigner();
  if (name == "hydraulis") return MakeHydraulisAssigner();
  std::vector<std::string_view> allowed = {"contiguous", "balanced", "hydraulis"};
  return InvalidArgumentError(
      fmt::format("--method: unknown assigner '{}' (allowed: {}, or 'global' before dynapipe or "
                  "token-budget)",
                  name, JoinAllowed(allowed)));
}

StatusOr<std::unique_ptr<MicroBatcher>> MakeMicroBatcher(std::string_view name) {
  if (name == "padding") return MakePaddingBatcher();
  if (name == "sorted") return MakeSortedBatcher();
  if (name == "token-budget") return MakeTokenBudgetBatcher();
  if (name == "packing") return MakePackingBatcher();
  if (name == "multipack") return MakeMultipackBatcher();
  if (name == "dynapipe") return MakeDynaPipeBatcher();
  if (name == "hydraulis") return MakeHydraulisBatcher();
  if (name == "gbp") return MakeGlobalBatchPackingBatcher();
  if (name == "gbpc") return MakeCpClassPackingBatcher();
  return InvalidArgumentError(fmt::format("--method: unknown micro-batcher '{}' (allowed: {})",
                                          name, JoinAllowed(Names(kBatchers))));
}

StatusOr<BatchPlan> RunMethod(std::string_view method, std::span<const Sample> batch,
                              const StageCostEvaluator& eval, const BatchingOptions& options) {
  std::string assigner_name, batcher_name;
  SLUICE_RETURN_IF_ERROR(SplitMethod(method, &assigner_name, &batcher_name));
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<MicroBatcher> batcher, MakeMicroBatcher(batcher_name));
  const int64_t dp = eval.parallel().dp;

  BatchPlan plan;
  if (assigner_name == kGlobal) {
    if (batcher_name != "dynapipe" && batcher_name != "token-budget" && batcher_name != "gbp" &&
        batcher_name != "gbpc") {
      return InvalidArgumentError(fmt::format(
          "--method '{}': the global assigner micro-batches the whole batch and splits the "
          "micro-batches over replicas; it composes with dynapipe, token-budget, gbp and gbpc only "
          "(the fixed-size baselines are per-replica configurations)",
          method));
    }
    SLUICE_ASSIGN_OR_RETURN(ReplicaBatches global, batcher->Build(batch, eval, options, dp));
    SLUICE_ASSIGN_OR_RETURN(plan, DistributeMicroBatches(std::move(global), batch, eval, options));
  } else {
    SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<Assigner> assigner, MakeAssigner(assigner_name));
    const std::vector<std::vector<Sample>> parts = assigner->Assign(batch, eval, options);
    SLUICE_CHECK(static_cast<int64_t>(parts.size()) == dp);
    plan.replicas.resize(static_cast<size_t>(dp));
    for (int64_t r = 0; r < dp; ++r) {
      SLUICE_ASSIGN_OR_RETURN(ReplicaBatches rb, batcher->Build(parts[r], eval, options, 1));
      if (rb.outcome != PlanOutcome::kOk) {
        plan.outcome = rb.outcome;
        plan.infeasible_reason = fmt::format("replica {}: {}", r, rb.infeasible_reason);
        plan.replicas.clear();
        break;
      }
      plan.replicas[r] = std::move(rb.micro_batches);
    }
  }
  plan.method = std::string(method);
  if (plan.outcome == PlanOutcome::kOk) {
    Status valid = ValidateBatchPlan(plan, batch, eval);
    if (!valid.ok()) {
      return InternalError(fmt::format("method '{}' produced an invalid plan: {}", method,
                                       valid.message()));
    }
  }
  return plan;
}

}  // namespace sluice
