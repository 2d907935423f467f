#include "trace/calibration.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "base/json_util.h"
#include "plan/instruction.h"

namespace sluice::trace {
namespace {

bool IsFitted(OpKind op) {
  return IsCompute(op) || op == OpKind::kOptimizerStep || op == OpKind::kLoadInput;
}

// The stage key of an instruction: its virtual stage, or for rank-wide ops the pipeline rank.
int64_t StageKey(const Instruction& in, const RankProgram& program) {
  return in.stage >= 0 && in.op != OpKind::kOptimizerStep ? in.stage : program.pp_index;
}

struct Point {
  double predicted_ns;
  double measured_ns;
};

// measured = scale * predicted + offset, see calibration.h.
OpCorrection Fit(const std::vector<Point>& pts) {
  OpCorrection c;
  c.samples = static_cast<int64_t>(pts.size());
  const double n = static_cast<double>(pts.size());
  double sd = 0, sm = 0, sdd = 0, sdm = 0;
  for (const Point& p : pts) {
    sd += p.predicted_ns;
    sm += p.measured_ns;
    sdd += p.predicted_ns * p.predicted_ns;
    sdm += p.predicted_ns * p.measured_ns;
  }
  if (sd <= 0) {  // nothing predicted: the op's measured mean becomes its offset
    c.offset_us = sm / n * 1e-3;
    c.scale = 1.0;
  } else {
    const double mean_d = sd / n, mean_m = sm / n;
    const double var = sdd / n - mean_d * mean_d;
    const double cv = var > 0 ? std::sqrt(var) / mean_d : 0;
    bool line = pts.size() >= 3 && cv >= 0.05;
    if (line) {
      const double a = (sdm / n - mean_d * mean_m) / var;
      const double b = mean_m - a * mean_d;
      if (a > 0 && b >= 0) {
        c.scale = a;
        c.offset_us = b * 1e-3;
      } else {
        line = false;
      }
    }
    if (!line) {
      c.scale = sdm / sdd;
      c.offset_us = 0;
    }
  }
  for (const Point& p : pts) {
    const double m = std::max(1.0, p.measured_ns);
    c.mean_abs_error_before += std::abs(p.predicted_ns - p.measured_ns) / m;
    c.mean_abs_error_after +=
        std::abs(c.scale * p.predicted_ns + c.offset_us * 1e3 - p.measured_ns) / m;
  }
  c.mean_abs_error_before /= n;
  c.mean_abs_error_after /= n;
  return c;
}

}  // namespace

std::vector<int64_t> MeasuredIterationTimes(const Analysis& a) {
  std::map<int64_t, std::pair<int64_t, int64_t>> span;
  std::map<int64_t, std::set<int64_t>> ranks;
  for (const GraphNode& n : a.graph.nodes) {
    if (n.iteration < 0 || n.stream < 0) continue;
    auto [it, inserted] = span.try_emplace(n.iteration, n.measured_start_ns, n.measured_end_ns);
    it->second.first = std::min(it->second.first, n.measured_start_ns);
    it->second.second = std::max(it->second.second, n.measured_end_ns);
    ranks[n.iteration].insert(n.rank);
  }
  std::vector<int64_t> out(span.empty() ? 0 : span.rbegin()->first + 1, -1);
  for (const auto& [it, s] : span) {
    if (ranks[it].size() == a.set.ranks.size()) out[it] = s.second - s.first;
  }
  return out;
}

StatusOr<Calibration> FitCalibration(const Analysis& a, const std::vector<ExecutionPlan>& plans,
                                     const FitOptions& options) {
  const TraceSet& set = a.set;
  for (const RankTrace& r : set.ranks) {
    if (r.format != TraceFormat::kSluice) {
      return InvalidArgumentError(fmt::format(
          "{}: calibration needs sluice's runtime traces (sluice train --plan ... --trace-dir); "
          "this is a {} trace",
          r.source, TraceFormatName(r.format)));
    }
  }
  std::set<int64_t> wanted(options.iterations.begin(), options.iterations.end());
  if (wanted.empty()) {
    for (size_t k = 0; k < plans.size(); ++k) wanted.insert(static_cast<int64_t>(k));
  }
  for (int64_t k : wanted) {
    if (k < 0 || k >= static_cast<int64_t>(plans.size())) {
      return InvalidArgumentError(fmt::format(
          "iteration {} has no plan: {} plan file(s) given (--plan, one per iteration in the "
          "order sluice train ran them)",
          k, plans.size()));
    }
  }
  std::map<std::pair<int64_t, std::string>, std::vector<Point>> points;  // (stage, op)
  std::map<std::string, std::vector<Point>> any_stage;
  std::vector<std::pair<double, double>> wires;  // (plan bytes, wire ns)
  // Transfer hubs by the (rank, op) of their send's post.
  // Only transfers some side waited for: their done time is the arrival, not a bound above it.
  std::map<std::pair<int64_t, int32_t>, int32_t> hub_of_send_post;
  std::vector<int32_t> rank_first(set.ranks.size() + 1, 0);
  for (size_t r = 0; r < set.ranks.size(); ++r) {
    rank_first[r + 1] = rank_first[r] + static_cast<int32_t>(set.ranks[r].ops.size());
  }
  for (size_t v = 0; v < a.graph.nodes.size(); ++v) {
    const GraphNode& n = a.graph.nodes[v];
    if (n.kind != NodeKind::kTransfer) continue;
    const MessageMatch& m = a.matching.messages[n.op];
    // The side done first must have been blocked in its wait (longer than a wait's own
    // overhead, 50 µs), so that its end is the arrival rather than a later look.
    bool waited = false;
    int64_t first_done = INT64_MAX;
    for (const auto& [rank, comm] : {std::pair{m.src, m.send}, std::pair{m.dst, m.recv}}) {
      const CommOp& op = set.ranks[rank].comms[comm];
      if (op.wait < 0 || op.done_ns == kUnknownTime || op.done_ns >= first_done) continue;
      first_done = op.done_ns;
      const GraphNode& w = a.graph.nodes[rank_first[rank] + op.wait];
      waited = w.measured_end_ns - w.measured_start_ns >= 50'000 &&
               w.measured_start_ns < n.measured_end_ns;
    }
    if (waited) {
      hub_of_send_post[{m.src, set.ranks[m.src].comms[m.send].post}] = static_cast<int32_t>(v);
    }
  }
  int32_t first_node = 0;
  for (const RankTrace& r : set.ranks) {
    // Ops of the compute stream by iteration, in order.
    std::map<int64_t, std::vector<int32_t>> by_iteration;
    for (size_t i = 0; i < r.ops.size(); ++i) {
      if (r.ops[i].stream == 0 && wanted.contains(r.ops[i].iteration)) {
        by_iteration[r.ops[i].iteration].push_back(static_cast<int32_t>(i));
      }
    }
    for (int64_t k : wanted) {
      const ExecutionPlan& plan = plans[k];
      if (r.rank >= static_cast<int64_t>(plan.ranks.size())) {
        return InvalidArgumentError(fmt::format(
            "{}: rank {} is not in the plan of iteration {} ({} ranks): a trace of another plan",
            r.source, r.rank, k, plan.ranks.size()));
      }
      const RankProgram& program = plan.ranks[r.rank];
      const std::vector<int32_t>& ops = by_iteration[k];
      if (ops.size() != program.instructions.size()) {
        return InvalidArgumentError(fmt::format(
            "{}: rank {} ran {} instructions in iteration {} but its plan has {}: a trace of "
            "another plan (give the plans in the order sluice train ran them)",
            r.source, r.rank, ops.size(), k, program.instructions.size()));
      }
      double pending = 0;
      for (size_t i = 0; i < ops.size(); ++i) {
        const TraceOp& op = r.ops[ops[i]];
        const Instruction& in = program.instructions[i];
        const std::string text = InstructionText(in);
        if (op.name != text) {
          return InvalidArgumentError(fmt::format(
              "{}: traceEvents[{}]: rank {} iteration {} instruction {} is '{}' in the trace but "
              "'{}' in the plan: a trace of another plan",
              r.source, op.event_index, r.rank, k, i, op.name, text));
        }
        const GraphNode& node = a.graph.nodes[first_node + ops[i]];
        pending += static_cast<double>(node.own_ns) + (i > 0 ? static_cast<double>(node.gap_ns) : 0);
        if (IsSend(in.op) && IsCommStart(in.op)) {
          auto it = hub_of_send_post.find({r.rank, ops[i]});
          if (it != hub_of_send_post.end()) {
            wires.push_back({static_cast<double>(in.bytes.count()),
                             static_cast<double>(a.graph.nodes[it->second].own_ns)});
          }
        }
        if (!IsFitted(in.op)) continue;
        const Point p{static_cast<double>(in.duration.nanos()), pending};
        points[{StageKey(in, program), std::string(OpKindName(in.op))}].push_back(p);
        any_stage[std::string(OpKindName(in.op))].push_back(p);
        pending = 0;
      }
    }
    first_node += static_cast<int32_t>(r.ops.size());
  }
  Calibration c;
  std::string its;
  for (int64_t k : wanted) its += (its.empty() ? "" : ",") + std::to_string(k);
  c.source = fmt::format("{} (iterations {})", set.ranks.front().source, its);
  for (const auto& [key, pts] : points) {
    OpCorrection o = Fit(pts);
    o.stage = key.first;
    o.op = key.second;
    c.ops.push_back(o);
  }
  for (const auto& [op, pts] : any_stage) {
    OpCorrection o = Fit(pts);
    o.op = op;
    c.ops.push_back(o);
  }
  if (options.fit_link && wires.size() >= 4) {
    // Robust line (wire times have a long tail of waits the trace cannot separate): the slope
    // between the medians of the smaller and the larger half by bytes, the latency the median of
    // what the slope leaves.
    std::sort(wires.begin(), wires.end());
    auto median = [](std::vector<double> v) {
      std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
      return v[v.size() / 2];
    };
    const size_t half = wires.size() / 2;
    std::vector<double> lb, lw, hb, hw;
    for (size_t i = 0; i < wires.size(); ++i) {
      (i < half ? lb : hb).push_back(wires[i].first);
      (i < half ? lw : hw).push_back(wires[i].second);
    }
    const double db = median(hb) - median(lb);
    double slope = db > 0 ? (median(hw) - median(lw)) / db : 0;  // ns per byte
    if (slope < 0) slope = 0;
    std::vector<double> rest;
    for (const auto& [b, w] : wires) rest.push_back(w - slope * b);
    const double alpha = std::max(0.0, median(rest));
    c.link = {true, alpha * 1e-3, slope > 0 ? 1.0 / slope : 1e6,
              static_cast<int64_t>(wires.size())};
  }
  return c;
}

void ApplyCalibration(const Calibration& c, ExecutionPlan* plan) {
  std::map<std::pair<int64_t, std::string>, const OpCorrection*> table;
  for (const OpCorrection& o : c.ops) table[{o.stage, o.op}] = &o;
  for (RankProgram& program : plan->ranks) {
    for (Instruction& in : program.instructions) {
      if (!IsFitted(in.op)) continue;
      const std::string op(OpKindName(in.op));
      auto it = table.find({StageKey(in, program), op});
      if (it == table.end()) it = table.find({-1, op});
      if (it == table.end()) continue;
      const OpCorrection& o = *it->second;
      in.duration = Duration::Nanos(std::max<int64_t>(
          0, std::llround(static_cast<double>(in.duration.nanos()) * o.scale + o.offset_us * 1e3)));
    }
  }
  if (c.link.fitted) {
    for (LinkSpec* link : {&plan->cluster.intra_node, &plan->cluster.inter_node}) {
      link->latency = Duration::Micros(c.link.latency_us);
      link->bandwidth = c.link.bandwidth_gb_per_s * 1e9;
    }
  }
}

std::string CalibrationToJson(const Calibration& c) {
  nlohmann::json j;
  j["format"] = "sluice-calibration/1";
  j["source"] = c.source;
  j["ops"] = nlohmann::json::array();
  for (const OpCorrection& o : c.ops) {
    j["ops"].push_back({{"stage", o.stage},
                        {"op", o.op},
                        {"scale", o.scale},
                        {"offset_us", o.offset_us},
                        {"samples", o.samples},
                        {"error_before", o.mean_abs_error_before},
                        {"error_after", o.mean_abs_error_after}});
  }
  if (c.link.fitted) {
    j["link"] = {{"latency_us", c.link.latency_us},
                 {"bandwidth_gb_per_s", c.link.bandwidth_gb_per_s},
                 {"samples", c.link.samples}};
  }
  return j.dump(1) + "\n";
}

StatusOr<Calibration> CalibrationFromJson(std::string_view text, std::string_view source) {
  SLUICE_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(text, source));
  JsonObjectReader r(j, std::string(source));
  SLUICE_RETURN_IF_ERROR(r.status());
  Calibration c;
  static constexpr std::string_view kFormats[] = {"sluice-calibration/1"};
  std::string format;
  SLUICE_RETURN_IF_ERROR(r.Enum("format", &format, kFormats));
  SLUICE_RETURN_IF_ERROR(r.OptionalString("source", &c.source));
  const nlohmann::json* ops = r.Child("ops");
  if (ops == nullptr || !ops->is_array()) return r.Error("ops", "expected an array");
  std::vector<std::string> names;
  for (int k = 0; k < kNumOpKinds; ++k) names.emplace_back(OpKindName(static_cast<OpKind>(k)));
  std::vector<std::string_view> fitted;
  for (const std::string& n : names) {
    if (IsFitted(*OpKindFromName(n))) fitted.push_back(n);
  }
  for (size_t i = 0; i < ops->size(); ++i) {
    JsonObjectReader o((*ops)[i], std::string(source), fmt::format("ops[{}]", i));
    SLUICE_RETURN_IF_ERROR(o.status());
    OpCorrection oc;
    SLUICE_RETURN_IF_ERROR(o.Int("stage", &oc.stage, -1, 1'000'000));
    SLUICE_RETURN_IF_ERROR(o.Enum("op", &oc.op, fitted));
    SLUICE_RETURN_IF_ERROR(o.Double("scale", &oc.scale, 0, 1e6));
    SLUICE_RETURN_IF_ERROR(o.Double("offset_us", &oc.offset_us, 0, 1e12));
    SLUICE_RETURN_IF_ERROR(o.OptionalInt("samples", &oc.samples, 0, INT64_MAX));
    SLUICE_RETURN_IF_ERROR(o.OptionalDouble("error_before", &oc.mean_abs_error_before, 0, 1e12));
    SLUICE_RETURN_IF_ERROR(o.OptionalDouble("error_after", &oc.mean_abs_error_after, 0, 1e12));
    SLUICE_RETURN_IF_ERROR(o.Finish());
    c.ops.push_back(oc);
  }
  if (const nlohmann::json* link = r.Child("link")) {
    JsonObjectReader l(*link, std::string(source), "link");
    SLUICE_RETURN_IF_ERROR(l.status());
    c.link.fitted = true;
    SLUICE_RETURN_IF_ERROR(l.Double("latency_us", &c.link.latency_us, 0, 1e9));
    SLUICE_RETURN_IF_ERROR(l.Double("bandwidth_gb_per_s", &c.link.bandwidth_gb_per_s, 1e-9, 1e9));
    SLUICE_RETURN_IF_ERROR(l.OptionalInt("samples", &c.link.samples, 0, INT64_MAX));
    SLUICE_RETURN_IF_ERROR(l.Finish());
  }
  SLUICE_RETURN_IF_ERROR(r.Finish());
  return c;
}

StatusOr<Calibration> ReadCalibrationFile(const std::string& path) {
  SLUICE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return CalibrationFromJson(text, path);
}

}  // namespace sluice::trace
