#include "sim/summary.h"

#include <fmt/core.h>

#include <algorithm>

#include "base/numbers.h"

namespace sluice {
namespace {

// "1,234,567" for counts in the table and headline.
std::string Grouped(double v) {
  const std::string grouped = GroupDigits(fmt::format("{:.0f}", std::abs(v)));
  return v < 0 ? "-" + grouped : grouped;
}

double Pct(Duration part, Duration whole) {
  return whole > Duration::Zero() ? 100.0 * part.seconds() / whole.seconds() : 0.0;
}

// The ranks the table lists: all of them up to 64, else replica 0 and the slowest replica.
std::vector<int64_t> ShownRanks(const ExecutionPlan& plan, const SimResult& r, std::string* note) {
  std::vector<int64_t> out;
  const int64_t n = static_cast<int64_t>(r.ranks.size());
  if (n <= 64) {
    for (int64_t i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  int64_t slowest = 0;
  for (int64_t d = 1; d < static_cast<int64_t>(r.replica_finish.size()); ++d) {
    if (r.replica_finish[d] > r.replica_finish[slowest]) slowest = d;
  }
  std::vector<int64_t> replicas = {0};
  if (slowest != 0) replicas.push_back(slowest);
  for (int64_t d : replicas) {
    for (int64_t p = 0; p < plan.pp(); ++p) out.push_back(plan.RankId(d, p));
  }
  *note = fmt::format("({} ranks: showing replica 0{}; the totals cover every rank)", n,
                      slowest == 0 ? "" : fmt::format(" and the slowest replica, {}", slowest));
  return out;
}

}  // namespace

std::string FormatSimSummary(const ExecutionPlan& plan, const SimResult& r) {
  std::string out;
  auto line = [&out](const std::string& s) { out += s + "\n"; };
  if (r.outcome == SimOutcome::kDeadlock) {
    line(fmt::format("DEADLOCK: {} rank(s) cannot finish", r.blocked.size()));
    for (const BlockedRank& b : r.blocked) {
      line(fmt::format("  rank {} at instruction {}: {}", b.rank, b.instruction, b.text));
    }
  }
  if (r.memory_exceeded) {
    const std::string_view prefix =
        r.outcome == SimOutcome::kOutOfMemory ? "OUT OF MEMORY" : "also";
    const RankProgram& p = plan.ranks[r.oom_rank];
    line(
        fmt::format("{}: rank {} (dp {}, pp {}) exceeds the memory limit of {} MB at instruction "
                    "{} ({}); peak {} MB",
                    prefix, r.oom_rank, p.dp_index, p.pp_index, Grouped(plan.memory_limit().mb()),
                    r.oom_instruction,
                    r.oom_instruction >= 0 ? InstructionText(p.instructions[r.oom_instruction])
                                           : std::string("model states"),
                    Grouped(r.ranks[r.oom_rank].peak_memory.mb())));
  }
  line(fmt::format("outcome: {}", SimOutcomeName(r.outcome)));
  const double padding = r.padded_tokens > 0
                             ? 100.0 * static_cast<double>(r.padded_tokens - r.real_tokens) /
                                   static_cast<double>(r.padded_tokens)
                             : 0.0;
  line(fmt::format(
      "iteration {:.3f} ms; {} real tokens{} ({} padded, {:.1f}% padding) -> {} "
      "tokens/s; MFU {:.1f}% ({} devices x {:.0f} TFLOP/s)",
      r.iteration_time.millis(), Grouped(static_cast<double>(r.real_tokens)),
      r.tokens_from_samples ? "" : " [no sample lengths: padded shapes]",
      Grouped(static_cast<double>(r.padded_tokens)), padding, Grouped(r.tokens_per_second),
      100.0 * r.mfu, plan.parallel.devices(), plan.cluster.device.peak_flops / 1e12));
  Duration path_compute, path_comm;
  for (const SimInterval& iv : r.critical_path) {
    (iv.stream == StreamKind::kCompute ? path_compute : path_comm) += iv.end - iv.start;
  }
  line(
      fmt::format("stage imbalance {:.1f}%, replica imbalance {:.1f}%; critical path {} "
                  "intervals: compute {:.3f} ms, communication {:.3f} ms, waiting {:.3f} ms",
                  100.0 * r.stage_imbalance, 100.0 * r.replica_imbalance, r.critical_path.size(),
                  path_compute.millis(), path_comm.millis(),
                  (r.iteration_time - path_compute - path_comm).millis()));
  int64_t peak_rank = 0;
  for (size_t i = 0; i < r.ranks.size(); ++i) {
    if (r.ranks[i].peak_memory > r.ranks[peak_rank].peak_memory)
      peak_rank = static_cast<int64_t>(i);
  }
  if (!r.ranks.empty()) {
    line(fmt::format(
        "memory: peak {} MB on rank {} (limit {} MB); {} instructions, {} events",
        Grouped(r.ranks[peak_rank].peak_memory.mb()), peak_rank, Grouped(plan.memory_limit().mb()),
        Grouped(static_cast<double>(r.instructions)), Grouped(static_cast<double>(r.events))));
  }
  std::string note;
  const std::vector<int64_t> shown = ShownRanks(plan, r, &note);
  out += "\n";
  line(fmt::format("{:>5} {:>4} {:>4} {:>11} {:>11} {:>11} {:>11} {:>7} {:>11} {:>10}", "rank",
                   "dp", "pp", "finish ms", "compute ms", "exp.comm ms", "bubble ms", "bubble",
                   "comm ms", "peak MB"));
  auto row = [&](const std::string& a, const std::string& b, const std::string& c, Duration finish,
                 Duration compute, Duration exposed, Duration bubble, Duration comm,
                 const std::string& peak) {
    line(
        fmt::format("{:>5} {:>4} {:>4} {:>11.3f} {:>11.3f} {:>11.3f} {:>11.3f} {:>6.1f}% "
                    "{:>11.3f} {:>10}",
                    a, b, c, finish.millis(), compute.millis(), exposed.millis(), bubble.millis(),
                    Pct(bubble, r.iteration_time), comm.millis(), peak));
  };
  for (int64_t i : shown) {
    const RankSimStats& s = r.ranks[i];
    const RankProgram& p = plan.ranks[i];
    row(std::to_string(i), std::to_string(p.dp_index), std::to_string(p.pp_index), s.finish,
        s.compute, s.exposed_comm, s.bubble, s.comm, Grouped(s.peak_memory.mb()));
  }
  if (!r.ranks.empty()) {
    Duration compute, exposed, bubble, comm;
    Bytes peak;
    for (const RankSimStats& s : r.ranks) {
      compute += s.compute;
      exposed += s.exposed_comm;
      bubble += s.bubble;
      comm += s.comm;
      peak = std::max(peak, s.peak_memory);
    }
    const int64_t n = static_cast<int64_t>(r.ranks.size());
    const Duration total = r.iteration_time * n;
    line(fmt::format(
        "{:>5} {:>4} {:>4} {:>11.3f} {:>11.3f} {:>11.3f} {:>11.3f} {:>6.1f}% "
        "{:>11.3f} {:>10}",
        "mean", "", "", r.iteration_time.millis(), compute.millis() / n, exposed.millis() / n,
        bubble.millis() / n, Pct(bubble, total), comm.millis() / n, Grouped(peak.mb()) + " max"));
    line(
        fmt::format("time of all ranks: compute {:.1f}%, exposed communication {:.1f}%, bubble "
                    "{:.1f}%",
                    Pct(compute, total), Pct(exposed, total), Pct(bubble, total)));
    Duration a2a, a2a_exposed;
    for (const RankSimStats& s : r.ranks) {
      a2a += s.all_to_all;
      a2a_exposed += s.exposed_all_to_all;
    }
    if (a2a > Duration::Zero()) {
      line(fmt::format(
          "all-to-all (MoE dispatch and combine): {:.3f} ms per rank, {:.3f} ms of it exposed "
          "({:.1f}% of the iteration)",
          a2a.millis() / n, a2a_exposed.millis() / n, Pct(a2a_exposed, total)));
    }
  }
  if (!note.empty()) line(note);
  return out;
}

nlohmann::json SimResultToJson(const ExecutionPlan& plan, const SimResult& r) {
  using nlohmann::json;
  json j;
  j["format"] = kSimResultFormat;
  j["outcome"] = std::string(SimOutcomeName(r.outcome));
  j["problem"] = r.problem;
  j["iteration_time_ns"] = r.iteration_time.nanos();
  j["real_tokens"] = r.real_tokens;
  j["padded_tokens"] = r.padded_tokens;
  j["tokens_from_samples"] = r.tokens_from_samples;
  j["tokens_per_second"] = r.tokens_per_second;
  j["model_flops"] = r.model_flops;
  j["mfu"] = r.mfu;
  j["devices"] = plan.parallel.devices();
  j["device_peak_flops"] = plan.cluster.device.peak_flops;
  json stage = json::array(), replica = json::array();
  for (Duration d : r.stage_compute) stage.push_back(d.nanos());
  for (Duration d : r.replica_finish) replica.push_back(d.nanos());
  j["stage_compute_ns"] = std::move(stage);
  j["replica_finish_ns"] = std::move(replica);
  j["stage_imbalance"] = r.stage_imbalance;
  j["replica_imbalance"] = r.replica_imbalance;
  j["memory_limit_bytes"] = plan.memory_limit().count();
  j["memory_exceeded"] = r.memory_exceeded;
  j["oom_rank"] = r.oom_rank;
  j["oom_instruction"] = r.oom_instruction;
  json ranks = json::array();
  for (size_t i = 0; i < r.ranks.size(); ++i) {
    const RankSimStats& s = r.ranks[i];
    if (plan.parallel.ep > 1) {  // all-to-all figures only where expert parallelism can have any
      ranks.push_back({{"all_to_all_ns", s.all_to_all.nanos()},
                       {"exposed_all_to_all_ns", s.exposed_all_to_all.nanos()}});
    } else {
      ranks.push_back(json::object());
    }
    ranks.back().update(json{{"rank", static_cast<int64_t>(i)},
                     {"dp", plan.ranks[i].dp_index},
                     {"pp", plan.ranks[i].pp_index},
                     {"finish_ns", s.finish.nanos()},
                     {"compute_ns", s.compute.nanos()},
                     {"exposed_comm_ns", s.exposed_comm.nanos()},
                     {"bubble_ns", s.bubble.nanos()},
                     {"comm_ns", s.comm.nanos()},
                     {"peak_memory_bytes", s.peak_memory.count()},
                     {"peak_instruction", s.peak_instruction}});
  }
  j["ranks"] = std::move(ranks);
  json blocked = json::array();
  for (const BlockedRank& b : r.blocked) {
    blocked.push_back({{"rank", b.rank}, {"instruction", b.instruction}, {"text", b.text}});
  }
  j["blocked"] = std::move(blocked);
  json path = json::array();
  for (const SimInterval& iv : r.critical_path) {
    path.push_back({{"rank", iv.rank},
                    {"instruction", iv.instruction},
                    {"text", InstructionText(plan.ranks[iv.rank].instructions[iv.instruction])},
                    {"stream", std::string(StreamKindName(iv.stream))},
                    {"start_ns", iv.start.nanos()},
                    {"end_ns", iv.end.nanos()}});
  }
  j["critical_path"] = std::move(path);
  j["instructions"] = r.instructions;
  j["events"] = r.events;
  return j;
}

}  // namespace sluice
