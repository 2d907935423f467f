// ZB-H1's greedy list scheduling (generators.h, schedule/cost_driven_orders.h).
#include "schedule/cost_driven_orders.h"

#include <fmt/core.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "schedule/dependencies.h"

namespace sluice::schedule_internal {
namespace {

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

// Greedy ZB-H1 (vpp = 1, stage r on rank r): a time-ordered simulation in which every idle rank
// picks, in this priority, the I of its oldest micro-batch whose gradient has arrived, the F of its
// next micro-batch (if fewer than pp - r await their I and Need() fits the bound), or the W of
// its oldest micro-batch past I. Transfers use the same channels as the estimator, and every
// action starts as soon as its rank is free and its inputs are there, so its timing is the
// estimator's of the list it writes (generators_test checks it): each rank's busy time and the
// end of its last action are kept for the estimate.
class ZbH1 {
 public:
  ZbH1(const ScheduleCosts& c, const std::vector<Bytes>& bound, Schedule* out)
      : c_(c),
        bound_(bound),
        out_(out),
        pp_(c.pp),
        m_(c.num_microbatches()),
        f_in_(static_cast<size_t>(m_ * pp_), kNever),
        g_in_(f_in_.size(), kNever),
        f_done_(f_in_.size(), kNever),
        next_f_(static_cast<size_t>(pp_), 0),
        next_i_(static_cast<size_t>(pp_), 0),
        next_w_(static_cast<size_t>(pp_), 0),
        held_(static_cast<size_t>(pp_), 0),
        busy_(static_cast<size_t>(pp_), 0),
        free_at_(static_cast<size_t>(pp_), 0),
        running_(static_cast<size_t>(pp_), 0),
        decide_(static_cast<size_t>(pp_), 0),
        channels_(pp_) {
    for (int64_t mb = 0; mb < m_; ++mb) {
      f_in_[Index(mb, 0)] = 0;
      g_in_[Index(mb, pp_ - 1)] = 0;
    }
  }

  std::string Run(ListTimes* times) {
    InitSchedule(c_, "zb-h1", out_);
    int64_t now = 0;
    for (int64_t r = 0; r < pp_; ++r) Decide(r, now);
    while (!heap_.empty()) {
      // Apply every event of this instant, then let the ranks it concerns choose, in rank order.
      now = heap_.front().time;
      to_decide_.clear();
      while (!heap_.empty() && heap_.front().time == now) {
        std::pop_heap(heap_.begin(), heap_.end(), Later());
        const Event e = heap_.back();
        heap_.pop_back();
        if (e.completes) Complete(e.rank, e.time);
        if (!decide_[e.rank]) to_decide_.push_back(e.rank);
        decide_[e.rank] = 1;
      }
      std::sort(to_decide_.begin(), to_decide_.end());
      for (int64_t r : to_decide_) {
        decide_[r] = 0;
        if (!running_[r]) Decide(r, now);
      }
    }
    for (int64_t r = 0; r < pp_; ++r) {
      if (next_w_[r] < m_) return Stuck(r);
    }
    if (times != nullptr) {
      times->busy.resize(static_cast<size_t>(pp_));
      times->finish.resize(static_cast<size_t>(pp_));
      for (int64_t r = 0; r < pp_; ++r) {
        times->busy[r] = Duration::Nanos(busy_[r]);
        times->finish[r] = Duration::Nanos(free_at_[r]);
      }
    }
    return "";
  }

 private:
  struct Event {
    int64_t time;
    int64_t seq;
    int64_t rank;
    bool completes;  // false: an input arrives at `rank`
  };
  struct Later {
    bool operator()(const Event& a, const Event& b) const {
      return a.time != b.time ? a.time > b.time : a.seq > b.seq;
    }
  };

  size_t Index(int64_t mb, int64_t stage) const { return static_cast<size_t>(mb * pp_ + stage); }
  void Push(int64_t time, int64_t rank, bool completes) {
    heap_.push_back(Event{time, seq_++, rank, completes});
    std::push_heap(heap_.begin(), heap_.end(), Later());
  }

  void Start(int64_t r, Action a, int64_t now) {
    out_->ranks[r].push_back(a);
    running_[r] = 1;
    const ChunkCost& c = c_.chunks[a.microbatch][a.stage];
    Duration d;
    switch (a.kind) {
      case ActionKind::kForward:
        held_[r] += c.stored.count() + c_.Held(a.microbatch, a.stage).count();
        ++next_f_[r];
        d = c.forward;
        break;
      case ActionKind::kBackwardInput:
        held_[r] -=
            c.stored.count() - c.stored_until_w.count() + c_.Held(a.microbatch, a.stage).count();
        ++next_i_[r];
        d = c.backward_input;
        break;
      default:
        held_[r] -= c.stored_until_w.count();
        ++next_w_[r];
        d = c.backward_weight;
        break;
    }
    busy_[r] += d.nanos();
    Push(now + d.nanos(), r, true);
  }

  // Hands the output of the action rank r just finished to its neighbour.
  void Complete(int64_t r, int64_t t) {
    running_[r] = 0;
    free_at_[r] = t;
    const Action& a = out_->ranks[r].back();
    if (a.kind == ActionKind::kForward) f_done_[Index(a.microbatch, a.stage)] = t;
    const auto out = ProducedBoundary(a.kind, a.stage, pp_);
    if (!out) return;
    const int64_t dst = out->to_stage;  // vpp = 1: stage s runs on rank s
    const int64_t d = c_.p2p.empty() ? 0 : c_.p2p[a.microbatch][out->boundary].nanos();
    const int64_t arrive = channels_.Arrive(r, dst, t, d);
    (out->gradient ? g_in_ : f_in_)[Index(a.microbatch, dst)] = arrive;
    if (!running_[dst]) Push(arrive, dst, false);
  }

  void Decide(int64_t r, int64_t now) {
    const int64_t i = next_i_[r];
    if (i < next_f_[r] && f_done_[Index(i, r)] <= now && g_in_[Index(i, r)] <= now) {
      return Start(r, Action{r, ActionKind::kBackwardInput, i}, now);
    }
    const int64_t f = next_f_[r];
    if (f < m_ && f_in_[Index(f, r)] <= now && f - i < pp_ - r &&
        held_[r] + Need(r, f) <= bound_[r].count()) {
      return Start(r, Action{r, ActionKind::kForward, f}, now);
    }
    if (next_w_[r] < i) return Start(r, Action{r, ActionKind::kBackwardWeight, next_w_[r]}, now);
    // Idle: wake up when the input of the next I or F arrives (inputs already announced; later
    // ones wake this rank when they are sent).
    int64_t wake = kNever;
    if (i < next_f_[r] && g_in_[Index(i, r)] > now) wake = g_in_[Index(i, r)];
    if (f < m_ && f_in_[Index(f, r)] > now) wake = std::min(wake, f_in_[Index(f, r)]);
    if (wake != kNever) Push(wake, r, false);
  }

  // Bytes the F of micro-batch f on rank r needs beside what the rank holds: its peak, and its
  // stored activations plus the largest I transient among the micro-batches awaiting their I
  // (f included), so that no I can exceed the bound later.
  int64_t Need(int64_t r, int64_t f) const {
    int64_t transient = 0;
    for (int64_t y = next_i_[r]; y <= f; ++y) {
      transient = std::max(transient, Transient(c_.chunks[y][r]));
    }
    const ChunkCost& c = c_.chunks[f][r];
    return std::max(c.peak.count(), c.stored.count() + transient) + c_.Held(f, r).count();
  }

  std::string Stuck(int64_t r) const {
    const int64_t f = next_f_[r];
    if (f < m_) {
      return fmt::format(
          "rank {} cannot run micro-batch {}: its forward needs {} (its peak, or its stored "
          "activations plus the largest backward transient still to come) beside {} held; the "
          "bound is {} (the 1F1B peak, capped by the budget)",
          r, f, FormatBytes(Bytes::Of(Need(r, f))), FormatBytes(Bytes::Of(held_[r])),
          FormatBytes(bound_[r]));
    }
    return fmt::format("rank {} stopped before the end (internal)", r);
  }

  const ScheduleCosts& c_;
  const std::vector<Bytes>& bound_;
  Schedule* out_;
  const int64_t pp_;
  const int64_t m_;
  std::vector<int64_t> f_in_, g_in_, f_done_;      // [mb * pp + stage], ns; kNever until known
  std::vector<int64_t> next_f_, next_i_, next_w_;  // per rank: next micro-batch of each kind
  std::vector<int64_t> held_;                      // per rank: activation bytes held
  std::vector<int64_t> busy_, free_at_;            // per rank: ns computing; end of its last
  std::vector<uint8_t> running_, decide_;
  std::vector<int64_t> to_decide_;  // ranks to let choose at the current instant
  TransferChannels channels_;  // the estimator's links, so its timing is the estimator's
  std::vector<Event> heap_;
  int64_t seq_ = 0;
};

}  // namespace

std::string ZbH1Order(const ScheduleCosts& costs, const std::vector<Bytes>& bound, Schedule* out,
                      ListTimes* times) {
  return ZbH1(costs, bound, out).Run(times);
}

}  // namespace sluice::schedule_internal
