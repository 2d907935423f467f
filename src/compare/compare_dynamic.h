// Per-iteration strategy (Hydraulis' dynamic strategies, issue 16): `sluice-dynamic`
// (MethodKind::kDynamic) chooses, for each global batch, one of a few strategies found for the
// data, with the cost of switching between them modelled.
//
// The strategies: the best homogeneous configurations of the method's own search (the simulated
// choice first, then the other candidates that ran every score batch, best estimate first, at
// most `homogeneous`) and the best heterogeneous mixes of compare_hetero.h (simulated ones
// first, at most `hetero`). Each carries a calibration factor from the search: its estimated
// over its simulated throughput on the score batches (1 when it was not simulated), so that one
// estimator's bias between shapes does not decide the choice.
//
// Per batch: the strategies plan it in order (Planner::Plan, HeteroPlanner::Plan); a strategy's
// estimate is the planner's makespan plus its gradient synchronisation (EstimateGradientSync; a
// heterogeneous plan's makespan includes both syncs) times its calibration factor; the strategy
// chosen minimises estimate + the cost of switching to it from the previous batch's strategy
// (the first batch switches from nothing). Only the chosen plan is simulated; its iteration is
// the simulated one plus the switch. The batch's planning time is the wall time of planning and
// choosing, the screen included. Homogeneous strategies whose planners batch alike (the same
// configuration under several schedules: Planner::SameBatching) share one batching of the batch
// (Planner::Batch, then PlanBatched each): the same plans as planning each from scratch.
//
// The screen (DynamicOptions::screen_margin; Hydraulis' "ranked by the estimator"): planning a
// heterogeneous strategy in full (three rounds of stage 1, every group batched, scheduled and
// lowered) costs several times a homogeneous one. Once a heterogeneous strategy has been planned
// in full (by the search, on its score batches, or here), its stage 1 alone prices later batches
// (HeteroPlanner::Screen, with the per-group scales its last full plan learnt). When a batch's
// screened estimate, calibrated and less the margin, plus the switch, is still no better than the
// best strategy planned so far, the strategy is not planned for that batch (BatchRecord::screened).
// The screen is an estimate: a strategy it skips could have won by more than the margin; `compare
// --dynamic-screen off` plans every strategy, and docs/benchmarks.md measures the two side by side.
// A strategy is planned at least every kScreenRefresh batches so that its scales follow the data.
// The mixes' refresh counters start staggered over that period (mix k of m starts k x
// kScreenRefresh / m batches into it), so that their refreshes do not fall on one batch while the
// screen skips them; a mix the screen lets through is planned in full, and its counter restarts.
// A refresh of a mix the screen would still skip is there for its scales, not for the choice:
// with DynamicOptions::quick_refresh (the default; `compare --dynamic-refresh quick`) it is
// planned from the scales it has learnt, stage 1 once (HeteroPlanner::PlanFrom) instead of three
// rounds, and that plan competes for the batch like any other (docs/benchmarks.md measures both).
//
// Switching cost (SwitchCost): a change of layout re-shards the parameters and optimizer states
// (fp16 weights and the fp32 master weights and Adam moments, ZeRO-sharded; gradients are rebuilt
// every iteration): each device receives the states its new place holds, priced as one
// all-to-all over every device (on the inter-node link when the cluster has several nodes) of
// the largest per-device state of the new layout. Layouts are equal when every group has the
// same (dp, tp, pp, vpp, cp, ZeRO); then switching (a different batching or schedule) is free.
//
// Internal to compare/ (compare.cc).
//
// Thread safety: a DynamicRunner is used by one thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "compare/compare_hetero.h"
#include "compare/compare_run.h"
#include "model/cluster_spec.h"
#include "model/hetero_config.h"
#include "planner/config_search.h"
#include "planner/hetero.h"
#include "planner/planner.h"

namespace sluice {

// One strategy: a homogeneous candidate or a heterogeneous mix.
struct Strategy {
  std::optional<Candidate> candidate;
  std::optional<HeteroConfig> hetero;
  double calibration = 1;  // simulated time / estimated time on the score batches
  // A mix: its scales on the search's last score batch (HeteroCandidate::scale), which the
  // screen starts from; empty: the mix is planned in full on the first batch.
  std::vector<double> screen_scale;

  HeteroConfig Layout() const;  // a candidate as one group
  std::string Describe() const;
};

struct StrategyLimits {
  int64_t homogeneous = 3;
  int64_t hetero = 2;
};
// The strategies of a dynamic method from its searches (see the header); empty when neither
// found anything.
std::vector<Strategy> PickStrategies(const MethodSearch& search,
                                     const std::optional<HeteroChoice>& hetero,
                                     StrategyLimits limits);

// The modelled time of switching from layout `from` (nullopt: the first batch, nothing to move
// from: zero) to `to`. Zero when the layouts are equal.
Duration SwitchCost(const std::optional<HeteroConfig>& from, const HeteroConfig& to,
                    const ModelSpec& model, const ClusterSpec& cluster);

struct DynamicOptions {
  // The screen's margin (see the header), in [0, 1); nullopt: no screen, every strategy plans
  // every batch.
  std::optional<double> screen_margin = kDynamicScreenMargin;
  // A refresh of a mix the screen would skip: from its learnt scales in one round of stage 1
  // (HeteroPlanner::PlanFrom) instead of in full (see the header).
  bool quick_refresh = true;
};

// Batches after which a screened strategy is planned in full again.
inline constexpr int64_t kScreenRefresh = 8;

class DynamicRunner {
 public:
  // Planners for every strategy. REQUIRES: `scorer`, `cs`, `cluster` and the cost model outlive
  // the runner. Errors: a strategy that cannot be planned (bugs: each ran in its search).
  static StatusOr<DynamicRunner> Create(CandidateScorer& scorer, const CostModel& cost,
                                        const ClusterSpec& cluster, const MethodSpec& method,
                                        const CompareScenario& cs, std::vector<Strategy> strategies,
                                        DynamicOptions options = {});

  const std::vector<Strategy>& strategies() const { return strategies_; }

  // Plans `batch` with every strategy the screen keeps, chooses one, simulates it. The record's
  // strategy, switch_ms and screened are set, and its iteration includes the switch.
  StatusOr<BatchRun> Run(const GlobalBatch& batch, const SimOptions& sim, const FlopCounter& flops,
                         int64_t devices);
  // Batches whose strategy differs from the previous batch's (a layout change or not).
  int64_t switches() const { return switches_; }

 private:
  DynamicRunner() = default;
  const ClusterSpec* cluster_ = nullptr;
  const CostModel* cost_ = nullptr;
  std::vector<Strategy> strategies_;
  std::vector<std::optional<Planner>> planners_;             // [strategy] homogeneous
  std::vector<std::optional<HeteroPlanner>> hetero_planners_;  // [strategy] heterogeneous
  std::vector<Duration> sync_;                               // [strategy] EstimateGradientSync
  // [strategy] the first strategy whose planner batches alike (Planner::SameBatching; itself
  // when none): its batching of a batch is computed once and shared.
  std::vector<size_t> batching_of_;
  DynamicOptions options_;
  // [strategy] heterogeneous: the scales of its last full plan (HeteroPlanResult::scale; empty
  // before the first), and the batches screened out since.
  std::vector<std::vector<double>> scale_;
  std::vector<int64_t> screened_since_;
  std::optional<int64_t> previous_;
  int64_t switches_ = 0;
};

}  // namespace sluice
