// Simulator: option checks, the engine run, and the figures derived from it (tokens, MFU,
// balance, outcome). The engine is sim_engine.h.
#include "sim/simulator.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>

#include "plan/validate.h"
#include "sim/sim_engine.h"
#include "sim/sim_stats.h"

namespace sluice {
namespace {

// Scale factors stay within [1e-6, 1e6] (latency scales [0, 1e6]): enough for any what-if, and
// scaled times stay far inside int64 nanoseconds.
constexpr double kMaxScale = 1e6;
constexpr double kMinScale = 1e-6;

Status CheckOptions(const ExecutionPlan& plan, const SimOptions& o) {
  auto positive = [](double v) { return std::isfinite(v) && v >= kMinScale && v <= kMaxScale; };
  auto bad = [](std::string_view field, double v) {
    return InvalidArgumentError(fmt::format(
        "simulation options: field '{}' is {}; allowed: a finite number > 0, in [1e-6, 1e6]",
        field, v));
  };
  if (!positive(o.compute_scale)) return bad("compute_scale", o.compute_scale);
  if (!positive(o.intra_node.bandwidth_scale)) {
    return bad("intra_node.bandwidth_scale", o.intra_node.bandwidth_scale);
  }
  if (!positive(o.inter_node.bandwidth_scale)) {
    return bad("inter_node.bandwidth_scale", o.inter_node.bandwidth_scale);
  }
  auto latency = [](double v) { return std::isfinite(v) && v >= 0 && v <= kMaxScale; };
  if (!latency(o.intra_node.latency_scale)) {
    return InvalidArgumentError(fmt::format(
        "simulation options: field 'intra_node.latency_scale' is {}; allowed: a finite number >= "
        "0, at most 1e6",
        o.intra_node.latency_scale));
  }
  if (!latency(o.inter_node.latency_scale)) {
    return InvalidArgumentError(fmt::format(
        "simulation options: field 'inter_node.latency_scale' is {}; allowed: a finite number >= "
        "0, at most 1e6",
        o.inter_node.latency_scale));
  }
  const int64_t ranks = static_cast<int64_t>(plan.ranks.size());
  std::vector<bool> seen(std::max<int64_t>(ranks, 0), false);
  for (size_t i = 0; i < o.stragglers.size(); ++i) {
    const Straggler& s = o.stragglers[i];
    if (s.rank < 0 || s.rank >= ranks) {
      return InvalidArgumentError(fmt::format(
          "simulation options: field 'stragglers[{}].rank' is {}; allowed: 0..{} (the plan's "
          "ranks)",
          i, s.rank, ranks - 1));
    }
    if (!positive(s.slowdown)) return bad(fmt::format("stragglers[{}].slowdown", i), s.slowdown);
    if (seen[s.rank]) {
      return InvalidArgumentError(fmt::format(
          "simulation options: field 'stragglers[{}].rank': rank {} is listed twice", i, s.rank));
    }
    seen[s.rank] = true;
  }
  return Status::Ok();
}

}  // namespace

std::string_view StreamKindName(StreamKind kind) {
  switch (kind) {
    case StreamKind::kCompute:
      return "compute";
    case StreamKind::kSendNext:
      return "send-next";
    case StreamKind::kSendPrev:
      return "send-prev";
    case StreamKind::kRecvPrev:
      return "recv-prev";
    case StreamKind::kRecvNext:
      return "recv-next";
    case StreamKind::kCollective:
      return "collective";
    case StreamKind::kAllToAll:
      return "all-to-all";
  }
  return "?";
}

std::string_view SimOutcomeName(SimOutcome outcome) {
  switch (outcome) {
    case SimOutcome::kOk:
      return "ok";
    case SimOutcome::kDeadlock:
      return "deadlock";
    case SimOutcome::kOutOfMemory:
      return "out-of-memory";
  }
  return "?";
}

Simulator::Simulator(const ExecutionPlan& plan, SimOptions options)
    : plan_(&plan), options_(std::move(options)) {}

StatusOr<SimResult> Simulator::Run() {
  SLUICE_RETURN_IF_ERROR(CheckOptions(*plan_, options_));
  // Shapes the model cannot take would be priced as if it could (an MFU of millions of percent).
  SLUICE_RETURN_IF_ERROR(CheckPlanFitsModel(*plan_));
  SimResult result;
  SLUICE_ASSIGN_OR_RETURN(sim_internal::TokenCount tokens,
                          sim_internal::CountTokens(*plan_, options_.samples));
  {
    sim_internal::Engine engine(*plan_, options_);
    SLUICE_RETURN_IF_ERROR(engine.Run(&result));
  }
  const ExecutionPlan& plan = *plan_;
  result.real_tokens = tokens.real;
  result.padded_tokens = tokens.padded;
  result.model_flops = tokens.model_flops;
  result.tokens_from_samples = !options_.samples.empty();
  const double seconds = result.iteration_time.seconds();
  if (seconds > 0) {
    result.tokens_per_second = static_cast<double>(result.real_tokens) / seconds;
    const double peak =
        static_cast<double>(plan.parallel.devices()) * plan.cluster.device.peak_flops;
    if (peak > 0) result.mfu = result.model_flops / (seconds * peak);
  }
  // Stage and replica balance.
  result.stage_compute.assign(plan.pp(), Duration::Zero());
  result.replica_finish.assign(plan.dp(), Duration::Zero());
  for (const RankProgram& p : plan.ranks) {
    const RankSimStats& s = result.ranks[p.rank];
    result.stage_compute[p.pp_index] = std::max(result.stage_compute[p.pp_index], s.compute);
    result.replica_finish[p.dp_index] = std::max(result.replica_finish[p.dp_index], s.finish);
  }
  auto imbalance = [](const std::vector<Duration>& v) {
    double sum = 0, max = 0;
    for (Duration d : v) {
      sum += static_cast<double>(d.nanos());
      max = std::max(max, static_cast<double>(d.nanos()));
    }
    return sum > 0 ? max / (sum / static_cast<double>(v.size())) - 1.0 : 0.0;
  };
  result.stage_imbalance = imbalance(result.stage_compute);
  result.replica_imbalance = imbalance(result.replica_finish);
  // Outcome: a deadlock first, then memory.
  if (!result.blocked.empty()) {
    result.outcome = SimOutcome::kDeadlock;
    std::string list;
    for (size_t i = 0; i < result.blocked.size() && i < 8; ++i) {
      const BlockedRank& b = result.blocked[i];
      list += fmt::format("{}rank {} at instruction {} ({})", i ? "; " : "", b.rank, b.instruction,
                          b.text);
    }
    if (result.blocked.size() > 8) list += fmt::format("; and {} more", result.blocked.size() - 8);
    result.problem =
        fmt::format("deadlock: {} rank(s) cannot finish: {}", result.blocked.size(), list);
  } else if (result.memory_exceeded) {
    result.outcome = SimOutcome::kOutOfMemory;
  }
  if (result.memory_exceeded) {
    const RankSimStats& s = result.ranks[result.oom_rank];
    const RankProgram& p = plan.ranks[result.oom_rank];
    const std::string text = fmt::format(
        "out of memory: rank {} (dp {}, pp {}) exceeds the limit {:.1f} MB at "
        "instruction {} ({}); its peak is {:.1f} MB",
        result.oom_rank, p.dp_index, p.pp_index, plan.memory_limit().mb(), result.oom_instruction,
        result.oom_instruction >= 0 ? InstructionText(p.instructions[result.oom_instruction])
                                    : std::string("model states"),
        s.peak_memory.mb());
    result.problem = result.problem.empty() ? text : result.problem + "; " + text;
  }
  return result;
}

StatusOr<SimResult> Simulate(const ExecutionPlan& plan, const SimOptions& options) {
  return Simulator(plan, options).Run();
}

}  // namespace sluice
