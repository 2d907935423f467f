#include "planner/recompute_pricer.h"

#include "batching/micro_batch.h"

namespace sluice {

std::optional<std::vector<ChunkCost>> EvaluatorPricer::Price(const ExecutionPlan& plan,
                                                             int64_t dp_index, int64_t microbatch,
                                                             Recompute level) const {
  const PlanMicroBatch& pmb = plan.replicas[dp_index].micro_batches[microbatch];
  const BatchIndex& index = index_;
  for (const auto& row : pmb.rows) {
    for (int64_t id : row) {
      if (!index.Contains(id)) return std::nullopt;
    }
  }
  MicroBatch mb;
  mb.rows = pmb.rows;
  mb.varlen = pmb.varlen;
  mb.recompute = level;
  if (!PriceMicroBatch(eval_, index, &mb) || !(mb.shape == pmb.shape)) return std::nullopt;
  ScheduleCostOptions options = options_;
  options.replica = dp_index;
  StatusOr<ScheduleCosts> costs =
      BuildScheduleCosts(std::span<const MicroBatch>(&mb, 1), eval_, cluster_, options);
  if (!costs.ok() || costs->chunks.size() != 1) return std::nullopt;
  return costs->chunks[0];
}

}  // namespace sluice
