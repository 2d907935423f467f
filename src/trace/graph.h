// The global data-flow graph of a measured run (dPRO §1.3), and its replay (replay.h).
//
// Nodes: every op of every rank's streams (compute, post, wait, optimizer, other), plus one hub
// per matched message (a transfer, placed on the receiving rank) and per collective instance.
// Edges (predecessors):
//   kStream  the op before it on its stream; the measured idle between them is the node's gap
//            (framework, launch and host overhead, as dPRO's gap attributes);
//   kData    forward -> backward of one micro-batch and stage, backward-input -> weight (sluice);
//   kPost    a post -> its transfer or collective (all members' posts for a collective; the
//            transfer may start as soon as its posts start: an isend moves data while posting);
//   kDone    a transfer or collective -> each wait that waits for it;
//   kLaunch  a host launch -> the GPU op it launched (Kineto).
// Replay semantics (what makes a replay with measured values reproduce the trace):
//   start(v) = max(end(stream pred) + gap(v), end(u) for its data and done preds u, start(u) for
//              its post and launch preds u)   [release(v) without a stream pred: its measured
//              start]
//   end(v)   = start(v) + own(v)
// own(op) is its measured duration, except for a wait: end - max(start, its hubs' measured
// ends) (its blocked part is explained by the hubs). A transfer's measured interval is from the
// later of the two posts' starts to the earlier of the two sides' done times, or from the send's
// post when it was done before the receive was posted (eager, as Gloo's small sends); a
// collective's from the last member's post to the earliest member's done time. A side's done
// time is its wait's end when the wait blocked (began more than 20 µs before it), else the
// wait's start: a wait that returns at once proves only that the transfer was done before it
// began. A hub some side blocked on is `waited`: its time is what the wire took, the samples
// CommModel::kFitted (replay.h) fits; the others are bounded from above only.
//
// Thread safety: a Graph is a value; building is a pure function.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "trace/align.h"
#include "trace/trace_model.h"

namespace sluice::trace {

enum class NodeKind : uint8_t {
  kCompute,
  kPost,
  kWait,
  kOptimizer,
  kOther,
  kTransfer,
  kCollective
};
std::string_view NodeKindName(NodeKind kind);

enum class EdgeKind : uint8_t { kStream, kData, kPost, kDone, kLaunch };
std::string_view EdgeKindName(EdgeKind kind);

struct GraphNode {
  NodeKind kind = NodeKind::kCompute;
  int64_t rank = -1;    // the op's rank; a transfer: the receiver; a collective: -1
  int32_t stream = -1;  // the rank's stream; -1 for hubs
  int32_t op = -1;      // index in the rank's ops; hubs: index in Matching messages/collectives
  int64_t iteration = -1;
  int64_t own_ns = 0;      // time it adds once ready
  int64_t gap_ns = 0;      // idle after its stream predecessor
  int64_t release_ns = 0;  // first node of a stream: its measured start
  int64_t measured_start_ns = 0;
  int64_t measured_end_ns = 0;
  int32_t first_pred = 0;  // preds[first_pred, first_pred + num_preds)
  int32_t num_preds = 0;
  int32_t stream_pred = -1;  // the stream predecessor, -1 none
  int64_t bytes = 0;         // hubs: the payload (0 unknown)
  int32_t comm_class = -1;   // hubs: (kind, ranks, key, eager) class, index into comm_classes
  bool waited = false;       // hubs: a side blocked until it was done (its time is a sample)
};

struct GraphEdge {
  int32_t from = 0;
  EdgeKind kind = EdgeKind::kStream;
};

struct Graph {
  std::vector<GraphNode> nodes;  // ops rank by rank and stream by stream, then the hubs
  std::vector<GraphEdge> preds;
  std::vector<int32_t> topo_order;  // every node after its preds
  int64_t edges_by_kind[5] = {0, 0, 0, 0, 0};
  int64_t origin_ns = 0;                  // earliest measured start
  std::vector<std::string> comm_classes;  // "transfer 0->1 act", "collective 0,1 pp0"
};

// Builds the graph of an aligned TraceSet. InvalidArgument naming a node when the dependencies
// form a cycle (a trace whose matching is wrong: e.g. ranks of different runs).
StatusOr<Graph> BuildGraph(const TraceSet& set, const Matching& matching);

// Fills graph->preds (CSR: each node's first_pred and num_preds), edges_by_kind and topo_order
// from `preds` ([node] its predecessor edges). Returns a node on a cycle (topo_order is then
// partial), or -1.
int32_t FinishGraph(const std::vector<std::vector<GraphEdge>>& preds, Graph* graph);

// "rank 1 compute 1F3 (iteration 2)" / "transfer 0->1 1SEND_F3" for messages and reports.
std::string NodeText(const Graph& graph, const TraceSet& set, const Matching& matching,
                     int32_t node);

}  // namespace sluice::trace
