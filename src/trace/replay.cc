#include "trace/replay.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <unordered_map>

namespace sluice::trace {
namespace {

int64_t Median(std::vector<int64_t>& v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

bool IsHub(const GraphNode& n) {
  return n.kind == NodeKind::kTransfer || n.kind == NodeKind::kCollective;
}

// The class of a node for median replays; "" for nodes that keep their measured values.
std::string ClassKey(const Graph& g, const TraceSet& set, const std::vector<int32_t>& position,
                     int32_t v) {
  const GraphNode& n = g.nodes[v];
  if (n.iteration < 0) return "";
  if (n.kind == NodeKind::kTransfer || n.kind == NodeKind::kCollective) {
    // Hubs: by their first post's class (the same op of the same iteration position).
    const GraphEdge& first = g.preds[n.first_pred];
    return fmt::format("hub{}|{}|{}", static_cast<int>(n.kind), n.num_preds,
                       ClassKey(g, set, position, first.from));
  }
  const TraceOp& op = set.ranks[n.rank].ops[n.op];
  return fmt::format("{}|{}|{}|{}|{}|{}", n.rank, n.stream, position[v], static_cast<int>(n.kind),
                     op.name, op.label);
}

}  // namespace

namespace {

// latency + slope x bytes over `samples` (hub nodes): Theil-Sen, robust to the long tail of
// waits on a busy core: the slope the median of the pairwise slopes (over at most 256 samples
// evenly spread by size), the latency the median of time - slope x bytes; the median time when
// sizes do not vary. A negative slope counts as 0. Sorts `samples`.
std::pair<int64_t, double> FitLine(const Graph& g, std::vector<int32_t>& samples) {
  std::sort(samples.begin(), samples.end(),
            [&](int32_t a, int32_t b) { return g.nodes[a].bytes < g.nodes[b].bytes; });
  constexpr size_t kMaxSamples = 256;
  std::vector<int32_t> some;
  const size_t step = (samples.size() + kMaxSamples - 1) / kMaxSamples;
  for (size_t i = 0; i < samples.size(); i += step) some.push_back(samples[i]);
  std::vector<double> slopes;
  for (size_t i = 0; i < some.size(); ++i) {
    const GraphNode& a = g.nodes[some[i]];
    for (size_t j = i + 1; j < some.size(); ++j) {
      const GraphNode& b = g.nodes[some[j]];
      if (b.bytes == a.bytes) continue;
      slopes.push_back(static_cast<double>(b.own_ns - a.own_ns) /
                       static_cast<double>(b.bytes - a.bytes));
    }
  }
  double slope = 0;  // ns per byte
  if (!slopes.empty()) {
    std::nth_element(slopes.begin(), slopes.begin() + slopes.size() / 2, slopes.end());
    slope = std::max(0.0, slopes[slopes.size() / 2]);
  }
  std::vector<int64_t> ys;
  for (int32_t v : samples) {
    ys.push_back(g.nodes[v].own_ns - std::llround(slope * static_cast<double>(g.nodes[v].bytes)));
  }
  return {std::max<int64_t>(0, Median(ys)), slope};
}

}  // namespace

std::vector<int64_t> FittedCommTimes(const Graph& g, int64_t* groups, std::vector<CommFit>* fits) {
  // Samples: the hubs some side waited for, per class and pooled per kind (transfer,
  // collective) for classes without any.
  std::vector<std::vector<int32_t>> samples(g.comm_classes.size());
  std::vector<int32_t> pooled[2];
  for (size_t v = 0; v < g.nodes.size(); ++v) {
    const GraphNode& n = g.nodes[v];
    if (n.comm_class < 0 || !n.waited) continue;
    samples[n.comm_class].push_back(static_cast<int32_t>(v));
    pooled[n.kind == NodeKind::kCollective].push_back(static_cast<int32_t>(v));
  }
  std::vector<std::pair<int64_t, double>> lines(samples.size());
  std::vector<char> fitted(samples.size(), 0);
  std::pair<int64_t, double> pooled_line[2];
  for (int k = 0; k < 2; ++k) {
    if (!pooled[k].empty()) pooled_line[k] = FitLine(g, pooled[k]);
  }
  for (size_t c = 0; c < samples.size(); ++c) {
    if (samples[c].empty()) continue;
    lines[c] = FitLine(g, samples[c]);
    fitted[c] = 1;
  }
  std::vector<int64_t> own(g.nodes.size(), 0);
  std::vector<char> used(samples.size(), 0);
  std::vector<CommFit> out(samples.size());
  for (size_t c = 0; c < samples.size(); ++c) {
    out[c].name = g.comm_classes[c];
    out[c].waited = static_cast<int64_t>(samples[c].size());
  }
  for (size_t v = 0; v < g.nodes.size(); ++v) {
    const GraphNode& n = g.nodes[v];
    if (n.comm_class < 0) continue;
    const int k = n.kind == NodeKind::kCollective;
    const std::pair<int64_t, double>* line = fitted[n.comm_class] ? &lines[n.comm_class]
                                             : !pooled[k].empty() ? &pooled_line[k]
                                                                  : nullptr;
    CommFit& f = out[n.comm_class];
    ++f.hubs;
    f.measured_ns += n.own_ns;
    if (line == nullptr) {
      own[v] = n.own_ns;  // nothing was waited for: its measured bound
    } else {
      own[v] = line->first + std::llround(line->second * static_cast<double>(n.bytes));
      used[n.comm_class] = 1;
      f.fitted = true;
      f.pooled = !fitted[n.comm_class];
      f.latency_ns = line->first;
      f.ns_per_byte = line->second;
    }
    f.modelled_ns += own[v];
  }
  if (fits != nullptr) *fits = std::move(out);
  if (groups != nullptr) *groups = std::count(used.begin(), used.end(), 1);
  return own;
}

StatusOr<WhatIf> ParseWhatIf(std::string_view text) {
  auto bad = [&] {
    return InvalidArgumentError(fmt::format(
        "--what-if '{}': expected WHAT=FACTOR (a number in [0, 1e6]) or WHAT+=DURATION (a number "
        ">= 0 with ns, us, ms or s, at most 1e6 s), WHAT one of compute, comm, link, gap, "
        "optimizer or a text the op's name or annotation contains, without '=' (e.g. comm=0.5, "
        "link+=2ms, 'forward=1.2')",
        text));
  };
  const size_t eq = text.rfind('=');
  if (eq == std::string_view::npos || eq + 1 >= text.size()) return bad();
  const bool add = eq > 0 && text[eq - 1] == '+';
  const size_t what_end = add ? eq - 1 : eq;
  if (what_end == 0) return bad();
  WhatIf w;
  w.match = std::string(text.substr(0, what_end));
  if (w.match.find('=') != std::string::npos) return bad();
  std::string value(text.substr(eq + 1));
  double unit = 1;  // ns per unit of the value
  if (add) {
    static constexpr std::pair<std::string_view, double> kUnits[] = {
        {"ns", 1}, {"us", 1e3}, {"ms", 1e6}, {"s", 1e9}};
    bool found = false;
    for (const auto& [suffix, ns] : kUnits) {
      if (value.size() > suffix.size() && value.ends_with(suffix)) {
        value.resize(value.size() - suffix.size());
        unit = ns;
        found = true;
        break;
      }
    }
    if (!found) return bad();
  }
  double x = 0;
  try {
    size_t used = 0;
    x = std::stod(value, &used);
    if (used != value.size()) return bad();
  } catch (const std::exception&) {
    return bad();
  }
  if (!(x >= 0) || !std::isfinite(x) || (add ? x * unit > 1e15 : x > kMaxWhatIfFactor)) {
    return bad();
  }
  if (add) {
    w.add_ns = std::llround(x * unit);
  } else {
    w.factor = x;
  }
  return w;
}

std::string WhatIfText(const WhatIf& w) {
  std::string out = w.match;
  if (w.factor != 1.0 || w.add_ns == 0) out += fmt::format("={}", w.factor);
  if (w.add_ns != 0) {
    const int64_t a = w.add_ns;
    out += a % 1'000'000 == 0 ? fmt::format("+={}ms", a / 1'000'000)
           : a % 1000 == 0    ? fmt::format("+={}us", a / 1000)
                              : fmt::format("+={}ns", a);
  }
  return out;
}

StatusOr<ReplayResult> Replay(const Graph& g, const TraceSet& set, const ReplayOptions& options) {
  const size_t n = g.nodes.size();
  std::vector<int64_t> own(n), gap(n);
  for (size_t v = 0; v < n; ++v) {
    own[v] = g.nodes[v].own_ns;
    gap[v] = g.nodes[v].gap_ns;
  }
  if (options.durations != ClassStat::kMeasured) {
    // Position of an op within its (rank, stream, iteration): iterations of one program line up.
    std::vector<int32_t> position(n, 0);
    for (size_t v = 1; v < n; ++v) {
      const GraphNode& a = g.nodes[v - 1];
      const GraphNode& b = g.nodes[v];
      if (!IsHub(b) && !IsHub(a) && a.rank == b.rank && a.stream == b.stream &&
          a.iteration == b.iteration) {
        position[v] = position[v - 1] + 1;
      }
    }
    std::unordered_map<std::string, std::vector<int32_t>> classes;
    for (size_t v = 0; v < n; ++v) {
      std::string key = ClassKey(g, set, position, static_cast<int32_t>(v));
      if (!key.empty()) classes[std::move(key)].push_back(static_cast<int32_t>(v));
    }
    std::vector<int64_t> values;
    for (auto& entry : classes) {
      // Not a structured binding: clang 14 (the fuzz build) cannot capture one in the lambda.
      const std::vector<int32_t>& members = entry.second;
      if (members.size() < 2) continue;
      auto stat = [&](auto field) {
        values.clear();
        for (int32_t v : members) values.push_back(field(g.nodes[v]));
        if (options.durations == ClassStat::kMedian) return Median(values);
        double sum = 0;
        for (int64_t x : values) sum += static_cast<double>(x);
        return static_cast<int64_t>(std::llround(sum / static_cast<double>(values.size())));
      };
      const int64_t own_median = stat([](const GraphNode& x) { return x.own_ns; });
      const int64_t gap_median = stat([](const GraphNode& x) { return x.gap_ns; });
      for (int32_t v : members) {
        own[v] = own_median;
        gap[v] = gap_median;
      }
    }
  }
  int64_t comm_models = 0;
  std::vector<CommFit> comm_fits;
  if (options.comm != CommModel::kMeasured) {
    const std::vector<int64_t> fitted = FittedCommTimes(g, &comm_models, &comm_fits);
    for (size_t v = 0; v < n; ++v) {
      if (!IsHub(g.nodes[v])) continue;
      if (options.comm == CommModel::kFitted) {
        own[v] = fitted[v];
      } else if (!g.nodes[v].waited) {
        own[v] = std::min(own[v], fitted[v]);  // the trace proves it done by its measured end
      }
    }
  }
  int64_t link_delay = 0;  // "link+=D": the send post -> transfer edges
  for (const WhatIf& w : options.what_if) {
    if (!(w.factor >= 0) || w.factor > kMaxWhatIfFactor || w.add_ns < 0 || w.add_ns > 1e15) {
      return InvalidArgumentError(
          fmt::format("what-if '{}': the factor must be a number in [0, 1e6] and the addition "
                      "in [0, 1e6 s]",
                      WhatIfText(w)));
    }
    if (w.match == "link" && w.add_ns > 0) {
      link_delay += w.add_ns;
      if (w.factor == 1.0) continue;
    }
    const int64_t add = w.match == "link" ? 0 : w.add_ns;
    auto change = [&](int64_t x) { return std::llround(static_cast<double>(x) * w.factor) + add; };
    int64_t hits = 0;
    for (size_t v = 0; v < n; ++v) {
      const GraphNode& node = g.nodes[v];
      if (w.match == "gap") {
        if (node.stream_pred >= 0) {
          gap[v] = change(gap[v]);
          ++hits;
        }
        continue;
      }
      bool hit = false;
      if (w.match == "compute") {
        hit = node.kind == NodeKind::kCompute || node.kind == NodeKind::kOptimizer;
      } else if (w.match == "comm") {
        hit = IsHub(node);
      } else if (w.match == "link") {
        hit = node.kind == NodeKind::kTransfer;
      } else if (w.match == "optimizer") {
        hit = node.kind == NodeKind::kOptimizer;
      } else if (!IsHub(node)) {
        const TraceOp& op = set.ranks[node.rank].ops[node.op];
        hit = op.name.find(w.match) != std::string::npos ||
              op.label.find(w.match) != std::string::npos;
      }
      if (hit) {
        own[v] = change(own[v]);
        ++hits;
      }
    }
    if (hits == 0) {
      return InvalidArgumentError(fmt::format(
          "--what-if '{}': '{}' matches no op of the trace, so it would change nothing (allowed: "
          "compute, comm, link, gap, optimizer, or a text an op's name or annotation contains, "
          "e.g. 'forward' or '1F0')",
          WhatIfText(w), w.match));
    }
  }
  ReplayResult r;
  r.comm_models = comm_models;
  r.comm_fits = std::move(comm_fits);
  r.start_ns.assign(n, 0);
  r.end_ns.assign(n, 0);
  // The pred edge index that set the start; -1: the stream predecessor; -2: released at its
  // measured start.
  std::vector<int32_t> via(n, -1);
  std::vector<int64_t> stream_ready(n, 0);
  for (int32_t v : g.topo_order) {
    const GraphNode& node = g.nodes[v];
    int64_t start = INT64_MIN;
    if (!IsHub(node)) {
      const bool released =
          node.stream_pred < 0 ||
          (options.per_iteration && g.nodes[node.stream_pred].iteration != node.iteration);
      start = released ? node.measured_start_ns - g.origin_ns : r.end_ns[node.stream_pred] + gap[v];
      if (released) via[v] = -2;
    }
    stream_ready[v] = start;
    for (int32_t e = node.first_pred; e < node.first_pred + node.num_preds; ++e) {
      const GraphEdge& edge = g.preds[e];
      if (edge.kind == EdgeKind::kStream) continue;
      int64_t ready = edge.kind == EdgeKind::kLaunch || edge.kind == EdgeKind::kPost
                          ? r.start_ns[edge.from]
                          : r.end_ns[edge.from];
      // A transfer lies on its receiver: the post of another rank is its send's.
      if (link_delay > 0 && edge.kind == EdgeKind::kPost && node.kind == NodeKind::kTransfer &&
          g.nodes[edge.from].rank != node.rank) {
        ready += link_delay;
      }
      if (ready > start) {
        start = ready;
        via[v] = e;
      }
    }
    if (start == INT64_MIN) start = 0;  // a hub without posts (cannot happen for matched ones)
    r.start_ns[v] = start;
    r.end_ns[v] = start + own[v];
  }
  // Spans and iterations over the ops (hubs lie between them).
  int64_t measured_end = INT64_MIN, replayed_end = INT64_MIN;
  int32_t last = -1;
  struct Span {
    int64_t m_lo = INT64_MAX, m_hi = INT64_MIN, r_lo = INT64_MAX, r_hi = INT64_MIN;
    std::vector<char> ranks;
  };
  std::map<int64_t, Span> spans;
  for (size_t v = 0; v < n; ++v) {
    const GraphNode& node = g.nodes[v];
    if (IsHub(node)) continue;
    measured_end = std::max(measured_end, node.measured_end_ns - g.origin_ns);
    r.max_deviation_ns =
        std::max(r.max_deviation_ns, std::abs(r.end_ns[v] - (node.measured_end_ns - g.origin_ns)));
    if (r.end_ns[v] > replayed_end) {
      replayed_end = r.end_ns[v];
      last = static_cast<int32_t>(v);
    }
    if (node.iteration < 0) continue;
    Span& s = spans[node.iteration];
    s.m_lo = std::min(s.m_lo, node.measured_start_ns);
    s.m_hi = std::max(s.m_hi, node.measured_end_ns);
    s.r_lo = std::min(s.r_lo, r.start_ns[v]);
    s.r_hi = std::max(s.r_hi, r.end_ns[v]);
    s.ranks.resize(set.ranks.size(), 0);
    s.ranks[node.rank] = 1;
  }
  r.measured_span_ns = last < 0 ? 0 : measured_end;
  r.replayed_span_ns = last < 0 ? 0 : replayed_end;
  for (const auto& [it, s] : spans) {
    if (std::count(s.ranks.begin(), s.ranks.end(), 1) != static_cast<int64_t>(set.ranks.size())) {
      continue;
    }
    r.iterations.push_back({it, s.m_hi - s.m_lo, s.r_hi - s.r_lo});
  }
  for (const IterationTime& it : r.iterations) {
    r.mean_iteration_measured_ns += static_cast<double>(it.measured_ns);
    r.mean_iteration_replayed_ns += static_cast<double>(it.replayed_ns);
    const double err =
        it.measured_ns > 0
            ? std::abs(static_cast<double>(it.replayed_ns) - static_cast<double>(it.measured_ns)) /
                  static_cast<double>(it.measured_ns)
            : 0;
    r.mean_abs_error += err;
    r.max_abs_error = std::max(r.max_abs_error, err);
  }
  if (!r.iterations.empty()) {
    const double k = static_cast<double>(r.iterations.size());
    r.mean_iteration_measured_ns /= k;
    r.mean_iteration_replayed_ns /= k;
    r.mean_abs_error /= k;
  }
  // Critical path: back from the last op through whatever set each start.
  if (options.critical_path && last >= 0) {
    for (int32_t v = last; v >= 0;) {
      const GraphNode& node = g.nodes[v];
      const int32_t e = via[v];
      CriticalStep step{v, r.start_ns[v], r.end_ns[v], EdgeKind::kStream};
      r.critical_by_kind_ns[static_cast<int>(node.kind)] += own[v];
      if (e >= 0) {
        step.via = g.preds[e].kind;
        r.critical_path.push_back(step);
        v = g.preds[e].from;
      } else {
        r.critical_path.push_back(step);
        if (e == -2) break;
        if (node.stream_pred >= 0) r.critical_gaps_ns += gap[v];
        v = node.stream_pred;
      }
    }
    std::reverse(r.critical_path.begin(), r.critical_path.end());
  }
  // Where each rank's time went, on its busiest stream.
  for (const RankTrace& rank : set.ranks) {
    std::map<int32_t, int64_t> count;
    for (const TraceOp& op : rank.ops) ++count[op.stream];
    RankBreakdown b;
    b.rank = rank.rank;
    int64_t best = -1;
    for (const auto& [s, c] : count) {
      if (c > best) best = c, b.stream = s;
    }
    r.ranks.push_back(b);
  }
  for (size_t v = 0; v < n; ++v) {
    const GraphNode& node = g.nodes[v];
    if (IsHub(node) || node.stream != r.ranks[node.rank].stream) continue;
    RankBreakdown& b = r.ranks[node.rank];
    if (node.stream_pred >= 0) b.gaps_ns += gap[v];
    b.waiting_ns += r.start_ns[v] - stream_ready[v];
    switch (node.kind) {
      case NodeKind::kCompute:
      case NodeKind::kOptimizer:
        b.compute_ns += own[v];
        break;
      case NodeKind::kPost:
      case NodeKind::kWait:
        b.comm_ns += own[v];
        break;
      default:
        b.other_ns += own[v];
    }
  }
  for (RankBreakdown& b : r.ranks) {
    b.bubble_ns = std::max<int64_t>(
        0, r.replayed_span_ns - b.compute_ns - b.comm_ns - b.waiting_ns - b.gaps_ns - b.other_ns);
  }
  return r;
}

}  // namespace sluice::trace
