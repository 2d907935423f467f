// One call from trace files to a replayable graph: read, match, align, build (docs/trace.md), and
// the text report `sluice trace replay` prints.
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

// The report: inputs, matching, clock offsets, graph size, the measured and median replays per
// iteration with their errors, the per-rank breakdown and the critical path's top steps.
std::string FormatReplayReport(const Analysis& a, const ReplayResult& measured,
                               const ReplayResult& median, int top_steps);

// The same figures as a JSON object (the format is in docs/formats.md, "Replay summary").
std::string ReplayJson(const Analysis& a, const ReplayResult& measured,
                       const ReplayResult& median);

}  // namespace sluice::trace
