// Trace readers: sluice's runtime traces, torch 1.13 CPU profiler traces and Kineto traces
// (torch >= 2) into one TraceSet (trace_model.h). docs/formats.md ("Traces sluice reads") lists
// what each reader takes from its format; docs/trace.md says how the pieces are used.
//
// Every document is parsed with base's ParseJson (depth-limited, duplicate keys rejected) and
// checked event by event: a malformed event is an InvalidArgument naming the file, the event's
// index in traceEvents and the field. Events a reader does not use (memory counters, instants,
// Python frames) are skipped and counted in TraceSet::notes.
//
// Which rank a document is: sluice traces say it (pid); Kineto traces in distributedInfo.rank;
// torch 1.13 traces do not, so the file name's "rank-N" / "rank_N" / "rankN" decides, else the
// document's position among the files given.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "trace/trace_model.h"

namespace sluice::trace {

struct ReadOptions {
  int64_t max_file_bytes = int64_t{2} << 30;  // larger files are refused (bytes)
  int64_t max_events = 20'000'000;            // traceEvents entries per document
};

// The format of a parsed document, by its shape (see docs/formats.md); InvalidArgument when it is
// none of them.
StatusOr<TraceFormat> DetectFormat(std::string_view text, std::string_view source);

// Reads one document. `rank_hint` is the rank of a document that does not say its own (-1: the
// reader fails instead). A sluice document merged from several ranks gives several RankTraces.
StatusOr<std::vector<RankTrace>> ReadTraceDocument(std::string_view text, std::string_view source,
                                                   int64_t rank_hint,
                                                   const ReadOptions& options = {});

// Reads files and folders (a folder: its trace-rank-*.json files when it has any, else every
// *.json in it), sorted by rank. Errors: a path that does not exist, a rank given twice, a rank
// missing between 0 and the largest (named in the message), and any document error. Point-to-
// point ops whose peer no annotation names get the other rank when there are exactly two (noted).
StatusOr<TraceSet> ReadTraces(const std::vector<std::string>& paths,
                              const ReadOptions& options = {});

// The rank a file name states ("trace-rank-3.json" -> 3), or -1.
int64_t RankFromFileName(std::string_view path);

}  // namespace sluice::trace
