// Heterogeneous replicas (Hydraulis, issue 16), planned and simulated: one iteration's devices
// split into replica groups of different shapes (model/hetero_config.h), the global batch spread
// over the replicas by Hydraulis' stage 1 across shapes, each group planned by a homogeneous
// Planner on its own samples, and the gradients synchronised across groups whose layers are cut
// differently by per-layer-range reduction groups.
//
// Stage 1 across shapes (HeteroPlanner::Dispatch): each group g has a capacity S_g, the longest
// sequence one of its replicas holds alone under the memory rule with pp micro-batches in flight
// at the most memory-saving recompute level, and per-sequence costs f_g(s) (EstimateSampleCosts
// on g's evaluator: Hydraulis' a s^2 + b s on the bottleneck stage). Replica r of group g has
// T_r = sum f_g(s_i) + (pp_g - 1) max f_g(s_i). For each of `shuffles` seeded shuffles the
// sequences are visited with those that fit the fewest groups first (the reference pins
// sequences only the widest replica holds), the rest in shuffled order; each goes to the replica
// that holds it and minimises the resulting max_r T_r (ties: an empty replica, then the smaller
// T_r, then the lower index). The shuffle kept has the smallest (some replica empty, max T_r).
// A sequence that fits no group makes the batch kOutOfMemory, naming it and the capacities.
// f is an estimate whose error differs between shapes (it leaves out the per-micro-batch cost,
// and the fit is off near the knee), so Plan refines it (HeteroPlannerOptions::refine_rounds):
// after each round, group g's costs are scaled by its planner's estimated makespan over stage
// 1's predicted time for it, and stage 1 runs again; the best round is kept.
//
// Each group then plans the union of its replicas' sequences with its own Planner (dp = the
// group's replicas; the method re-spreads them over those identical replicas, e.g. hydraulis'
// own stage 1), producing an ordinary validated ExecutionPlan on the group's ranks.
//
// Gradient synchronisation (ReductionGroupsOf): the union of every group's stage cuts splits the
// decoder layers into ranges; for each range, one member per group: the pipeline stage holding
// it (the embedding rides with the range holding layer 0, the output head with the last). Inside
// a group the plan's own data-parallel reduction (dp x cp, plan/lower.h) sums its replicas'
// gradients, so afterwards each of the group's cp x dp copies of a tp shard holds the group's
// sum; across groups each range is then reduced hierarchically (PriceReduction): every copy takes
// 1/(cp x dp) of its shard into an all-reduce over the groups (the bytes per device are the
// largest over the groups, 2 x params / (tp x cp x dp)), on the inter-node link when the groups'
// stages lie on different nodes, and each group then all-gathers its shard over its cp x dp
// copies (the slowest group's gather counts). With ZeRO-2 each copy keeps its reduced part
// (the group plan's reduce-scatter), so there is no gather: the group plan's own all-gather of
// the updated parameters after the step distributes them.
// The planner's estimate (HeteroPlanResult::makespan) prices the ranges one after another after
// the slowest group, fully exposed. The simulation (SimulateHetero, OverlapCrossSync) overlaps
// them with the work still running, as homogeneous plans overlap their bucketed reductions with
// the backward: each range is reduced in pieces of layers (SplitReductions), a piece starting
// once every member stage's backward has passed its layers and reduced them inside the group;
// pieces go one after another on one channel in the order they become ready, and each member
// rank's tail after its own reduction (the optimizer step and, with ZeRO-2, the gather of the
// updated parameters) waits for its pieces. Stages that end their backward early (the last
// pipeline stages, the faster group) and the last layers of every stage hide theirs.
//
// Device placement: each group's plan is simulated on the whole cluster from device 0 (its ranks'
// node boundaries as if it started at device 0); the groups run on disjoint devices and share no
// link in the model.
//
// Thread safety: a HeteroPlanner is immutable after Create; Plan() may run concurrently.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/units.h"
#include "cost/cost_model.h"
#include "data/global_batcher.h"
#include "data/sample.h"
#include "model/cluster_spec.h"
#include "model/hetero_config.h"
#include "plan/plan_json.h"
#include "planner/planner.h"
#include "sim/simulator.h"

namespace sluice {

// One stage of one replica group that holds a reduction group's layers.
struct ReductionMember {
  int64_t group = 0;  // index into HeteroConfig::groups
  int64_t stage = 0;  // pipeline rank of the group's replicas that holds the range

  friend bool operator==(const ReductionMember&, const ReductionMember&) = default;
};

// A range of decoder layers cut identically in every group (no group's stage boundary inside it).
struct ReductionGroup {
  int64_t first_layer = 0;
  int64_t layers = 0;
  bool embedding = false;    // the range holding layer 0 also reduces the input embedding
  bool output_head = false;  // the last range also reduces the final LayerNorm and output head
  int64_t params = 0;        // parameters of the range, unsharded (tp 1)
  std::vector<ReductionMember> members;  // one per group, in group order
  Duration cross_group_time;  // PriceReduction (set by HeteroPlanner::Create; 0 before)

  friend bool operator==(const ReductionGroup&, const ReductionGroup&) = default;
};

// The reduction groups of `config` for `model`, in layer order; they partition [0, layers).
// REQUIRES: CheckHeteroFits(config, model, ...) is ok.
std::vector<ReductionGroup> ReductionGroupsOf(const ModelSpec& model, const HeteroConfig& config);
// Cross-group time of one reduction group (see the header); zero with a single group.
Duration PriceReduction(const ReductionGroup& group, const HeteroConfig& config,
                        const ClusterSpec& cluster);

struct HeteroPlannerOptions {
  PlannerOptions planner;  // each group's (method, schedule, batching seed and max_seqlen, ...)
  int64_t shuffles = 16;   // stage 1 shuffles across shapes
  // Rounds of stage 1 after the first, each with group g's costs f_g scaled by what its planner
  // estimated over what stage 1 predicted for it (max over its replicas of T_r) in the round
  // before; the round with the smallest estimated makespan is kept. 0: stage 1 once.
  int64_t refine_rounds = 2;
  // Pieces per reduction range in the simulated overlap (SplitReductions).
  int64_t overlap_pieces = 4;
};

// Stage 1 across shapes.
struct HeteroDispatch {
  bool ok = false;                  // every sequence fits some group
  std::string reason;               // why not
  std::vector<int64_t> replica_of;  // per sequence position; replicas numbered group by group
  std::vector<int64_t> group_of;    // per sequence position
  int64_t max_time = 0;             // max_r T_r (ns, scaled costs)
  bool all_nonempty = false;
  std::vector<int64_t> group_time;  // [group] max over its replicas of T_r (ns, unscaled costs)
};

struct HeteroPlanResult {
  PlanOutcome outcome = PlanOutcome::kOk;
  std::string infeasible_reason;
  HeteroDispatch dispatch;
  std::vector<std::vector<Sample>> samples;  // [group] the group's sequences, in batch order
  std::vector<PlanResult> groups;            // [group] (empty unless outcome == kOk)
  std::vector<ReductionGroup> reductions;
  std::vector<ReductionGroup> pieces;  // SplitReductions of `reductions` (the simulated overlap)
  Duration cross_sync;  // sum of PriceReduction over the reductions
  // Estimate: max over groups of (makespan + the group's own gradient sync, EstimateGradientSync)
  // plus cross_sync.
  Duration makespan;
  Duration planning_time;  // wall time of Plan()
  // [group] the kept round's planned makespan over stage 1's time for the group (HeteroDispatch::
  // group_time): how far stage 1's per-sequence costs were off for this batch (empty unless kOk;
  // 1 for a group stage 1 gave no time). HeteroPlanner::Screen prices another batch with them.
  std::vector<double> scale;
};

class HeteroPlanner {
 public:
  // REQUIRES: `cost` outlives the planner. Errors: CheckHeteroFits' (with `source`), a group
  // whose model states alone exceed its memory limit (InvalidArgument naming the group).
  static StatusOr<HeteroPlanner> Create(const CostModel& cost, const HeteroConfig& config,
                                        const ClusterSpec& cluster, HeteroPlannerOptions options,
                                        std::string_view source = "replicas");

  const HeteroConfig& config() const { return config_; }
  // [group] the longest sequence one replica of the group holds (tokens; 0: none).
  const std::vector<int64_t>& capacities() const { return capacities_; }
  const std::vector<ReductionGroup>& reductions() const { return reductions_; }
  const Planner& group_planner(int64_t g) const { return planners_[g]; }

  // Stage 1 with f_g multiplied by scale[g] (empty: 1 for every group). REQUIRES: scale is empty
  // or has one entry per group.
  HeteroDispatch Dispatch(std::span<const Sample> batch, std::span<const double> scale = {}) const;
  // Plans one global batch. Infeasible (a sequence no group holds, a group left with fewer
  // sequences than replicas, a group's plan out of memory) is the outcome; errors are bugs or
  // Planner::Plan's.
  StatusOr<HeteroPlanResult> Plan(std::span<const Sample> batch) const;
  // A quick plan from scales learnt on earlier batches (an earlier HeteroPlanResult::scale):
  // stage 1 once with f_g multiplied by scale[g], no refine rounds; the result's scale is this
  // plan's, as Plan's. What sluice-dynamic's screen refreshes a mix it would skip with
  // (compare/compare_dynamic.h). `scale` with another count than the groups' is taken as empty.
  StatusOr<HeteroPlanResult> PlanFrom(std::span<const Sample> batch,
                                      std::span<const double> scale) const;
  // Stage 1's estimate of Plan(batch).makespan without planning the groups: stage 1 with f_g
  // scaled by `scale` (an earlier batch's HeteroPlanResult::scale), then max over groups of
  // (scale[g] x stage 1's time for the group + the group's gradient sync) + the cross-group
  // sync. nullopt when stage 1 fails (a sequence no group holds). Costs stage 1 alone: no group
  // is batched or scheduled. An estimate, not a bound: Plan may come out either side of it.
  // `scale` with another count than the groups' is taken as empty (1 for every group).
  std::optional<Duration> Screen(std::span<const Sample> batch,
                                 std::span<const double> scale) const;

 private:
  HeteroPlanner() = default;
  // The groups' plans of earlier rounds of one Plan call, by (group, the batch indices of its
  // sequences): a group's planner is deterministic, so a round that gives a group the same
  // sequences takes the plan already made.
  using GroupPlans = std::map<std::pair<int64_t, std::vector<int64_t>>, PlanResult>;
  // One round of Plan: stage 1 with `scale`, then every group's planner (through `plans`). The
  // result's `groups` stay empty: `*made` gets each group's plan in `plans` (all of them only
  // when the outcome is kOk), which Plan moves out for the round it keeps (no copies per round).
  // Plan and PlanFrom: rounds of stage 1 from `scale`, at most `rounds` after the first.
  StatusOr<HeteroPlanResult> PlanRounds(std::span<const Sample> batch, std::vector<double> scale,
                                        int64_t rounds) const;
  StatusOr<HeteroPlanResult> PlanRound(std::span<const Sample> batch, std::span<const double> scale,
                                       GroupPlans* plans, std::vector<PlanResult*>* made) const;
  HeteroConfig config_;
  ClusterSpec cluster_;
  HeteroPlannerOptions options_;
  std::vector<Planner> planners_;
  std::vector<int64_t> capacities_;
  std::vector<Duration> group_sync_;  // [group] EstimateGradientSync
  std::vector<ReductionGroup> reductions_;
  std::vector<ReductionGroup> pieces_;
  Duration cross_sync_;
};

// The heterogeneous plan as JSON ("sluice-hetero-plan/1", docs/formats.md has the homogeneous
// plan): {"format", "replicas": HeteroConfigToJson, "device_offsets": [per group],
// "reductions": [{"first_layer", "layers", "embedding", "output_head", "params", "members":
// [{"group", "stage"}], "cross_group_ms"}], "cross_group_ms", "groups": [the group's plan as
// PlanToJson (plan/plan_json.h)]}. REQUIRES: plan.outcome == kOk, `config` the plan's.
nlohmann::json HeteroPlanToJson(const HeteroPlanResult& plan, const HeteroConfig& config,
                                const ClusterSpec& cluster);

struct HeteroSimResult {
  SimOutcome outcome = SimOutcome::kOk;
  std::string problem;
  bool memory_exceeded = false;
  Duration iteration_time;  // the last rank's finish with the cross-group reduction overlapped
  Duration slowest_group;   // max over groups of the simulated iteration
  Duration cross_sync;      // the cross-group reductions' time (sum over the ranges)
  Duration cross_exposed;   // iteration_time - slowest_group: the part not hidden
  int64_t real_tokens = 0;
  std::vector<SimResult> groups;
};
// Simulates every group's plan (options.samples set to the group's sequences; the timeline is
// recorded for the gradient-ready times and kept only when options.record_timeline) and adds
// the cross-group synchronisation, overlapped (OverlapCrossSync). REQUIRES: plan.outcome == kOk.
StatusOr<HeteroSimResult> SimulateHetero(const HeteroPlanResult& plan, SimOptions options);

// Each range split into up to `pieces` consecutive layer pieces (the embedding with the first,
// the output head with the last), each priced by PriceReduction (cross_group_time set): the
// units in which the simulation reduces across groups, like the gradient buckets of a
// homogeneous plan.
std::vector<ReductionGroup> SplitReductions(std::span<const ReductionGroup> ranges,
                                            const ModelSpec& model, const HeteroConfig& config,
                                            const ClusterSpec& cluster, int64_t pieces);

// One rank of a group's simulation, for the overlap.
struct RankTiming {
  Duration backward_start, backward_end;  // its last backward (or weight-gradient) op
  Duration reduced;  // end of its last in-group gradient reduction (no reduction: last compute)
  Duration finish;   // its last instruction (>= reduced)
};
struct OverlappedSync {
  Duration iteration_time;  // max of every rank's finish and every piece's done + its tails
  Duration slowest_group;   // max over ranks of finish
  Duration exposed;         // iteration_time - slowest_group
};
// The overlap of the cross-group reductions of `pieces` (see the header comment) from each
// group's rank timings ([group][rank id = replica x pp + stage]) and configurations; `layers`
// the model's decoder layers. A piece is ready once every member rank has reduced the piece's
// layers inside its group: its stage's layers are done last to first, linearly over its last
// backward, and reduced at most the stage's lag (reduced - backward end) after that. Pieces are
// reduced one after another in the order they are ready; each member rank's tail after its own
// reduction (finish - reduced) waits for its pieces.
OverlappedSync OverlapCrossSync(std::span<const ReductionGroup> pieces, int64_t layers,
                                std::span<const std::vector<RankTiming>> timing,
                                std::span<const ParallelConfig> groups);

// ---- Search over 2-shape mixes ----

// Every mix of two shapes that covers the cluster: a narrow shape (tp 1 or 2, cp 1 or 2, pp 1, 2
// or 4) for short sequences and a wide one (tp x cp from 4 to 16 with tp 1-8 and cp 1-8, pp 1 or
// 2, more devices per pipeline position than the narrow one) for long ones, with n_wide >= 1 wide
// replicas first and n_narrow >= 1 narrow ones after them, dp x pp x tp x cp summing to the
// devices; ZeRO `zero` and the memory limit and reserve given on every group; only mixes
// CheckHeteroFits accepts. Deterministic order.
std::vector<HeteroConfig> EnumerateHeteroMixes(const ModelSpec& model, const ClusterSpec& cluster,
                                               int64_t zero, std::optional<Bytes> memory_limit,
                                               std::optional<Bytes> memory_reserve);

struct HeteroCandidate {
  HeteroConfig config;
  bool feasible = false;              // every score batch planned (and, when simulated, ran)
  std::string reason;                 // why not feasible
  double estimated_tokens_per_s = 0;  // real tokens / sum of HeteroPlanResult::makespan
  bool simulated = false;
  double simulated_tokens_per_s = 0;  // real tokens / sum of simulated iterations
  // The last score batch's HeteroPlanResult::scale (empty unless feasible by estimate): what a
  // screen of later batches starts from (HeteroPlanner::Screen, compare/compare_dynamic.h).
  std::vector<double> scale;
};
struct HeteroSearch {
  std::vector<HeteroCandidate> ranked;  // feasible by estimate first, best first
  std::optional<HeteroCandidate> best;  // best simulated feasible candidate
  double seconds = 0;
};
// Plans every mix on `score` batches, ranks them by the estimate, simulates the `simulate_top`
// best and keeps the fastest simulated one. Errors: bugs only.
StatusOr<HeteroSearch> SearchHetero(const CostModel& cost, const ClusterSpec& cluster,
                                    std::span<const HeteroConfig> mixes,
                                    std::span<const GlobalBatch> score,
                                    const HeteroPlannerOptions& options, const SimOptions& sim,
                                    int64_t simulate_top);

}  // namespace sluice
