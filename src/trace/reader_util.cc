#include "trace/reader_util.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace sluice::trace_internal {
namespace {

using trace::CommKind;
using trace::CommOp;
using trace::RankTrace;
using trace::TraceOp;
using trace::TraceOpKind;

// ±1e12 µs is ±11.6 days: any real trace, far from int64 nanoseconds' end.
constexpr double kMaxAbsMicros = 1e12;

std::string IdText(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_number_unsigned()) return std::to_string(v.get<uint64_t>());
  return "";
}

bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

bool IsCommName(std::string_view n) {
  return StartsWith(n, "c10d::") || StartsWith(n, "gloo:") || StartsWith(n, "nccl:") ||
         StartsWith(n, "mpi:") || StartsWith(n, "ucc:") || n == "record_param_comms";
}

CommKind CommKindOf(const RawEvent& e) {
  std::string n = e.name;
  if (n == "record_param_comms") n = StringArg(e, "Collective name");
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  if (n.find("send") != std::string::npos) return CommKind::kSend;
  if (n.find("recv") != std::string::npos) return CommKind::kRecv;
  return CommKind::kCollective;
}

int64_t StepNumber(std::string_view n) {
  if (!StartsWith(n, "ProfilerStep#")) return -1;
  int64_t v = 0;
  std::string_view digits = n.substr(13);
  if (digits.empty() || digits.size() > 12) return -1;
  for (char c : digits) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}

bool IsAnnotation(std::string_view n) {
  return n.find("::") == std::string_view::npos && !IsCommName(n) && StepNumber(n) < 0 &&
         !StartsWith(n, "Optimizer.") && !StartsWith(n, "aten") && !n.empty();
}

// The number after the first of `keys` ("to=3" -> 3) in `text`, or -1.
int64_t NumberAfter(std::string_view text, std::initializer_list<std::string_view> keys) {
  for (std::string_view key : keys) {
    size_t at = 0;
    while ((at = text.find(key, at)) != std::string_view::npos) {
      const bool word_start = at == 0 || text[at - 1] == ' ' || text[at - 1] == ',' ||
                              text[at - 1] == '(' || text[at - 1] == '[';
      size_t i = at + key.size();
      int64_t v = 0;
      size_t digits = 0;
      while (i < text.size() && text[i] >= '0' && text[i] <= '9' && digits < 12) {
        v = v * 10 + (text[i] - '0');
        ++i, ++digits;
      }
      if (word_start && digits > 0) return v;
      at += key.size();
    }
  }
  return -1;
}

// "group=0,2,4" in `text` -> "group=0,2,4"; "" when absent.
std::string GroupKey(std::string_view text) {
  const size_t at = text.find("group=");
  if (at == std::string_view::npos) return "";
  size_t end = at + 6;
  while (end < text.size() && ((text[end] >= '0' && text[end] <= '9') || text[end] == ',')) ++end;
  return std::string(text.substr(at, end - at));
}

}  // namespace

Status EventError(std::string_view source, int64_t index, std::string_view name,
                  std::string_view problem) {
  if (name.empty()) {
    return InvalidArgumentError(fmt::format("{}: traceEvents[{}]: {}", source, index, problem));
  }
  return InvalidArgumentError(
      fmt::format("{}: traceEvents[{}] ('{}'): {}", source, index, name.substr(0, 60), problem));
}

StatusOr<const nlohmann::json*> EventArray(const nlohmann::json& doc, std::string_view source,
                                           int64_t max_events) {
  const nlohmann::json* events = nullptr;
  if (doc.is_array()) {
    events = &doc;
  } else if (doc.is_object() && doc.contains("traceEvents") && doc["traceEvents"].is_array()) {
    events = &doc["traceEvents"];
  } else {
    return InvalidArgumentError(fmt::format(
        "{}: not a Chrome trace: expected an array of events or an object with a 'traceEvents' "
        "array",
        source));
  }
  if (static_cast<int64_t>(events->size()) > max_events) {
    return InvalidArgumentError(fmt::format("{}: {} events in traceEvents; at most {} are read",
                                            source, events->size(), max_events));
  }
  return events;
}

Status ReadRawEvent(const nlohmann::json& e, int64_t index, std::string_view source,
                    RawEvent* out) {
  *out = RawEvent{};
  out->index = index;
  if (!e.is_object()) return EventError(source, index, "", "an event must be a JSON object");
  auto name = e.find("name");
  if (name != e.end()) {
    if (!name->is_string()) return EventError(source, index, "", "field 'name': not a string");
    out->name = name->get<std::string>();
  }
  auto ph = e.find("ph");
  if (ph == e.end() || !ph->is_string() || ph->get_ref<const std::string&>().size() != 1) {
    return EventError(source, index, out->name, "field 'ph': expected a one-letter string");
  }
  out->ph = ph->get_ref<const std::string&>()[0];
  auto cat = e.find("cat");
  if (cat != e.end() && cat->is_string()) out->cat = cat->get<std::string>();
  for (const char* key : {"pid", "tid"}) {
    auto v = e.find(key);
    if (v == e.end()) continue;
    std::string text = IdText(*v);
    if (text.empty() && !(v->is_string())) {
      return EventError(source, index, out->name,
                        fmt::format("field '{}': expected an integer or a string", key));
    }
    (key[0] == 'p' ? out->pid : out->tid) = std::move(text);
  }
  auto number = [&](const char* key, bool required, int64_t* ns) -> Status {
    auto v = e.find(key);
    if (v == e.end()) {
      if (required) return EventError(source, index, out->name, fmt::format("no '{}'", key));
      return Status::Ok();
    }
    if (!v->is_number()) {
      return EventError(source, index, out->name,
                        fmt::format("field '{}': expected a number (µs)", key));
    }
    const double us = v->get<double>();
    if (!std::isfinite(us) || std::abs(us) > kMaxAbsMicros) {
      return EventError(source, index, out->name,
                        fmt::format("field '{}': {} is outside ±1e12 µs", key, us));
    }
    *ns = std::llround(us * 1e3);
    return Status::Ok();
  };
  const bool complete = out->ph == 'X';
  SLUICE_RETURN_IF_ERROR(number("ts", complete, &out->ts_ns));
  SLUICE_RETURN_IF_ERROR(number("dur", complete, &out->dur_ns));
  if (out->dur_ns < 0) {
    return EventError(source, index, out->name, "field 'dur': negative duration");
  }
  auto args = e.find("args");
  if (args != e.end()) {
    if (!args->is_object()) {
      return EventError(source, index, out->name, "field 'args': expected an object");
    }
    out->args = &*args;
  }
  auto id = e.find("id");
  if (id != e.end()) out->id = &*id;
  return Status::Ok();
}

Status IntArg(const RawEvent& e, std::string_view key, std::string_view source, int64_t* out) {
  if (e.args == nullptr) return Status::Ok();
  auto v = e.args->find(key);
  if (v == e.args->end()) return Status::Ok();
  if (!v->is_number_integer()) {
    return EventError(source, e.index, e.name,
                      fmt::format("field 'args.{}': expected an integer", key));
  }
  *out = v->get<int64_t>();
  return Status::Ok();
}

std::string StringArg(const RawEvent& e, std::string_view key) {
  if (e.args == nullptr) return "";
  auto v = e.args->find(key);
  if (v == e.args->end() || !v->is_string()) return "";
  return v->get<std::string>();
}

std::unordered_map<int64_t, int64_t> AbsorbBackendEvents(std::vector<const RawEvent*>* events) {
  std::vector<const RawEvent*> comms;
  for (const RawEvent* e : *events) {
    if (IsCommName(e->name)) comms.push_back(e);
  }
  std::sort(comms.begin(), comms.end(), [](const RawEvent* a, const RawEvent* b) {
    return a->ts_ns != b->ts_ns ? a->ts_ns < b->ts_ns : a->index < b->index;
  });
  std::unordered_map<int64_t, int64_t> end;   // c10d event index -> extended end
  std::unordered_set<int64_t> absorbed;       // backend event indices
  std::vector<const RawEvent*> waiting[3];    // c10d events without their backend event, by kind
  constexpr int64_t kTolerance = 1'000'000;   // a backend event may start 1 ms before its call
  for (const RawEvent* e : comms) {
    const int kind = static_cast<int>(CommKindOf(*e));
    if (StartsWith(e->name, "c10d::")) {
      waiting[kind].push_back(e);
      continue;
    }
    auto& queue = waiting[kind];
    auto it = std::find_if(queue.begin(), queue.end(), [&](const RawEvent* c) {
      return c->ts_ns <= e->ts_ns + kTolerance;
    });
    if (it == queue.end()) continue;
    end[(*it)->index] = std::max((*it)->ts_ns + (*it)->dur_ns, e->ts_ns + e->dur_ns);
    absorbed.insert(e->index);
    queue.erase(queue.begin(), it + 1);  // calls before it ran no backend op of their own
  }
  std::erase_if(*events, [&](const RawEvent* e) { return absorbed.contains(e->index); });
  return end;
}

void FlattenThread(std::vector<const RawEvent*> events, int32_t stream,
                   const std::unordered_map<int64_t, int64_t>& comm_end, RankTrace* rank) {
  std::sort(events.begin(), events.end(), [](const RawEvent* a, const RawEvent* b) {
    if (a->ts_ns != b->ts_ns) return a->ts_ns < b->ts_ns;
    if (a->dur_ns != b->dur_ns) return a->dur_ns > b->dur_ns;
    return a->index < b->index;
  });
  const int n = static_cast<int>(events.size());
  // Nesting: parent[i] = the innermost open event containing i (-1: top level). Partial overlaps
  // close the open event (the later one becomes its sibling).
  std::vector<int> parent(n, -1);
  std::vector<std::vector<int>> children(n);
  std::vector<int> top_level;
  std::vector<int> open;
  auto end_of = [&](int i) { return events[i]->ts_ns + events[i]->dur_ns; };
  for (int i = 0; i < n; ++i) {
    while (!open.empty() &&
           (events[i]->ts_ns >= end_of(open.back()) || end_of(i) > end_of(open.back()))) {
      open.pop_back();
    }
    if (open.empty()) {
      top_level.push_back(i);
    } else {
      parent[i] = open.back();
      children[open.back()].push_back(i);
    }
    open.push_back(i);
  }
  // has_comm[i]: i or a descendant is a communication (children come after parents: reverse).
  std::vector<char> has_comm(n, 0);
  for (int i = n - 1; i >= 0; --i) {
    if (IsCommName(events[i]->name)) has_comm[i] = 1;
    if (has_comm[i] && parent[i] >= 0) has_comm[parent[i]] = 1;
  }
  struct Item {
    int event;
    int annotation;  // event index of the innermost annotation, -1 none
    int64_t iteration;
  };
  std::vector<Item> stack;
  for (auto it = top_level.rbegin(); it != top_level.rend(); ++it) stack.push_back({*it, -1, -1});
  while (!stack.empty()) {
    const Item item = stack.back();
    stack.pop_back();
    const RawEvent& e = *events[item.event];
    const int64_t step = StepNumber(e.name);
    const bool comm = IsCommName(e.name);
    if (step >= 0 || (has_comm[item.event] && !comm)) {
      const int annotation = IsAnnotation(e.name) ? item.event : item.annotation;
      const int64_t iteration = step >= 0 ? step : item.iteration;
      const auto& kids = children[item.event];
      for (auto it = kids.rbegin(); it != kids.rend(); ++it) {
        stack.push_back({*it, annotation, iteration});
      }
      continue;
    }
    const std::string label =
        IsAnnotation(e.name) ? e.name
                             : (item.annotation >= 0 ? events[item.annotation]->name : e.name);
    const int64_t end = e.ts_ns + e.dur_ns;
    if (comm) {
      const CommKind kind = CommKindOf(e);
      CommOp c;
      c.kind = kind;
      c.text = label;
      if (kind == CommKind::kSend) {
        c.peer = NumberAfter(label, {"to=", "dst=", "peer="});
      } else if (kind == CommKind::kRecv) {
        c.peer = NumberAfter(label, {"from=", "src=", "peer="});
      } else {
        c.key = GroupKey(label);
      }
      auto extended = comm_end.find(e.index);
      const int64_t comm_done = extended != comm_end.end() ? std::max(end, extended->second) : end;
      c.done_ns = comm_done;
      TraceOp post{.name = e.name, .label = label, .kind = TraceOpKind::kCommPost, .stream = stream,
                   .start_ns = e.ts_ns, .end_ns = e.ts_ns, .iteration = item.iteration,
                   .event_index = e.index};
      TraceOp wait = post;
      wait.kind = TraceOpKind::kCommWait;
      wait.end_ns = comm_done;
      c.post = static_cast<int32_t>(rank->ops.size());
      c.wait = c.post + 1;
      rank->ops.push_back(std::move(post));
      rank->ops.push_back(std::move(wait));
      rank->comms.push_back(std::move(c));
      continue;
    }
    const TraceOpKind kind = StartsWith(e.name, "Optimizer.") ||
                                     label.find("optimizer") != std::string::npos
                                 ? TraceOpKind::kOptimizer
                                 : TraceOpKind::kCompute;
    rank->ops.push_back(TraceOp{.name = e.name, .label = label, .kind = kind, .stream = stream,
                                .start_ns = e.ts_ns, .end_ns = end, .iteration = item.iteration,
                                .event_index = e.index});
  }
}

}  // namespace sluice::trace_internal
