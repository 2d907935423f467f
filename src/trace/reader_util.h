// Internal to src/trace/: the checked form of one Trace Event Format event, shared by readers.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "trace/trace_model.h"

namespace sluice::trace_internal {

struct RawEvent {
  int64_t index = 0;  // position in traceEvents
  std::string name;
  std::string cat;
  char ph = 'X';
  std::string pid;  // numbers as their decimal text
  std::string tid;
  int64_t ts_ns = 0;
  int64_t dur_ns = 0;
  const nlohmann::json* args = nullptr;  // null when absent; an object otherwise
  const nlohmann::json* id = nullptr;    // flow events
};

// The traceEvents array of `doc` (the document itself when it is an array).
StatusOr<const nlohmann::json*> EventArray(const nlohmann::json& doc, std::string_view source,
                                           int64_t max_events);

// Checks event `index` and fills `out`: "ph" a one-letter string, "name" a string, "pid"/"tid"
// integers or strings, and for ph X "ts" and "dur" finite numbers in µs (dur >= 0, ts within
// ±1e12 µs); for other phases ts is optional. Errors name the source, the index and the field.
Status ReadRawEvent(const nlohmann::json& e, int64_t index, std::string_view source, RawEvent* out);

// "<source>: traceEvents[<index>] (<name>): <problem>".
Status EventError(std::string_view source, int64_t index, std::string_view name,
                  std::string_view problem);

// Optional integer argument; `*out` unchanged when absent. Error when present but not an integer.
Status IntArg(const RawEvent& e, std::string_view key, std::string_view source, int64_t* out);
// Optional string argument ("" when absent or not a string).
std::string StringArg(const RawEvent& e, std::string_view key);

// A c10d call and the backend op that runs it (c10d::send then gloo:send on the same thread;
// c10d::allreduce_ on the caller's thread and gloo:all_reduce on Gloo's worker thread) are one
// communication: each backend event is paired with the earliest unpaired c10d event of its kind
// that started before it (1 ms of tolerance), removed from `events`, and the c10d event's end
// becomes the later of the two ends (the calls are blocking). Returns c10d index -> that end.
std::unordered_map<int64_t, int64_t> AbsorbBackendEvents(std::vector<const RawEvent*>* events);

// Flattens one thread's nested profiler events (torch 1.13 CPU ops, Kineto cpu_op and
// user_annotation) into non-overlapping ops on `stream` of `rank`: a communication event becomes
// a post and a wait ending at `comm_end` of its index when there (AbsorbBackendEvents); an event
// with a communication inside is split into its children; any other
// outermost event is one compute op labelled with its innermost enclosing annotation.
// ProfilerStep#N ranges set the iteration. `events` need not be sorted.
void FlattenThread(std::vector<const RawEvent*> events, int32_t stream,
                   const std::unordered_map<int64_t, int64_t>& comm_end, trace::RankTrace* rank);

}  // namespace sluice::trace_internal

namespace sluice::trace_internal {

// The readers of each format, on a parsed document (trace_reader.cc, torch_reader.cc).
StatusOr<std::vector<trace::RankTrace>> ReadSluiceDocument(const nlohmann::json& doc,
                                                           std::string_view source,
                                                           int64_t max_events);
StatusOr<trace::RankTrace> ReadTorchCpuDocument(const nlohmann::json& doc, std::string_view source,
                                                int64_t rank, int64_t max_events);
StatusOr<trace::RankTrace> ReadKinetoDocument(const nlohmann::json& doc, std::string_view source,
                                              int64_t rank_hint, int64_t max_events);

}  // namespace sluice::trace_internal
