#include "schedule/schedule_costs.h"

#include <fmt/core.h>

#include <algorithm>
#include <vector>

#include "cost/comm_model.h"

namespace sluice {
namespace {

// share = part / whole, or 1 / n when the whole is zero.
double Share(int64_t part, int64_t whole, int64_t n) {
  return whole > 0 ? static_cast<double>(part) / static_cast<double>(whole)
                   : 1.0 / static_cast<double>(n);
}

// Whether the boundary from rank `src` to rank `dst` of a pipeline whose first device is `first`
// crosses nodes (any tensor-parallel peer pair in different nodes).
bool CrossesNodes(int64_t first, int64_t src, int64_t dst, int64_t tp, int64_t per_node) {
  for (int64_t j = 0; j < tp; ++j) {
    if ((first + src * tp + j) / per_node != (first + dst * tp + j) / per_node) return true;
  }
  return false;
}

}  // namespace

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
  const int64_t first = options.replica * pp * par.tp;
  if (options.replica < 0 || first + pp * par.tp > cluster.num_devices()) {
    return InvalidArgumentError(
        fmt::format("schedule cost options: replica {} needs devices {}..{}, the cluster has {}",
                    options.replica, first, first + pp * par.tp - 1, cluster.num_devices()));
  }
  const AlphaBetaCommModel comm(cluster);
  ScheduleCosts out;
  out.pp = pp;
  out.vpp = vpp;
  out.chunks.assign(static_cast<size_t>(m), std::vector<ChunkCost>(static_cast<size_t>(stages)));
  out.p2p.assign(static_cast<size_t>(m), std::vector<Duration>(static_cast<size_t>(stages - 1)));
  for (int64_t r = 0; r < pp; ++r) out.budget.push_back(eval.ActivationBudget(r));
  std::vector<StageCost> chunk;
  for (int64_t i = 0; i < m; ++i) {
    const MicroBatch& mb = micro_batches[i];
    if (static_cast<int64_t>(mb.stage_forward.size()) != pp ||
        static_cast<int64_t>(mb.stage_backward.size()) != pp ||
        static_cast<int64_t>(mb.stage_backward_weight.size()) != pp ||
        static_cast<int64_t>(mb.stage_stored.size()) != pp ||
        static_cast<int64_t>(mb.stage_peak.size()) != pp) {
      return InvalidArgumentError(fmt::format(
          "schedule costs: micro-batch {} has figures for {} stages, the pipeline has {}", i,
          mb.stage_forward.size(), pp));
    }
    const bool shares = vpp > 1 && eval.EvaluateChunks(mb.shape, mb.recompute, &chunk);
    for (int64_t c = 0; c < stages; ++c) {
      const int64_t d = c % pp;
      const Duration weight = mb.stage_backward_weight[d];
      ChunkCost& cc = out.chunks[i][c];
      if (vpp == 1) {
        cc.forward = mb.stage_forward[d];
        cc.backward_input = mb.stage_backward[d] - weight;
        cc.backward_weight = weight;
        cc.stored = mb.stage_stored[d];
        cc.peak = mb.stage_peak[d];
      } else {
        // The chunk's shares of its device's figures; its peak is its own high-water mark at
        // the padded shape, scaled like its stored bytes.
        const double even = 1.0 / static_cast<double>(vpp);
        double fw = even, bi = even, bw = even, mem = even, peak_scale = 1.0;
        if (shares) {
          StageCost sum;
          for (int64_t k = d; k < stages; k += pp) {
            sum.forward += chunk[k].forward;
            sum.backward_input += chunk[k].backward_input;
            sum.backward_weight += chunk[k].backward_weight;
            sum.stored += chunk[k].stored;
          }
          fw = Share(chunk[c].forward.nanos(), sum.forward.nanos(), vpp);
          bi = Share(chunk[c].backward_input.nanos(), sum.backward_input.nanos(), vpp);
          bw = Share(chunk[c].backward_weight.nanos(), sum.backward_weight.nanos(), vpp);
          mem = Share(chunk[c].stored.count(), sum.stored.count(), vpp);
          peak_scale = Share(mb.stage_stored[d].count(), sum.stored.count(), 1);
        }
        cc.forward = mb.stage_forward[d].Scaled(fw);
        cc.backward_input = (mb.stage_backward[d] - weight).Scaled(bi);
        cc.backward_weight = weight.Scaled(bw);
        cc.stored = mb.stage_stored[d].Scaled(mem);
        // Without shares the running layer's transient stays whole.
        cc.peak = shares
                      ? chunk[c].peak.Scaled(peak_scale)
                      : cc.stored + std::max(Bytes::Zero(), mb.stage_peak[d] - mb.stage_stored[d]);
      }
      cc.stored_until_w = cc.stored.Scaled(options.w_stored_fraction);
      if (c + 1 < stages) {
        const int64_t dst = (c + 1) % pp;
        out.p2p[i][c] =
            d == dst
                ? Duration::Zero()
                : comm.PointToPoint(eval.ChunkBoundaryBytes(mb.shape, c),
                                    CrossesNodes(first, d, dst, par.tp, cluster.devices_per_node));
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
  for (size_t i = 0; i < order.size(); ++i) {
    out->chunks[i] = costs.chunks[order[i]];
    if (!costs.p2p.empty()) out->p2p[i] = costs.p2p[order[i]];
  }
}

}  // namespace sluice
