#include "trace/analyze.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
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
  // sluice train writes the ranks of one host on one clock: a rank that causality had to move
  // ran elsewhere, or its trace is of another run.
  for (size_t r = 0; r < set.ranks.size(); ++r) {
    if (set.ranks[r].format == TraceFormat::kSluice &&
        std::abs(a.clocks.offset_ns[r]) > 1'000'000) {
      set.notes.push_back(fmt::format(
          "{}: rank {}'s receives end before their sends were posted unless its clock moves by "
          "{:+.3f} ms; sluice train writes the ranks of one host on one clock, so this is another "
          "host or a trace of another run or plan (replay --plan checks the plan)",
          set.ranks[r].source, r, a.clocks.offset_ns[r] * 1e-6));
    }
  }
  SLUICE_ASSIGN_OR_RETURN(a.graph, BuildGraph(set, a.matching));
  a.set = std::move(set);
  return a;
}

StatusOr<Analysis> AnalyzeFiles(const std::vector<std::string>& paths, const ReadOptions& options) {
  SLUICE_ASSIGN_OR_RETURN(TraceSet set, ReadTraces(paths, options));
  return Analyze(std::move(set));
}

StatusOr<Replays> ReplayAll(const Analysis& a, ClassStat class_stat,
                            const std::vector<WhatIf>& what_if) {
  Replays r;
  r.class_stat = class_stat;
  SLUICE_ASSIGN_OR_RETURN(r.exact, Replay(a.graph, a.set, ReplayOptions{}));
  ReplayOptions o;
  o.comm = CommModel::kWaitedElseFitted;
  SLUICE_ASSIGN_OR_RETURN(r.whole_run, Replay(a.graph, a.set, o));
  o.per_iteration = true;
  o.critical_path = false;
  SLUICE_ASSIGN_OR_RETURN(r.per_iteration, Replay(a.graph, a.set, o));
  o.comm = CommModel::kFitted;
  SLUICE_ASSIGN_OR_RETURN(r.model, Replay(a.graph, a.set, o));
  ReplayOptions c;
  c.durations = class_stat;
  c.critical_path = false;
  SLUICE_ASSIGN_OR_RETURN(r.by_class, Replay(a.graph, a.set, c));
  if (!what_if.empty()) {
    r.what_if = what_if;
    ReplayOptions w;
    w.comm = CommModel::kWaitedElseFitted;
    w.what_if = what_if;
    SLUICE_ASSIGN_OR_RETURN(r.what_if_whole_run, Replay(a.graph, a.set, w));
    w.per_iteration = true;
    w.critical_path = false;
    SLUICE_ASSIGN_OR_RETURN(r.what_if_per_iteration, Replay(a.graph, a.set, w));
  }
  return r;
}

std::string FormatWhatIfReport(const Replays& r) {
  if (r.what_if.empty() && r.what_if_plan.empty()) return "";
  std::string list = r.what_if_plan;
  for (const WhatIf& w : r.what_if) list += (list.empty() ? "" : ", ") + WhatIfText(w);
  std::string out = fmt::format(
      "what-if {}: iteration times predicted from this trace (per-iteration replay: each "
      "iteration from its measured start; whole-run: chained)\n",
      list);
  out += "  iteration  measured ms  replayed ms  what-if ms  change   whole-run what-if ms\n";
  const std::vector<IterationTime>& base = r.per_iteration.iterations;
  const std::vector<IterationTime>& w = r.what_if_per_iteration.iterations;
  const std::vector<IterationTime>& ww = r.what_if_whole_run.iterations;
  for (size_t i = 0; i < base.size() && i < w.size(); ++i) {
    const double change = 100 * (static_cast<double>(w[i].replayed_ns) /
                                     std::max(1.0, static_cast<double>(base[i].replayed_ns)) -
                                 1);
    out += fmt::format("  {:>9}  {:>11.3f}  {:>11.3f}  {:>10.3f}  {:>+6.1f}%  {:>20}\n",
                       base[i].iteration, Ms(base[i].measured_ns), Ms(base[i].replayed_ns),
                       Ms(w[i].replayed_ns), change,
                       i < ww.size() ? fmt::format("{:.3f}", Ms(ww[i].replayed_ns)) : "-");
  }
  const double b = std::max(1.0, r.per_iteration.mean_iteration_replayed_ns);
  out += fmt::format(
      "  mean: {:.3f} ms replayed -> {:.3f} ms with the what-if ({:+.1f}%); whole-run {:.3f} -> "
      "{:.3f} ms\n",
      Ms(r.per_iteration.mean_iteration_replayed_ns),
      Ms(r.what_if_per_iteration.mean_iteration_replayed_ns),
      100 * (r.what_if_per_iteration.mean_iteration_replayed_ns / b - 1),
      Ms(r.whole_run.mean_iteration_replayed_ns),
      Ms(r.what_if_whole_run.mean_iteration_replayed_ns));
  return out;
}

namespace {

double SignedError(int64_t replayed, int64_t measured) {
  return measured > 0 ? (static_cast<double>(replayed) - static_cast<double>(measured)) /
                            static_cast<double>(measured)
                      : 0;
}

std::string Summary(const ReplayResult& r) {
  return fmt::format(
      "mean |error| {}, worst {}; mean iteration {:.3f} ms vs {:.3f} ms measured "
      "({:+.1f}%)",
      Pct(r.mean_abs_error), Pct(r.max_abs_error), Ms(r.mean_iteration_replayed_ns),
      Ms(r.mean_iteration_measured_ns),
      100 * (r.mean_iteration_replayed_ns / std::max(1.0, r.mean_iteration_measured_ns) - 1));
}

}  // namespace

std::string FormatReplayReport(const Analysis& a, const Replays& rp, int top_steps) {
  std::string out;
  const TraceSet& s = a.set;
  out += fmt::format("traces: {} rank(s), {}\n", s.ranks.size(),
                     TraceFormatName(s.ranks.front().format));
  for (const RankTrace& r : s.ranks) {
    out += fmt::format("  rank {}: {} ({} ops on {} stream(s), {} communications)\n", r.rank,
                       r.source, r.ops.size(), r.streams.size(), r.comms.size());
  }
  out +=
      fmt::format("matched: {} message(s), {} collective(s); {} op(s) unmatched\n",
                  a.matching.messages.size(), a.matching.collectives.size(), a.matching.unmatched);
  out += "clock offsets (added to each rank's times):\n";
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    out +=
        fmt::format("  rank {}: {:+.3f} ms ({})\n", r, Ms(a.clocks.offset_ns[r]), a.clocks.how[r]);
  }
  out += fmt::format(
      "  {} send->receive bounds, {} still broken; {} receive(s) posted before their send "
      "(clipped to it)\n",
      a.clocks.causality_bounds, a.clocks.violations, a.clocks.clipped_receives);
  const Graph& g = a.graph;
  out += fmt::format(
      "graph: {} nodes, {} edges (stream {}, data {}, post {}, done {}, launch {}); {} "
      "communication class(es)\n",
      g.nodes.size(), g.preds.size(), g.edges_by_kind[0], g.edges_by_kind[1], g.edges_by_kind[2],
      g.edges_by_kind[3], g.edges_by_kind[4], g.comm_classes.size());
  const ReplayResult& exact = rp.exact;
  out += fmt::format(
      "exact replay (every op, gap and transfer as measured): span {:.3f} ms measured, {:.3f} ms "
      "replayed (ops end within {:.3f} ms of their measured end)\n",
      Ms(exact.measured_span_ns), Ms(exact.replayed_span_ns), Ms(exact.max_deviation_ns));
  out += "communication models (fitted on the transfers and collectives some side waited for):\n";
  out +=
      "  class                          count  waited  latency us   us/KiB  measured ms  "
      "modelled ms\n";
  for (const CommFit& f : rp.model.comm_fits) {
    out += fmt::format(
        "  {:<30} {:>5}  {:>6}  {:>10}  {:>7}  {:>11.3f}  {:>11.3f}\n", f.name.substr(0, 30),
        f.hubs, f.waited,
        f.fitted ? fmt::format("{:.1f}{}", f.latency_ns * 1e-3, f.pooled ? " (pooled)" : "")
                 : std::string("measured"),
        f.fitted ? fmt::format("{:.3f}", f.ns_per_byte * 1.024) : "-", Ms(f.measured_ns),
        Ms(f.modelled_ns));
  }
  out += fmt::format(
      "iterations: replay (dPRO: each op's measured own time and gap, each waited-for transfer "
      "and collective its measured time, the others the model's within their measured bound; "
      "waits recomputed from the dependencies; each iteration from its ranks' measured starts); "
      "model (the same with every transfer and collective from the model); class (class {}s of "
      "own times and gaps)\n",
      rp.class_stat == ClassStat::kMedian ? "median" : "mean");
  out += "  iteration  measured ms  replayed ms   error      model ms   error  class ms   error\n";
  const size_t k = rp.per_iteration.iterations.size();
  for (size_t i = 0; i < k; ++i) {
    const IterationTime& p = rp.per_iteration.iterations[i];
    const IterationTime* w = i < rp.model.iterations.size() ? &rp.model.iterations[i] : nullptr;
    const IterationTime* c =
        i < rp.by_class.iterations.size() ? &rp.by_class.iterations[i] : nullptr;
    out += fmt::format(
        "  {:>9}  {:>11.3f}  {:>11.3f}  {:>+6.1f}%  {:>12.3f}  {:>+6.1f}%  {:>8.3f}  "
        "{:>+6.1f}%\n",
        p.iteration, Ms(p.measured_ns), Ms(p.replayed_ns),
        100 * SignedError(p.replayed_ns, p.measured_ns), w ? Ms(w->replayed_ns) : 0.0,
        w ? 100 * SignedError(w->replayed_ns, w->measured_ns) : 0.0, c ? Ms(c->replayed_ns) : 0.0,
        c ? 100 * SignedError(c->replayed_ns, c->measured_ns) : 0.0);
  }
  if (k > 0) {
    out += "  replay:           " + Summary(rp.per_iteration) + "\n";
    out += "  whole-run replay: " + Summary(rp.whole_run) + " (iterations chained)\n";
    out += "  model replay:     " + Summary(rp.model) + "\n";
    out += "  class replay:     " + Summary(rp.by_class) + "\n";
  } else {
    out += "  (no iteration has ops on every rank)\n";
  }
  const ReplayResult& c = rp.whole_run;
  out += "where the time went (whole-run replay, ms, each rank's busiest stream):\n";
  out += "  rank  stream            compute     comm  waiting     gaps    other   bubble\n";
  for (const RankBreakdown& b : c.ranks) {
    out += fmt::format("  {:>4}  {:<14} {:>9.3f} {:>8.3f} {:>8.3f} {:>8.3f} {:>8.3f} {:>8.3f}\n",
                       b.rank, StreamName(s.ranks[b.rank], b.stream).substr(0, 14),
                       Ms(b.compute_ns), Ms(b.comm_ns), Ms(b.waiting_ns), Ms(b.gaps_ns),
                       Ms(b.other_ns), Ms(b.bubble_ns));
  }
  out += fmt::format("critical path (whole-run replay): {} steps; own time on it (ms):",
                     c.critical_path.size());
  for (int kind = 0; kind < 7; ++kind) {
    if (c.critical_by_kind_ns[kind] > 0) {
      out += fmt::format(" {} {:.3f},", NodeKindName(static_cast<NodeKind>(kind)),
                         Ms(c.critical_by_kind_ns[kind]));
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

std::string ReplayJson(const Analysis& a, const Replays& rp) {
  const ReplayResult& measured = rp.exact;
  const ReplayResult& median = rp.by_class;
  nlohmann::json j;
  j["format"] = "sluice-replay/2";
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
  auto replay_json = [](const ReplayResult& r) {
    nlohmann::json out;
    out["iterations"] = nlohmann::json::array();
    for (const IterationTime& it : r.iterations) {
      out["iterations"].push_back({{"iteration", it.iteration},
                                   {"measured_ms", Ms(it.measured_ns)},
                                   {"replayed_ms", Ms(it.replayed_ns)}});
    }
    out["mean_iteration_measured_ms"] = Ms(r.mean_iteration_measured_ns);
    out["mean_iteration_replayed_ms"] = Ms(r.mean_iteration_replayed_ns);
    out["mean_abs_error"] = r.mean_abs_error;
    out["max_abs_error"] = r.max_abs_error;
    return out;
  };
  j["per_iteration"] = replay_json(rp.per_iteration);
  j["whole_run"] = replay_json(rp.whole_run);
  j["model"] = replay_json(rp.model);
  j["class"] = replay_json(median);
  j["class"]["stat"] = rp.class_stat == ClassStat::kMedian ? "median" : "mean";
  if (!rp.what_if.empty() || !rp.what_if_plan.empty()) {
    nlohmann::json w;
    if (!rp.what_if_plan.empty()) w["plan"] = rp.what_if_plan;
    w["what_if"] = nlohmann::json::array();
    for (const WhatIf& x : rp.what_if) w["what_if"].push_back(WhatIfText(x));
    w["per_iteration"] = replay_json(rp.what_if_per_iteration);
    w["whole_run"] = replay_json(rp.what_if_whole_run);
    j["what_if"] = std::move(w);
  }
  j["ranks_breakdown_ms"] = nlohmann::json::array();
  for (const RankBreakdown& b : rp.whole_run.ranks) {
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
