// One call from trace files to a replayable graph: read, match, align, build (docs/trace.md), and
// the text report `sluice replay` prints.
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "trace/align.h"
#include "trace/graph.h"
#include "trace/replay.h"
#include "trace/trace_model.h"
#include "trace/trace_reader.h"

namespace sluice::trace {

struct Analysis {
  TraceSet set;  // aligned
  Matching matching;
  ClockAlignment clocks;
  Graph graph;
};

// Matches, aligns and builds the graph of `set`.
StatusOr<Analysis> Analyze(TraceSet set);
// ReadTraces + Analyze.
StatusOr<Analysis> AnalyzeFiles(const std::vector<std::string>& paths,
                                const ReadOptions& options = {});

// The replays `sluice replay` reports (replay.h says what each tells).
struct Replays {
  ReplayResult exact;          // everything as measured: reproduces a consistent trace
  ReplayResult per_iteration;  // dPRO: measured own times, gaps and waited-for transfers
  ReplayResult whole_run;      // the same, iterations chained (what-ifs start here)
  ReplayResult model;          // per-iteration with every transfer and collective modelled
  ReplayResult by_class;       // class means (or medians) of own times and gaps
  ClassStat class_stat = ClassStat::kMean;
  // With what-ifs: per_iteration and whole_run again with them applied (the prediction); with a
  // what-if plan (plan_whatif.h), its replays, what_if_plan naming it.
  std::vector<WhatIf> what_if;
  std::string what_if_plan;
  ReplayResult what_if_per_iteration;
  ReplayResult what_if_whole_run;
};

// Runs the four replays of `a`, and the two what-if replays when `what_if` is not empty.
StatusOr<Replays> ReplayAll(const Analysis& a, ClassStat class_stat,
                            const std::vector<WhatIf>& what_if = {});

// The what-if replays against the replays without them, per iteration: "" without what-ifs.
std::string FormatWhatIfReport(const Replays& r);

// The report: inputs, matching, clock offsets, graph size, the exact check, replayed vs measured
// time per iteration (per-iteration, whole-run and class replays) with their errors, the per-rank
// breakdown and the critical path's top steps (of the whole-run replay).
std::string FormatReplayReport(const Analysis& a, const Replays& r, int top_steps);

// The same figures as a JSON object (the format is in docs/formats.md, "Replay summary").
std::string ReplayJson(const Analysis& a, const Replays& r);

}  // namespace sluice::trace
