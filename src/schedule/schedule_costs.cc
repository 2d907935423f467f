#include "schedule/schedule_costs.h"

#include <fmt/core.h>

#include <algorithm>
#include <vector>

#include "cost/comm_model.h"

namespace sluice {

StatusOr<ScheduleCosts> BuildScheduleCosts(std::span<const MicroBatch> micro_batches,
                                           const StageCostEvaluator& eval,
                                           const ClusterSpec& cluster,
                                           const ScheduleCostOptions& options) {
  const ParallelConfig& par = eval.parallel();
  const int64_t pp = par.pp;
  const int64_t vpp = par.vpp;
  const int64_t stages = pp * vpp;
  const int64_t m = static_cast<int64_t>(micro_batches.size());
  if (m == 0) return InvalidArgumentError("schedule costs: the replica has no micro-batches");
  if (!(options.w_stored_fraction >= 0 && options.w_stored_fraction <= 1)) {
    return InvalidArgumentError(
        fmt::format("schedule cost options: w_stored_fraction must be in [0, 1], got {}",
                    options.w_stored_fraction));
  }
  if (options.replica < 0 || options.replica >= std::max(par.dp, int64_t{1}) ||
      par.devices() > cluster.num_devices()) {
    return InvalidArgumentError(fmt::format(
        "schedule cost options: replica {} of dp {} needs {} devices, the cluster has {}",
        options.replica, par.dp, par.devices(), cluster.num_devices()));
  }
  const AlphaBetaCommModel comm(cluster);
  ScheduleCosts out;
  out.pp = pp;
  out.vpp = vpp;
  out.chunks.assign(static_cast<size_t>(m), std::vector<ChunkCost>(static_cast<size_t>(stages)));
  out.p2p.assign(static_cast<size_t>(m), std::vector<Duration>(static_cast<size_t>(stages - 1)));
  out.held.assign(static_cast<size_t>(m), std::vector<Bytes>(static_cast<size_t>(stages)));
  // Each rank keeps room for the transient buffers of its largest micro-batch.
  std::vector<Bytes> transient(static_cast<size_t>(pp));
  for (const MicroBatch& mb : micro_batches) {
    for (int64_t r = 0; r < pp; ++r) {
      transient[r] = std::max(transient[r], eval.TransientBuffers(mb.shape, r));
    }
  }
  for (int64_t r = 0; r < pp; ++r) {
    out.budget.push_back(std::max(Bytes::Zero(), eval.ActivationBudget(r) - transient[r]));
  }
  for (int64_t i = 0; i < m; ++i) {
    const MicroBatch& mb = micro_batches[i];
    if (static_cast<int64_t>(mb.stages.size()) != pp) {
      return InvalidArgumentError(fmt::format(
          "schedule costs: micro-batch {} has figures for {} stages, the pipeline has {}", i,
          mb.stages.size(), pp));
    }
    eval.SplitOverChunks(mb.shape, mb.recompute, mb.stages, &out.chunks[i]);
    for (int64_t c = 0; c < stages; ++c) {
      const int64_t d = c % pp;
      ChunkCost& cc = out.chunks[i][c];
      cc.stored_until_w = cc.stored.Scaled(options.w_stored_fraction);
      out.held[i][c] = eval.ChunkHeldBuffers(mb.shape, c);
      if (c + 1 < stages) {
        const int64_t dst = (c + 1) % pp;
        out.p2p[i][c] =
            d == dst
                ? Duration::Zero()
                : comm.PointToPoint(eval.ChunkBoundaryBytes(mb.shape, c),
                                    RanksCrossNodes(cluster, par, options.replica * pp + d,
                                                    options.replica * pp + dst));
      }
    }
  }
  return out;
}

void PermuteMicroBatches(const ScheduleCosts& costs, std::span<const int64_t> order,
                         ScheduleCosts* out) {
  out->pp = costs.pp;
  out->vpp = costs.vpp;
  out->budget = costs.budget;
  out->chunks.resize(order.size());
  out->p2p.resize(costs.p2p.empty() ? 0 : order.size());
  out->held.resize(costs.held.empty() ? 0 : order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    out->chunks[i] = costs.chunks[order[i]];
    if (!costs.p2p.empty()) out->p2p[i] = costs.p2p[order[i]];
    if (!costs.held.empty()) out->held[i] = costs.held[order[i]];
  }
}

}  // namespace sluice
