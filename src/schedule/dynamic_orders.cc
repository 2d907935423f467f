#include "schedule/dynamic_orders.h"

#include "schedule/dependencies.h"

#include <fmt/core.h>

#include <algorithm>
#include <limits>
#include <utility>

namespace sluice::schedule_internal {
namespace {

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

void InitSchedule(const ScheduleCosts& c, const char* name, Schedule* out) {
  out->name = name;
  out->pp = c.pp;
  out->vpp = c.vpp;
  out->num_microbatches = c.num_microbatches();
  out->ranks.assign(static_cast<size_t>(c.pp), {});
  for (std::vector<Action>& r : out->ranks) {
    r.clear();
    r.reserve(static_cast<size_t>(3 * c.num_microbatches() * c.vpp));
  }
}

int64_t Transient(const ChunkCost& c) {
  return std::max<int64_t>(0, c.peak.count() - c.stored.count());
}

// Greedy ZB-H1 (vpp = 1, stage r on rank r): a time-ordered simulation in which every idle rank
// picks, in this priority, the I of its oldest micro-batch whose gradient has arrived, the F of its
// next micro-batch (if fewer than pp - r await their I and Need() fits the bound), or the W of
// its oldest micro-batch past I. Transfers use the same channels as the estimator, so its timing
// is the estimator's.
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
        running_(static_cast<size_t>(pp_), 0),
        decide_(static_cast<size_t>(pp_), 0),
        channels_(pp_) {
    for (int64_t mb = 0; mb < m_; ++mb) {
      f_in_[Index(mb, 0)] = 0;
      g_in_[Index(mb, pp_ - 1)] = 0;
    }
  }

  std::string Run() {
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
        held_[r] += c.stored.count();
        ++next_f_[r];
        d = c.forward;
        break;
      case ActionKind::kBackwardInput:
        held_[r] -= c.stored.count() - c.stored_until_w.count();
        ++next_i_[r];
        d = c.backward_input;
        break;
      default:
        held_[r] -= c.stored_until_w.count();
        ++next_w_[r];
        d = c.backward_weight;
        break;
    }
    Push(now + d.nanos(), r, true);
  }

  // Hands the output of the action rank r just finished to its neighbour.
  void Complete(int64_t r, int64_t t) {
    running_[r] = 0;
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
    return std::max(c.peak.count(), c.stored.count() + transient);
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
  std::vector<uint8_t> running_, decide_;
  std::vector<int64_t> to_decide_;  // ranks to let choose at the current instant
  TransferChannels channels_;  // the estimator's links, so its timing is the estimator's
  std::vector<Event> heap_;
  int64_t seq_ = 0;
};

// DynaPipe's cyclic order with a reservation throttle. In each cycle every rank takes the head of
// each of its stages' F and B queues that was ready when the cycle began, backwards first, then
// by (micro-batch, stage); outputs become ready in the next cycle. A micro-batch enters stage 0
// only if fewer than max_in_flight are in flight and, on every rank, the stored activations of
// all its chunks there, plus those reserved by the micro-batches still on that rank, plus the
// largest backward transient among them, fit the budget. A reservation lasts until the
// micro-batch's last backward on the rank, so no later F or B can exceed the budget and no rank
// ever waits for memory: the order cannot deadlock.
class Adaptive {
 public:
  Adaptive(const ScheduleCosts& c, int64_t max_in_flight, Schedule* out)
      : c_(c),
        out_(out),
        pp_(c.pp),
        stages_(c.pp * c.vpp),
        m_(c.num_microbatches()),
        cap_(max_in_flight > 0 ? max_in_flight : m_),
        need_(static_cast<size_t>(m_ * pp_), 0),
        trans_(need_.size(), 0),
        next_f_(static_cast<size_t>(stages_), 0),
        next_b_(next_f_.size(), 0),
        f_avail_(next_f_.size(), 0),
        b_avail_(next_f_.size(), 0),
        add_f_(next_f_.size(), 0),
        add_b_(next_f_.size(), 0),
        reserved_(static_cast<size_t>(pp_), 0),
        released_(static_cast<size_t>(pp_), 0) {
    for (int64_t mb = 0; mb < m_; ++mb) {
      for (int64_t s = 0; s < stages_; ++s) {
        const ChunkCost& cc = c_.chunks[mb][s];
        const size_t k = static_cast<size_t>(mb * pp_ + s % pp_);
        need_[k] += cc.stored.count();
        trans_[k] = std::max(trans_[k], Transient(cc));
      }
    }
    f_avail_[0] = m_;
  }

  std::string Run() {
    InitSchedule(c_, "adaptive", out_);
    std::vector<Action> ops;
    ops.reserve(static_cast<size_t>(2 * c_.vpp));
    while (finished_ < m_) {
      bool progress = false;
      for (int64_t r = 0; r < pp_; ++r) {
        ops.clear();
        for (int64_t s = r; s < stages_; s += pp_) {
          if (next_b_[s] < b_avail_[s]) ops.push_back({s, ActionKind::kBackward, next_b_[s]});
          if (next_f_[s] < f_avail_[s]) ops.push_back({s, ActionKind::kForward, next_f_[s]});
        }
        std::sort(ops.begin(), ops.end(), [](const Action& a, const Action& b) {
          if (a.kind != b.kind) return a.kind == ActionKind::kBackward;
          return a.microbatch != b.microbatch ? a.microbatch < b.microbatch : a.stage < b.stage;
        });
        for (const Action& a : ops) {
          if (a.kind == ActionKind::kForward && a.stage == 0 && !Admit(a.microbatch)) continue;
          Place(r, a);
          progress = true;
        }
      }
      for (int64_t s = 0; s < stages_; ++s) {
        f_avail_[s] += add_f_[s];
        b_avail_[s] += add_b_[s];
        add_f_[s] = add_b_[s] = 0;
      }
      if (!progress) return Refusal();
    }
    return "";
  }

 private:
  size_t Key(int64_t mb, int64_t r) const { return static_cast<size_t>(mb * pp_ + r); }

  // Whether micro-batch `mb` may enter now; reserves its memory when it does.
  bool Admit(int64_t mb) {
    if (entered_ - finished_ >= cap_) return false;
    for (int64_t r = 0; r < pp_; ++r) {
      if (!c_.budget.empty() && Need(mb, r) > c_.budget[r].count()) return false;
    }
    for (int64_t r = 0; r < pp_; ++r) reserved_[r] += need_[Key(mb, r)];
    ++entered_;
    return true;
  }

  // Bytes rank r would need with `mb` admitted beside the micro-batches it still holds.
  int64_t Need(int64_t mb, int64_t r) const {
    int64_t trans = trans_[Key(mb, r)];
    for (int64_t x = released_[r]; x < entered_; ++x) trans = std::max(trans, trans_[Key(x, r)]);
    return reserved_[r] + need_[Key(mb, r)] + trans;
  }

  void Place(int64_t r, const Action& a) {
    out_->ranks[r].push_back(a);
    if (a.kind == ActionKind::kForward) {
      ++next_f_[a.stage];
      ++(a.stage + 1 < stages_ ? add_f_[a.stage + 1] : add_b_[a.stage]);
      return;
    }
    ++next_b_[a.stage];
    if (a.stage > 0) ++add_b_[a.stage - 1];
    if (a.stage < pp_) {  // the micro-batch's last backward on this rank
      reserved_[r] -= need_[Key(a.microbatch, r)];
      ++released_[r];
    }
    if (a.stage == 0) ++finished_;
  }

  std::string Refusal() const {
    const int64_t mb = next_f_[0];
    for (int64_t r = 0; r < pp_; ++r) {
      if (!c_.budget.empty() && Need(mb, r) > c_.budget[r].count()) {
        return fmt::format(
            "micro-batch {} alone needs {} on rank {} (stored activations of its {} chunk(s) "
            "there plus the largest backward transient), the budget is {}",
            mb, FormatBytes(Bytes::Of(Need(mb, r))), r, c_.vpp, FormatBytes(c_.budget[r]));
      }
    }
    return fmt::format("micro-batch {} can never enter (internal)", mb);
  }

  const ScheduleCosts& c_;
  Schedule* out_;
  const int64_t pp_;
  const int64_t stages_;
  const int64_t m_;
  const int64_t cap_;
  std::vector<int64_t> need_;   // [mb * pp + rank]: stored bytes of all the micro-batch's chunks
  std::vector<int64_t> trans_;  // [mb * pp + rank]: largest backward transient there
  std::vector<int64_t> next_f_, next_b_;    // per stage: head of the F and B queues
  std::vector<int64_t> f_avail_, b_avail_;  // per stage: micro-batches whose input is ready
  std::vector<int64_t> add_f_, add_b_;      // per stage: becoming ready at the next cycle
  std::vector<int64_t> reserved_;           // per rank: bytes reserved by admitted micro-batches
  std::vector<int64_t> released_;           // per rank: micro-batches whose reservation ended there
  int64_t entered_ = 0;
  int64_t finished_ = 0;
};

}  // namespace

std::string ZbH1Order(const ScheduleCosts& costs, const std::vector<Bytes>& bound, Schedule* out) {
  return ZbH1(costs, bound, out).Run();
}

std::string AdaptiveOrder(const ScheduleCosts& costs, int64_t max_in_flight, Schedule* out) {
  return Adaptive(costs, max_in_flight, out).Run();
}

}  // namespace sluice::schedule_internal
