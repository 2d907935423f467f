#include "trace/graph.h"

#include <fmt/core.h>

#include <algorithm>
#include <map>
#include <tuple>

namespace sluice::trace {
namespace {

// A wait that returns within this of its transfer's done time did not block on it.
constexpr int64_t kBlockedNs = 20'000;

NodeKind KindOfOp(TraceOpKind k) {
  switch (k) {
    case TraceOpKind::kCompute:
      return NodeKind::kCompute;
    case TraceOpKind::kCommPost:
      return NodeKind::kPost;
    case TraceOpKind::kCommWait:
      return NodeKind::kWait;
    case TraceOpKind::kOptimizer:
      return NodeKind::kOptimizer;
    case TraceOpKind::kOther:
      return NodeKind::kOther;
  }
  return NodeKind::kOther;
}

}  // namespace

std::string_view NodeKindName(NodeKind kind) {
  switch (kind) {
    case NodeKind::kCompute:
      return "compute";
    case NodeKind::kPost:
      return "post";
    case NodeKind::kWait:
      return "wait";
    case NodeKind::kOptimizer:
      return "optimizer";
    case NodeKind::kOther:
      return "other";
    case NodeKind::kTransfer:
      return "transfer";
    case NodeKind::kCollective:
      return "collective";
  }
  return "?";
}

std::string_view EdgeKindName(EdgeKind kind) {
  switch (kind) {
    case EdgeKind::kStream:
      return "stream";
    case EdgeKind::kData:
      return "data";
    case EdgeKind::kPost:
      return "post";
    case EdgeKind::kDone:
      return "done";
    case EdgeKind::kLaunch:
      return "launch";
  }
  return "?";
}

int32_t FinishGraph(const std::vector<std::vector<GraphEdge>>& preds, Graph* graph) {
  // CSR and a topological order (Kahn).
  Graph& g = *graph;
  const size_t n = g.nodes.size();
  g.preds.clear();
  g.topo_order.clear();
  std::fill(std::begin(g.edges_by_kind), std::end(g.edges_by_kind), 0);
  std::vector<int32_t> indegree(n, 0), succ_first(n + 1, 0), succ;
  for (size_t v = 0; v < n; ++v) {
    g.nodes[v].first_pred = static_cast<int32_t>(g.preds.size());
    g.nodes[v].num_preds = static_cast<int32_t>(preds[v].size());
    for (const GraphEdge& e : preds[v]) {
      g.preds.push_back(e);
      ++g.edges_by_kind[static_cast<int>(e.kind)];
      ++succ_first[e.from + 1];
    }
    indegree[v] = g.nodes[v].num_preds;
  }
  for (size_t v = 0; v < n; ++v) succ_first[v + 1] += succ_first[v];
  succ.resize(g.preds.size());
  std::vector<int32_t> fill(succ_first.begin(), succ_first.end() - 1);
  for (size_t v = 0; v < n; ++v) {
    for (const GraphEdge& e : preds[v]) succ[fill[e.from]++] = static_cast<int32_t>(v);
  }
  g.topo_order.reserve(n);
  for (size_t v = 0; v < n; ++v) {
    if (indegree[v] == 0) g.topo_order.push_back(static_cast<int32_t>(v));
  }
  for (size_t head = 0; head < g.topo_order.size(); ++head) {
    const int32_t v = g.topo_order[head];
    for (int32_t s = succ_first[v]; s < succ_first[v + 1]; ++s) {
      if (--indegree[succ[s]] == 0) g.topo_order.push_back(succ[s]);
    }
  }
  if (g.topo_order.size() != n) {
    for (size_t v = 0; v < n; ++v) {
      if (indegree[v] > 0) return static_cast<int32_t>(v);
    }
  }
  return -1;
}

StatusOr<Graph> BuildGraph(const TraceSet& set, const Matching& matching) {
  Graph g;
  std::vector<std::vector<GraphEdge>> preds;
  std::vector<int32_t> first_node(set.ranks.size() + 1, 0);  // node of ranks[r].ops[0]
  int64_t origin = INT64_MAX;
  for (size_t r = 0; r < set.ranks.size(); ++r) {
    const RankTrace& rank = set.ranks[r];
    first_node[r] = static_cast<int32_t>(g.nodes.size());
    for (size_t i = 0; i < rank.ops.size(); ++i) {
      const TraceOp& op = rank.ops[i];
      GraphNode n;
      n.kind = KindOfOp(op.kind);
      n.rank = rank.rank;
      n.stream = op.stream;
      n.op = static_cast<int32_t>(i);
      n.iteration = op.iteration;
      n.own_ns = op.end_ns - op.start_ns;
      n.measured_start_ns = op.start_ns;
      n.measured_end_ns = op.end_ns;
      origin = std::min(origin, op.start_ns);
      preds.emplace_back();
      const int32_t id = static_cast<int32_t>(g.nodes.size());
      if (i > 0 && rank.ops[i - 1].stream == op.stream) {
        n.stream_pred = id - 1;
        n.gap_ns = std::max<int64_t>(0, op.start_ns - rank.ops[i - 1].end_ns);
        preds.back().push_back({id - 1, EdgeKind::kStream});
      } else {
        n.release_ns = op.start_ns;
      }
      if (op.launched_by >= 0) {
        preds.back().push_back({first_node[r] + op.launched_by, EdgeKind::kLaunch});
      }
      g.nodes.push_back(n);
    }
    // Data dependencies of sluice's ops: F -> B / I of (iteration, stage, micro-batch), I -> W.
    if (rank.format == TraceFormat::kSluice) {
      std::map<std::tuple<int64_t, int64_t, int64_t>, int32_t> forward, input_grad;
      for (size_t i = 0; i < rank.ops.size(); ++i) {
        const TraceOp& op = rank.ops[i];
        const auto key = std::make_tuple(op.iteration, op.stage, op.microbatch);
        const int32_t id = first_node[r] + static_cast<int32_t>(i);
        if (op.label == "forward") {
          forward[key] = id;
        } else if (op.label == "backward" || op.label == "backward-input") {
          if (auto it = forward.find(key); it != forward.end()) {
            preds[id].push_back({it->second, EdgeKind::kData});
          }
          if (op.label == "backward-input") input_grad[key] = id;
        } else if (op.label == "backward-weight") {
          if (auto it = input_grad.find(key); it != input_grad.end()) {
            preds[id].push_back({it->second, EdgeKind::kData});
          }
        }
      }
    }
  }
  first_node[set.ranks.size()] = static_cast<int32_t>(g.nodes.size());
  auto node_of = [&](int64_t rank, int32_t op) { return first_node[rank] + op; };
  // Hubs. A wait's own time excludes what its hubs explain.
  std::vector<int64_t> hub_end_before(g.nodes.size(), INT64_MIN);
  std::map<std::string, int32_t> class_ids;
  auto add_hub = [&](NodeKind kind, int64_t rank, int32_t index,
                     const std::vector<std::pair<int64_t, const CommOp*>>& parts) {
    GraphNode h;
    h.kind = kind;
    h.rank = rank;
    h.op = index;
    int64_t start = INT64_MIN, done = INT64_MAX;
    preds.emplace_back();
    const int32_t id = static_cast<int32_t>(g.nodes.size());
    int64_t first_post = INT64_MIN;
    int64_t blocked_done = INT64_MAX;  // the earliest done time a side blocked on
    for (const auto& [r, c] : parts) {
      const int32_t post = node_of(r, c->post);
      start = std::max(start, g.nodes[post].measured_start_ns);
      if (first_post == INT64_MIN) first_post = g.nodes[post].measured_start_ns;
      h.iteration = std::max(h.iteration, g.nodes[post].iteration);
      if (c->done_ns == kUnknownTime) continue;
      int64_t side_done = c->done_ns;
      if (c->wait >= 0) {
        // A wait that began less than kBlockedNs before this side's done time did not block:
        // the transfer was done when it began. One that began earlier blocked until the done
        // time, which is then the transfer's end seen by a waiting rank (a sample for the
        // communication model).
        const int64_t wait_start = g.nodes[node_of(r, c->wait)].measured_start_ns;
        if (c->done_ns - wait_start > kBlockedNs) {
          blocked_done = std::min(blocked_done, c->done_ns);
        } else {
          side_done = std::min(side_done, std::max(wait_start, g.nodes[post].measured_start_ns));
        }
      }
      done = std::min(done, side_done);
    }
    h.waited = blocked_done != INT64_MAX && blocked_done <= done;
    if (done == INT64_MAX) done = start;
    // A message done on some side before the receive was posted went eagerly (Gloo's small
    // sends): it waits for the send's post only. Otherwise every post gates it (rendezvous).
    const bool eager = kind == NodeKind::kTransfer && done < start;
    if (eager) start = first_post;
    std::string cls = kind == NodeKind::kTransfer ? "transfer " : "collective ";
    for (size_t i = 0; i < parts.size(); ++i) {
      cls += (i == 0                        ? ""
              : kind == NodeKind::kTransfer ? "->"
                                            : ",") +
             std::to_string(parts[i].first);
      h.bytes = std::max(h.bytes, parts[i].second->bytes);
    }
    cls += " " + parts[0].second->key + (eager ? " eager" : "");
    auto [it, added] = class_ids.try_emplace(cls, static_cast<int32_t>(g.comm_classes.size()));
    if (added) g.comm_classes.push_back(cls);
    h.comm_class = it->second;
    for (size_t i = 0; i < (eager ? 1 : parts.size()); ++i) {
      preds.back().push_back({node_of(parts[i].first, parts[i].second->post), EdgeKind::kPost});
    }
    h.measured_start_ns = start;
    h.measured_end_ns = std::max(start, done);
    h.own_ns = h.measured_end_ns - start;
    g.nodes.push_back(h);
    for (const auto& [r, c] : parts) {
      if (c->wait < 0) continue;
      const int32_t wait = node_of(r, c->wait);
      preds[wait].push_back({id, EdgeKind::kDone});
      hub_end_before[wait] = std::max(hub_end_before[wait], h.measured_end_ns);
    }
  };
  for (size_t m = 0; m < matching.messages.size(); ++m) {
    const MessageMatch& msg = matching.messages[m];
    add_hub(NodeKind::kTransfer, msg.dst, static_cast<int32_t>(m),
            {{msg.src, &set.ranks[msg.src].comms[msg.send]},
             {msg.dst, &set.ranks[msg.dst].comms[msg.recv]}});
  }
  for (size_t c = 0; c < matching.collectives.size(); ++c) {
    std::vector<std::pair<int64_t, const CommOp*>> parts;
    for (const auto& [r, ci] : matching.collectives[c].members) {
      parts.push_back({r, &set.ranks[r].comms[ci]});
    }
    add_hub(NodeKind::kCollective, -1, static_cast<int32_t>(c), parts);
  }
  for (size_t i = 0; i < hub_end_before.size(); ++i) {
    if (hub_end_before[i] == INT64_MIN) continue;
    GraphNode& w = g.nodes[i];
    w.own_ns =
        std::max<int64_t>(0, w.measured_end_ns - std::max(w.measured_start_ns, hub_end_before[i]));
  }
  if (const int32_t v = FinishGraph(preds, &g); v >= 0) {
    return InvalidArgumentError(fmt::format(
        "the trace's dependencies form a cycle through {} ({} of {} nodes ordered): the "
        "ranks' communications do not match (traces of different runs or plans?)",
        NodeText(g, set, matching, v), g.topo_order.size(), g.nodes.size()));
  }
  g.origin_ns = origin == INT64_MAX ? 0 : origin;
  return g;
}

std::string NodeText(const Graph& graph, const TraceSet& set, const Matching& matching,
                     int32_t node) {
  const GraphNode& n = graph.nodes[node];
  if (n.kind == NodeKind::kTransfer) {
    const MessageMatch& m = matching.messages[n.op];
    return fmt::format("transfer {}->{} '{}'", m.src, m.dst, set.ranks[m.src].comms[m.send].text);
  }
  if (n.kind == NodeKind::kCollective) {
    const CollectiveMatch& c = matching.collectives[n.op];
    return fmt::format("collective #{}{} over {} ranks", c.order,
                       c.key.empty() ? "" : " '" + c.key + "'", c.members.size());
  }
  const RankTrace& r = set.ranks[n.rank];
  const TraceOp& op = r.ops[n.op];
  std::string text = fmt::format("rank {} {} '{}'", n.rank, NodeKindName(n.kind), op.name);
  if (op.label != op.name) text += fmt::format(" in '{}'", op.label);
  if (op.iteration >= 0) text += fmt::format(" (iteration {})", op.iteration);
  if (op.event_index >= 0) text += fmt::format(" [{} event {}]", r.source, op.event_index);
  return text;
}

}  // namespace sluice::trace
