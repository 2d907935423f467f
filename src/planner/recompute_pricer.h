// EvaluatorPricer: the planner's RecomputePricer (passes/recompute.h). A micro-batch of a plan is
// priced at another recompute level exactly as the planner priced it: PriceMicroBatch with the
// batch's samples (batching/micro_batch.h), then BuildScheduleCosts for its replica
// (schedule/schedule_costs.h), which is what the lowering records per virtual stage.
//
// Thread safety: immutable; Price may run concurrently. REQUIRES: the evaluator outlives it.
#pragma once

#include <optional>
#include <vector>

#include "batching/micro_batch.h"
#include "batching/stage_cost.h"
#include "data/sample.h"
#include "model/cluster_spec.h"
#include "passes/recompute.h"
#include "schedule/schedule_costs.h"

namespace sluice {

class EvaluatorPricer final : public passes::RecomputePricer {
 public:
  // `batch`: the global batch the plan was made from (every sample id of its rows).
  EvaluatorPricer(const StageCostEvaluator& eval, ClusterSpec cluster, std::vector<Sample> batch,
                  ScheduleCostOptions options = {})
      : eval_(eval),
        cluster_(std::move(cluster)),
        batch_(std::move(batch)),
        index_(batch_),
        options_(options) {}
  // Not copyable or movable: index_ refers to batch_.
  EvaluatorPricer(const EvaluatorPricer&) = delete;
  EvaluatorPricer& operator=(const EvaluatorPricer&) = delete;
  // nullopt also when a row's sample is not in the batch or the shape differs from the plan's.
  std::optional<std::vector<ChunkCost>> Price(const ExecutionPlan& plan, int64_t dp_index,
                                              int64_t microbatch, Recompute level) const override;

 private:
  const StageCostEvaluator& eval_;
  ClusterSpec cluster_;
  std::vector<Sample> batch_;
  BatchIndex index_;  // of batch_, built once (a whole data set's index costs ~1 ms to sort)
  ScheduleCostOptions options_;
};

}  // namespace sluice
