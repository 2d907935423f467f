// Replay of a measured run's graph (graph.h): list scheduling with measured (or per-class mean or
// median) durations and gaps, what-if scaling, the critical path and where each rank's time went.
//
// The stream order is fixed by the trace, so the replay is one pass over the graph in topological
// order (O(nodes + edges)). The replays say different things:
//  - exact (every op, gap and transfer interval as measured): reproduces a consistent aligned
//    trace to the nanosecond; a check of the graph, the matching and the clocks;
//  - per-iteration (dPRO): every op its own measured time and gap; a transfer or collective that
//    some side waited for its measured time, the others (whose end the trace bounds only from
//    above) the communication model's within that bound (CommModel::kWaitedElseFitted); each
//    iteration started at its ranks' measured starts; who waits for whom, and how long, is
//    recomputed from the dependencies. Compared per iteration with the measured time: the replay
//    error;
//  - model (CommModel::kFitted): the same with every transfer and collective from the model
//    fitted on the whole trace: how much of the run the communication model explains;
//  - class (kMean / kMedian): every op takes its class's mean or median (dPRO's avg), the
//    iteration time compared with the measured mean (dPRO §1.6).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "trace/graph.h"

namespace sluice::trace {

// A change to the replayed run. `match` picks what changes: "compute" (compute and optimizer
// ops), "comm" (transfers and collectives), "link" (point-to-point transfers only), "gap" (the
// gaps between ops), "optimizer", or else the ops whose name or label contains the text. Their own
// times (gaps for "gap") become own x factor + add_ns, except for "link" with add_ns: a transfer
// then starts add_ns after its send was posted at the earliest (the send's post -> transfer edge
// is delayed, as `sluice train --link-delay-ms` hands each send to c10d that much later; the
// receive's post still gates it and the sender's compute goes on).
struct WhatIf {
  std::string match;
  double factor = 1.0;  // in [0, kMaxWhatIfFactor]
  int64_t add_ns = 0;   // in [0, 1e15]
};
inline constexpr double kMaxWhatIfFactor = 1e6;

// "WHAT=FACTOR" (e.g. "comm=0.5") or "WHAT+=DURATION" with DURATION a number >= 0 and a unit
// ns, us, ms or s (e.g. "link+=2ms", "forward+=150us"). InvalidArgument naming the text and
// the forms allowed. A what-if whose WHAT matches no op of the trace is an error of the replay.
StatusOr<WhatIf> ParseWhatIf(std::string_view text);
// The form ParseWhatIf reads: "comm=0.5", "link+=2ms" (exact to the ns: "link+=1500us").
std::string WhatIfText(const WhatIf& w);

// What each op's own time and gap are in a replay.
enum class ClassStat : uint8_t {
  kMeasured,  // its own measured values
  kMean,      // the mean over its class (dPRO's avg)
  kMedian,    // the median over its class
};

// What a transfer's or collective's own time is in a replay.
enum class CommModel : uint8_t {
  kMeasured,          // its measured interval (graph.h)
  kWaitedElseFitted,  // its measured interval when some side waited for it, else kFitted's
                      // time, at most its measured interval (the trace proves it done by then)
  kFitted,  // latency + bytes / bandwidth fitted per (kind, ranks, key) over the whole trace
            // from the hubs some side waited for (graph.h: the others are bounded from above
            // only), pooled per kind for classes without such a hub; a robust line, the
            // median when sizes do not vary or are unknown
};

struct ReplayOptions {
  ClassStat durations = ClassStat::kMeasured;
  CommModel comm = CommModel::kMeasured;
  // Each iteration's first op on each stream starts at its measured start (the ranks' clocks
  // aligned), not after the previous iteration's replayed end: iterations are replayed apart.
  bool per_iteration = false;
  std::vector<WhatIf> what_if;
  bool critical_path = true;
};

struct RankBreakdown {
  int64_t rank = 0;
  int32_t stream = 0;      // the stream counted (the rank's busiest)
  int64_t compute_ns = 0;  // compute and optimizer ops
  int64_t comm_ns = 0;     // inside posts and waits once their transfers were done
  int64_t waiting_ns = 0;  // blocked: a wait until its transfer or collective was done, an op
                           // until its data or launch arrived
  int64_t gaps_ns = 0;     // host / framework gaps between ops
  int64_t other_ns = 0;    // loads, frees, launches
  int64_t bubble_ns = 0;   // the replayed span minus all of the above (idle at the ends)
};

struct IterationTime {
  int64_t iteration = 0;
  int64_t measured_ns = 0;  // last end - first start of the iteration's ops, over the ranks
  int64_t replayed_ns = 0;
};

struct CriticalStep {
  int32_t node = 0;
  int64_t start_ns = 0;  // replayed, from the origin
  int64_t end_ns = 0;
  EdgeKind via = EdgeKind::kStream;  // how it waited for the previous step
};

// One communication class's model under CommModel::kFitted.
struct CommFit {
  std::string name;     // Graph::comm_classes
  int64_t hubs = 0;     // transfers or collectives of the class
  int64_t waited = 0;   // of them, samples (some side waited for it)
  bool pooled = false;  // no sample of its own: the line of every waited hub of its kind
  bool fitted = false;  // false: no sample at all, its measured bounds are kept
  int64_t latency_ns = 0;
  double ns_per_byte = 0;
  int64_t measured_ns = 0;  // sum of its hubs' measured times
  int64_t modelled_ns = 0;  // sum of their fitted times
};

struct ReplayResult {
  std::vector<int64_t> start_ns;  // [node] replayed, relative to graph.origin_ns
  std::vector<int64_t> end_ns;
  int64_t measured_span_ns = 0;  // whole trace, first start to last end
  int64_t replayed_span_ns = 0;
  int64_t max_deviation_ns = 0;           // max over ops of |replayed end - measured end|
  std::vector<IterationTime> iterations;  // every iteration with ops on every rank, ascending
  double mean_iteration_measured_ns = 0;
  double mean_iteration_replayed_ns = 0;
  double mean_abs_error = 0;  // mean over iterations of |replayed - measured| / measured
  double max_abs_error = 0;
  std::vector<CriticalStep> critical_path;                 // first to last
  int64_t critical_by_kind_ns[7] = {0, 0, 0, 0, 0, 0, 0};  // [NodeKind] own time on the path
  int64_t critical_gaps_ns = 0;
  std::vector<RankBreakdown> ranks;
  int64_t comm_models = 0;         // CommModel::kFitted: (kind, ranks, key) groups fitted
  std::vector<CommFit> comm_fits;  // CommModel::kFitted: per class
};

// Each hub's own time under CommModel::kFitted ([node], 0 for non-hubs), and the number of
// classes priced by a fitted line; `fits` (optional) gets one entry per class.
std::vector<int64_t> FittedCommTimes(const Graph& graph, int64_t* groups = nullptr,
                                     std::vector<CommFit>* fits = nullptr);

// REQUIRES: `graph` was built from `set`. InvalidArgument for a negative or non-finite what-if
// factor or a negative addition.
StatusOr<ReplayResult> Replay(const Graph& graph, const TraceSet& set,
                              const ReplayOptions& options);

}  // namespace sluice::trace
