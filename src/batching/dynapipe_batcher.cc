#include "batching/dynapipe_batcher.h"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <limits>
#include <queue>
#include <unordered_map>
#include <utility>

namespace sluice {
namespace {

constexpr int64_t kInf = std::numeric_limits<int64_t>::max();
using Wide = __int128;  // scaled objectives: (S-1) D t_max + C sum, exact

// Appends the row of runs starting at a sample: `time_of(d, l)` is the bottleneck time (ns) of
// the run of d samples at levels[l], or kInf when it does not fit; d grows by one, and a level
// that stopped fitting is not asked again. Returns the row's length.
template <typename TimeOf>
int64_t PriceRow(std::span<const Recompute> levels, int64_t max_d, TimeOf time_of,
                 SplitCandidates* c) {
  bool alive[3] = {true, true, true};
  const int64_t begin = static_cast<int64_t>(c->time_ns.size());
  int64_t d = 1;
  for (; d <= max_d; ++d) {
    int64_t best = kInf;
    Recompute best_rc = levels[0];
    for (size_t l = 0; l < levels.size(); ++l) {
      if (!alive[l]) continue;
      const int64_t t = time_of(d, l);
      if (t == kInf) {
        alive[l] = false;  // shapes only grow along a row: it stays infeasible
      } else if (t < best) {
        best = t;
        best_rc = levels[l];
      }
    }
    if (best == kInf) break;
    c->time_ns.push_back(best);
    c->recompute.push_back(best_rc);
  }
  const int64_t len = d - 1;
  c->suffix_min.resize(c->time_ns.size());
  int64_t m = kInf;
  for (int64_t k = begin + len - 1; k >= begin; --k) {
    m = std::min(m, c->time_ns[k]);
    c->suffix_min[k] = m;
  }
  return len;
}

// Bottleneck time of one padded shape at one level, kInf when infeasible.
int64_t ShapeTime(const StageCostEvaluator& eval, const LayerShape& shape, Recompute rc) {
  const CostSummary s = eval.Summarize(shape, rc, eval.pp());
  return s.feasible ? s.bottleneck.nanos() : kInf;
}

// Memoised ShapeTime for the general (encoder-decoder) path, where runs from different starts
// reach the same padded (enc, dec) maxima: per (enc, dec), per micro-batch size, per level.
class ShapeCache {
 public:
  static constexpr int64_t kUnknown = -1;
  // The entries of (enc, dec); index d - 1, level l.
  std::vector<std::array<int64_t, 3>>* Row(int64_t enc, int64_t dec) {
    return &rows_[static_cast<uint64_t>(enc) << 32 | static_cast<uint64_t>(dec)];
  }
  static int64_t& At(std::vector<std::array<int64_t, 3>>* row, int64_t d, size_t l) {
    if (static_cast<int64_t>(row->size()) < d) {
      row->resize(static_cast<size_t>(d), {kUnknown, kUnknown, kUnknown});
    }
    return (*row)[static_cast<size_t>(d - 1)][l];
  }

 private:
  std::unordered_map<uint64_t, std::vector<std::array<int64_t, 3>>> rows_;
};

// The constrained DP: least sum of run times with every run <= t_max; among equal sums the
// smallest largest run; among those the first split point found (smallest start).
class ConstrainedDp {
 public:
  explicit ConstrainedDp(const SplitCandidates& c)
      : c_(c), sum_(c.n + 1), max_(c.n + 1), parent_(c.n + 1) {}

  // False when no split keeps every run <= t_max.
  bool Run(int64_t t_max) {
    const int64_t n = c_.n;
    std::fill(sum_.begin(), sum_.end(), kInf);
    sum_[0] = 0;
    max_[0] = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t fi = sum_[i];
      const int64_t len = c_.row_len[i];
      if (fi == kInf || len == 0) continue;
      const int64_t mi = max_[i];
      const int64_t* t = c_.time_ns.data() + c_.row_begin[i];
      const int64_t* suf = c_.suffix_min.data() + c_.row_begin[i];
      // Suffix minima are non-decreasing: entries that can be <= t_max form a prefix.
      const int64_t lim = std::upper_bound(suf, suf + len, t_max) - suf;
      for (int64_t d = 1; d <= lim; ++d) {
        const int64_t td = t[d - 1];
        if (td > t_max) continue;
        const int64_t v = fi + td;
        const int64_t j = i + d;
        if (v < sum_[j] || (v == sum_[j] && std::max(mi, td) < max_[j])) {
          sum_[j] = v;
          max_[j] = std::max(mi, td);
          parent_[j] = i;
        }
      }
    }
    return sum_[n] != kInf;
  }
  int64_t sum() const { return sum_[c_.n]; }
  int64_t max() const { return max_[c_.n]; }
  std::vector<int64_t> Ends() const {
    std::vector<int64_t> ends;
    for (int64_t j = c_.n; j > 0; j = parent_[j]) ends.push_back(j);
    std::reverse(ends.begin(), ends.end());
    return ends;
  }

 private:
  const SplitCandidates& c_;
  std::vector<int64_t> sum_;
  std::vector<int64_t> max_;
  std::vector<int64_t> parent_;
};

// An interval [lo, hi] of t_max indices whose G values are all >= g_lb, keyed by its bound.
struct Interval {
  Wide bound;
  int64_t lo;
  int64_t hi;
  int64_t g_lb;
};
struct IntervalAfter {
  bool operator()(const Interval& a, const Interval& b) const {
    if (a.bound != b.bound) return a.bound > b.bound;
    return a.lo > b.lo;
  }
};

}  // namespace

int64_t SplitCandidates::num_candidates() const {
  int64_t total = 0;
  for (int64_t len : row_len) total += len;
  return total;
}

double SplitObjective::Value(Duration t_max, Duration sum) const {
  return static_cast<double>(stages - 1) / static_cast<double>(chunks) * t_max.millis() +
         sum.millis() / static_cast<double>(replicas);
}

SplitCandidates BuildSplitCandidates(std::span<const Sample> ordered,
                                     const StageCostEvaluator& eval,
                                     const std::optional<Recompute>& fixed) {
  const int64_t n = static_cast<int64_t>(ordered.size());
  SplitCandidates c;
  c.n = n;
  c.row_begin.assign(static_cast<size_t>(n), 0);
  c.row_len.assign(static_cast<size_t>(n), 0);
  std::vector<Recompute> levels;
  if (fixed) {
    levels = {*fixed};
  } else {
    levels = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
  }
  const bool encdec = eval.model().is_encoder_decoder();
  bool sorted = !encdec;
  for (int64_t i = 1; i < n && sorted; ++i) {
    sorted = eval.SeqLen(ordered[i]) <= eval.SeqLen(ordered[i - 1]);
  }
  if (sorted) {
    // A run starting at i is padded to i's length: starts with the same padded length share a row.
    for (int64_t i = 0; i < n;) {
      const int64_t pad = eval.Pad(std::max<int64_t>(1, eval.SeqLen(ordered[i])));
      int64_t g = i + 1;
      while (g < n && eval.Pad(std::max<int64_t>(1, eval.SeqLen(ordered[g]))) == pad) ++g;
      const int64_t begin = static_cast<int64_t>(c.time_ns.size());
      const int64_t len = PriceRow(
          levels, n - i,
          [&](int64_t d, size_t l) {
            return ShapeTime(eval, {d, pad, 0}, levels[l]);
          },
          &c);
      for (int64_t k = i; k < g; ++k) {
        c.row_begin[k] = begin;
        c.row_len[k] = std::min(len, n - k);
      }
      i = g;
    }
    return c;
  }
  ShapeCache cache;
  for (int64_t i = 0; i < n; ++i) {
    int64_t max_enc = 1;
    int64_t max_dec = 1;
    int64_t at = 0;  // the run length the maxima cover
    LayerShape shape;
    std::vector<std::array<int64_t, 3>>* row = nullptr;
    c.row_begin[i] = static_cast<int64_t>(c.time_ns.size());
    c.row_len[i] = PriceRow(
        levels, n - i,
        [&](int64_t d, size_t l) {
          if (d != at) {
            const Sample& s = ordered[i + d - 1];
            const int64_t enc = eval.Pad(std::max(max_enc, eval.SeqLen(s)));
            const int64_t dec = encdec ? eval.Pad(std::max(max_dec, eval.DecLen(s))) : 0;
            max_enc = std::max(max_enc, eval.SeqLen(s));
            max_dec = std::max(max_dec, eval.DecLen(s));
            if (row == nullptr || enc != shape.seqlen || dec != shape.dec_seqlen) {
              row = cache.Row(enc, dec);
            }
            shape = LayerShape{d, enc, dec};
            at = d;
          }
          int64_t& t = ShapeCache::At(row, d, l);
          if (t == ShapeCache::kUnknown) t = ShapeTime(eval, shape, levels[l]);
          return t;
        },
        &c);
  }
  return c;
}

SplitSolution SolveConsecutiveSplit(const SplitCandidates& candidates,
                                    const SplitObjective& objective, Duration thinning) {
  SplitSolution out;
  if (candidates.n == 0) {
    out.feasible = true;
    return out;
  }
  const Wide a = static_cast<Wide>(objective.stages - 1) * objective.replicas;
  const Wide b = objective.chunks;
  auto scaled = [&](int64_t t_max, int64_t sum) { return a * t_max + b * sum; };
  ConstrainedDp dp(candidates);
  // Unconstrained: the least sum G_inf, reached with t* as its largest run. Larger t_max values
  // cannot do better.
  ++out.dp_runs;
  if (!dp.Run(kInf)) return out;
  const int64_t g_inf = dp.sum();
  int64_t best_t = dp.max();
  Wide best = scaled(best_t, g_inf);
  // The distinct run times up to t*, ascending, optionally thinned.
  std::vector<int64_t> values;
  values.reserve(candidates.time_ns.size());
  for (int64_t t : candidates.time_ns) {
    if (t <= best_t) values.push_back(t);
  }
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  if (thinning > Duration::Zero() && values.size() > 2) {
    std::vector<int64_t> kept = {values.front()};
    for (size_t k = 1; k + 1 < values.size(); ++k) {
      if (values[k] - kept.back() >= thinning.nanos()) kept.push_back(values[k]);
    }
    kept.push_back(values.back());
    values = std::move(kept);
  }
  out.tmax_values = static_cast<int64_t>(values.size());
  auto index_of = [&](int64_t t) {
    return static_cast<int64_t>(std::lower_bound(values.begin(), values.end(), t) - values.begin());
  };
  std::priority_queue<Interval, std::vector<Interval>, IntervalAfter> queue;
  auto push = [&](int64_t lo, int64_t hi, int64_t g_lb) {
    if (lo > hi) return;
    const Wide bound = scaled(values[lo], g_lb);
    if (bound < best) queue.push(Interval{bound, lo, hi, g_lb});
  };
  push(0, index_of(best_t) - 1, g_inf);
  while (!queue.empty()) {
    const Interval iv = queue.top();
    queue.pop();
    if (iv.bound >= best) break;  // every remaining interval is bounded at least as high
    const int64_t mid = iv.lo + (iv.hi - iv.lo) / 2;
    ++out.dp_runs;
    if (!dp.Run(values[mid])) {
      push(mid + 1, iv.hi, iv.g_lb);  // smaller t_max values are infeasible too
      continue;
    }
    const int64_t g = dp.sum();
    const int64_t t_star = dp.max();  // G is constant on [t*, values[mid]]
    const Wide obj = scaled(t_star, g);
    if (obj < best) {
      best = obj;
      best_t = t_star;
    }
    push(iv.lo, std::min(index_of(t_star), mid) - 1, g);
    push(mid + 1, iv.hi, iv.g_lb);
  }
  ++out.dp_runs;
  const bool ok = dp.Run(best_t);
  SLUICE_CHECK(ok);
  out.feasible = true;
  out.ends = dp.Ends();
  out.sum = Duration::Nanos(dp.sum());
  out.t_max = Duration::Nanos(dp.max());
  out.objective_ms = objective.Value(out.t_max, out.sum);
  return out;
}

bool RaiseRecomputeToFit(const StageCostEvaluator& eval, const BatchIndex& index,
                         const std::optional<Recompute>& fixed,
                         std::vector<MicroBatch>* micro_batches, std::string* reason) {
  for (const MicroBatch& mb : *micro_batches) {
    if (static_cast<int64_t>(mb.stages.size()) != eval.pp()) {
      *reason = CheckSequenceMemory(eval, *micro_batches);  // names the malformed one
      return false;
    }
  }
  std::vector<char> stuck(micro_batches->size(), 0);
  for (;;) {
    const std::optional<MemoryViolation> v = FindMemoryViolation(eval, *micro_batches);
    if (!v) return true;
    int64_t pick = -1;
    if (!fixed) {
      for (int64_t i = v->begin; i < v->end; ++i) {
        const MicroBatch& mb = (*micro_batches)[i];
        if (stuck[i] || mb.recompute == Recompute::kFull) continue;
        if (pick < 0 || mb.stages[v->stage].stored > (*micro_batches)[pick].stages[v->stage].stored) {
          pick = i;
        }
      }
    }
    if (pick < 0) {
      *reason = CheckSequenceMemory(eval, *micro_batches);
      return false;
    }
    MicroBatch& mb = (*micro_batches)[pick];
    bool raised = false;
    for (int r = static_cast<int>(mb.recompute) + 1; r <= 2 && !raised; ++r) {
      MicroBatch trial = mb;
      trial.recompute = static_cast<Recompute>(r);
      if (PriceMicroBatch(eval, index, &trial)) {
        mb = std::move(trial);
        raised = true;
      }
    }
    if (!raised) stuck[pick] = 1;
  }
}

namespace {

// Why a sample cannot form a micro-batch even alone.
std::string AloneReason(const Sample& s, const StageCostEvaluator& eval,
                        const std::optional<Recompute>& fixed) {
  const bool encdec = eval.model().is_encoder_decoder();
  const LayerShape shape{1, eval.Pad(std::max<int64_t>(1, eval.SeqLen(s))),
                         encdec ? eval.Pad(std::max<int64_t>(1, eval.DecLen(s))) : 0};
  std::string detail = "the cost model has no answer for that shape";
  double least = -1;
  for (int r = 0; r < 3; ++r) {
    const Recompute rc = static_cast<Recompute>(r);
    if (fixed && *fixed != rc) continue;
    const CostSummary c = eval.Summarize(shape, rc, eval.pp());
    if (c.memory_load > 0 && (least < 0 || c.memory_load < least)) {
      least = c.memory_load;
      detail = fmt::format(
          "at best (recompute {}) it needs {:.2f}x the activation budget with "
          "{} micro-batches in flight on stage 0",
          RecomputeName(rc), c.memory_load, eval.InFlight(0, eval.pp()));
    }
  }
  return fmt::format("sample id {} ({}x{}{} tokens padded) does not fit on its own: {}", s.id,
                     shape.mbs, shape.seqlen, encdec ? fmt::format("+{}", shape.dec_seqlen) : "",
                     detail);
}

class DynaPipeBatcher final : public MicroBatcher {
 public:
  explicit DynaPipeBatcher(const DynaPipeOptions& options) : options_(options) {}
  std::string_view name() const override { return "dynapipe"; }

  StatusOr<ReplicaBatches> Build(std::span<const Sample> samples, const StageCostEvaluator& eval,
                                 const BatchingOptions& options, int64_t replicas) const override {
    if (replicas < 1) {
      return InvalidArgumentError(fmt::format("dynapipe: replicas must be >= 1, got {}", replicas));
    }
    if (options.tmax_thinning < Duration::Zero()) {
      return InvalidArgumentError("dynapipe: tmax_thinning must be >= 0");
    }
    ReplicaBatches out;
    if (samples.empty()) return out;
    const std::vector<int64_t> order = OrderSamples(samples, eval, options_.order, options_.tsp);
    std::vector<Sample> ordered;
    ordered.reserve(order.size());
    for (int64_t i : order) ordered.push_back(samples[i]);
    const SplitCandidates cand = BuildSplitCandidates(ordered, eval, options.recompute);
    for (int64_t i = 0; i < cand.n; ++i) {
      if (cand.row_len[i] == 0) {
        out.outcome = PlanOutcome::kOutOfMemory;
        out.infeasible_reason = AloneReason(ordered[i], eval, options.recompute);
        return out;
      }
    }
    const SplitObjective objective{eval.pp(), eval.parallel().vpp, replicas};
    const SplitSolution sol = SolveConsecutiveSplit(cand, objective, options.tmax_thinning);
    if (!sol.feasible) {
      return InternalError("dynapipe: every sample fits alone but the split DP found no split");
    }
    const BatchIndex index(samples);
    int64_t begin = 0;
    for (int64_t end : sol.ends) {
      MicroBatch mb;
      for (int64_t k = begin; k < end; ++k) mb.rows.push_back({ordered[k].id});
      mb.recompute = cand.RecomputeOf(begin, end - begin);
      if (!PriceMicroBatch(eval, index, &mb)) {
        return InternalError(
            fmt::format("dynapipe: micro-batch of samples {}..{} priced by the "
                        "DP has no cost",
                        begin, end - 1));
      }
      out.micro_batches.push_back(std::move(mb));
      begin = end;
    }
    if (replicas == 1) {
      std::string reason;
      if (!RaiseRecomputeToFit(eval, index, options.recompute, &out.micro_batches, &reason)) {
        out.outcome = PlanOutcome::kOutOfMemory;
        out.infeasible_reason = "dynapipe: " + reason;
        out.micro_batches.clear();
      }
    }
    return out;
  }

 private:
  DynaPipeOptions options_;
};

}  // namespace

std::unique_ptr<MicroBatcher> MakeDynaPipeBatcher() {
  return std::make_unique<DynaPipeBatcher>(DynaPipeOptions{});
}

std::unique_ptr<MicroBatcher> MakeDynaPipeBatcher(const DynaPipeOptions& options) {
  return std::make_unique<DynaPipeBatcher>(options);
}

}  // namespace sluice
