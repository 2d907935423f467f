#include "schedule/estimator.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstddef>
#include <limits>

#include "schedule/dependencies.h"

namespace sluice {
namespace {

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

// Duration of an action of `kind` with chunk cost `c`, in nanoseconds.
inline int64_t DurationNs(const ChunkCost& c, ActionKind kind) {
  switch (kind) {
    case ActionKind::kForward:
      return c.forward.nanos();
    case ActionKind::kBackward:
      return c.backward_input.nanos() + c.backward_weight.nanos();
    case ActionKind::kBackwardInput:
      return c.backward_input.nanos();
    case ActionKind::kBackwardWeight:
      return c.backward_weight.nanos();
  }
  return 0;
}

// "" when `costs` and every action of `s` agree in shape; else the first disagreement.
std::string CheckShapes(const Schedule& s, const ScheduleCosts& c) {
  const int64_t stages = s.num_stages();
  if (s.pp < 1 || s.vpp < 1 || static_cast<int64_t>(s.ranks.size()) != s.pp) {
    return fmt::format("schedule has pp = {}, vpp = {} and {} rank lists", s.pp, s.vpp,
                       s.ranks.size());
  }
  if (c.pp != s.pp || c.vpp != s.vpp) {
    return fmt::format("costs are for pp = {}, vpp = {}; the schedule has pp = {}, vpp = {}", c.pp,
                       c.vpp, s.pp, s.vpp);
  }
  const int64_t m = c.num_microbatches();
  for (int64_t mb = 0; mb < m; ++mb) {
    if (static_cast<int64_t>(c.chunks[mb].size()) != stages) {
      return fmt::format("costs of micro-batch {} have {} stages, expected {}", mb,
                         c.chunks[mb].size(), stages);
    }
  }
  if (!c.p2p.empty()) {
    if (static_cast<int64_t>(c.p2p.size()) != m) {
      return fmt::format("p2p costs for {} micro-batches, expected {}", c.p2p.size(), m);
    }
    for (int64_t mb = 0; mb < m; ++mb) {
      if (static_cast<int64_t>(c.p2p[mb].size()) != stages - 1) {
        return fmt::format("p2p costs of micro-batch {} have {} boundaries, expected {}", mb,
                           c.p2p[mb].size(), stages - 1);
      }
    }
  }
  if (!c.held.empty()) {
    if (static_cast<int64_t>(c.held.size()) != m) {
      return fmt::format("held buffers for {} micro-batches, expected {}", c.held.size(), m);
    }
    for (int64_t mb = 0; mb < m; ++mb) {
      if (static_cast<int64_t>(c.held[mb].size()) != stages) {
        return fmt::format("held buffers of micro-batch {} for {} stages, expected {}", mb,
                           c.held[mb].size(), stages);
      }
    }
  }
  if (!c.budget.empty() && static_cast<int64_t>(c.budget.size()) != s.pp) {
    return fmt::format("{} memory budgets for pp = {}", c.budget.size(), s.pp);
  }
  for (int64_t r = 0; r < s.pp; ++r) {
    for (size_t k = 0; k < s.ranks[r].size(); ++k) {
      const Action& a = s.ranks[r][k];
      // stage % pp == r without a division: stage - r is a multiple of pp below pp * vpp.
      const int64_t chunk_base = a.stage - r;
      bool on_rank = chunk_base >= 0 && chunk_base < stages;
      if (on_rank && s.vpp == 1) on_rank = chunk_base == 0;
      if (on_rank && s.vpp > 1) on_rank = chunk_base % s.pp == 0;
      if (a.stage < 0 || a.stage >= stages || a.microbatch < 0 || a.microbatch >= m || !on_rank) {
        return fmt::format(
            "rank {} step {}: action {} is outside the costs ({} micro-batches, "
            "{} stages) or not on its stage's rank",
            r, k, a.ToString(), m, stages);
      }
    }
  }
  return "";
}

// Replay of the per-rank lists (estimator.h, "Model"); records every action's start and end into
// `timeline` when one is given. Each rank runs its list in order as far as its inputs are known
// (their times may lie ahead of the rank's clock); a rank that produced another's input wakes it.
// No event queue is needed: an action's times depend only on its rank's previous action, the
// times of its inputs, and the channels its rank sends on (only that rank writes them, in its list
// order, which is the order their data became ready), so the times do not depend on the order the
// ranks are advanced in.
class Replay {
 public:
  Replay(const Schedule& s, const ScheduleCosts& c, const ReplayOptions& options,
         ScheduleTimeline* timeline)
      : s_(s),
        c_(c),
        options_(options),
        min_ns_(std::max<int64_t>(0, options.min_duration.nanos())),
        timeline_(timeline),
        stages_(s.num_stages()),
        rank_of_(static_cast<size_t>(stages_)),
        f_in_(static_cast<size_t>(c.num_microbatches() * stages_), kNever),
        g_in_(f_in_.size(), kNever),
        f_done_(f_in_.size(), kNever),
        i_done_(f_in_.size(), kNever),
        next_(static_cast<size_t>(s.pp), 0),
        free_(static_cast<size_t>(s.pp), 0),
        busy_(static_cast<size_t>(s.pp), 0),
        queued_(static_cast<size_t>(s.pp), 0),
        channels_(s.pp) {
    work_.reserve(static_cast<size_t>(s.pp));
    for (int64_t st = 0; st < stages_; ++st) rank_of_[st] = s.RankOf(st);
    if (timeline_ != nullptr) {
      timeline_->start.assign(static_cast<size_t>(s.pp), {});
      timeline_->end.assign(static_cast<size_t>(s.pp), {});
      for (int64_t r = 0; r < s.pp; ++r) {
        timeline_->start[r].reserve(s.ranks[r].size());
        timeline_->end[r].reserve(s.ranks[r].size());
      }
    }
  }

  void Run() {
    const int64_t m = c_.num_microbatches();
    for (int64_t mb = 0; mb < m; ++mb) {
      f_in_[Index(mb, 0)] = 0;
      g_in_[Index(mb, stages_ - 1)] = 0;
    }
    for (int64_t r = s_.pp - 1; r >= 0; --r) Wake(r);
    while (!work_.empty()) {
      const int64_t r = work_.back();
      work_.pop_back();
      queued_[r] = 0;
      Advance(r);
    }
  }

  bool Finished(int64_t r) const { return next_[r] == s_.ranks[r].size(); }
  size_t NextStep(int64_t r) const { return next_[r]; }
  int64_t FreeAt(int64_t r) const { return free_[r]; }
  int64_t Busy(int64_t r) const { return busy_[r]; }
  bool Done(const Action& a) const {
    const size_t i = Index(a.microbatch, a.stage);
    return a.kind == ActionKind::kForward ? f_done_[i] != kNever : i_done_[i] != kNever;
  }

 private:
  size_t Index(int64_t mb, int64_t stage) const {
    return static_cast<size_t>(mb * stages_ + stage);
  }

  void Wake(int64_t r) {
    if (queued_[r]) return;
    queued_[r] = 1;
    work_.push_back(r);
  }

  // Time the data of `t`, ready at `ready` on rank `src`, arrives at the consumer's rank.
  int64_t Transfer(int64_t src, const BoundaryTransfer& t, int64_t ready, int64_t mb) {
    const int64_t dst = rank_of_[t.to_stage];
    if (src == dst) return ready;
    const int64_t d =
        std::max(min_ns_, c_.p2p.empty() ? int64_t{0} : c_.p2p[mb][t.boundary].nanos());
    if (!options_.channel_contention) return ready + d;
    return channels_.Arrive(src, dst, ready, d);
  }

  // Runs rank r's next actions, in order, while their inputs are known.
  void Advance(int64_t r) {
    const std::vector<Action>& list = s_.ranks[r];
    while (next_[r] < list.size()) {
      const Action& a = list[next_[r]];
      const size_t i = Index(a.microbatch, a.stage);
      int64_t ready = 0;
      switch (a.kind) {
        case ActionKind::kForward:
          ready = f_in_[i];
          break;
        case ActionKind::kBackward:
        case ActionKind::kBackwardInput:
          ready = std::max(f_done_[i], g_in_[i]);
          break;
        case ActionKind::kBackwardWeight:
          ready = i_done_[i];
          break;
      }
      if (ready == kNever) return;
      const int64_t start = std::max(free_[r], ready);
      const int64_t run = std::max(min_ns_, DurationNs(c_.chunks[a.microbatch][a.stage], a.kind));
      const int64_t end = start + run;
      ++next_[r];
      busy_[r] += run;
      free_[r] = end;
      if (timeline_ != nullptr) {
        timeline_->start[r].push_back(Duration::Nanos(start));
        timeline_->end[r].push_back(Duration::Nanos(end));
      }
      if (a.kind == ActionKind::kForward) {
        f_done_[i] = end;
      } else if (ProducesInputGradient(a.kind)) {
        i_done_[i] = end;
      }
      if (const auto out = ProducedBoundary(a.kind, a.stage, stages_)) {
        // The consumer's input of (mb, to_stage): activations for its F, gradients for its B/I.
        std::vector<int64_t>& in = out->gradient ? g_in_ : f_in_;
        in[Index(a.microbatch, out->to_stage)] = Transfer(r, *out, end, a.microbatch);
        const int64_t dst = rank_of_[out->to_stage];
        if (dst != r) Wake(dst);
      }
    }
  }

  const Schedule& s_;
  const ScheduleCosts& c_;
  const ReplayOptions options_;
  const int64_t min_ns_;
  ScheduleTimeline* timeline_;  // nullptr: not recorded
  const int64_t stages_;
  std::vector<int64_t> rank_of_;  // [stage]: its rank, without a division per lookup
  // Per (micro-batch, stage), in nanoseconds, kNever until known: forward input at the stage's
  // rank, gradient input there, end of F, end of B or I.
  std::vector<int64_t> f_in_, g_in_, f_done_, i_done_;
  std::vector<size_t> next_;  // per rank: index of the next action
  std::vector<int64_t> free_, busy_;
  std::vector<uint8_t> queued_;  // per rank: in work_
  TransferChannels channels_;
  std::vector<int64_t> work_;  // ranks whose inputs changed since they last stopped
};

// Where each stuck rank stopped and what its next action waits for.
std::string DescribeDeadlock(const Schedule& s, const Replay& replay) {
  auto where = [&](const Action& want) {
    const int64_t r = s.RankOf(want.stage);
    for (size_t k = 0; k < s.ranks[r].size(); ++k) {
      if (s.ranks[r][k] == want) {
        return fmt::format("{} (rank {} step {}; rank {} is stuck at step {})", want.ToString(), r,
                           k, r, replay.NextStep(r));
      }
    }
    return fmt::format("{}, which rank {} never runs", want.ToString(), r);
  };
  std::string out = "deadlock:";
  for (int64_t r = 0; r < s.pp; ++r) {
    if (replay.Finished(r)) continue;
    const Action& a = s.ranks[r][replay.NextStep(r)];
    std::vector<Action> needs;
    if (const auto prior = LocalPrerequisite(a.kind)) {
      needs.push_back({a.stage, *prior, a.microbatch});
    }
    if (const auto in = ConsumedBoundary(a.kind, a.stage, s.num_stages())) {
      Action producer{in->from_stage, a.kind, a.microbatch};
      if (in->gradient) {
        // The gradient comes from the next stage's B or I, whichever the schedule has.
        producer.kind = ActionKind::kBackward;
        const int64_t nr = s.RankOf(in->from_stage);
        bool has_b = false;
        for (const Action& x : s.ranks[nr]) has_b = has_b || x == producer;
        if (!has_b) producer.kind = ActionKind::kBackwardInput;
      }
      needs.push_back(producer);
    }
    std::string waits;
    for (const Action& n : needs) {
      if (replay.Done(n)) continue;
      waits += fmt::format("{}{}", waits.empty() ? "" : " and ", where(n));
    }
    out += fmt::format(" rank {} step {} ({}) waits for {};", r, replay.NextStep(r), a.ToString(),
                       waits.empty() ? "nothing (inconsistent)" : waits);
  }
  out.pop_back();
  return out;
}

}  // namespace

double ScheduleEstimate::RankBubbleFraction(int64_t rank) const {
  if (makespan.nanos() <= 0) return 0;
  return 1.0 - static_cast<double>(busy[rank].nanos()) / static_cast<double>(makespan.nanos());
}

Bytes RankPeakMemory(std::span<const Action> list, const ScheduleCosts& costs) {
  MemoryWalk walk;
  for (const Action& a : list) walk.Apply(a, costs);
  return Bytes::Of(walk.peak);
}

Duration ActionDuration(const Action& a, const ScheduleCosts& costs) {
  return Duration::Nanos(DurationNs(costs.chunks[a.microbatch][a.stage], a.kind));
}

namespace {

// The budget check of the memory half: the first rank whose peak is over its budget.
void CheckMemory(const ScheduleCosts& costs, ScheduleEstimate* e) {
  for (size_t r = 0; r < e->peak_memory.size(); ++r) {
    if (!costs.budget.empty() && e->peak_memory[r] > costs.budget[r] && e->fits_memory) {
      e->fits_memory = false;
      e->memory_problem = fmt::format(
          "rank {} needs {} of activations{}, its budget is {}", r, FormatBytes(e->peak_memory[r]),
          costs.held.empty() ? "" : " and held buffers", FormatBytes(costs.budget[r]));
    }
  }
}

// The memory half of an estimate: every rank's peak by its list order, and the first over budget.
void EstimateMemory(const Schedule& schedule, const ScheduleCosts& costs, ScheduleEstimate* e) {
  e->peak_memory.resize(static_cast<size_t>(schedule.pp));
  for (int64_t r = 0; r < schedule.pp; ++r) {
    e->peak_memory[r] = RankPeakMemory(schedule.ranks[r], costs);
  }
  CheckMemory(costs, e);
}

}  // namespace

ScheduleEstimate EstimateTimedSchedule(const Schedule& schedule, const ScheduleCosts& costs,
                                       std::span<const Duration> busy,
                                       std::span<const Duration> finish,
                                       std::span<const Bytes> peak) {
  ScheduleEstimate e;
  e.peak_memory.assign(peak.begin(), peak.end());
  CheckMemory(costs, &e);
  e.completed = true;
  e.busy.assign(busy.begin(), busy.end());
  e.finish.assign(finish.begin(), finish.end());
  int64_t total_busy = 0;
  for (size_t r = 0; r < e.finish.size(); ++r) {
    e.makespan = std::max(e.makespan, e.finish[r]);
    total_busy += e.busy[r].nanos();
  }
  if (e.makespan.nanos() > 0) {
    e.bubble_fraction =
        1.0 - static_cast<double>(total_busy) /
                  (static_cast<double>(schedule.pp) * static_cast<double>(e.makespan.nanos()));
  }
  return e;
}

ScheduleEstimate EstimateSchedule(const Schedule& schedule, const ScheduleCosts& costs) {
  ScheduleEstimate e;
  e.problem = CheckShapes(schedule, costs);
  if (!e.problem.empty()) {
    e.fits_memory = false;
    return e;
  }
  const int64_t pp = schedule.pp;
  e.busy.assign(static_cast<size_t>(pp), Duration::Zero());
  e.finish.assign(static_cast<size_t>(pp), Duration::Zero());
  EstimateMemory(schedule, costs, &e);
  Replay replay(schedule, costs, ReplayOptions{}, nullptr);
  replay.Run();
  e.completed = true;
  int64_t total_busy = 0;
  for (int64_t r = 0; r < pp; ++r) {
    e.completed = e.completed && replay.Finished(r);
    e.busy[r] = Duration::Nanos(replay.Busy(r));
    e.finish[r] = Duration::Nanos(replay.FreeAt(r));
    e.makespan = std::max(e.makespan, e.finish[r]);
    total_busy += replay.Busy(r);
  }
  if (!e.completed) e.problem = DescribeDeadlock(schedule, replay);
  if (e.makespan.nanos() > 0) {
    e.bubble_fraction =
        1.0 - static_cast<double>(total_busy) /
                  (static_cast<double>(pp) * static_cast<double>(e.makespan.nanos()));
  }
  return e;
}

ScheduleTimeline ReplaySchedule(const Schedule& schedule, const ScheduleCosts& costs,
                                const ReplayOptions& options) {
  ScheduleTimeline t;
  t.problem = CheckShapes(schedule, costs);
  if (!t.problem.empty()) return t;
  Replay replay(schedule, costs, options, &t);
  replay.Run();
  t.completed = true;
  for (int64_t r = 0; r < schedule.pp; ++r) t.completed = t.completed && replay.Finished(r);
  if (!t.completed) t.problem = DescribeDeadlock(schedule, replay);
  return t;
}

}  // namespace sluice
