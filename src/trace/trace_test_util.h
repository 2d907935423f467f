// Helpers of the trace tests (trace_test.cc, trace_readers_test.cc): sluice trace events and
// documents written in memory, a two-stage pipeline's events, and the analysis of a document.
#pragma once

#include <fmt/core.h>

#include <string>
#include <utility>
#include <vector>

#include "trace/analyze.h"

namespace sluice::trace {

// One sluice event. ts/dur in µs.
inline std::string Ev(int rank, int tid, const std::string& name, const std::string& op, double ts,
                      double dur, int iteration, int mb = -1, int stage = -1, int peer = -1,
                      int bytes = 0) {
  std::string args = fmt::format(R"("op":"{}","iteration":{})", op, iteration);
  if (mb >= 0) args += fmt::format(R"(,"mb":{})", mb);
  if (stage >= 0) args += fmt::format(R"(,"stage":{})", stage);
  if (peer >= 0) args += fmt::format(R"(,"peer":{})", peer);
  if (bytes > 0) args += fmt::format(R"(,"bytes":{})", bytes);
  static const char* kCat[] = {"compute", "send", "recv", "collective"};
  return fmt::format(
      R"({{"name":"{}","cat":"{}","ph":"X","pid":{},"tid":{},"ts":{},"dur":{},"args":{{{}}}}})",
      name, kCat[tid], rank, tid, ts, dur, args);
}

inline std::string Doc(const std::vector<std::string>& events) {
  std::string out = R"({"traceEvents":[)";
  for (size_t i = 0; i < events.size(); ++i) out += (i ? "," : "") + events[i];
  return out + R"(],"displayTimeUnit":"ms"})";
}

// A two-stage pipeline, one micro-batch per iteration: rank 0 F, send; rank 1 recv, F, B, send
// grad; rank 0 recv grad, B; both step. `shift_us` is added to every time of rank 1. In
// iteration `slow_iteration` rank 0's forward takes `extra_us` longer: everything after it on
// rank 0 and everything after the receive's wait on rank 1 is that much later (iterations are
// 2,000 µs apart then).
inline std::vector<std::string> PipelineEvents(int iterations, double shift_us = 0,
                                               int slow_iteration = -1, double extra_us = 0) {
  std::vector<std::string> e;
  for (int it = 0; it < iterations; ++it) {
    const double x = it == slow_iteration ? extra_us : 0;
    double t = it * (slow_iteration >= 0 ? 2000.0 : 1000.0);
    double s = t + shift_us;
    // rank 0
    e.push_back(Ev(0, 0, "0LOAD0", "load-input", t + 0, 5, it, 0, 0));
    e.push_back(Ev(0, 0, "0F0", "forward", t + 5, 100 + x, it, 0, 0));
    t += x;
    e.push_back(Ev(0, 0, "0SEND_F0", "send-act-start", t + 106, 4, it, 0, 0, 1, 4096));
    e.push_back(Ev(0, 1, "0SEND_F0", "send-act-start", t + 106, 30, it, 0, 0, 1, 4096));
    e.push_back(Ev(0, 0, "0SEND_F0.wait", "send-act-finish", t + 111, 25, it, 0, 0, 1));
    e.push_back(Ev(0, 0, "0RECV_B0", "recv-grad-start", t + 137, 2, it, 0, 0, 1, 4096));
    e.push_back(Ev(0, 2, "0RECV_B0", "recv-grad-start", t + 137, 363, it, 0, 0, 1, 4096));
    e.push_back(Ev(0, 0, "0RECV_B0.wait", "recv-grad-finish", t + 140, 360, it, 0, 0, 1));
    e.push_back(Ev(0, 0, "0B0", "backward", t + 501, 200, it, 0, 0));
    e.push_back(Ev(0, 0, "STEP", "optimizer-step", t + 702, 50, it));
    // rank 1
    e.push_back(Ev(1, 0, "1LOAD0", "load-input", s + 0, 5, it, 0, 1));
    e.push_back(Ev(1, 0, "1RECV_F0", "recv-act-start", s + 6, 2, it, 0, 1, 0, 4096));
    e.push_back(Ev(1, 2, "1RECV_F0", "recv-act-start", s + 6, 134 + x, it, 0, 1, 0, 4096));
    e.push_back(Ev(1, 0, "1RECV_F0.wait", "recv-act-finish", s + 9, 131 + x, it, 0, 1, 0));
    s += x;
    e.push_back(Ev(1, 0, "1F0", "forward", s + 141, 150, it, 0, 1));
    e.push_back(Ev(1, 0, "1B0", "backward", s + 292, 180, it, 0, 1));
    e.push_back(Ev(1, 0, "1SEND_B0", "send-grad-start", s + 473, 3, it, 0, 1, 0, 4096));
    e.push_back(Ev(1, 1, "1SEND_B0", "send-grad-start", s + 473, 25, it, 0, 1, 0, 4096));
    e.push_back(Ev(1, 0, "1SEND_B0.wait", "send-grad-finish", s + 477, 21, it, 0, 1, 0));
    e.push_back(Ev(1, 0, "STEP", "optimizer-step", s + 499, 50, it));
  }
  return e;
}

inline StatusOr<Analysis> AnalyzeText(const std::string& text) {
  SLUICE_ASSIGN_OR_RETURN(std::vector<RankTrace> ranks, ReadTraceDocument(text, "mem.json", -1));
  TraceSet set;
  set.ranks = std::move(ranks);
  return Analyze(std::move(set));
}

}  // namespace sluice::trace
