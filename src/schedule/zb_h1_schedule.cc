// ZB-H1's greedy list scheduling (generators.h, schedule/cost_driven_orders.h).
#include <fmt/core.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "schedule/cost_driven_orders.h"
#include "schedule/dependencies.h"
#include "schedule/estimator.h"

namespace sluice::schedule_internal {
namespace {

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

// Greedy ZB-H1 (vpp = 1, stage r on rank r): a time-ordered simulation in which every idle rank
// picks, in this priority, the I of its oldest micro-batch whose gradient has arrived, the F of its
// next micro-batch (if fewer than pp - r await their I and Need() fits the bound), or the W of
// its oldest micro-batch past I. Transfers use the same channels as the estimator, and every
// action starts as soon as its rank is free and its inputs are there, so its timing is the
// estimator's of the list it writes (generators_test checks it): each rank's busy time, the end
// of its last action and its memory walk (the estimator's memory rule) are kept for the estimate.
//
// The simulation keeps one next event per rank instead of an event queue: a running rank's is
// the end of its action, an idle rank's the arrival of an input it may wait for. At each instant
// the ranks whose action ends hand on their outputs, then the idle ranks with an event choose.
// Neither order within an instant matters: a rank sends on channels only it sends on, and
// chooses from its own state and the inputs sent to it.
class ZbH1 {
 public:
  ZbH1(const ScheduleCosts& c, const std::vector<Bytes>& bound, Schedule* out)
      : c_(c),
        bound_(bound),
        out_(out),
        pp_(c.pp),
        m_(c.num_microbatches()),
        times_(static_cast<size_t>(m_ * pp_)),
        ranks_(static_cast<size_t>(pp_)),
        channels_(pp_) {
    for (int64_t mb = 0; mb < m_; ++mb) {
      At(mb, 0).f_in = 0;
      At(mb, pp_ - 1).g_in = 0;
    }
  }

  std::string Run(ListTimes* times) {
    if (out_ != nullptr) InitSchedule(c_, "zb-h1", out_);
    int64_t now = kNever;
    for (int64_t r = 0; r < pp_; ++r) {
      Decide(r, 0);
      now = std::min(now, ranks_[r].event_at);
    }
    while (now != kNever) {
      for (int64_t r = 0; r < pp_; ++r) {
        if (ranks_[r].running && ranks_[r].event_at == now) Complete(r, now);
      }
      int64_t next = kNever;
      for (int64_t r = 0; r < pp_; ++r) {
        Rank& k = ranks_[r];
        if (!k.running && k.event_at == now) {
          k.event_at = kNever;
          Decide(r, now);
        }
        next = std::min(next, k.event_at);
      }
      now = next;
    }
    for (int64_t r = 0; r < pp_; ++r) {
      if (ranks_[r].next_w < m_) return Stuck(r);
    }
    if (times != nullptr) {
      times->busy.resize(static_cast<size_t>(pp_));
      times->finish.resize(static_cast<size_t>(pp_));
      times->peak.resize(static_cast<size_t>(pp_));
      for (int64_t r = 0; r < pp_; ++r) {
        times->busy[r] = Duration::Nanos(ranks_[r].busy);
        times->finish[r] = Duration::Nanos(ranks_[r].free_at);
        times->peak[r] = Bytes::Of(ranks_[r].memory.peak);
      }
    }
    return "";
  }

 private:
  // When the inputs of one micro-batch's stage arrive and its F ended, in ns (kNever until known).
  struct StageTimes {
    int64_t f_in = kNever, g_in = kNever, f_done = kNever;
  };
  struct Rank {
    int64_t next_f = 0, next_i = 0, next_w = 0;  // next micro-batch of each kind
    int64_t busy = 0, free_at = 0;               // ns computing; end of its last action
    // Its next event: the end of its action when running, else when an input it may wait for
    // arrives (kNever: none known; an input sent later sets it).
    int64_t event_at = kNever;
    bool running = false;
    Action current;     // the action it runs or ran last
    MemoryWalk memory;  // the estimator's memory rule over the list so far
  };

  StageTimes& At(int64_t mb, int64_t stage) {
    return times_[static_cast<size_t>(mb * pp_ + stage)];
  }

  void Start(int64_t r, Action a, int64_t now) {
    if (out_ != nullptr) out_->ranks[r].push_back(a);
    Rank& k = ranks_[r];
    k.running = true;
    k.current = a;
    k.memory.Apply(a, c_);
    const ChunkCost& c = c_.chunks[a.microbatch][a.stage];
    int64_t d = 0;
    switch (a.kind) {
      case ActionKind::kForward:
        ++k.next_f;
        d = c.forward.nanos();
        break;
      case ActionKind::kBackwardInput:
        ++k.next_i;
        d = c.backward_input.nanos();
        break;
      default:
        ++k.next_w;
        d = c.backward_weight.nanos();
        break;
    }
    k.busy += d;
    k.event_at = now + d;
  }

  // Hands the output of the action rank r just finished to its neighbour; the rank then chooses
  // at this instant (its event stays `t`).
  void Complete(int64_t r, int64_t t) {
    Rank& k = ranks_[r];
    k.running = false;
    k.free_at = t;
    const Action& a = k.current;
    if (a.kind == ActionKind::kForward) At(a.microbatch, a.stage).f_done = t;
    const auto out = ProducedBoundary(a.kind, a.stage, pp_);
    if (!out) return;
    const int64_t dst = out->to_stage;  // vpp = 1: stage s runs on rank s
    const int64_t d = c_.p2p.empty() ? 0 : c_.p2p[a.microbatch][out->boundary].nanos();
    const int64_t arrive = channels_.Arrive(r, dst, t, d);
    StageTimes& in = At(a.microbatch, dst);
    (out->gradient ? in.g_in : in.f_in) = arrive;
    Rank& to = ranks_[dst];
    if (!to.running) to.event_at = std::min(to.event_at, arrive);
  }

  void Decide(int64_t r, int64_t now) {
    Rank& k = ranks_[r];
    const int64_t i = k.next_i;
    const int64_t f = k.next_f;
    const bool i_open = i < f;
    Action a{r, ActionKind::kBackwardInput, i};
    if (i_open && At(i, r).f_done <= now && At(i, r).g_in <= now) {
      // a: the I
    } else if (f < m_ && At(f, r).f_in <= now && f - i < pp_ - r &&
               k.memory.held + Need(r, f) <= bound_[r].count()) {
      a = Action{r, ActionKind::kForward, f};
    } else if (k.next_w < i) {
      a = Action{r, ActionKind::kBackwardWeight, k.next_w};
    } else {
      // Idle: wake up when the input of the next I or F arrives (inputs already announced; later
      // ones wake this rank when they are sent).
      int64_t wake = kNever;
      if (i_open && At(i, r).g_in > now) wake = At(i, r).g_in;
      if (f < m_ && At(f, r).f_in > now) wake = std::min(wake, At(f, r).f_in);
      k.event_at = wake;
      return;
    }
    Start(r, a, now);
  }

  // Bytes the F of micro-batch f on rank r needs beside what the rank holds: its peak, and its
  // stored activations plus the largest I transient among the micro-batches awaiting their I
  // (f included), so that no I can exceed the bound later.
  int64_t Need(int64_t r, int64_t f) const {
    int64_t transient = 0;
    for (int64_t y = ranks_[r].next_i; y <= f; ++y) {
      transient = std::max(transient, Transient(c_.chunks[y][r]));
    }
    const ChunkCost& c = c_.chunks[f][r];
    return std::max(c.peak.count(), c.stored.count() + transient) + c_.Held(f, r).count();
  }

  std::string Stuck(int64_t r) const {
    const int64_t f = ranks_[r].next_f;
    if (f < m_) {
      return fmt::format(
          "rank {} cannot run micro-batch {}: its forward needs {} (its peak, or its stored "
          "activations plus the largest backward transient still to come) beside {} held; the "
          "bound is {} (the 1F1B peak, capped by the budget)",
          r, f, FormatBytes(Bytes::Of(Need(r, f))), FormatBytes(Bytes::Of(ranks_[r].memory.held)),
          FormatBytes(bound_[r]));
    }
    return fmt::format("rank {} stopped before the end (internal)", r);
  }

  const ScheduleCosts& c_;
  const std::vector<Bytes>& bound_;
  Schedule* out_;
  const int64_t pp_;
  const int64_t m_;
  std::vector<StageTimes> times_;  // [mb * pp + stage]
  std::vector<Rank> ranks_;
  TransferChannels channels_;  // the estimator's links, so its timing is the estimator's
};

}  // namespace

std::string ZbH1Order(const ScheduleCosts& costs, const std::vector<Bytes>& bound, Schedule* out,
                      ListTimes* times) {
  return ZbH1(costs, bound, out).Run(times);
}

}  // namespace sluice::schedule_internal
