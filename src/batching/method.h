// Batching methods: one global batch -> per-replica ordered micro-batches, behind one interface.
//
// A method is an Assigner (samples -> data-parallel replicas) composed with a MicroBatcher (one
// replica's samples -> ordered micro-batches), or DynaPipe's global form (micro-batch the whole
// batch, then distribute micro-batches over replicas by Karmarkar-Karp). Names:
//   padding        pad every sample to max_seqlen, fixed micro-batch size
//   sorted         sort by length, fixed micro-batch size, pad to each micro-batch's max
//   token-budget   fairseq max_tokens / DynaPipe "TB": greedy cut by padded tokens
//   packing        Megatron/DeepSpeed pack-dataset: next-fit into max_seqlen rows, fixed rows/mb
//   multipack      first-fit-decreasing into max_seqlen rows, fixed rows per micro-batch
//   dynapipe       order (sort / 2-D TSP path), exact consecutive-split DP, Karmarkar-Karp over dp
//   hydraulis      randomised greedy min-max assignment, then balanced varlen packing per replica
//   ASSIGNER+BATCHER  any composition, e.g. hydraulis+dynapipe; assigners: contiguous (Megatron's
//                  data-parallel sampler: equal consecutive slices), balanced (LPT on estimated
//                  cost), hydraulis, global (DynaPipe's: micro-batch first, then Karmarkar-Karp).
// The single names are shorthands: padding = contiguous+padding (likewise sorted, token-budget,
// packing, multipack), dynapipe = global+dynapipe, hydraulis = hydraulis+hydraulis.
//
// Every method honours the memory rule of stage_cost.h or returns PlanOutcome::kOutOfMemory;
// unsupported combinations (e.g. varlen packing of an encoder-decoder model) are a Status error.
// Deterministic: same batch, options and seed -> identical plan.
//
// Thread safety: methods are stateless; RunMethod may be called concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "base/units.h"
#include "batching/micro_batch.h"
#include "batching/stage_cost.h"
#include "data/sample.h"

namespace sluice {

struct BatchingOptions {
  uint64_t seed = 0;                      // all randomness (Hydraulis shuffles, TSP starts)
  int64_t max_seqlen = 0;                 // padding/packing row length; 0 = the model's max position
  // Fixed-size baselines (padding, sorted, packing, multipack): micro-batch size in rows.
  // 0 = search per batch for the fastest size that fits (favourable to the baseline).
  int64_t micro_batch_size = 0;
  // Recompute level for every micro-batch; absent = the method chooses (baselines: the fastest
  // level that fits, uniform over the batch; dynapipe/hydraulis: per micro-batch, by cost).
  std::optional<Recompute> recompute;
  // token-budget: padded tokens per micro-batch; 0 = search per batch.
  int64_t tokens_per_micro_batch = 0;
  // dynapipe: thin the t_max candidates to this spacing (0 = exact: every distinct value).
  Duration tmax_thinning = Duration::Zero();
  // hydraulis: seeded shuffles tried by the stage-1 randomised greedy.
  int64_t hydraulis_shuffles = 64;

  friend bool operator==(const BatchingOptions&, const BatchingOptions&) = default;
};

struct ReplicaBatches {
  PlanOutcome outcome = PlanOutcome::kOk;
  std::string infeasible_reason;
  std::vector<MicroBatch> micro_batches;  // in execution order
};

class Assigner {
 public:
  virtual ~Assigner() = default;
  virtual std::string_view name() const = 0;
  // Splits `batch` over eval.parallel().dp replicas (each sample exactly once).
  virtual std::vector<std::vector<Sample>> Assign(std::span<const Sample> batch,
                                                  const StageCostEvaluator& eval,
                                                  const BatchingOptions& options) const = 0;
};

class MicroBatcher {
 public:
  virtual ~MicroBatcher() = default;
  virtual std::string_view name() const = 0;
  // Micro-batches of one replica's samples, in execution order, or kOutOfMemory. `replicas` > 1
  // in the global form: the micro-batches will be spread over that many replicas afterwards
  // (DynaPipe's objective then divides the summed time by it).
  virtual StatusOr<ReplicaBatches> Build(std::span<const Sample> samples,
                                         const StageCostEvaluator& eval,
                                         const BatchingOptions& options,
                                         int64_t replicas = 1) const = 0;
};

struct MethodInfo {
  std::string name;
  std::string description;
};
// The single-name methods and the assigners/batchers that compose, with one line each.
std::vector<MethodInfo> ListMethods();
std::vector<MethodInfo> ListAssigners();
std::vector<MethodInfo> ListMicroBatchers();

// Factories; errors list the allowed names.
StatusOr<std::unique_ptr<Assigner>> MakeAssigner(std::string_view name);
StatusOr<std::unique_ptr<MicroBatcher>> MakeMicroBatcher(std::string_view name);

// Runs `method` (a single name or ASSIGNER+BATCHER) on one global batch.
StatusOr<BatchPlan> RunMethod(std::string_view method, std::span<const Sample> batch,
                              const StageCostEvaluator& eval, const BatchingOptions& options);

}  // namespace sluice
