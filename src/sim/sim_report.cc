#include "sim/sim_report.h"

#include <fmt/core.h>

#include <algorithm>
#include <set>
#include <tuple>

namespace sluice {
namespace {

constexpr int64_t kMaxDrawnRanks = 16;  // above: replica 0 only in timeline and memory chart
constexpr int64_t kMaxTableRanks = 64;  // above: replica 0 only in the tables

std::string Ms(Duration d) { return fmt::format("{:.3f}", d.millis()); }
std::string Pct(double f) { return fmt::format("{:.1f}%", 100.0 * f); }
double Frac(Duration part, Duration whole) {
  return whole > Duration::Zero() ? part.seconds() / whole.seconds() : 0.0;
}

// Rank ids drawn (or listed) when at most `limit` ranks are shown: all, or replica 0's.
std::vector<int64_t> Shown(const ExecutionPlan& plan, int64_t limit) {
  std::vector<int64_t> out;
  const int64_t n = static_cast<int64_t>(plan.ranks.size());
  const int64_t count = n <= limit ? n : plan.pp();
  for (int64_t i = 0; i < count; ++i) out.push_back(i);
  return out;
}

report::Section SummarySection(const ExecutionPlan& plan, const SimResult& r) {
  report::Section s;
  s.heading = "Summary";
  report::Table head;
  head.title = "Headline figures";
  head.header = {"figure", "value"};
  const double padding = r.padded_tokens > 0
                             ? static_cast<double>(r.padded_tokens - r.real_tokens) /
                                   static_cast<double>(r.padded_tokens)
                             : 0.0;
  Duration path_compute, path_comm;
  for (const SimInterval& iv : r.critical_path) {
    (iv.stream == StreamKind::kCompute ? path_compute : path_comm) += iv.end - iv.start;
  }
  head.rows = {
      {"outcome", std::string(SimOutcomeName(r.outcome))},
      {"iteration time", Ms(r.iteration_time) + " ms"},
      {"real tokens",
       fmt::format("{}{}", r.real_tokens,
                   r.tokens_from_samples ? "" : " (padded shapes: no lengths given)")},
      {"padded tokens", fmt::format("{} ({} padding)", r.padded_tokens, Pct(padding))},
      {"tokens/s (real)", fmt::format("{:.0f}", r.tokens_per_second)},
      {"MFU", fmt::format("{} of {} x {:.0f} TFLOP/s", Pct(r.mfu), plan.parallel.devices(),
                          plan.cluster.device.peak_flops / 1e12)},
      {"stage imbalance", Pct(r.stage_imbalance)},
      {"replica imbalance", Pct(r.replica_imbalance)},
      {"critical path", fmt::format("{} intervals: compute {} ms, communication {} ms",
                                    r.critical_path.size(), Ms(path_compute), Ms(path_comm))},
      {"memory limit", fmt::format("{:.1f} MB", plan.memory_limit().mb())},
      {"instructions / events", fmt::format("{} / {}", r.instructions, r.events)}};
  Duration a2a, exposed_a2a;
  for (const RankSimStats& st : r.ranks) {
    a2a += st.all_to_all;
    exposed_a2a += st.exposed_all_to_all;
  }
  if (a2a > Duration::Zero()) {  // expert parallelism
    const int64_t n = static_cast<int64_t>(r.ranks.size());
    head.rows.push_back({"all-to-all (mean per rank)",
                         fmt::format("{} ms, {} ms of it exposed",
                                     Ms(Duration::Nanos(a2a.nanos() / n)),
                                     Ms(Duration::Nanos(exposed_a2a.nanos() / n)))});
  }
  head.numeric = {false, false};
  s.blocks.push_back(head);
  report::Table ranks;
  ranks.title = "Per rank";
  ranks.header = {"rank",      "dp",           "pp",
                  "finish ms", "compute ms",   "exposed comm ms",
                  "bubble ms", "comm busy ms", "peak MB"};
  for (int64_t i : Shown(plan, kMaxTableRanks)) {
    const RankSimStats& st = r.ranks[i];
    ranks.rows.push_back({std::to_string(i), std::to_string(plan.ranks[i].dp_index),
                          std::to_string(plan.ranks[i].pp_index), Ms(st.finish), Ms(st.compute),
                          Ms(st.exposed_comm), Ms(st.bubble), Ms(st.comm),
                          fmt::format("{:.1f}", st.peak_memory.mb())});
  }
  s.blocks.push_back(ranks);
  if (static_cast<int64_t>(plan.ranks.size()) > kMaxTableRanks) {
    s.text = fmt::format("{} ranks: the table lists replica 0 only.", plan.ranks.size());
  }
  return s;
}

report::Section TimelineSection(const ExecutionPlan& plan, const SimResult& r) {
  report::Section s;
  s.heading = "Pipeline timeline";
  if (r.timeline.empty()) {
    s.text = "The timeline was not recorded (record_timeline off).";
    return s;
  }
  const std::vector<int64_t> shown = Shown(plan, kMaxDrawnRanks);
  s.text =
      static_cast<int64_t>(shown.size()) < static_cast<int64_t>(plan.ranks.size())
          ? fmt::format("{} ranks: replica 0 only ({} ranks). ", plan.ranks.size(), shown.size())
          : "";
  s.text +=
      "Per rank a compute row and the communication streams it used; bars on the critical "
      "path say so in their tooltips.";
  std::set<std::tuple<int64_t, int64_t, int>> critical;
  for (const SimInterval& iv : r.critical_path) {
    critical.insert({iv.rank, iv.instruction, static_cast<int>(iv.stream)});
  }
  report::Timeline t;
  t.title = "Simulated iteration";
  t.unit = "ms";
  for (int64_t rank : shown) {
    report::TimelineRow compute{fmt::format("rank {} compute", rank), {}};
    report::TimelineRow p2p{fmt::format("rank {} p2p", rank), {}};
    report::TimelineRow coll{fmt::format("rank {} collective", rank), {}};
    report::TimelineRow a2a{fmt::format("rank {} all-to-all", rank), {}};
    auto lo = std::lower_bound(r.timeline.begin(), r.timeline.end(), rank,
                               [](const SimInterval& iv, int64_t v) { return iv.rank < v; });
    for (auto it = lo; it != r.timeline.end() && it->rank == rank; ++it) {
      const Instruction& in = plan.ranks[rank].instructions[it->instruction];
      if (it->end == it->start && !IsCompute(in.op)) continue;
      report::TimelineBar bar;
      bar.start = it->start.millis();
      bar.end = it->end.millis();
      bar.label = InstructionText(in);
      bar.category = TimelineCategory(in.op);
      const bool on_path =
          critical.count({it->rank, it->instruction, static_cast<int>(it->stream)}) > 0;
      bar.tooltip =
          fmt::format("rank {} {} on {}: {:.3f}-{:.3f} ms{}{}{}", rank, bar.label,
                      StreamKindName(it->stream), bar.start, bar.end,
                      in.bytes.count() > 0 ? fmt::format(", {} bytes", in.bytes.count()) : "",
                      in.microbatch >= 0 ? fmt::format(", micro-batch {}", in.microbatch) : "",
                      on_path ? " (critical path)" : "");
      (it->stream == StreamKind::kCompute      ? compute
       : it->stream == StreamKind::kCollective ? coll
       : it->stream == StreamKind::kAllToAll   ? a2a
                                               : p2p)
          .bars.push_back(std::move(bar));
    }
    t.rows.push_back(std::move(compute));
    if (!p2p.bars.empty()) t.rows.push_back(std::move(p2p));
    if (!coll.bars.empty()) t.rows.push_back(std::move(coll));
    if (!a2a.bars.empty()) t.rows.push_back(std::move(a2a));
  }
  s.blocks.push_back(std::move(t));
  return s;
}

report::Section MemorySection(const ExecutionPlan& plan, const SimResult& r) {
  report::Section s;
  s.heading = "Memory over time";
  if (r.memory.empty()) {
    s.text = "The memory timeline was not recorded (record_memory off).";
    return s;
  }
  const std::vector<int64_t> shown = Shown(plan, kMaxDrawnRanks);
  s.text = fmt::format(
      "Model states + activations (the plan's per-stage costs) + live buffers, per rank{}.",
      static_cast<int64_t>(shown.size()) < static_cast<int64_t>(plan.ranks.size())
          ? fmt::format("; {} ranks: replica 0 only", plan.ranks.size())
          : "");
  report::LineChart chart;
  chart.title = "Device memory";
  chart.x_label = "time (ms)";
  chart.y_label = "MB";
  chart.step = true;
  chart.limit = plan.memory_limit().mb();
  chart.limit_label = fmt::format("limit {:.0f} MB", plan.memory_limit().mb());
  for (int64_t rank : shown) {
    report::Series series;
    series.name = fmt::format("rank {}", rank);
    for (const MemoryPoint& m : r.memory[rank])
      series.points.push_back({m.time.millis(), m.bytes.mb()});
    if (!series.points.empty() && series.points.back().first < r.iteration_time.millis()) {
      series.points.push_back({r.iteration_time.millis(), series.points.back().second});
    }
    chart.series.push_back(std::move(series));
  }
  s.blocks.push_back(std::move(chart));
  return s;
}

report::Section BreakdownSection(const ExecutionPlan& plan, const SimResult& r) {
  report::Section s;
  s.heading = "Where time went";
  s.text =
      "Each rank's iteration split into compute, communication it waited for with its "
      "compute idle (exposed), and the rest (bubble: waiting for other ranks).";
  report::Table t;
  t.title = "Breakdown per rank";
  t.header = {"rank", "compute", "exposed comm", "bubble"};
  report::BarChart bars;
  bars.title = "Idle time per rank (bubble + exposed communication)";
  bars.value_label = "ms";
  for (int64_t i : Shown(plan, kMaxTableRanks)) {
    const RankSimStats& st = r.ranks[i];
    t.rows.push_back({std::to_string(i), Pct(Frac(st.compute, r.iteration_time)),
                      Pct(Frac(st.exposed_comm, r.iteration_time)),
                      Pct(Frac(st.bubble, r.iteration_time))});
    const Duration idle = st.bubble + st.exposed_comm;
    bars.bars.push_back(
        {fmt::format("rank {}", i), idle.millis(), Pct(Frac(idle, r.iteration_time)), false});
  }
  s.blocks.push_back(std::move(t));
  s.blocks.push_back(std::move(bars));
  return s;
}

}  // namespace

report::HtmlReport BuildSimulationReport(const ExecutionPlan& plan, const SimResult& r) {
  report::HtmlReport out;
  out.title = fmt::format("sluice simulate: {} on {}", plan.model.name, plan.cluster.name);
  const std::string schedule = plan.replicas.empty() ? "-" : plan.replicas[0].schedule;
  out.subtitle = fmt::format(
      "dp {} x pp {} x tp {}{}, ZeRO-{}, method {}, schedule {}; cost model: {}", plan.dp(),
      plan.pp(), plan.parallel.tp,
      (plan.parallel.cp > 1 ? fmt::format(" x cp {}", plan.parallel.cp) : "") +
          (plan.vpp() > 1 ? fmt::format(" x vpp {}", plan.vpp()) : "") +
          (SearchesOrder(plan.cluster, plan.parallel)
               ? fmt::format(", order {}", RankOrderName(plan.parallel.order))
               : ""),
      plan.parallel.zero, plan.method, schedule, plan.cost_model);
  if (r.outcome != SimOutcome::kOk || r.memory_exceeded) {
    report::Section problem;
    problem.heading = r.outcome == SimOutcome::kDeadlock ? "Deadlock" : "Out of memory";
    problem.text = r.problem;
    if (!r.blocked.empty()) {
      report::Table t;
      t.title = "Blocked ranks";
      t.header = {"rank", "instruction", "waits for"};
      t.numeric = {true, true, false};
      for (const BlockedRank& b : r.blocked) {
        t.rows.push_back({std::to_string(b.rank), std::to_string(b.instruction), b.text});
      }
      problem.blocks.push_back(std::move(t));
    }
    out.sections.push_back(std::move(problem));
  }
  out.sections.push_back(SummarySection(plan, r));
  out.sections.push_back(TimelineSection(plan, r));
  out.sections.push_back(MemorySection(plan, r));
  out.sections.push_back(BreakdownSection(plan, r));
  return out;
}

std::string TimelineCategory(OpKind op) {
  switch (op) {
    case OpKind::kForward:
      return "forward";
    case OpKind::kBackward:
      return "backward";
    case OpKind::kBackwardInput:
      return "backward-input";
    case OpKind::kBackwardWeight:
      return "backward-weight";
    case OpKind::kLoadInput:
      return "load";
    case OpKind::kOptimizerStep:
      return "optimizer";
    case OpKind::kAllReduceGrad:
      return "all-reduce";
    case OpKind::kReduceScatterGrad:
      return "reduce-scatter";
    case OpKind::kAllGatherParams:
      return "all-gather";
    case OpKind::kAllToAllDispatch:
    case OpKind::kAllToAllCombine:
      return "all-to-all";
    default:
      if (IsSend(op)) return "send";
      return IsCommStart(op) || IsCommFinish(op) ? "recv" : "other";
  }
}

}  // namespace sluice
