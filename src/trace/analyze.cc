#include "trace/analyze.h"

#include <fmt/core.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

namespace sluice::trace {
namespace {

double Ms(double ns) { return ns * 1e-6; }

std::string Pct(double x) { return fmt::format("{:.1f}%", 100 * x); }

}  // namespace

StatusOr<Analysis> Analyze(TraceSet set) {
  Analysis a;
  a.matching = MatchComms(set);
  a.clocks = AlignClocks(&set, a.matching);
  SLUICE_ASSIGN_OR_RETURN(a.graph, BuildGraph(set, a.matching));
  a.set = std::move(set);
  return a;
}

StatusOr<Analysis> AnalyzeFiles(const std::vector<std::string>& paths, const ReadOptions& options) {
  SLUICE_ASSIGN_OR_RETURN(TraceSet set, ReadTraces(paths, options));
  return Analyze(std::move(set));
}

std::string FormatReplayReport(const Analysis& a, const ReplayResult& measured,
                               const ReplayResult& median, int top_steps) {
  std::string out;
  const TraceSet& s = a.set;
  out += fmt::format("traces: {} rank(s), {}\n", s.ranks.size(),
                     TraceFormatName(s.ranks.front().format));
  for (const RankTrace& r : s.ranks) {
    out += fmt::format("  rank {}: {} ({} ops on {} stream(s), {} communications)\n", r.rank,
                       r.source, r.ops.size(), r.streams.size(), r.comms.size());
  }
  out += fmt::format("matched: {} message(s), {} collective(s); {} op(s) unmatched\n",
                     a.matching.messages.size(), a.matching.collectives.size(),
                     a.matching.unmatched);
  out += "clock offsets (added to each rank's times):\n";
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    out += fmt::format("  rank {}: {:+.3f} ms ({})\n", r, Ms(a.clocks.offset_ns[r]),
                       a.clocks.how[r]);
  }
  out += fmt::format(
      "  {} send->receive bounds, {} still broken; {} receive(s) posted before their send "
      "(clipped to it)\n",
      a.clocks.causality_bounds, a.clocks.violations, a.clocks.clipped_receives);
  const Graph& g = a.graph;
  out += fmt::format(
      "graph: {} nodes, {} edges (stream {}, data {}, post {}, done {}, launch {})\n",
      g.nodes.size(), g.preds.size(), g.edges_by_kind[0], g.edges_by_kind[1], g.edges_by_kind[2],
      g.edges_by_kind[3], g.edges_by_kind[4]);
  out += fmt::format(
      "replay with measured durations: span {:.3f} ms measured, {:.3f} ms replayed (ops end "
      "within {:.3f} ms of their measured end)\n",
      Ms(measured.measured_span_ns), Ms(measured.replayed_span_ns),
      Ms(measured.max_deviation_ns));
  out += "iterations (class replay: each op's class mean or median own time and gap):\n";
  out += "  iteration  measured ms  replayed ms   error\n";
  for (const IterationTime& it : median.iterations) {
    const double err = it.measured_ns > 0 ? (static_cast<double>(it.replayed_ns) -
                                             static_cast<double>(it.measured_ns)) /
                                                static_cast<double>(it.measured_ns)
                                          : 0;
    out += fmt::format("  {:>9}  {:>11.3f}  {:>11.3f}  {:>+6.1f}%\n", it.iteration,
                       Ms(it.measured_ns), Ms(it.replayed_ns), 100 * err);
  }
  if (!median.iterations.empty()) {
    out += fmt::format(
        "  mean       {:>11.3f}  {:>11.3f}   mean |error| {}, worst {}; mean iteration "
        "error {}\n",
        Ms(median.mean_iteration_measured_ns), Ms(median.mean_iteration_replayed_ns),
        Pct(median.mean_abs_error), Pct(median.max_abs_error),
        Pct(std::abs(median.mean_iteration_replayed_ns - median.mean_iteration_measured_ns) /
            std::max(1.0, median.mean_iteration_measured_ns)));
  } else {
    out += "  (no iteration has ops on every rank)\n";
  }
  out += "where the time went (class replay, ms, each rank's busiest stream):\n";
  out += "  rank  stream            compute     comm  waiting     gaps    other   bubble\n";
  for (const RankBreakdown& b : median.ranks) {
    out += fmt::format("  {:>4}  {:<14} {:>9.3f} {:>8.3f} {:>8.3f} {:>8.3f} {:>8.3f} {:>8.3f}\n",
                       b.rank, s.ranks[b.rank].streams[b.stream].substr(0, 14), Ms(b.compute_ns),
                       Ms(b.comm_ns), Ms(b.waiting_ns), Ms(b.gaps_ns), Ms(b.other_ns),
                       Ms(b.bubble_ns));
  }
  const ReplayResult& c = median;
  out += fmt::format("critical path: {} steps; own time on it (ms):", c.critical_path.size());
  for (int k = 0; k < 7; ++k) {
    if (c.critical_by_kind_ns[k] > 0) {
      out += fmt::format(" {} {:.3f},", NodeKindName(static_cast<NodeKind>(k)),
                         Ms(c.critical_by_kind_ns[k]));
    }
  }
  out += fmt::format(" gaps {:.3f}\n", Ms(c.critical_gaps_ns));
  std::vector<CriticalStep> steps = c.critical_path;
  std::stable_sort(steps.begin(), steps.end(), [](const CriticalStep& x, const CriticalStep& y) {
    return x.end_ns - x.start_ns > y.end_ns - y.start_ns;
  });
  if (static_cast<int>(steps.size()) > top_steps) steps.resize(top_steps);
  for (const CriticalStep& st : steps) {
    out += fmt::format("  {:>9.3f} ms  {}\n", Ms(st.end_ns - st.start_ns),
                       NodeText(g, s, a.matching, st.node));
  }
  for (const std::string& n : s.notes) out += "note: " + n + "\n";
  for (const std::string& n : a.matching.notes) out += "note: " + n + "\n";
  return out;
}

std::string ReplayJson(const Analysis& a, const ReplayResult& measured,
                       const ReplayResult& median) {
  nlohmann::json j;
  j["format"] = "sluice-replay/1";
  j["trace_format"] = TraceFormatName(a.set.ranks.front().format);
  j["ranks"] = a.set.ranks.size();
  j["messages"] = a.matching.messages.size();
  j["collectives"] = a.matching.collectives.size();
  j["unmatched"] = a.matching.unmatched;
  j["clock_offsets_ms"] = nlohmann::json::array();
  for (int64_t o : a.clocks.offset_ns) j["clock_offsets_ms"].push_back(Ms(o));
  j["causality_violations"] = a.clocks.violations;
  j["clipped_receives"] = a.clocks.clipped_receives;
  j["nodes"] = a.graph.nodes.size();
  j["edges"] = a.graph.preds.size();
  j["measured_replay_span_ms"] = Ms(measured.replayed_span_ns);
  j["measured_span_ms"] = Ms(measured.measured_span_ns);
  j["iterations"] = nlohmann::json::array();
  for (const IterationTime& it : median.iterations) {
    j["iterations"].push_back(
        {{"iteration", it.iteration}, {"measured_ms", Ms(it.measured_ns)},
         {"replayed_ms", Ms(it.replayed_ns)}});
  }
  j["mean_iteration_measured_ms"] = Ms(median.mean_iteration_measured_ns);
  j["mean_iteration_replayed_ms"] = Ms(median.mean_iteration_replayed_ns);
  j["mean_abs_error"] = median.mean_abs_error;
  j["max_abs_error"] = median.max_abs_error;
  j["ranks_breakdown_ms"] = nlohmann::json::array();
  for (const RankBreakdown& b : median.ranks) {
    j["ranks_breakdown_ms"].push_back({{"rank", b.rank},
                                       {"compute", Ms(b.compute_ns)},
                                       {"comm", Ms(b.comm_ns)},
                                       {"waiting", Ms(b.waiting_ns)},
                                       {"gaps", Ms(b.gaps_ns)},
                                       {"other", Ms(b.other_ns)},
                                       {"bubble", Ms(b.bubble_ns)}});
  }
  return j.dump(1);
}

}  // namespace sluice::trace
