// Shared by the trace reader fuzz targets (sluice_trace_fuzzer.cc, torch_trace_fuzzer.cc,
// kineto_trace_fuzzer.cc): parse the input as JSON, run one reader on it and, when it reads, match,
// align, build the graph and run every replay and the report. Any input must give a value or a
// Status, never a crash or a hang; every replay of a graph that was built must succeed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "base/json_util.h"
#include "trace/analyze.h"
#include "trace/reader_util.h"

namespace sluice::trace_fuzz {

inline void CheckRanks(std::vector<trace::RankTrace> ranks) {
  if (ranks.empty() || ranks.size() > 64) return;
  trace::TraceSet set;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i].rank != static_cast<int64_t>(i)) return;  // ReadTraces refuses gaps
  }
  set.ranks = std::move(ranks);
  StatusOr<trace::Analysis> a = trace::Analyze(std::move(set));
  if (!a.ok()) return;  // e.g. a cycle: an error naming a node
  StatusOr<trace::Replays> r = trace::ReplayAll(*a, trace::ClassStat::kMedian);
  if (!r.ok()) std::abort();
  (void)trace::FormatReplayReport(*a, *r, 5);
  (void)trace::ReplayJson(*a, *r);
}

// `read` is one of trace_internal's document readers, bound to its arguments.
template <typename Read>
int Run(const uint8_t* data, size_t size, Read read) {
  if (size > (1 << 20)) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  StatusOr<nlohmann::json> doc = ParseJson(text, "fuzz.json");
  if (!doc.ok()) return 0;
  read(*doc);
  return 0;
}

}  // namespace sluice::trace_fuzz
