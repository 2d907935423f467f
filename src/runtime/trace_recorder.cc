#include "runtime/trace_recorder.h"

#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "base/json_util.h"

namespace sluice::runtime {
namespace {

constexpr const char* kStreamNames[] = {"compute", "send", "recv", "collective"};

}  // namespace

std::string TraceRecorder::ToChromeJson() const {
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", rank_},
                    {"args", {{"name", fmt::format("rank {} (dp {}, pp {})", rank_, dp_index_,
                                                   pp_index_)}}}});
  events.push_back(
      {{"name", "process_sort_index"}, {"ph", "M"}, {"pid", rank_}, {"args", {{"sort_index", rank_}}}});
  for (int t = 0; t < 4; ++t) {
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", rank_},
                      {"tid", t},
                      {"args", {{"name", kStreamNames[t]}}}});
  }
  for (const TraceEvent& e : events_) {
    nlohmann::json args = {{"op", e.op}, {"iteration", e.iteration}};
    if (e.microbatch >= 0) args["mb"] = e.microbatch;
    if (e.stage >= 0) args["stage"] = e.stage;
    if (e.peer >= 0) args["peer"] = e.peer;
    if (e.bytes > 0) args["bytes"] = e.bytes;
    if (e.handed_ns >= 0) args["handed_ts"] = static_cast<double>(e.handed_ns) / 1e3;
    events.push_back({{"name", e.name},
                      {"cat", kStreamNames[static_cast<int>(e.stream)]},
                      {"ph", "X"},
                      {"pid", rank_},
                      {"tid", static_cast<int>(e.stream)},
                      {"ts", static_cast<double>(e.start_ns) / 1e3},
                      {"dur", static_cast<double>(e.end_ns - e.start_ns) / 1e3},
                      {"args", std::move(args)}});
  }
  nlohmann::json doc = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  return doc.dump();
}

StatusOr<std::string> MergeChromeTraces(std::span<const std::string> documents) {
  nlohmann::json events = nlohmann::json::array();
  for (size_t i = 0; i < documents.size(); ++i) {
    // ParseJson bounds the nesting (the merged document is dumped recursively).
    StatusOr<nlohmann::json> parsed = ParseJson(documents[i], fmt::format("trace document {}", i));
    if (!parsed.ok()) return parsed.status();
    nlohmann::json& doc = *parsed;
    if (!doc.is_object() || !doc.contains("traceEvents") ||
        !doc["traceEvents"].is_array()) {
      return InvalidArgumentError(
          fmt::format("trace document {} is not a Chrome trace (no traceEvents array)", i));
    }
    for (auto& e : doc["traceEvents"]) events.push_back(std::move(e));
  }
  nlohmann::json merged = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  return merged.dump();
}

}  // namespace sluice::runtime
