#include "sim/chrome_trace.h"

#include <fmt/core.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <tuple>
#include <vector>

#include "base/json_util.h"
#include "plan/comm_replay.h"

namespace sluice {
namespace {

// Microseconds with three decimals (whole nanoseconds), as Kineto writes them.
std::string Micros(Duration d) {
  const int64_t ns = d.nanos();
  return fmt::format("{}{}.{:03d}", ns < 0 ? "-" : "", std::abs(ns) / 1000, std::abs(ns) % 1000);
}

std::string_view Category(OpKind op) {
  if (IsCollective(op)) return "collective";
  if (IsCommStart(op) || IsCommFinish(op)) return "p2p";
  return "compute";
}

}  // namespace

std::string ChromeTraceJson(const ExecutionPlan& plan, const SimResult& result) {
  std::string out;
  out.reserve(256 + result.timeline.size() * 160);
  auto it = std::back_inserter(out);
  fmt::format_to(it,
                 "{{\"displayTimeUnit\": \"ms\", \"otherData\": {{\"producer\": \"sluice "
                 "simulate\", \"outcome\": \"{}\", \"iteration_time_us\": {}}},\n"
                 "\"traceEvents\": [\n",
                 SimOutcomeName(result.outcome), Micros(result.iteration_time));
  bool first = true;
  auto sep = [&] {
    if (!first) out += ",\n";
    first = false;
  };
  // Which streams each rank used, for thread names.
  std::vector<uint8_t> used(plan.ranks.size(), 0);
  for (const SimInterval& iv : result.timeline) {
    used[iv.rank] |= static_cast<uint8_t>(1u << static_cast<int>(iv.stream));
  }
  for (const RankProgram& p : plan.ranks) {
    sep();
    fmt::format_to(
        it,
        "{{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": {}, \"args\": {{\"name\": "
        "\"rank {} (dp {}, pp {})\"}}}},\n"
        "{{\"ph\": \"M\", \"name\": \"process_sort_index\", \"pid\": {}, \"args\": "
        "{{\"sort_index\": {}}}}}",
        p.rank, p.rank, p.dp_index, p.pp_index, p.rank, p.rank);
    for (int s = 0; s < kNumStreamKinds; ++s) {
      if (s != 0 && !(used[p.rank] & (1u << s))) continue;
      fmt::format_to(it,
                     ",\n{{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": {}, \"tid\": {}, "
                     "\"args\": {{\"name\": \"{}\"}}}},\n"
                     "{{\"ph\": \"M\", \"name\": \"thread_sort_index\", \"pid\": {}, \"tid\": {}, "
                     "\"args\": {{\"sort_index\": {}}}}}",
                     p.rank, s, StreamKindName(static_cast<StreamKind>(s)), p.rank, s, s);
    }
  }
  std::vector<std::tuple<int64_t, int64_t, int>> critical;
  for (const SimInterval& iv : result.critical_path) {
    critical.emplace_back(iv.rank, iv.instruction, static_cast<int>(iv.stream));
  }
  std::sort(critical.begin(), critical.end());
  for (const SimInterval& iv : result.timeline) {
    const Instruction& in = plan.ranks[iv.rank].instructions[iv.instruction];
    const bool on_path =
        std::binary_search(critical.begin(), critical.end(),
                           std::make_tuple(iv.rank, iv.instruction, static_cast<int>(iv.stream)));
    sep();
    fmt::format_to(it,
                   "{{\"ph\": \"X\", \"name\": \"{}\", \"cat\": \"{}\", \"pid\": {}, \"tid\": {}, "
                   "\"ts\": {}, \"dur\": {}, \"args\": {{\"microbatch\": {}, \"stage\": {}, "
                   "\"shapes\": \"{}\", \"bytes\": {}{}}}}}",
                   InstructionText(in), Category(in.op), iv.rank, static_cast<int>(iv.stream),
                   Micros(iv.start), Micros(iv.end - iv.start), in.microbatch, in.stage,
                   ShapesText(in.shapes), in.bytes.count(), on_path ? ", \"critical\": true" : "");
  }
  for (size_t r = 0; r < result.memory.size(); ++r) {
    for (const MemoryPoint& m : result.memory[r]) {
      sep();
      fmt::format_to(it,
                     "{{\"ph\": \"C\", \"name\": \"memory\", \"pid\": {}, \"ts\": {}, \"args\": "
                     "{{\"MB\": {:.3f}}}}}",
                     r, Micros(m.time), m.bytes.mb());
    }
  }
  out += "\n]}\n";
  return out;
}

Status WriteChromeTrace(const ExecutionPlan& plan, const SimResult& result, std::string_view path) {
  return WriteStringToFile(std::string(path), ChromeTraceJson(plan, result));
}

}  // namespace sluice
