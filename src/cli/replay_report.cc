#include "cli/replay_report.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <tuple>

namespace sluice::cli {
namespace {

using trace::Graph;
using trace::GraphNode;
using trace::NodeKind;

double Ms(double ns) { return ns * 1e-6; }

std::string Pct(double x) { return fmt::format("{:+.1f}%", 100 * x); }

double Error(int64_t replayed, int64_t measured) {
  return measured > 0 ? (static_cast<double>(replayed) - static_cast<double>(measured)) /
                            static_cast<double>(measured)
                      : 0;
}

bool IsHub(const GraphNode& n) {
  return n.kind == NodeKind::kTransfer || n.kind == NodeKind::kCollective;
}

std::string Category(const trace::Analysis& a, const GraphNode& n) {
  if (IsHub(n) || a.set.ranks[n.rank].format != trace::TraceFormat::kSluice) {
    return std::string(trace::NodeKindName(n.kind));
  }
  return a.set.ranks[n.rank].ops[n.op].label;
}

std::string ShortLabel(const trace::Analysis& a, const GraphNode& n) {
  if (n.kind == NodeKind::kTransfer) {
    const trace::MessageMatch& m = a.matching.messages[n.op];
    return a.set.ranks[m.src].comms[m.send].text;
  }
  if (n.kind == NodeKind::kCollective) return "collective";
  return a.set.ranks[n.rank].ops[n.op].name;
}

// The row of a node: "rank R <stream>", hubs on "rank R transfers in" / "collectives".
std::string RowOf(const trace::Analysis& a, const GraphNode& n) {
  if (n.kind == NodeKind::kTransfer) return fmt::format("rank {} transfers in", n.rank);
  if (n.kind == NodeKind::kCollective) return "collectives";
  return fmt::format("rank {} {}", n.rank, a.set.ranks[n.rank].streams[n.stream]);
}

// Bars of iteration `it`, measured or replayed (`start`/`end` relative to the graph's origin),
// shifted so that the iteration starts at 0.
report::Timeline IterationTimeline(const trace::Analysis& a, int64_t it, const std::string& title,
                                   const std::vector<int64_t>* start,
                                   const std::vector<int64_t>* end,
                                   const std::vector<int32_t>* critical) {
  const Graph& g = a.graph;
  auto s = [&](size_t v) {
    return start ? (*start)[v] : g.nodes[v].measured_start_ns - g.origin_ns;
  };
  auto e = [&](size_t v) { return end ? (*end)[v] : g.nodes[v].measured_end_ns - g.origin_ns; };
  int64_t lo = INT64_MAX;
  for (size_t v = 0; v < g.nodes.size(); ++v) {
    if (g.nodes[v].iteration == it && !IsHub(g.nodes[v])) lo = std::min(lo, s(v));
  }
  report::Timeline t;
  t.title = title;
  t.unit = "ms";
  std::map<std::string, size_t> row_index;
  auto row = [&](const std::string& label) -> report::TimelineRow& {
    auto [pos, added] = row_index.try_emplace(label, t.rows.size());
    if (added) t.rows.push_back({label, {}});
    return t.rows[pos->second];
  };
  for (size_t v = 0; v < g.nodes.size(); ++v) {
    const GraphNode& n = g.nodes[v];
    if (n.iteration != it || lo == INT64_MAX) continue;
    report::TimelineBar bar;
    bar.start = Ms(static_cast<double>(s(v) - lo));
    bar.end = Ms(static_cast<double>(e(v) - lo));
    bar.label = ShortLabel(a, n);
    bar.category = Category(a, n);
    bar.tooltip = fmt::format("{}: {:.3f}-{:.3f} ms",
                              trace::NodeText(g, a.set, a.matching, static_cast<int32_t>(v)),
                              bar.start, bar.end);
    row(RowOf(a, n)).bars.push_back(std::move(bar));
  }
  if (critical != nullptr) {
    report::TimelineRow& path = row("critical path");
    for (int32_t v : *critical) {
      if (g.nodes[v].iteration != it) continue;
      report::TimelineBar bar;
      bar.start = Ms(static_cast<double>(s(v) - lo));
      bar.end = Ms(static_cast<double>(e(v) - lo));
      bar.label = ShortLabel(a, g.nodes[v]);
      bar.category = Category(a, g.nodes[v]);
      bar.tooltip = "critical path: " + trace::NodeText(g, a.set, a.matching, v);
      path.bars.push_back(std::move(bar));
    }
  }
  // Ranks in order, each rank's streams before its transfers; collectives, the critical path last.
  auto key = [](const std::string& l) {
    const int group = l == "critical path" ? 2 : l == "collectives" ? 1 : 0;
    const int64_t rank = group == 0 ? std::strtoll(l.c_str() + 5, nullptr, 10) : 0;
    return std::make_tuple(group, rank, l.find("transfers") != std::string::npos, l);
  };
  std::stable_sort(t.rows.begin(), t.rows.end(),
                   [&](const report::TimelineRow& x, const report::TimelineRow& y) {
                     return key(x.label) < key(y.label);
                   });
  return t;
}

report::Table ErrorTable(const trace::Replays& r) {
  report::Table t;
  t.title = "Replayed vs measured iteration time";
  t.header = {"iteration", "measured ms", "replay ms", "error",
              "model ms",  "error",       "class ms",  "error"};
  const auto& p = r.per_iteration.iterations;
  for (size_t i = 0; i < p.size(); ++i) {
    std::vector<std::string> row = {std::to_string(p[i].iteration),
                                    fmt::format("{:.3f}", Ms(p[i].measured_ns)),
                                    fmt::format("{:.3f}", Ms(p[i].replayed_ns)),
                                    Pct(Error(p[i].replayed_ns, p[i].measured_ns))};
    for (const trace::ReplayResult* other : {&r.model, &r.by_class}) {
      if (i < other->iterations.size()) {
        const trace::IterationTime& o = other->iterations[i];
        row.push_back(fmt::format("{:.3f}", Ms(o.replayed_ns)));
        row.push_back(Pct(Error(o.replayed_ns, o.measured_ns)));
      } else {
        row.insert(row.end(), {"-", "-"});
      }
    }
    t.rows.push_back(std::move(row));
  }
  auto summary = [](const std::string& name, const trace::ReplayResult& x) {
    return std::vector<std::string>{name,
                                    fmt::format("{:.3f}", Ms(x.mean_iteration_measured_ns)),
                                    fmt::format("{:.3f}", Ms(x.mean_iteration_replayed_ns)),
                                    fmt::format("mean |error| {:.1f}%, worst {:.1f}%",
                                                100 * x.mean_abs_error, 100 * x.max_abs_error),
                                    "",
                                    "",
                                    "",
                                    ""};
  };
  t.rows.push_back(summary("replay", r.per_iteration));
  t.rows.push_back(summary("model replay", r.model));
  t.rows.push_back(summary("class replay", r.by_class));
  return t;
}

}  // namespace

report::HtmlReport BuildReplayReport(const trace::Analysis& a, const trace::Replays& r,
                                     int64_t iteration,
                                     const std::vector<trace::OpCorrection>* departures) {
  report::HtmlReport h;
  h.title = "sluice replay";
  const trace::TraceSet& s = a.set;
  h.subtitle = fmt::format(
      "{} rank(s), {} traces; {} message(s) and {} collective(s) matched, {} op(s) unmatched",
      s.ranks.size(), trace::TraceFormatName(s.ranks.front().format), a.matching.messages.size(),
      a.matching.collectives.size(), a.matching.unmatched);
  for (const trace::RankTrace& rt : s.ranks) {
    h.facts.push_back({fmt::format("rank {}", rt.rank),
                       fmt::format("{} ({} ops; clock {:+.3f} ms, {})", rt.source, rt.ops.size(),
                                   Ms(a.clocks.offset_ns[rt.rank]), a.clocks.how[rt.rank])});
  }
  h.facts.push_back(
      {"graph", fmt::format("{} nodes, {} edges", a.graph.nodes.size(), a.graph.preds.size())});
  h.facts.push_back({"exact replay", fmt::format("ops end within {:.3f} ms of their measured end",
                                                 Ms(r.exact.max_deviation_ns))});
  // The iteration drawn: the one asked for, else the one with the median measured time.
  const auto& its = r.whole_run.iterations;
  int64_t shown = iteration;
  if (shown < 0 && !its.empty()) {
    std::vector<trace::IterationTime> sorted = its;
    std::sort(sorted.begin(), sorted.end(),
              [](const auto& x, const auto& y) { return x.measured_ns < y.measured_ns; });
    shown = sorted[sorted.size() / 2].iteration;
  }
  report::Section timelines;
  timelines.heading = fmt::format("Iteration {}: measured and replayed", shown);
  timelines.text =
      "Above: what the trace measured (ranks' clocks aligned). Below: the whole-run replay (each "
      "op's measured own time and gap, waited-for transfers as measured, the others from the "
      "communication model, every wait recomputed from the dependencies), with its critical path "
      "in the last row. Both start at the iteration's first op.";
  std::vector<int32_t> critical;
  for (const trace::CriticalStep& st : r.whole_run.critical_path) critical.push_back(st.node);
  timelines.blocks.push_back(IterationTimeline(a, shown, "measured", nullptr, nullptr, nullptr));
  timelines.blocks.push_back(IterationTimeline(a, shown, "replayed", &r.whole_run.start_ns,
                                               &r.whole_run.end_ns, &critical));
  report::Section errors;
  errors.heading = "Replay error";
  errors.text =
      "replay: measured own times, gaps and waited-for transfers, waits recomputed, each "
      "iteration from its ranks' measured starts (dPRO). model: every transfer and collective "
      "from the fitted communication model. class: every op its class's mean own time and gap.";
  errors.blocks.push_back(ErrorTable(r));
  report::Section path;
  path.heading = "Critical path";
  path.text = fmt::format("{} steps through the whole run; the longest 30 are listed.",
                          r.whole_run.critical_path.size());
  report::Table steps;
  steps.title = "Longest steps on the critical path (whole-run replay)";
  steps.header = {"ms", "waited via", "step"};
  steps.wrap = {false, false, true};
  std::vector<trace::CriticalStep> longest = r.whole_run.critical_path;
  std::stable_sort(longest.begin(), longest.end(), [](const auto& x, const auto& y) {
    return x.end_ns - x.start_ns > y.end_ns - y.start_ns;
  });
  if (longest.size() > 30) longest.resize(30);
  for (const trace::CriticalStep& st : longest) {
    steps.rows.push_back({fmt::format("{:.3f}", Ms(st.end_ns - st.start_ns)),
                          std::string(trace::EdgeKindName(st.via)),
                          trace::NodeText(a.graph, s, a.matching, st.node)});
  }
  path.blocks.push_back(std::move(steps));
  report::Table breakdown;
  breakdown.title = "Where the time went (whole-run replay, ms, each rank's busiest stream)";
  breakdown.header = {"rank", "stream", "compute", "comm", "waiting", "gaps", "other", "bubble"};
  for (const trace::RankBreakdown& b : r.whole_run.ranks) {
    breakdown.rows.push_back(
        {std::to_string(b.rank), trace::StreamName(s.ranks[b.rank], b.stream),
         fmt::format("{:.3f}", Ms(b.compute_ns)), fmt::format("{:.3f}", Ms(b.comm_ns)),
         fmt::format("{:.3f}", Ms(b.waiting_ns)), fmt::format("{:.3f}", Ms(b.gaps_ns)),
         fmt::format("{:.3f}", Ms(b.other_ns)), fmt::format("{:.3f}", Ms(b.bubble_ns))});
  }
  path.blocks.push_back(std::move(breakdown));
  report::Table comm;
  comm.title = "Communication models (fitted on what some side waited for)";
  comm.header = {"class", "count", "waited", "latency us", "us/KiB", "measured ms", "modelled ms"};
  for (const trace::CommFit& f : r.model.comm_fits) {
    comm.rows.push_back(
        {f.name, std::to_string(f.hubs), std::to_string(f.waited),
         f.fitted ? fmt::format("{:.1f}{}", f.latency_ns * 1e-3, f.pooled ? " (pooled)" : "")
                  : "measured",
         f.fitted ? fmt::format("{:.3f}", f.ns_per_byte * 1.024) : "-",
         fmt::format("{:.3f}", Ms(f.measured_ns)), fmt::format("{:.3f}", Ms(f.modelled_ns))});
  }
  errors.blocks.push_back(std::move(comm));
  h.sections.push_back(std::move(timelines));
  h.sections.push_back(std::move(errors));
  h.sections.push_back(std::move(path));
  if (departures != nullptr && !departures->empty()) {
    report::Section d;
    d.heading = "Measured vs the plan's cost model";
    d.text =
        "Per (virtual stage, op): the mean |error| of the plan's durations against the "
        "measured costs, the largest first, and the line on the plan's features (its "
        "duration, tokens, attention work, rows, tokens recomputed in full, a constant) that "
        "sluice calibrate would fit.";
    report::Table t;
    t.title = "Op classes against the plan";
    t.header = {"stage", "op", "samples", "plan's mean |error|", "fitted line"};
    for (const trace::OpCorrection& o : *departures) {
      t.rows.push_back({o.stage < 0 ? "any" : std::to_string(o.stage), o.op,
                        std::to_string(o.samples),
                        fmt::format("{:.1f}%", 100 * o.mean_abs_error_before), o.Describe()});
    }
    d.blocks.push_back(std::move(t));
    h.sections.push_back(std::move(d));
  }
  return h;
}

}  // namespace sluice::cli
