// PyTorch profiler traces: the torch 1.13 CPU form and the Kineto form (trace_reader.h).
#include <fmt/core.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "trace/reader_util.h"

namespace sluice::trace_internal {
namespace {

using trace::CommKind;
using trace::CommOp;
using trace::RankTrace;
using trace::TraceFormat;
using trace::TraceOp;
using trace::TraceOpKind;

// Reads every event of `events`, checked; the ones `keep` accepts are returned.
template <typename Keep>
StatusOr<std::vector<RawEvent>> ReadEvents(const nlohmann::json& events, std::string_view source,
                                           Keep keep) {
  std::vector<RawEvent> out;
  RawEvent e;
  for (size_t i = 0; i < events.size(); ++i) {
    SLUICE_RETURN_IF_ERROR(ReadRawEvent(events[i], static_cast<int64_t>(i), source, &e));
    if (keep(e)) out.push_back(std::move(e));
  }
  return out;
}

// Flattens every (pid, tid) thread of `events` into streams of `rank`.
void FlattenThreads(std::vector<const RawEvent*> events, std::string_view prefix,
                    RankTrace* rank) {
  const std::unordered_map<int64_t, int64_t> comm_end = AbsorbBackendEvents(&events);
  std::map<std::pair<std::string, std::string>, std::vector<const RawEvent*>> threads;
  for (const RawEvent* e : events) threads[{e->pid, e->tid}].push_back(e);
  for (auto& [key, list] : threads) {
    const int32_t stream = static_cast<int32_t>(rank->streams.size());
    rank->streams.push_back(fmt::format("{}{}/{}", prefix, key.first, key.second));
    FlattenThread(std::move(list), stream, comm_end, rank);
  }
}

int64_t DtypeBytes(std::string_view dtype) {
  if (dtype == "Double" || dtype == "Long" || dtype == "ComplexFloat") return 8;
  if (dtype == "Half" || dtype == "BFloat16" || dtype == "Short") return 2;
  if (dtype == "Byte" || dtype == "Char" || dtype == "Bool" || dtype.starts_with("Float8")) {
    return 1;
  }
  return 4;  // Float, Int and anything unnamed
}

// "[0, 2, 4]" -> "group=0,2,4".
std::string GroupFromRanks(std::string_view ranks) {
  std::string out = "group=";
  bool digit_last = false;
  for (char c : ranks) {
    if (c >= '0' && c <= '9') {
      out += c;
      digit_last = true;
    } else if (digit_last) {
      out += ',';
      digit_last = false;
    }
  }
  if (!out.empty() && out.back() == ',') out.pop_back();
  return out == "group=" ? "" : out;
}

bool IsGpuCat(std::string_view cat) {
  return cat == "kernel" || cat == "gpu_memcpy" || cat == "gpu_memset" || cat == "Kernel" ||
         cat == "Memcpy" || cat == "Memset";
}

}  // namespace

StatusOr<RankTrace> ReadTorchCpuDocument(const nlohmann::json& doc, std::string_view source,
                                         int64_t rank, int64_t max_events) {
  SLUICE_ASSIGN_OR_RETURN(const nlohmann::json* events, EventArray(doc, source, max_events));
  SLUICE_ASSIGN_OR_RETURN(std::vector<RawEvent> raw,
                          ReadEvents(*events, source, [](const RawEvent& e) {
                            return e.ph == 'X';
                          }));
  RankTrace r;
  r.rank = rank;
  r.source = std::string(source);
  r.format = TraceFormat::kTorchCpu;
  std::vector<const RawEvent*> ptrs;
  for (const RawEvent& e : raw) ptrs.push_back(&e);
  FlattenThreads(ptrs, "", &r);
  trace::SortOps(&r);
  return r;
}

StatusOr<RankTrace> ReadKinetoDocument(const nlohmann::json& doc, std::string_view source,
                                       int64_t rank_hint, int64_t max_events) {
  SLUICE_ASSIGN_OR_RETURN(const nlohmann::json* events, EventArray(doc, source, max_events));
  int64_t rank = rank_hint;
  if (doc.is_object() && doc.contains("distributedInfo")) {
    const nlohmann::json& info = doc["distributedInfo"];
    if (!info.is_object() || !info.contains("rank") || !info["rank"].is_number_integer() ||
        info["rank"].get<int64_t>() < 0) {
      return InvalidArgumentError(fmt::format(
          "{}: field 'distributedInfo.rank': expected an integer >= 0", source));
    }
    rank = info["rank"].get<int64_t>();
  }
  if (rank < 0) {
    return InvalidArgumentError(fmt::format(
        "{}: the Kineto trace has no distributedInfo.rank; name the file trace-rank-N.json",
        source));
  }
  SLUICE_ASSIGN_OR_RETURN(std::vector<RawEvent> raw,
                          ReadEvents(*events, source, [](const RawEvent& e) {
                            return e.ph == 'X' || ((e.ph == 's' || e.ph == 'f') &&
                                                   e.cat == "ac2g");
                          }));
  RankTrace r;
  r.rank = rank;
  r.source = std::string(source);
  r.format = TraceFormat::kKineto;
  std::vector<const RawEvent*> cpu, gpu, launches, flows;
  for (const RawEvent& e : raw) {
    if (e.ph != 'X') {
      flows.push_back(&e);
    } else if (IsGpuCat(e.cat)) {
      gpu.push_back(&e);
    } else if (e.cat == "cuda_runtime" || e.cat == "cuda_driver" || e.cat == "hip_runtime") {
      launches.push_back(&e);
    } else if (e.cat == "cpu_op" || e.cat == "user_annotation" || e.cat.empty()) {
      cpu.push_back(&e);
    }
  }
  if (gpu.empty()) {  // a CPU-only Kineto trace reads as torch's CPU form does
    FlattenThreads(cpu, "", &r);
    trace::SortOps(&r);
    return r;
  }
  // Iterations: ProfilerStep#N ranges of the host.
  std::vector<std::pair<int64_t, std::pair<int64_t, int64_t>>> steps;  // start -> (end, N)
  for (const RawEvent* e : cpu) {
    if (e->name.starts_with("ProfilerStep#")) {
      int64_t n = 0;
      for (char c : e->name.substr(13)) {
        if (c < '0' || c > '9' || n > 1'000'000'000) break;
        n = n * 10 + (c - '0');
      }
      steps.push_back({e->ts_ns, {e->ts_ns + e->dur_ns, n}});
    }
  }
  std::sort(steps.begin(), steps.end());
  auto iteration_at = [&](int64_t t) -> int64_t {
    auto it = std::upper_bound(steps.begin(), steps.end(),
                               std::make_pair(t, std::make_pair(INT64_MAX, INT64_MAX)));
    if (it == steps.begin()) return -1;
    --it;
    return t <= it->second.first ? it->second.second : -1;
  };
  // Launches: one stream per host thread; indexed by correlation id and by flow id.
  std::map<std::pair<std::string, std::string>, int32_t> stream_of;
  auto stream_for = [&](const std::string& prefix, const RawEvent& e) {
    auto [it, inserted] =
        stream_of.try_emplace({prefix + e.pid, e.tid}, static_cast<int32_t>(r.streams.size()));
    if (inserted) r.streams.push_back(fmt::format("{}{}/{}", prefix, e.pid, e.tid));
    return it->second;
  };
  std::map<int64_t, int32_t> launch_by_correlation;
  for (const RawEvent* e : launches) {
    int64_t corr = -1;
    SLUICE_RETURN_IF_ERROR(IntArg(*e, "correlation", source, &corr));
    if (corr >= 0) launch_by_correlation[corr] = static_cast<int32_t>(r.ops.size());
    r.ops.push_back(TraceOp{.name = e->name, .label = e->name, .kind = TraceOpKind::kOther,
                            .stream = stream_for("host ", *e), .start_ns = e->ts_ns,
                            .end_ns = e->ts_ns + e->dur_ns, .iteration = iteration_at(e->ts_ns),
                            .event_index = e->index});
  }
  // ac2g flows: the start sits inside a launch, the end on the kernel's start.
  std::map<std::string, int32_t> launch_by_flow;
  for (const RawEvent* f : flows) {
    if (f->ph != 's' || f->id == nullptr) continue;
    for (size_t i = 0; i < r.ops.size(); ++i) {
      const TraceOp& op = r.ops[i];
      if (r.streams[op.stream] == fmt::format("host {}/{}", f->pid, f->tid) &&
          op.start_ns <= f->ts_ns && f->ts_ns <= op.end_ns) {
        launch_by_flow[f->id->dump()] = static_cast<int32_t>(i);
        break;
      }
    }
  }
  std::map<std::pair<std::string, int64_t>, int32_t> flow_at_kernel;  // (pid/tid, ts) -> launch
  for (const RawEvent* f : flows) {
    if (f->ph != 'f' || f->id == nullptr) continue;
    auto it = launch_by_flow.find(f->id->dump());
    if (it != launch_by_flow.end()) {
      flow_at_kernel[{f->pid + "/" + f->tid, f->ts_ns}] = it->second;
    }
  }
  for (const RawEvent* e : gpu) {
    int64_t corr = -1;
    SLUICE_RETURN_IF_ERROR(IntArg(*e, "correlation", source, &corr));
    int32_t launcher = -1;
    if (auto it = launch_by_correlation.find(corr); corr >= 0 && it != launch_by_correlation.end()) {
      launcher = it->second;
    } else if (auto f = flow_at_kernel.find({e->pid + "/" + e->tid, e->ts_ns});
               f != flow_at_kernel.end()) {
      launcher = f->second;
    }
    const int64_t iteration =
        iteration_at(launcher >= 0 ? r.ops[launcher].start_ns : e->ts_ns);
    TraceOp op{.name = e->name, .label = e->cat, .kind = TraceOpKind::kCompute,
               .stream = stream_for("gpu ", *e), .start_ns = e->ts_ns,
               .end_ns = e->ts_ns + e->dur_ns, .iteration = iteration, .event_index = e->index,
               .launched_by = launcher};
    const std::string collective = StringArg(*e, "Collective name");
    if (collective.empty()) {
      r.ops.push_back(std::move(op));
      continue;
    }
    CommOp c;
    c.text = fmt::format("{} ({})", collective, e->name.substr(0, 40));
    if (collective == "send" || collective == "recv") {
      c.kind = collective == "send" ? CommKind::kSend : CommKind::kRecv;
      SLUICE_RETURN_IF_ERROR(
          IntArg(*e, c.kind == CommKind::kSend ? "Dst Rank" : "Src Rank", source, &c.peer));
    } else {
      c.kind = CommKind::kCollective;
      c.key = GroupFromRanks(StringArg(*e, "Process Group Ranks"));
      if (c.key.empty()) c.key = StringArg(*e, "Process Group Name");
    }
    int64_t nelems = 0;
    SLUICE_RETURN_IF_ERROR(IntArg(*e, "In msg nelems", source, &nelems));
    c.bytes = nelems * DtypeBytes(StringArg(*e, "dtype"));
    op.bytes = c.bytes;
    c.done_ns = op.end_ns;
    TraceOp post = op;
    post.kind = TraceOpKind::kCommPost;
    post.end_ns = post.start_ns;
    op.kind = TraceOpKind::kCommWait;
    c.post = static_cast<int32_t>(r.ops.size());
    c.wait = c.post + 1;
    r.ops.push_back(std::move(post));
    r.ops.push_back(std::move(op));
    r.comms.push_back(std::move(c));
  }
  trace::SortOps(&r);
  return r;
}

}  // namespace sluice::trace_internal
