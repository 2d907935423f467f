#include "trace/trace_model.h"

#include <algorithm>
#include <numeric>

namespace sluice::trace {

std::string_view TraceFormatName(TraceFormat format) {
  switch (format) {
    case TraceFormat::kSluice:
      return "sluice";
    case TraceFormat::kTorchCpu:
      return "torch-cpu";
    case TraceFormat::kKineto:
      return "kineto";
  }
  return "?";
}

std::string_view TraceOpKindName(TraceOpKind kind) {
  switch (kind) {
    case TraceOpKind::kCompute:
      return "compute";
    case TraceOpKind::kCommPost:
      return "post";
    case TraceOpKind::kCommWait:
      return "wait";
    case TraceOpKind::kOptimizer:
      return "optimizer";
    case TraceOpKind::kOther:
      return "other";
  }
  return "?";
}

std::string_view CommKindName(CommKind kind) {
  switch (kind) {
    case CommKind::kSend:
      return "send";
    case CommKind::kRecv:
      return "recv";
    case CommKind::kCollective:
      return "collective";
  }
  return "?";
}

std::string StreamName(const RankTrace& rank, int32_t stream) {
  return stream >= 0 && stream < static_cast<int32_t>(rank.streams.size()) ? rank.streams[stream]
                                                                           : "-";
}

void SortOps(RankTrace* rank) {
  std::vector<TraceOp>& ops = rank->ops;
  std::vector<int32_t> order(ops.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const TraceOp& x = ops[a];
    const TraceOp& y = ops[b];
    if (x.stream != y.stream) return x.stream < y.stream;
    if (x.start_ns != y.start_ns) return x.start_ns < y.start_ns;
    return x.end_ns < y.end_ns;
  });
  std::vector<int32_t> new_index(ops.size());
  std::vector<TraceOp> sorted;
  sorted.reserve(ops.size());
  for (size_t i = 0; i < order.size(); ++i) {
    new_index[order[i]] = static_cast<int32_t>(i);
    sorted.push_back(std::move(ops[order[i]]));
  }
  // One stream runs one op at a time: an op that starts inside its predecessor (a profiler's
  // overlapping siblings) starts where the predecessor ends.
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i].stream != sorted[i - 1].stream) continue;
    if (sorted[i].start_ns < sorted[i - 1].end_ns) {
      sorted[i].start_ns = sorted[i - 1].end_ns;
      sorted[i].end_ns = std::max(sorted[i].end_ns, sorted[i].start_ns);
    }
  }
  for (TraceOp& op : sorted) {
    if (op.launched_by >= 0) op.launched_by = new_index[op.launched_by];
  }
  for (CommOp& c : rank->comms) {
    if (c.post >= 0) c.post = new_index[c.post];
    if (c.wait >= 0) c.wait = new_index[c.wait];
  }
  ops = std::move(sorted);
}

}  // namespace sluice::trace
