// DynaPipe's dynamic micro-batching: order the samples, cut the order into consecutive runs by an
// exact dynamic program, one micro-batch per run.
//
// Formulation (docs/batching-dynapipe.md). Samples s_0..s_{n-1} in the order of ordering.h. A
// candidate micro-batch is a run [i, i + d) padded to its longest input (and target); its time
// t(i, d) is the bottleneck stage's forward + backward (StageCostEvaluator::Summarize). Among
// the recompute levels allowed (BatchingOptions::recompute, or all three) that fit the memory
// rule of stage_cost.h with pp in flight, the candidate takes the fastest (ties: less
// recompute). A run grows until no level fits, so candidates are O(n K), K the longest feasible
// run. The split minimises
//   (S - 1) * t_max / C + sum(t) / D,   S = pp, C = vpp, D = `replicas` of Build,
// exactly: the distinct candidate times are the t_max values, and a branch-and-bound over them
// (bound (S - 1) t / C + G(t_hi) / D, with G(t) the least sum under t_max = t, non-increasing)
// runs the O(n K) constrained DP only where the bound can still win. Optional thinning of the
// t_max values (BatchingOptions::tmax_thinning) reproduces the reference's 5 ms grid.
//
// Memory: the DP's per-micro-batch rule assumes neighbours like the micro-batch itself; Build
// (replicas == 1) and DistributeMicroBatches (karmarkar_karp.h) check the final order exactly and,
// when the recompute level is not fixed, raise the level of micro-batches in an overfull window
// (RaiseRecomputeToFit) before giving up with kOutOfMemory.
//
// Ties break deterministically (fewest-sum first, then smaller max, then the earliest split
// point found), so the same input gives the same plan. Thread safety: stateless; Build may run
// concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/units.h"
#include "batching/method.h"
#include "batching/micro_batch.h"
#include "batching/ordering.h"
#include "batching/stage_cost.h"
#include "data/sample.h"

namespace sluice {

struct DynaPipeOptions {
  SampleOrder order = SampleOrder::kAuto;  // kLexicographic: the "DP (S)" ablation
  TspOptions tsp;                          // for kTspPath
};

// The "dynapipe" micro-batcher (one sample per row, padded shapes).
std::unique_ptr<MicroBatcher> MakeDynaPipeBatcher();
std::unique_ptr<MicroBatcher> MakeDynaPipeBatcher(const DynaPipeOptions& options);

// Candidate micro-batches of an ordered sample list: for start i, runs of d = 1..row_len[i]
// samples, each with its time (ns) and recompute level. Rows of starts whose runs have the same
// shapes (decoder-only, equal padded first length) are stored once.
struct SplitCandidates {
  int64_t n = 0;
  std::vector<int64_t> time_ns;      // concatenated rows; entry d-1 of a row = run of d samples
  std::vector<int64_t> suffix_min;   // per row entry: min of time_ns over the rest of its row
  std::vector<Recompute> recompute;  // parallel to time_ns
  std::vector<int64_t> row_begin;    // per start i: index of its d = 1 entry
  std::vector<int64_t> row_len;      // per start i: its longest feasible run (<= n - i)

  // REQUIRES: 1 <= d <= row_len[i].
  Duration Time(int64_t i, int64_t d) const {
    return Duration::Nanos(time_ns[row_begin[i] + d - 1]);
  }
  Recompute RecomputeOf(int64_t i, int64_t d) const { return recompute[row_begin[i] + d - 1]; }
  int64_t num_candidates() const;  // sum of row_len
};

// Prices every feasible run of `ordered` (see the file comment). `fixed`: the only recompute
// level allowed, or all three. Starts that fit nowhere get row_len 0.
SplitCandidates BuildSplitCandidates(std::span<const Sample> ordered,
                                     const StageCostEvaluator& eval,
                                     const std::optional<Recompute>& fixed);

struct SplitObjective {
  int64_t stages = 1;    // S
  int64_t chunks = 1;    // C (virtual stages per device)
  int64_t replicas = 1;  // D

  // (S - 1) * t_max / C + sum / D, in milliseconds.
  double Value(Duration t_max, Duration sum) const;
};

struct SplitSolution {
  bool feasible = false;
  std::vector<int64_t> ends;  // exclusive end of each run, ascending; the last is n
  Duration t_max;             // the largest run time of the split
  Duration sum;               // the sum of the run times
  double objective_ms = 0;    // SplitObjective::Value(t_max, sum)
  int64_t tmax_values = 0;    // distinct t_max candidates (after thinning)
  int64_t dp_runs = 0;        // constrained DPs evaluated, including the final one
};

// The optimal consecutive split for `objective` over `candidates` (exact when thinning is zero;
// with thinning > 0 only t_max values at least that far apart are tried, like the reference).
SplitSolution SolveConsecutiveSplit(const SplitCandidates& candidates,
                                    const SplitObjective& objective,
                                    Duration thinning = Duration::Zero());

// Raises the recompute level of micro-batches in the first overfull window of the exact check
// (the one with the most stored activations on the overfull stage first, re-priced with
// PriceMicroBatch) until CheckSequenceMemory passes. With `fixed` set nothing is raised. Returns
// false, with the remaining violation in `reason`, when no level can be raised any more.
bool RaiseRecomputeToFit(const StageCostEvaluator& eval, const BatchIndex& index,
                         const std::optional<Recompute>& fixed,
                         std::vector<MicroBatch>* micro_batches, std::string* reason);

}  // namespace sluice
