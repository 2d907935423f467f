// Hydraulis stage 2 (hydraulis.h): a replica's sequences packed into balanced varlen
// micro-batches, the micro-batch count v and the recompute levels chosen by the 1F1B objective.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <string>
#include <utility>

#include "batching/assigners.h"
#include "batching/baseline_search.h"
#include "batching/baselines.h"
#include "batching/hydraulis.h"
#include "batching/micro_batch.h"

namespace sluice {
namespace {

// Sequence lengths of a varlen micro-batch: `enc` the (encoder or only) lengths, `dec` the
// decoder lengths of encoder-decoder samples (empty for decoder-only models).
struct VarlenLengths {
  std::vector<int64_t> enc;
  std::vector<int64_t> dec;
};

CostSummary SummarizeLengths(const StageCostEvaluator& eval, const VarlenLengths& l, Recompute rc,
                             int64_t num_micro_batches) {
  return eval.model().is_encoder_decoder()
             ? eval.SummarizeVarlen(l.enc, l.dec, rc, num_micro_batches)
             : eval.SummarizeVarlen(l.enc, rc, num_micro_batches);
}

// The tokens a sample adds to a varlen micro-batch: its length, plus its target for
// encoder-decoder models (both rows grow).
int64_t PackedTokens(const StageCostEvaluator& eval, const Sample& s) {
  return eval.SeqLen(s) + eval.DecLen(s);
}

// The most memory-hungry composition of `tokens` tokens out of sequences no longer than
// `longest`: as many sequences of `longest` as fit, then the rest (memory per sequence is
// convex in its length, so concentrating tokens in long sequences needs the most).
// Encoder-decoder: copies of `widest` (the sample with the most tokens, `longest` = its input +
// target), the rest split in its proportions (at least one token a side).
VarlenLengths WorstComposition(int64_t tokens, int64_t longest, const StageCostEvaluator& eval,
                               const Sample& widest) {
  VarlenLengths out;
  const int64_t copies = tokens / longest, rest = tokens % longest;
  if (!eval.model().is_encoder_decoder()) {
    out.enc.assign(static_cast<size_t>(copies), longest);
    if (rest > 0) out.enc.push_back(rest);
    return out;
  }
  const int64_t enc = eval.SeqLen(widest), dec = eval.DecLen(widest);
  out.enc.assign(static_cast<size_t>(copies), enc);
  out.dec.assign(static_cast<size_t>(copies), dec);
  if (rest > 0) {
    const int64_t rest_enc = std::max<int64_t>(1, rest * enc / longest);
    out.enc.push_back(rest_enc);
    out.dec.push_back(std::max<int64_t>(1, rest - rest_enc));
  }
  return out;
}

// Whether the worst composition of `tokens` tokens out of sequences no longer than `longest`
// (WorstComposition) fits the memory rule at level rc with v micro-batches in flight: a pure
// function of (tokens, rc, the in-flight counts of v), each asked once. A replica's token cappers
// share one: their binary searches probe the same token counts until their answers part.
class FitsMemo {
 public:
  FitsMemo(const StageCostEvaluator& eval, int64_t longest, const Sample& widest)
      : eval_(eval), longest_(longest), widest_(widest) {}

  bool Fits(int64_t tokens, Recompute rc, int64_t v) {
    const std::array<int64_t, 3> key{tokens, static_cast<int64_t>(rc), InFlightId(v)};
    auto it = memo_.find(key);
    if (it != memo_.end()) return it->second;
    const VarlenLengths lengths = WorstComposition(tokens, longest_, eval_, widest_);
    const bool fits = SummarizeLengths(eval_, lengths, rc, v).feasible;
    memo_.emplace(key, fits);
    return fits;
  }

  // A number per distinct vector of in-flight counts (eval.InFlight(s, v) for every stage s):
  // equal for two v exactly when their vectors are.
  int64_t InFlightId(int64_t v) {
    auto known = id_of_v_.find(v);
    if (known != id_of_v_.end()) return known->second;
    std::vector<int64_t> counts;
    for (int64_t s = 0; s < eval_.pp(); ++s) counts.push_back(eval_.InFlight(s, v));
    auto at = std::find(vectors_.begin(), vectors_.end(), counts);
    const int64_t id = at - vectors_.begin();
    if (at == vectors_.end()) vectors_.push_back(std::move(counts));
    id_of_v_.emplace(v, id);
    return id;
  }

 private:
  const StageCostEvaluator& eval_;
  int64_t longest_;
  Sample widest_;
  std::map<std::array<int64_t, 3>, bool> memo_;  // (tokens, level, InFlightId) -> fits
  std::map<int64_t, int64_t> id_of_v_;
  std::vector<std::vector<int64_t>> vectors_;  // [InFlightId] the in-flight counts
};

// S_cap(v): the most tokens a varlen micro-batch may hold so that any composition of sequences
// no longer than `longest` fits the memory rule with v micro-batches in flight, at some allowed
// recompute level (the most memory-saving one, in practice).
// Memoised by the in-flight counts (1F1B: the same for every v >= pp).
class TokenCapper {
 public:
  // `fits`: the replica's FitsMemo (of the same `longest`); it outlives the capper.
  TokenCapper(const StageCostEvaluator& eval, std::vector<Recompute> levels, int64_t longest,
              int64_t total, FitsMemo* fits)
      : eval_(eval), levels_(std::move(levels)), longest_(longest), total_(total), fits_(fits) {}

  // 0 when even one sequence of `longest` breaks the rule; at most `total`.
  int64_t Cap(int64_t v) {
    const int64_t key = fits_->InFlightId(v);
    auto it = memo_.find(key);
    if (it != memo_.end()) return it->second;
    int64_t cap = 0;
    if (Fits(longest_, v)) {
      int64_t good = longest_, bad = total_ + 1;
      if (Fits(total_, v))
        good = total_;
      else
        bad = total_;
      while (bad - good > 1) {
        const int64_t mid = good + (bad - good) / 2;
        if (Fits(mid, v))
          good = mid;
        else
          bad = mid;
      }
      cap = good;
    }
    memo_.emplace(key, cap);
    return cap;
  }

 private:
  bool Fits(int64_t tokens, int64_t v) const {
    return std::any_of(levels_.begin(), levels_.end(),
                       [&](Recompute rc) { return fits_->Fits(tokens, rc, v); });
  }

  const StageCostEvaluator& eval_;
  std::vector<Recompute> levels_;
  int64_t longest_;
  int64_t total_;
  FitsMemo* fits_;
  std::map<int64_t, int64_t> memo_;  // by the FitsMemo's InFlightId of v
};

int64_t MaxStored(const MicroBatch& mb) {
  Bytes m;
  for (const ChunkCost& c : mb.stages) m = std::max(m, c.stored);
  return m.count();
}

// A partition's non-empty bins as varlen micro-batches to be: sample positions (longest
// first), their lengths, and their partition loads.
struct PackedBins {
  std::vector<std::vector<int64_t>> bins;
  std::vector<VarlenLengths> lengths;
  std::vector<size_t> by_load;  // bin indices, heaviest partition load first
  int64_t m = 0;                // non-empty bins
};

PackedBins BinsOf(std::span<const Sample> samples, std::span<const PartitionItem> items,
                  const StageCostEvaluator& eval, const Partition& part, int64_t v) {
  PackedBins p;
  p.bins.resize(static_cast<size_t>(v));
  for (size_t i = 0; i < samples.size(); ++i) {
    p.bins[part.bin[i]].push_back(static_cast<int64_t>(i));
  }
  std::erase_if(p.bins, [](const std::vector<int64_t>& b) { return b.empty(); });
  p.m = static_cast<int64_t>(p.bins.size());
  const bool encdec = eval.model().is_encoder_decoder();
  p.lengths.resize(p.bins.size());
  std::vector<int64_t> load(p.bins.size(), 0);
  for (size_t b = 0; b < p.bins.size(); ++b) {
    std::vector<int64_t>& bin = p.bins[b];
    std::stable_sort(bin.begin(), bin.end(), [&](int64_t x, int64_t y) {
      return eval.SeqLen(samples[x]) > eval.SeqLen(samples[y]);
    });
    for (int64_t i : bin) {
      p.lengths[b].enc.push_back(eval.SeqLen(samples[i]));
      if (encdec) p.lengths[b].dec.push_back(eval.DecLen(samples[i]));
      load[b] += items[i].cost;
    }
  }
  p.by_load.resize(p.bins.size());
  std::iota(p.by_load.begin(), p.by_load.end(), 0);
  std::stable_sort(p.by_load.begin(), p.by_load.end(),
                   [&](size_t x, size_t y) { return load[x] > load[y]; });
  return p;
}

// Bin b at every level: the least bottleneck of the levels at which it could be part of a
// sequence that fits (its peak and buffers within every stage's budget; a level whose lookup
// fails counts as zero; Infinite: none) and the fastest level whose memory rule holds alone with
// m in flight (the last level when none).
struct BinLevels {
  Duration floor = Duration::Infinite();
  size_t fastest = 0;
};
BinLevels LevelsOf(const StageCostEvaluator& eval, const PackedBins& p, size_t b,
                   const std::vector<Recompute>& levels) {
  BinLevels out{Duration::Infinite(), levels.size() - 1};
  Duration fastest = Duration::Infinite();
  for (size_t l = 0; l < levels.size(); ++l) {
    const CostSummary s = SummarizeLengths(eval, p.lengths[b], levels[l], p.m);
    if (s.memory_load_alone <= 1.0) out.floor = std::min(out.floor, s.bottleneck);
    if (s.feasible && s.bottleneck < fastest) {
      fastest = s.bottleneck;
      out.fastest = l;
    }
  }
  return out;
}

// `t` x `slots`; Infinite stays Infinite.
Duration TimesSlots(Duration t, int64_t slots) { return t.is_infinite() ? t : t * slots; }

// A lower bound on the objective of any micro-batches made of `p`: every micro-batch ends at one
// of `levels`, so its bottleneck is at least its bin's floor (LevelsOf), and Objective at least
// the largest floor times (pp - 1 + m). This one uses the heaviest bin only.
// `*heaviest`: that bin's LevelsOf, which Materialize reuses.
Duration HeaviestBinBound(const StageCostEvaluator& eval, const PackedBins& p,
                          const std::vector<Recompute>& levels, BinLevels* heaviest) {
  *heaviest = LevelsOf(eval, p, p.by_load.front(), levels);
  return TimesSlots(heaviest->floor, eval.pp() - 1 + p.m);
}

// What Materialize made of a partition.
enum class Materialized {
  kOk,       // `out` holds the priced micro-batches
  kFailed,   // pricing failed, or even the heaviest levels overflow
  kBounded,  // it cannot beat the incumbent: not built
};

// Turns a partition's bins into priced varlen micro-batches in descending order of real tokens:
// each at the fastest allowed level whose memory rule holds alone with m in flight, then raised
// one level at a time (largest stored activations first) until the sequence passes
// CheckSequenceMemory, then lowered where a lighter level is faster and the sequence still
// passes. Before pricing anything it bounds the objective bin by bin, heaviest first (as
// HeaviestBinBound, over the bins seen so far), and stops with kBounded as soon as the bound
// shows it cannot beat `incumbent` (Infinite: nothing yet): above it, or equal to it when
// `ties_win` is false; `*bound` is then that bound.
Materialized Materialize(const PackedBins& p, std::span<const Sample> samples,
                         const StageCostEvaluator& eval, const BatchIndex& index,
                         const std::vector<Recompute>& levels, const BinLevels& heaviest,
                         Duration incumbent, bool ties_win, std::vector<MicroBatch>* out,
                         Duration* bound) {
  std::vector<size_t> level_of(p.bins.size(), levels.size() - 1);
  Duration slowest_floor = Duration::Zero();
  for (size_t b : p.by_load) {
    const BinLevels l = b == p.by_load.front() ? heaviest : LevelsOf(eval, p, b, levels);
    if (l.floor.is_infinite()) return Materialized::kFailed;  // no level can fit in a sequence
    level_of[b] = l.fastest;
    slowest_floor = std::max(slowest_floor, l.floor);
    *bound = TimesSlots(slowest_floor, eval.pp() - 1 + p.m);
    if (!incumbent.is_infinite() && (*bound > incumbent || (*bound == incumbent && !ties_win))) {
      return Materialized::kBounded;
    }
  }
  std::vector<MicroBatch> mbs;
  for (size_t b = 0; b < p.bins.size(); ++b) {
    MicroBatch mb;
    mb.varlen = true;
    mb.rows.emplace_back();
    for (int64_t i : p.bins[b]) mb.rows[0].push_back(samples[i].id);
    mb.recompute = levels[level_of[b]];
    if (!PriceMicroBatch(eval, index, &mb)) return Materialized::kFailed;
    mbs.push_back(std::move(mb));
  }
  std::vector<size_t> order(mbs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return mbs[x].real_tokens > mbs[y].real_tokens; });
  out->clear();
  std::vector<size_t> levels_in_order;
  for (size_t j : order) {
    out->push_back(std::move(mbs[j]));
    levels_in_order.push_back(level_of[j]);
  }
  while (!SequenceFitsMemory(eval, *out)) {
    int64_t raise = -1;
    for (size_t j = 0; j < out->size(); ++j) {
      if (levels_in_order[j] + 1 >= levels.size()) continue;
      if (raise < 0 || MaxStored((*out)[j]) > MaxStored((*out)[raise])) {
        raise = static_cast<int64_t>(j);
      }
    }
    if (raise < 0) return Materialized::kFailed;
    MicroBatch& mb = (*out)[raise];
    mb.recompute = levels[++levels_in_order[raise]];
    if (!PriceMicroBatch(eval, index, &mb)) return Materialized::kFailed;
  }
  // Raising is greedy; lower again every micro-batch that can run faster at a lighter level
  // while the sequence still fits, until none can.
  for (bool lowered = true; lowered;) {
    lowered = false;
    for (size_t j = 0; j < out->size(); ++j) {
      for (size_t l = 0; l < levels_in_order[j]; ++l) {
        MicroBatch trial = (*out)[j];
        trial.recompute = levels[l];
        if (!PriceMicroBatch(eval, index, &trial) || trial.Bottleneck() >= (*out)[j].Bottleneck()) {
          continue;
        }
        std::swap((*out)[j], trial);
        if (SequenceFitsMemory(eval, *out)) {
          levels_in_order[j] = l;
          lowered = true;
          break;
        }
        std::swap((*out)[j], trial);
      }
    }
  }
  return Materialized::kOk;
}

Duration Objective(std::span<const MicroBatch> mbs, int64_t pp) {
  Duration worst = Duration::Zero();
  for (const MicroBatch& mb : mbs) worst = std::max(worst, mb.Bottleneck());
  return worst * (pp - 1 + static_cast<int64_t>(mbs.size()));
}

}  // namespace

std::vector<int64_t> MicroBatchCounts(int64_t v_min, int64_t v_max) {
  SLUICE_CHECK(1 <= v_min && v_min <= v_max);
  std::vector<int64_t> counts;
  if (v_max - v_min + 1 <= kMaxMicroBatchCounts) {
    for (int64_t v = v_min; v <= v_max; ++v) counts.push_back(v);
    return counts;
  }
  const double ratio = std::pow(static_cast<double>(v_max) / static_cast<double>(v_min),
                                1.0 / static_cast<double>(kMaxMicroBatchCounts - 1));
  double x = static_cast<double>(v_min);
  for (int64_t k = 0; k < kMaxMicroBatchCounts; ++k, x *= ratio) {
    // Never fewer than one step per value, never past v_max, always ending at v_max.
    const int64_t remaining = kMaxMicroBatchCounts - 1 - k;
    int64_t v = std::max<int64_t>(counts.empty() ? v_min : counts.back() + 1, std::llround(x));
    v = std::min(v, v_max - remaining);
    if (k == kMaxMicroBatchCounts - 1) v = v_max;
    counts.push_back(v);
  }
  return counts;
}

StatusOr<ReplicaBatches> HydraulisPackReplica(std::span<const Sample> samples,
                                              const StageCostEvaluator& eval,
                                              const BatchingOptions& options,
                                              HydraulisPackDetail* detail) {
  if (!eval.varlen_supported()) {
    return InvalidArgumentError(fmt::format(
        "hydraulis needs varlen (per-sample attention) costs, which the cost model '{}' could not "
        "provide for model '{}'",
        eval.cost_model().Describe(), eval.model().name));
  }
  SLUICE_RETURN_IF_ERROR(CheckSampleLengths(samples, eval, options).status());
  HydraulisPackDetail local;
  HydraulisPackDetail& d = detail ? *detail : local;
  const bool exhaustive = d.exhaustive;
  d = HydraulisPackDetail{};
  d.exhaustive = exhaustive;
  if (samples.empty()) return ReplicaBatches{};

  const std::vector<Recompute> levels = RecomputeLevels(options);
  // f(s) at the fastest allowed level that has a fit.
  StageCostEvaluator::Quadratic q;
  for (Recompute rc : levels) {
    q = eval.BottleneckQuadratic(rc);
    if (q.a > 0 || q.b > 0) break;
  }
  // Encoder-decoder models have no quadratic fit: f(s) is the sample's share of a padded
  // micro-batch of copies of it (EstimateSampleCosts), at the fastest allowed level.
  const bool encdec = eval.model().is_encoder_decoder();
  std::vector<int64_t> pair_cost;
  if (encdec) {
    BatchingOptions at_level = options;
    at_level.recompute = levels.front();
    pair_cost = EstimateSampleCosts(samples, eval, at_level);
  }
  std::vector<PartitionItem> items;
  int64_t longest = 0;
  size_t longest_at = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    const int64_t s = PackedTokens(eval, samples[i]);
    const double len = static_cast<double>(eval.SeqLen(samples[i]));
    const int64_t f = encdec ? pair_cost[i] : Duration::Millis(q.a * len * len + q.b * len).nanos();
    items.push_back({std::max<int64_t>(0, f), s});
    d.total_tokens += s;
    if (s > longest) {
      longest = s;
      longest_at = i;
    }
  }
  const int64_t n = static_cast<int64_t>(items.size());
  // U = c / b: below it a micro-batch spends more time on its fixed cost than on its tokens.
  // It only bounds the search (v_max); the objective itself charges c per micro-batch.
  d.utilization_len =
      q.b > 0 && q.c > 0 ? std::max<int64_t>(1, static_cast<int64_t>(std::ceil(q.c / q.b))) : 1;

  const BatchIndex index(samples);
  const PartitionOrders orders = OrdersOf(items);
  FitsMemo fits(eval, longest, samples[longest_at]);
  TokenCapper capper(eval, levels, longest, d.total_tokens, &fits);
  int64_t v_fail = 0;  // the first v whose cap is below the longest sequence
  for (int64_t v = 1; v <= n; ++v) {
    const int64_t cap = capper.Cap(v);
    if (cap < longest) {  // caps only shrink as v grows
      v_fail = v;
      break;
    }
    if (v * cap >= d.total_tokens) {
      d.v_min = v;
      break;
    }
  }
  if (d.v_min == 0) {
    ReplicaBatches oom;
    oom.outcome = PlanOutcome::kOutOfMemory;
    const Sample& worst = samples[longest_at];
    if (v_fail <= 1) {
      MicroBatch alone;
      alone.rows = {{worst.id}};
      alone.varlen = true;
      alone.recompute = levels.back();
      const std::string need = PriceMicroBatch(eval, index, &alone)
                                   ? MemoryNeedReason(eval, {&alone, 1})
                                   : "the cost model cannot price it";
      oom.infeasible_reason =
          fmt::format("hydraulis: sample id {} ({} tokens) alone at recompute {} does not fit: {}",
                      worst.id, longest, RecomputeName(levels.back()), need);
    } else {
      oom.infeasible_reason = fmt::format(
          "hydraulis: the replica's {} tokens need more than {} micro-batches of at most "
          "S_cap({}) = {} tokens, but with {} micro-batches in flight the token cap S_cap({}) = {} "
          "(any composition of sequences up to the longest, at recompute up to {}) is below the "
          "longest sequence (sample id {}, {} tokens); activation budget of stage 0 {}",
          d.total_tokens, v_fail - 1, v_fail - 1, capper.Cap(v_fail - 1), v_fail, v_fail,
          capper.Cap(v_fail), RecomputeName(levels.back()), worst.id, longest,
          FormatBytes(eval.ActivationBudget(0)));
    }
    return oom;
  }
  d.v_max = std::max(d.v_min, std::min(n, d.total_tokens / d.utilization_len));

  // One capper per allowed level: a lighter level's smaller cap may pack tighter bins that run
  // without (or with less) recomputation, so each distinct cap is tried.
  std::vector<TokenCapper> level_cappers;
  for (Recompute rc : levels)
    level_cappers.emplace_back(eval, std::vector<Recompute>{rc}, longest, d.total_tokens, &fits);
  // The options: a partition per (v, cap), in the search's order (v ascending, then caps
  // descending); the best objective wins, ties the first option. They are built best bound first
  // (HeaviestBinBound), and the search stops at the first whose bound shows it cannot win: the
  // same choice as building every option in order, with far fewer built.
  struct Option {
    size_t k = 0;  // its v's index in d.tried_v
    int64_t cap = 0;
    PackedBins bins;
    Duration bound;
    BinLevels heaviest;  // its heaviest bin's LevelsOf (HeaviestBinBound)
  };
  std::vector<MicroBatch> best, candidate;
  Duration best_obj = Duration::Infinite();
  size_t best_option = 0;  // its position in the search's order
  size_t positions = 0;    // options so far
  // Partitions, bounds and builds the options of d.tried_v[first..].
  auto search = [&](size_t first) {
    std::vector<Option> options;
    for (size_t k = first; k < d.tried_v.size(); ++k) {
      const int64_t v = d.tried_v[k];
      std::vector<int64_t> caps = {capper.Cap(v)};
      for (TokenCapper& c : level_cappers) caps.push_back(c.Cap(v));
      std::sort(caps.begin(), caps.end(), std::greater<>());
      caps.erase(std::unique(caps.begin(), caps.end()), caps.end());
      d.token_cap[k] = caps.front();
      std::vector<std::vector<int64_t>> seen;  // partitions already taken at this v
      for (int64_t cap : caps) {
        if (cap < longest || v * cap < d.total_tokens) continue;
        const Partition part = MinMaxPartition(items, v, cap, orders);
        // A cap that does not bind gives the partition of a larger one: same micro-batches, same
        // objective, which would not replace it (ties keep the first).
        if (!part.feasible || std::find(seen.begin(), seen.end(), part.bin) != seen.end()) {
          continue;
        }
        seen.push_back(part.bin);
        Option o{k, cap, BinsOf(samples, items, eval, part, v), Duration::Zero(), BinLevels{}};
        o.bound = HeaviestBinBound(eval, o.bins, levels, &o.heaviest);
        options.push_back(std::move(o));
      }
    }
    std::vector<size_t> order(options.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t x, size_t y) { return options[x].bound < options[y].bound; });
    std::vector<bool> built(options.size(), false);
    for (size_t i : order) {
      Option& o = options[i];
      const size_t position = positions + i;  // in the search's order
      const bool ties_win = position < best_option;
      const Duration incumbent = exhaustive ? Duration::Infinite() : best_obj;
      if (!incumbent.is_infinite() && (o.bound > best_obj || (o.bound == best_obj && !ties_win))) {
        continue;  // it cannot win; later ones may still tie earlier in the order
      }
      Duration bound = o.bound;
      const Materialized made = Materialize(o.bins, samples, eval, index, levels, o.heaviest,
                                            incumbent, ties_win, &candidate, &bound);
      o.bound = std::max(o.bound, bound);
      if (made != Materialized::kOk) {
        if (made == Materialized::kFailed) o.bound = Duration::Infinite();
        continue;
      }
      built[i] = true;
      o.bound = Objective(candidate, eval.pp());
      if (best_obj.is_infinite() || o.bound < best_obj || (o.bound == best_obj && ties_win)) {
        best_obj = o.bound;
        best = std::move(candidate);
        best_option = position;
        d.chosen_v = d.tried_v[o.k];
      }
    }
    // Per v: its best option's objective and cap, or the least bound when that is lower.
    for (size_t i = 0; i < options.size(); ++i) {
      const Option& o = options[i];
      if (o.bound < d.objective[o.k]) {
        d.objective[o.k] = o.bound;
        d.token_cap[o.k] = o.cap;
        d.bounded[o.k] = !built[i];
      }
    }
    positions += options.size();
  };
  const std::vector<int64_t> counts = MicroBatchCounts(d.v_min, d.v_max);
  for (const int64_t v : counts) {
    if (v > n) break;
    d.tried_v.push_back(v);
  }
  d.token_cap.assign(d.tried_v.size(), 0);
  d.objective.assign(d.tried_v.size(), Duration::Infinite());
  d.bounded.assign(d.tried_v.size(), false);
  search(0);
  // Past v_max only while nothing was feasible (bin packing may need more bins).
  for (int64_t v = d.v_max + 1; best_obj.is_infinite() && v <= n; ++v) {
    d.tried_v.push_back(v);
    d.token_cap.push_back(0);
    d.objective.push_back(Duration::Infinite());
    d.bounded.push_back(false);
    search(d.tried_v.size() - 1);
  }
  if (best_obj.is_infinite()) {
    ReplicaBatches oom;
    oom.outcome = PlanOutcome::kOutOfMemory;
    oom.infeasible_reason = fmt::format(
        "hydraulis: no micro-batch count from {} to {} packs the replica's {} sequences under its "
        "token cap within the memory budget (activation budget of stage 0 {})",
        d.v_min, d.tried_v.back(), n, FormatBytes(eval.ActivationBudget(0)));
    return oom;
  }
  ReplicaBatches out;
  out.micro_batches = std::move(best);
  return out;
}

}  // namespace sluice
