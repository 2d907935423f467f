#include "trace/trace_reader.h"

#include <fmt/core.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <system_error>

#include "base/json_util.h"
#include "plan/instruction.h"
#include "trace/reader_util.h"

namespace sluice::trace {
namespace {

namespace fs = std::filesystem;
using trace_internal::EventArray;
using trace_internal::EventError;
using trace_internal::IntArg;
using trace_internal::RawEvent;
using trace_internal::ReadRawEvent;

constexpr std::string_view kSluiceStreams[] = {"compute", "send", "recv", "collective"};

bool IsSluiceStreamName(std::string_view cat) {
  return std::find(std::begin(kSluiceStreams), std::end(kSluiceStreams), cat) !=
         std::end(kSluiceStreams);
}

StatusOr<TraceFormat> DetectFormatOfDoc(const nlohmann::json& doc, std::string_view source) {
  if (doc.is_array()) return TraceFormat::kTorchCpu;
  if (!doc.is_object() || !doc.contains("traceEvents") || !doc["traceEvents"].is_array()) {
    return InvalidArgumentError(
        fmt::format("{}: not a trace sluice reads: expected a JSON array of events (torch 1.13 "
                    "export_chrome_trace) or an object with a 'traceEvents' array (sluice train "
                    "--trace-dir, Kineto)",
                    source));
  }
  if (doc.contains("schemaVersion") || doc.contains("deviceProperties") ||
      doc.contains("distributedInfo") || doc.contains("baseTimeNanoseconds")) {
    return TraceFormat::kKineto;
  }
  for (const nlohmann::json& e : doc["traceEvents"]) {
    if (!e.is_object()) continue;
    auto ph = e.find("ph");
    if (ph == e.end() || !ph->is_string() || *ph != "X") continue;
    auto cat = e.find("cat");
    auto args = e.find("args");
    const bool sluice = cat != e.end() && cat->is_string() &&
                        IsSluiceStreamName(cat->get_ref<const std::string&>()) && args != e.end() &&
                        args->is_object() && args->contains("op");
    return sluice ? TraceFormat::kSluice : TraceFormat::kKineto;
  }
  return TraceFormat::kSluice;  // no complete event: an empty sluice trace reads as no ops
}

// "rank 3 (dp 1, pp 0)" -> 0; -1 when the text has no "pp N".
int64_t PipelineIndexOf(std::string_view text) {
  const size_t at = text.find("pp ");
  if (at == std::string_view::npos) return -1;
  int64_t v = 0;
  size_t i = at + 3, digits = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9' && digits < 12) {
    v = v * 10 + (text[i++] - '0');
    ++digits;
  }
  return digits > 0 ? v : -1;
}

struct SluiceRank {
  RankTrace trace;
  int64_t pp = -1;
  std::map<std::pair<int64_t, std::string>, int64_t> stream_end;  // (iteration, name) -> end
};

}  // namespace

}  // namespace sluice::trace

namespace sluice::trace_internal {

StatusOr<std::vector<trace::RankTrace>> ReadSluiceDocument(const nlohmann::json& doc,
                                                           std::string_view source,
                                                           int64_t max_events) {
  using namespace trace;  // NOLINT: this reader builds trace types throughout
  SLUICE_ASSIGN_OR_RETURN(const nlohmann::json* events, EventArray(doc, source, max_events));
  std::map<int64_t, SluiceRank> ranks;
  auto rank_of = [&](int64_t r) -> SluiceRank& {
    SluiceRank& s = ranks[r];
    if (s.trace.streams.empty()) {
      s.trace.rank = r;
      s.trace.source = std::string(source);
      s.trace.format = TraceFormat::kSluice;
      s.trace.streams.assign(std::begin(kSluiceStreams), std::end(kSluiceStreams));
    }
    return s;
  };
  RawEvent e;
  for (size_t i = 0; i < events->size(); ++i) {
    const int64_t index = static_cast<int64_t>(i);
    SLUICE_RETURN_IF_ERROR(ReadRawEvent((*events)[i], index, source, &e));
    int64_t pid = -1;
    if (e.ph == 'M' || e.ph == 'X') {
      char* end = nullptr;
      pid = e.pid.empty() ? -1 : std::strtoll(e.pid.c_str(), &end, 10);
      if (e.pid.empty() || *end != '\0' || pid < 0 || pid > 1'000'000) {
        return EventError(source, index, e.name,
                          "field 'pid': expected the rank, an integer in 0..1000000");
      }
    }
    if (e.ph == 'M') {
      if (e.name == "process_name" && e.args != nullptr) {
        rank_of(pid).pp = PipelineIndexOf(trace_internal::StringArg(e, "name"));
      }
      continue;
    }
    if (e.ph != 'X') continue;
    char* end = nullptr;
    const int64_t tid = e.tid.empty() ? -1 : std::strtoll(e.tid.c_str(), &end, 10);
    if (e.tid.empty() || *end != '\0' || tid < 0 || tid > 3) {
      return EventError(source, index, e.name,
                        "field 'tid': expected the stream, 0 (compute), 1 (send), 2 (recv) or 3 "
                        "(collective)");
    }
    if (e.args == nullptr) return EventError(source, index, e.name, "no 'args' object");
    const std::string op_name = trace_internal::StringArg(e, "op");
    const std::optional<OpKind> op = OpKindFromName(op_name);
    if (!op) {
      return EventError(source, index, e.name,
                        fmt::format("field 'args.op': '{}' is not an op of sluice-plan/1 "
                                    "(docs/formats.md lists them)",
                                    op_name.substr(0, 40)));
    }
    TraceOp t;
    t.name = e.name;
    t.label = op_name;
    t.stream = static_cast<int32_t>(tid);
    t.start_ns = e.ts_ns;
    t.end_ns = e.ts_ns + e.dur_ns;
    t.event_index = index;
    if (!e.args->contains("iteration")) {
      return EventError(source, index, e.name, "no 'args.iteration'");
    }
    SLUICE_RETURN_IF_ERROR(IntArg(e, "iteration", source, &t.iteration));
    SLUICE_RETURN_IF_ERROR(IntArg(e, "mb", source, &t.microbatch));
    SLUICE_RETURN_IF_ERROR(IntArg(e, "stage", source, &t.stage));
    SLUICE_RETURN_IF_ERROR(IntArg(e, "bytes", source, &t.bytes));
    int64_t peer = -1;
    SLUICE_RETURN_IF_ERROR(IntArg(e, "peer", source, &peer));
    if (t.iteration < 0) return EventError(source, index, e.name, "negative 'args.iteration'");
    SluiceRank& s = rank_of(pid);
    if (tid != 0) {  // a transfer's or collective's stream interval: when it was seen done
      s.stream_end[{t.iteration, t.name}] = t.end_ns;
      if (*op == OpKind::kAllToAllDispatch || *op == OpKind::kAllToAllCombine) {
        s.trace.all_to_alls.push_back(t);
      }
      continue;
    }
    if (IsCompute(*op)) {
      t.kind = TraceOpKind::kCompute;
    } else if (IsCommStart(*op) || IsCollective(*op)) {
      t.kind = TraceOpKind::kCommPost;
    } else if (IsCommFinish(*op)) {
      t.kind = TraceOpKind::kCommWait;
    } else if (*op == OpKind::kOptimizerStep) {
      t.kind = TraceOpKind::kOptimizer;
    } else {
      t.kind = TraceOpKind::kOther;
    }
    if (t.kind == TraceOpKind::kCommPost) {
      CommOp c;
      c.kind = IsCollective(*op) ? CommKind::kCollective
                                 : (IsSend(*op) ? CommKind::kSend : CommKind::kRecv);
      c.peer = c.kind == CommKind::kCollective ? -1 : peer;
      if (c.kind != CommKind::kCollective && peer < 0) {
        return EventError(source, index, e.name, "a transfer without 'args.peer'");
      }
      c.key = op_name.find("-act-") != std::string::npos ? "act" : "grad";
      if (c.kind != CommKind::kCollective) {
        c.instance = fmt::format("iteration {} mb {}", t.iteration, t.microbatch);
      }
      c.bytes = t.bytes;
      c.post = static_cast<int32_t>(s.trace.ops.size());
      c.text = t.name;
      s.trace.comms.push_back(std::move(c));
    }
    s.trace.ops.push_back(std::move(t));
  }
  std::vector<RankTrace> out;
  for (auto& [r, s] : ranks) {
    RankTrace& rt = s.trace;
    // Waits: a *Finish is "<start's name>.wait" of the same iteration; a collective's wait is
    // the optimizer step that follows it in its iteration.
    std::map<std::pair<int64_t, std::string>, int32_t> by_name;
    for (size_t c = 0; c < rt.comms.size(); ++c) {
      const TraceOp& post = rt.ops[rt.comms[c].post];
      by_name[{post.iteration, post.name}] = static_cast<int32_t>(c);
      if (rt.comms[c].kind == CommKind::kCollective) {
        rt.comms[c].key = fmt::format("pp{}", s.pp);
      }
    }
    std::vector<int32_t> pending_collectives;
    std::vector<int32_t> order(rt.ops.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return rt.ops[a].start_ns < rt.ops[b].start_ns; });
    std::map<int32_t, int32_t> comm_of_post;
    for (size_t c = 0; c < rt.comms.size(); ++c) comm_of_post[rt.comms[c].post] = c;
    for (int32_t i : order) {
      const TraceOp& op = rt.ops[i];
      if (op.kind == TraceOpKind::kCommWait && op.name.size() > 5 && op.name.ends_with(".wait")) {
        auto it = by_name.find({op.iteration, op.name.substr(0, op.name.size() - 5)});
        if (it != by_name.end()) rt.comms[it->second].wait = i;
      } else if (op.kind == TraceOpKind::kCommPost &&
                 rt.comms[comm_of_post[i]].kind == CommKind::kCollective) {
        pending_collectives.push_back(comm_of_post[i]);
      } else if (op.kind == TraceOpKind::kOptimizer) {
        for (int32_t c : pending_collectives) rt.comms[c].wait = i;
        pending_collectives.clear();
      }
    }
    for (CommOp& c : rt.comms) {
      const TraceOp& post = rt.ops[c.post];
      auto it = s.stream_end.find({post.iteration, post.name});
      int64_t done = it != s.stream_end.end() ? it->second : kUnknownTime;
      if (c.wait >= 0) {
        const int64_t wait_end = rt.ops[c.wait].end_ns;
        done = done == kUnknownTime ? wait_end : std::min(done, wait_end);
      }
      c.done_ns = done;
    }
    SortOps(&rt);
    out.push_back(std::move(rt));
  }
  return out;
}

}  // namespace sluice::trace_internal

namespace sluice::trace {

int64_t RankFromFileName(std::string_view path) {
  const size_t slash = path.find_last_of('/');
  std::string_view name = slash == std::string_view::npos ? path : path.substr(slash + 1);
  size_t at = name.rfind("rank");
  if (at == std::string_view::npos) return -1;
  size_t i = at + 4;
  if (i < name.size() && (name[i] == '-' || name[i] == '_')) ++i;
  int64_t v = 0;
  size_t digits = 0;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9' && digits < 7) {
    v = v * 10 + (name[i++] - '0');
    ++digits;
  }
  return digits > 0 ? v : -1;
}

StatusOr<TraceFormat> DetectFormat(std::string_view text, std::string_view source) {
  SLUICE_ASSIGN_OR_RETURN(nlohmann::json doc, ParseJson(text, source));
  return DetectFormatOfDoc(doc, source);
}

StatusOr<std::vector<RankTrace>> ReadTraceDocument(std::string_view text, std::string_view source,
                                                   int64_t rank_hint, const ReadOptions& options) {
  SLUICE_ASSIGN_OR_RETURN(nlohmann::json doc, ParseJson(text, source));
  SLUICE_ASSIGN_OR_RETURN(TraceFormat format, DetectFormatOfDoc(doc, source));
  switch (format) {
    case TraceFormat::kSluice:
      return trace_internal::ReadSluiceDocument(doc, source, options.max_events);
    case TraceFormat::kTorchCpu: {
      if (rank_hint < 0) {
        return InvalidArgumentError(fmt::format(
            "{}: a torch 1.13 trace does not say its rank; name the file trace-rank-N.json",
            source));
      }
      SLUICE_ASSIGN_OR_RETURN(RankTrace r, trace_internal::ReadTorchCpuDocument(
                                               doc, source, rank_hint, options.max_events));
      return std::vector<RankTrace>{std::move(r)};
    }
    case TraceFormat::kKineto: {
      SLUICE_ASSIGN_OR_RETURN(RankTrace r, trace_internal::ReadKinetoDocument(
                                               doc, source, rank_hint, options.max_events));
      return std::vector<RankTrace>{std::move(r)};
    }
  }
  return InternalError("unknown trace format");
}

StatusOr<TraceSet> ReadTraces(const std::vector<std::string>& paths, const ReadOptions& options) {
  if (paths.empty()) return InvalidArgumentError("no trace file or folder given");
  std::vector<std::string> files;
  for (const std::string& p : paths) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      std::vector<std::string> all, per_rank;
      for (const auto& entry : fs::directory_iterator(p, ec)) {
        const std::string name = entry.path().filename().string();
        if (!entry.is_regular_file() || !name.ends_with(".json")) continue;
        all.push_back(entry.path().string());
        if (name.starts_with("trace-rank-")) per_rank.push_back(entry.path().string());
      }
      if (ec) return IoError(fmt::format("{}: cannot list the folder: {}", p, ec.message()));
      std::vector<std::string>& chosen = per_rank.empty() ? all : per_rank;
      if (chosen.empty()) {
        return NotFoundError(fmt::format("{}: the folder holds no .json trace", p));
      }
      std::sort(chosen.begin(), chosen.end());
      files.insert(files.end(), chosen.begin(), chosen.end());
    } else if (fs::is_regular_file(p, ec)) {
      files.push_back(p);
    } else {
      return NotFoundError(fmt::format("{}: no such trace file or folder", p));
    }
  }
  TraceSet set;
  std::map<int64_t, RankTrace> by_rank;
  for (size_t i = 0; i < files.size(); ++i) {
    std::error_code ec;
    const auto size = fs::file_size(files[i], ec);
    if (!ec && static_cast<int64_t>(size) > options.max_file_bytes) {
      return InvalidArgumentError(fmt::format("{}: {} bytes; traces up to {} bytes are read",
                                              files[i], size, options.max_file_bytes));
    }
    SLUICE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(files[i]));
    int64_t hint = RankFromFileName(files[i]);
    if (hint < 0) hint = static_cast<int64_t>(i);
    SLUICE_ASSIGN_OR_RETURN(std::vector<RankTrace> ranks,
                            ReadTraceDocument(text, files[i], hint, options));
    for (RankTrace& r : ranks) {
      auto [it, inserted] = by_rank.try_emplace(r.rank, std::move(r));
      if (!inserted) {
        return InvalidArgumentError(fmt::format("rank {} is given twice: in {} and in {}",
                                                it->first, it->second.source, files[i]));
      }
    }
  }
  if (by_rank.empty()) return InvalidArgumentError("the traces hold no rank");
  std::vector<int64_t> missing;
  const int64_t last = by_rank.rbegin()->first;
  for (int64_t r = 0; r <= last; ++r) {
    if (!by_rank.contains(r)) missing.push_back(r);
  }
  if (!missing.empty()) {
    std::string list;
    for (int64_t r : missing) list += (list.empty() ? "" : ", ") + std::to_string(r);
    return InvalidArgumentError(
        fmt::format("rank(s) {} missing: the traces give ranks up to {} (one file per rank, e.g. "
                    "trace-rank-N.json)",
                    list, last));
  }
  for (auto& [r, t] : by_rank) set.ranks.push_back(std::move(t));
  if (set.ranks.size() == 2) {
    int64_t guessed = 0;
    for (RankTrace& r : set.ranks) {
      for (CommOp& c : r.comms) {
        if (c.kind != CommKind::kCollective && c.peer < 0) {
          c.peer = 1 - r.rank;
          ++guessed;
        }
      }
    }
    if (guessed > 0) {
      set.notes.push_back(fmt::format(
          "{} point-to-point op(s) name no peer; with two ranks the peer is the other rank",
          guessed));
    }
  }
  return set;
}

}  // namespace sluice::trace
