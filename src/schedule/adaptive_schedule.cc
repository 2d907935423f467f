// DynaPipe's adaptive schedule: the memory-throttled cyclic order (generators.h,
// schedule/cost_driven_orders.h).
#include "schedule/cost_driven_orders.h"

#include <fmt/core.h>

#include <algorithm>
#include <utility>

namespace sluice::schedule_internal {
namespace {

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
        need_[k] += cc.stored.count() + c_.Held(mb, s).count();
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

std::string AdaptiveOrder(const ScheduleCosts& costs, int64_t max_in_flight, Schedule* out) {
  return Adaptive(costs, max_in_flight, out).Run();
}

}  // namespace sluice::schedule_internal
