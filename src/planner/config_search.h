// Configuration search: the parallel configurations, schedules and batching methods a careful
// user would try for each compared method, priced the way `sluice compare` ranks them.
//
// The space: every (dp, pp, tp) that CheckParallelFits accepts on the cluster (by default only
// those that use every device; tp a power of two within one node that the cost model supports),
// every ZeRO stage of SearchSpace::zero (ZeRO does not change a configuration with dp = 1, so
// only the first listed stage is kept there), each of the method's schedules (interleaved with
// every vpp of SearchSpace::vpp that cuts the layers evenly) and each of its batching methods.
// The fixed-size baselines' micro-batch size and recompute level are searched per batch by the
// batching layer itself (batching/baseline_search.h).
//
// Ranking is two-stage: every candidate is planned on the score batches (PickScoreBatches: the
// first few global batches plus the longest and densest ones) and scored by the fast estimator
// (PlanResult::makespan, plus the data-parallel gradient synchronisation that the estimator does
// not see, priced by the α-β model as if fully exposed); the best few per method are then
// simulated (sim/simulator.h) and the best simulated throughput wins. Candidates are counted and
// ranked by the rule of run_tally.h: a score batch that does not fit memory (in planning or in
// simulation) is a failed batch, and a candidate that failed one ranks below every candidate
// that ran them all; one that failed every batch, or whose model states alone exceed the limit,
// is infeasible with the reason kept. A batching method that does not support the model (e.g.
// varlen packing of an encoder-decoder model) is "unsupported".
//
// Thread safety: a CandidateScorer is used by one thread. Deterministic for fixed inputs.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/units.h"
#include "batching/stage_cost.h"
#include "cost/cost_model.h"
#include "data/global_batcher.h"
#include "model/cluster_spec.h"
#include "model/parallel_config.h"
#include "planner/planner.h"
#include "planner/run_tally.h"
#include "planner/search_space.h"
#include "sim/simulator.h"

namespace sluice {

// One point of the search.
struct Candidate {
  ParallelConfig parallel;
  ScheduleKind schedule = ScheduleKind::k1F1B;
  std::string batching;
  // cp > 1 only: each micro-batch may run at a smaller cp (PlannerOptions::dynamic_cp).
  bool dynamic_cp = false;

  // "dp 2 x pp 4 x tp 1, ZeRO-1, 1f1b, dynapipe" (vpp shown when > 1; ", dynamic cp" when set).
  std::string Describe() const;
  // A unique, ordered key for memoisation.
  std::string Key() const;

  friend bool operator==(const Candidate&, const Candidate&) = default;
};

// Parallel configurations (vpp 1) to try, with the reasons others were left out. Each carries
// `memory_limit` and `memory_reserve` (ParallelConfig::MemoryLimit).
struct ParallelSpace {
  std::vector<ParallelConfig> configs;
  std::vector<std::string> skipped;
};
ParallelSpace EnumerateParallelConfigs(const ModelSpec& model, const ClusterSpec& cluster,
                                       const CostModel& cost, const SearchSpace& space,
                                       std::optional<Bytes> memory_limit,
                                       std::optional<Bytes> memory_reserve = std::nullopt);

// Every candidate of `method` over `configs`, in a deterministic order.
std::vector<Candidate> ExpandCandidates(std::span<const ParallelConfig> configs,
                                        const MethodSpec& method, const ModelSpec& model,
                                        const SearchSpace& space);

// The indices of the score batches among `batches` (ascending, no repeats): the first `first`
// (0 = all), plus, when `extremes`, the batch holding the longest sample (input + target), the
// batch with the most attention work (the sum over its samples of (input + target)^2) and the
// batch with the most tokens; the earliest batch wins a tie. Deterministic.
std::vector<size_t> PickScoreBatches(std::span<const GlobalBatch> batches, int64_t first,
                                     bool extremes);

// Time of the data-parallel gradient synchronisation of the slowest stage, if fully exposed:
// all-reduce of the fp16 gradients (ZeRO 0, 1) or reduce-scatter + all-gather (ZeRO >= 2) over
// the stage's GradientRing (dp * cp devices, priced by AlphaBetaCommModel with its crossing
// shares). Zero when dp * cp = 1.
Duration EstimateGradientSync(const StageCostEvaluator& eval, const ClusterSpec& cluster);

// The outcome of one candidate on the score batches.
struct CandidateScore {
  Candidate candidate;
  // kOk: at least one score batch ran (see failed_batches); kOutOfMemory: none did, or the model
  // states alone exceed the limit.
  enum class State { kOk, kOutOfMemory, kUnsupported } state = State::kOk;
  std::string reason;          // why not kOk, or why its first failed batch failed
  int64_t failed_batches = 0;  // score batches that did not fit memory (planned or simulated)
  int64_t tokens = 0;          // real tokens placed over the score batches that ran
  Duration estimated_time;     // sum of (makespan + gradient sync) over the batches that ran
  double estimated_tokens_per_s = 0;  // RunTally::TokensPerSecond of the estimates
  bool simulated = false;
  double simulated_tokens_per_s = 0;  // RunTally::TokensPerSecond of the simulated times
  Duration planning_time;             // summed Planner::Plan wall time over the score batches
  // Compute seconds of each virtual stage (StageComputeSeconds, planner/layer_cut.h) summed over
  // the score batches that ran: what the layer cut search rescales its weights by.
  std::vector<double> stage_busy;

  bool complete() const { return state == State::kOk && failed_batches == 0; }
};

// Builds evaluators, plans and simulations of candidates on demand, memoised by Candidate::Key.
class CandidateScorer {
 public:
  // REQUIRES: every argument outlives the scorer; `batches` are the score batches.
  CandidateScorer(const CostModel& cost, const ClusterSpec& cluster,
                  std::span<const GlobalBatch> batches, const BatchingOptions& batching,
                  const SimOptions& sim);
  CandidateScorer(const CandidateScorer&) = delete;
  CandidateScorer& operator=(const CandidateScorer&) = delete;

  // The evaluator a planner of `schedule` on `parallel` uses (MakePlannerEvaluator), shared by
  // every candidate of the same (parallel, in-flight rule); or why none exists (model states
  // exceed memory).
  StatusOr<std::shared_ptr<const StageCostEvaluator>> Evaluator(const ParallelConfig& parallel,
                                                                ScheduleKind schedule);
  // The planner options a candidate runs with.
  PlannerOptions OptionsFor(const Candidate& candidate) const;
  // The planner of a candidate, on its shared evaluator. Errors: Evaluator's, Planner::Create's.
  StatusOr<Planner> PlannerFor(const Candidate& candidate);

  // Fast-estimator score (memoised). Errors: bugs only (a plan failing validation).
  StatusOr<CandidateScore> Score(const Candidate& candidate);
  // Score() plus a simulation of every score batch (memoised). A batch whose simulation exceeds
  // memory or deadlocks is a failed batch (with the simulator's reason).
  StatusOr<CandidateScore> Simulate(const Candidate& candidate);

  const CostModel& cost() const { return *cost_; }
  std::span<const GlobalBatch> batches() const { return batches_; }

 private:
  struct EvalKey {
    int64_t dp, pp, tp, cp, ep, vpp, zero;
    InFlightPolicy policy;
    std::vector<int64_t> layer_cut;
    auto operator<=>(const EvalKey&) const = default;
  };
  const CostModel* cost_;
  const ClusterSpec* cluster_;
  std::span<const GlobalBatch> batches_;
  BatchingOptions batching_;
  SimOptions sim_;
  std::map<EvalKey, StatusOr<std::shared_ptr<const StageCostEvaluator>>> evaluators_;
  std::map<std::string, CandidateScore> scores_;
};

// The search of one method: every candidate scored, the top `simulate_top` feasible ones
// simulated. `best` is the simulated feasible candidate that ranks first by the rule of
// run_tally.h (every score batch run before any failed, then the simulated throughput); absent
// when none is feasible (`reason` then says why, e.g. the memory need of the smallest
// micro-batch).
struct MethodSearch {
  std::string method;
  std::vector<CandidateScore> ranked;  // every candidate, best estimate first, infeasible last
  std::optional<CandidateScore> best;
  std::string reason;
  bool unsupported = false;  // no batching method of the method supports the model
};

// The layer cut search (planner/layer_cut.h) on `base`'s configuration, scored by
// scorer.Score; the chosen cut simulated (scorer.Simulate), or nullopt when `base` has no
// pipeline to cut (one chunk), runs vpp > 1 or already has a cut, or the even cut stays best.
StatusOr<std::optional<CandidateScore>> BalanceLayerCut(CandidateScorer& scorer,
                                                        const Candidate& base);

// Runs the search of `method` over `candidates` (see MethodSearch). `on_candidate` is called
// after each candidate scored (progress); `cancelled` is polled between candidates (the search
// then stops with what it has). With `balance_layer_cut` (SearchSpace::layer_cut "balanced"),
// the best simulated candidate with a pipeline (vpp 1, the even cut) then gets the layer cut
// search (planner/layer_cut.h) scored by Score() on the score batches; a cut it finds is
// simulated as a candidate of its own and ranked with the others.
StatusOr<MethodSearch> SearchMethod(CandidateScorer& scorer, const std::string& method,
                                    std::span<const Candidate> candidates, int64_t simulate_top,
                                    const std::function<void()>& on_candidate,
                                    const std::function<bool()>& cancelled,
                                    bool balance_layer_cut = false);

}  // namespace sluice
