#include "schedule/generators.h"

#include <fmt/core.h>

#include <algorithm>
#include <utility>

#include "schedule/cost_driven_orders.h"

namespace sluice {
namespace {

constexpr ScheduleKind kKinds[] = {ScheduleKind::kGPipe, ScheduleKind::k1F1B,
                                   ScheduleKind::kInterleaved, ScheduleKind::kZbH1,
                                   ScheduleKind::kAdaptive};

Schedule EmptySchedule(std::string name, int64_t pp, int64_t vpp, int64_t m) {
  Schedule s;
  s.name = std::move(name);
  s.pp = pp;
  s.vpp = vpp;
  s.num_microbatches = m;
  s.ranks.assign(static_cast<size_t>(pp), {});
  return s;
}

Action F(int64_t stage, int64_t mb) { return Action{stage, ActionKind::kForward, mb}; }
Action B(int64_t stage, int64_t mb) { return Action{stage, ActionKind::kBackward, mb}; }

// Calls fn(action) for rank r's 1F1B list in order: min(pp - r - 1, m) warm-up F, F/B pairs,
// the remaining B.
template <class Fn>
void ForEachOneFOneB(int64_t r, int64_t pp, int64_t m, Fn&& fn) {
  const int64_t warmup = std::min(pp - r - 1, m);
  for (int64_t mb = 0; mb < warmup; ++mb) fn(F(r, mb));
  for (int64_t i = 0; i < m - warmup; ++i) {
    fn(F(r, warmup + i));
    fn(B(r, i));
  }
  for (int64_t mb = m - warmup; mb < m; ++mb) fn(B(r, mb));
}

void AppendOneFOneB(int64_t r, int64_t pp, int64_t m, std::vector<Action>* list) {
  ForEachOneFOneB(r, pp, m, [list](const Action& a) { list->push_back(a); });
}

// The pipeline's 1F1B peak: the largest per-rank activation peak of the 1F1B order (walked
// without building the lists: ZB-H1 asks it for every order the search scores).
Bytes OneFOneBPeak(const ScheduleCosts& costs) {
  int64_t peak = 0;
  for (int64_t r = 0; r < costs.pp; ++r) {
    MemoryWalk walk;
    ForEachOneFOneB(r, costs.pp, costs.num_microbatches(),
                    [&](const Action& a) { walk.Apply(a, costs); });
    peak = std::max(peak, walk.peak);
  }
  return Bytes::Of(peak);
}

// Estimates `s` and turns the estimate into an outcome. A generated schedule that does not run
// to the end is a bug in this library, reported as an internal error.
StatusOr<ScheduleResult> Finish(Schedule s, const ScheduleCosts& costs, std::string_view why_oom) {
  ScheduleResult r;
  r.estimate = EstimateSchedule(s, costs);
  if (!r.estimate.completed) {
    return InternalError(fmt::format("schedule '{}' (pp = {}, vpp = {}, m = {}) does not run: {}",
                                     s.name, s.pp, s.vpp, s.num_microbatches, r.estimate.problem));
  }
  if (!r.estimate.fits_memory) {
    r.outcome = PlanOutcome::kOutOfMemory;
    r.infeasible_reason = fmt::format("{}: {}{}", s.name, r.estimate.memory_problem, why_oom);
  }
  r.schedule = std::move(s);
  return r;
}

// As Finish, for a schedule its generator timed and walked (EstimateTimedSchedule).
ScheduleResult FinishTimed(Schedule s, const ScheduleCosts& costs,
                           const schedule_internal::ListTimes& times) {
  ScheduleResult r;
  r.estimate = EstimateTimedSchedule(s, costs, times.busy, times.finish, times.peak);
  if (!r.estimate.fits_memory) {
    r.outcome = PlanOutcome::kOutOfMemory;
    r.infeasible_reason = fmt::format("{}: {}", s.name, r.estimate.memory_problem);
  }
  r.schedule = std::move(s);
  return r;
}

ScheduleResult OutOfMemory(std::string reason) {
  ScheduleResult r;
  r.outcome = PlanOutcome::kOutOfMemory;
  r.infeasible_reason = std::move(reason);
  r.estimate.fits_memory = false;
  return r;
}

Status CheckNonNegative(const ChunkCost& c, int64_t mb, int64_t stage) {
  if (c.forward < Duration::Zero() || c.backward_input < Duration::Zero() ||
      c.backward_weight < Duration::Zero() || c.stored < Bytes::Zero() || c.peak < Bytes::Zero() ||
      c.stored_until_w < Bytes::Zero()) {
    return InvalidArgumentError(fmt::format(
        "schedule costs: micro-batch {} stage {}: times and bytes must be >= 0", mb, stage));
  }
  if (c.stored_until_w > c.stored) {
    return InvalidArgumentError(
        fmt::format("schedule costs: micro-batch {} stage {}: stored_until_w {} exceeds stored {}",
                    mb, stage, c.stored_until_w.count(), c.stored.count()));
  }
  return Status::Ok();
}

}  // namespace

std::string_view ScheduleKindName(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return "gpipe";
    case ScheduleKind::k1F1B:
      return "1f1b";
    case ScheduleKind::kInterleaved:
      return "interleaved";
    case ScheduleKind::kZbH1:
      return "zb-h1";
    case ScheduleKind::kAdaptive:
      return "adaptive";
  }
  return "?";
}

StatusOr<ScheduleKind> ParseScheduleKind(std::string_view name) {
  for (ScheduleKind k : kKinds) {
    if (name == ScheduleKindName(k)) return k;
  }
  return InvalidArgumentError(fmt::format(
      "unknown schedule '{}'; allowed: gpipe, 1f1b, interleaved, zb-h1, adaptive", name));
}

std::string_view InterleavedRoundsName(InterleavedRounds rounds) {
  switch (rounds) {
    case InterleavedRounds::kPadded:
      return "padded";
    case InterleavedRounds::kFlexible:
      return "flexible";
    case InterleavedRounds::kAuto:
      return "auto";
  }
  return "?";
}

StatusOr<InterleavedRounds> ParseInterleavedRounds(std::string_view name) {
  for (InterleavedRounds r :
       {InterleavedRounds::kPadded, InterleavedRounds::kFlexible, InterleavedRounds::kAuto}) {
    if (name == InterleavedRoundsName(r)) return r;
  }
  return InvalidArgumentError(
      fmt::format("unknown interleaved rounds '{}'; allowed: padded, flexible, auto", name));
}

StatusOr<ScheduleKind> ParsePlanScheduleName(std::string_view name) {
  if (name == kInterleavedFlexName) return ScheduleKind::kInterleaved;
  StatusOr<ScheduleKind> kind = ParseScheduleKind(name);
  if (!kind.ok()) {
    return InvalidArgumentError(
        fmt::format("unknown schedule '{}'; allowed: gpipe, 1f1b, interleaved, {}, zb-h1, adaptive",
                    name, kInterleavedFlexName));
  }
  return kind;
}

std::vector<ScheduleKind> AllScheduleKinds() { return {std::begin(kKinds), std::end(kKinds)}; }

bool SupportsVpp(ScheduleKind kind, int64_t vpp) {
  if (vpp < 1) return false;
  return kind == ScheduleKind::kInterleaved || kind == ScheduleKind::kAdaptive || vpp == 1;
}

Status ValidateScheduleCosts(const ScheduleCosts& c) {
  if (c.pp < 1 || c.vpp < 1) {
    return InvalidArgumentError(
        fmt::format("schedule costs: pp = {} and vpp = {}; both must be >= 1", c.pp, c.vpp));
  }
  const int64_t m = c.num_microbatches();
  const int64_t stages = c.pp * c.vpp;
  if (m == 0) return InvalidArgumentError("schedule costs: no micro-batches");
  for (int64_t mb = 0; mb < m; ++mb) {
    if (static_cast<int64_t>(c.chunks[mb].size()) != stages) {
      return InvalidArgumentError(
          fmt::format("schedule costs: micro-batch {} has {} stage costs, pp * vpp = {}", mb,
                      c.chunks[mb].size(), stages));
    }
    for (int64_t s = 0; s < stages; ++s)
      SLUICE_RETURN_IF_ERROR(CheckNonNegative(c.chunks[mb][s], mb, s));
  }
  if (!c.p2p.empty()) {
    if (static_cast<int64_t>(c.p2p.size()) != m) {
      return InvalidArgumentError(
          fmt::format("schedule costs: p2p has {} micro-batches, the costs {}", c.p2p.size(), m));
    }
    for (int64_t mb = 0; mb < m; ++mb) {
      if (static_cast<int64_t>(c.p2p[mb].size()) != stages - 1) {
        return InvalidArgumentError(
            fmt::format("schedule costs: p2p of micro-batch {} has {} boundaries, expected {}", mb,
                        c.p2p[mb].size(), stages - 1));
      }
      for (Duration d : c.p2p[mb]) {
        if (d < Duration::Zero()) {
          return InvalidArgumentError(
              fmt::format("schedule costs: p2p of micro-batch {} is negative", mb));
        }
      }
    }
  }
  if (!c.held.empty()) {
    if (static_cast<int64_t>(c.held.size()) != m) {
      return InvalidArgumentError(fmt::format(
          "schedule costs: held buffers for {} micro-batches, the costs {}", c.held.size(), m));
    }
    for (int64_t mb = 0; mb < m; ++mb) {
      if (static_cast<int64_t>(c.held[mb].size()) != stages) {
        return InvalidArgumentError(
            fmt::format("schedule costs: held buffers of micro-batch {} for {} stages, expected {}",
                        mb, c.held[mb].size(), stages));
      }
      for (Bytes b : c.held[mb]) {
        if (b < Bytes::Zero()) {
          return InvalidArgumentError(
              fmt::format("schedule costs: held buffers of micro-batch {} are negative", mb));
        }
      }
    }
  }
  if (!c.budget.empty() && static_cast<int64_t>(c.budget.size()) != c.pp) {
    return InvalidArgumentError(
        fmt::format("schedule costs: {} memory budgets for pp = {} (give one per rank, or none)",
                    c.budget.size(), c.pp));
  }
  return Status::Ok();
}

Schedule GPipeOrder(int64_t pp, int64_t m) {
  Schedule s = EmptySchedule("gpipe", pp, 1, m);
  for (int64_t r = 0; r < pp; ++r) {
    for (int64_t mb = 0; mb < m; ++mb) s.ranks[r].push_back(F(r, mb));
    for (int64_t mb = 0; mb < m; ++mb) s.ranks[r].push_back(B(r, mb));
  }
  return s;
}

Schedule OneFOneBOrder(int64_t pp, int64_t m) {
  Schedule s = EmptySchedule("1f1b", pp, 1, m);
  for (int64_t r = 0; r < pp; ++r) AppendOneFOneB(r, pp, m, &s.ranks[r]);
  return s;
}

int64_t InterleavedRoundSize(int64_t pp, int64_t m, InterleavedRounds rounds) {
  SLUICE_CHECK_MSG(pp >= 1 && m >= 1 && rounds != InterleavedRounds::kAuto,
                   "InterleavedRoundSize: pp, m >= 1 and padded or flexible rounds");
  if (rounds == InterleavedRounds::kPadded) return pp;
  const int64_t count = std::max<int64_t>(1, m / pp);
  return (m + count - 1) / count;
}

Schedule InterleavedOrder(int64_t pp, int64_t vpp, int64_t m, InterleavedRounds rounds) {
  if (vpp == 1) {
    Schedule s = OneFOneBOrder(pp, m);
    s.name = "interleaved";
    return s;
  }
  // Megatron's schedule table over rounds of `round` slots, each round run chunk by chunk;
  // backward k is table entry k with the chunk mirrored; rank r warms up with
  // 2 (pp - r - 1) + (vpp - 1) round forwards. Slots the micro-batches do not fill hold phantom
  // micro-batches whose actions are left out: dropping whole micro-batches from a deadlock-free
  // order keeps it deadlock-free (the full order's execution, restricted to the real
  // micro-batches, is still one), which Megatron's table with a short last round is not (its
  // warm-up assumes full rounds).
  //  - padded: rounds of pp, up to pp - 1 phantoms, all in the last round, whose chunk switches
  //    then wait for the wrap around the pipeline (idle slots on every rank);
  //  - flexible (PyTorch's ScheduleInterleaved1F1B when its rounds divide m): max(1, m / pp)
  //    rounds of ceil(m / rounds) slots; the last rounds end with one phantom each, so every
  //    round runs at least min(m, pp) real micro-batches and keeps the ranks busy through a chunk
  //    switch, for (vpp - 1)(round - pp) more forwards in the warm-up.
  const int64_t round = InterleavedRoundSize(pp, m, rounds);
  Schedule s =
      EmptySchedule(round == pp ? "interleaved" : std::string(kInterleavedFlexName), pp, vpp, m);
  const int64_t count =
      rounds == InterleavedRounds::kPadded ? (m + pp - 1) / pp : std::max<int64_t>(1, m / pp);
  const int64_t padded = count * round;  // slots
  // ids[slot] = the micro-batch in that slot of the rounds, -1 for a phantom.
  std::vector<int64_t> ids;
  ids.reserve(static_cast<size_t>(padded));
  if (rounds == InterleavedRounds::kPadded) {
    for (int64_t k = 0; k < padded; ++k) ids.push_back(k < m ? k : -1);
  } else {
    const int64_t short_rounds = padded - m;  // < count: one phantom each, at the end
    int64_t next = 0;
    for (int64_t g = 0; g < count; ++g) {
      const int64_t size = g < count - short_rounds ? round : round - 1;
      for (int64_t j = 0; j < round; ++j) ids.push_back(j < size ? next++ : -1);
    }
  }
  std::vector<std::pair<int64_t, int64_t>> table;  // (micro-batch or -1, chunk)
  table.reserve(static_cast<size_t>(padded * vpp));
  for (int64_t g = 0; g < padded; g += round) {
    for (int64_t c = 0; c < vpp; ++c) {
      for (int64_t k = g; k < g + round; ++k) table.emplace_back(ids[k], c);
    }
  }
  const int64_t total = padded * vpp;
  for (int64_t r = 0; r < pp; ++r) {
    std::vector<Action>& list = s.ranks[r];
    auto fwd = [&](int64_t k) {
      if (table[k].first >= 0) list.push_back(F(table[k].second * pp + r, table[k].first));
    };
    auto bwd = [&](int64_t k) {
      if (table[k].first >= 0)
        list.push_back(B((vpp - 1 - table[k].second) * pp + r, table[k].first));
    };
    const int64_t warmup = std::min((pp - r - 1) * 2 + (vpp - 1) * round, total);
    for (int64_t k = 0; k < warmup; ++k) fwd(k);
    for (int64_t k = 0; k < total - warmup; ++k) {
      fwd(warmup + k);
      bwd(k);
    }
    for (int64_t k = total - warmup; k < total; ++k) bwd(k);
  }
  return s;
}

std::vector<int64_t> ChunksInFlight(const Schedule& schedule) {
  std::vector<int64_t> out;
  out.reserve(schedule.ranks.size());
  for (const std::vector<Action>& list : schedule.ranks) {
    int64_t now = 0, most = 0;
    for (const Action& a : list) {
      if (a.kind == ActionKind::kForward) {
        most = std::max(most, ++now);
      } else if (a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardInput) {
        --now;
      }
    }
    out.push_back(most);
  }
  return out;
}

namespace {

// Interleaved 1F1B in `options.rounds`; kAuto estimates both orders (when they differ) and keeps
// the padded one unless the flexible one fits and is strictly shorter.
StatusOr<ScheduleResult> Interleaved(const ScheduleCosts& costs, const ScheduleOptions& options) {
  const int64_t pp = costs.pp;
  const int64_t m = costs.num_microbatches();
  if (options.rounds != InterleavedRounds::kAuto || costs.vpp == 1 || m % pp == 0) {
    const InterleavedRounds rounds = options.rounds == InterleavedRounds::kFlexible
                                         ? InterleavedRounds::kFlexible
                                         : InterleavedRounds::kPadded;
    return Finish(InterleavedOrder(pp, costs.vpp, m, rounds), costs, "");
  }
  SLUICE_ASSIGN_OR_RETURN(
      ScheduleResult padded,
      Finish(InterleavedOrder(pp, costs.vpp, m, InterleavedRounds::kPadded), costs, ""));
  SLUICE_ASSIGN_OR_RETURN(
      ScheduleResult flexible,
      Finish(InterleavedOrder(pp, costs.vpp, m, InterleavedRounds::kFlexible), costs, ""));
  const bool take =
      flexible.outcome == PlanOutcome::kOk &&
      (padded.outcome != PlanOutcome::kOk || flexible.estimate.makespan < padded.estimate.makespan);
  return take ? std::move(flexible) : std::move(padded);
}

}  // namespace

StatusOr<ScheduleResult> GenerateSchedule(ScheduleKind kind, const ScheduleCosts& costs,
                                          const ScheduleOptions& options) {
  SLUICE_RETURN_IF_ERROR(ValidateScheduleCosts(costs));
  if (!SupportsVpp(kind, costs.vpp)) {
    return InvalidArgumentError(
        fmt::format("schedule '{}' runs one stage per rank (vpp = 1), the costs have vpp = {}; use "
                    "interleaved or adaptive",
                    ScheduleKindName(kind), costs.vpp));
  }
  if (options.max_in_flight < 0) {
    return InvalidArgumentError(
        fmt::format("schedule options: max_in_flight must be >= 0 (0 = unlimited), got {}",
                    options.max_in_flight));
  }
  const int64_t pp = costs.pp;
  const int64_t m = costs.num_microbatches();
  switch (kind) {
    case ScheduleKind::kGPipe:
      return Finish(GPipeOrder(pp, m), costs, " (GPipe keeps every micro-batch's activations)");
    case ScheduleKind::k1F1B:
      return Finish(OneFOneBOrder(pp, m), costs, "");
    case ScheduleKind::kInterleaved:
      return Interleaved(costs, options);
    case ScheduleKind::kZbH1: {
      Schedule s;
      schedule_internal::ListTimes times;
      const std::string oom =
          schedule_internal::ZbH1Order(costs, schedule_internal::ZbH1Bound(costs), &s, &times);
      if (!oom.empty()) return OutOfMemory("zb-h1: " + oom);
      // ZB-H1's simulation timed and walked the list as the estimator would.
      return FinishTimed(std::move(s), costs, times);
    }
    case ScheduleKind::kAdaptive: {
      Schedule s;
      const std::string oom = schedule_internal::AdaptiveOrder(costs, options.max_in_flight, &s);
      if (!oom.empty()) return OutOfMemory("adaptive: " + oom);
      return Finish(std::move(s), costs, "");
    }
  }
  return InternalError("unknown schedule kind");
}

StatusOr<Duration> ScheduleMakespan(ScheduleKind kind, const ScheduleCosts& costs,
                                    const ScheduleOptions& options) {
  if (kind != ScheduleKind::kZbH1 || costs.vpp != 1 || options.max_in_flight < 0) {
    SLUICE_ASSIGN_OR_RETURN(ScheduleResult r, GenerateSchedule(kind, costs, options));
    if (r.outcome != PlanOutcome::kOk || !r.estimate.completed) return Duration::Infinite();
    return r.estimate.makespan;
  }
  SLUICE_RETURN_IF_ERROR(ValidateScheduleCosts(costs));
  schedule_internal::ListTimes times;
  if (!schedule_internal::ZbH1Order(costs, schedule_internal::ZbH1Bound(costs), nullptr, &times)
           .empty()) {
    return Duration::Infinite();
  }
  // As EstimateTimedSchedule: over budget is out of memory (the bound keeps it within).
  for (size_t r = 0; r < times.peak.size() && !costs.budget.empty(); ++r) {
    if (times.peak[r] > costs.budget[r]) return Duration::Infinite();
  }
  return *std::max_element(times.finish.begin(), times.finish.end());
}

namespace schedule_internal {

std::vector<Bytes> ZbH1Bound(const ScheduleCosts& costs) {
  std::vector<Bytes> bound(static_cast<size_t>(costs.pp), OneFOneBPeak(costs));
  for (int64_t r = 0; r < costs.pp && !costs.budget.empty(); ++r) {
    bound[r] = std::min(bound[r], costs.budget[r]);
  }
  return bound;
}

}  // namespace schedule_internal

}  // namespace sluice
