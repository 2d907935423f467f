#include "batching/ordering.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>

namespace sluice {
namespace {

constexpr std::string_view kOrderNames[] = {"auto", "sort", "tsp", "lexicographic"};

int64_t Dist(const LengthPoint& a, const LengthPoint& b) {
  return std::abs(a.enc - b.enc) + std::abs(a.dec - b.dec);
}

// a comes before b in "larger first" order: enc + dec, then enc, descending.
bool Larger(const LengthPoint& a, const LengthPoint& b) {
  if (a.enc + a.dec != b.enc + b.dec) return a.enc + a.dec > b.enc + b.dec;
  return a.enc > b.enc;
}

// Lexicographically descending (enc, dec); ties by index.
std::vector<int64_t> LexOrder(std::span<const LengthPoint> p) {
  std::vector<int64_t> idx(p.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) {
    if (p[a].enc != p[b].enc) return p[a].enc > p[b].enc;
    return p[a].dec > p[b].dec;
  });
  return idx;
}

// Improves an open path over `pts` in place by 2-opt and Or-opt moves towards each point's
// nearest neighbours, within `budget` counted evaluations.
class PathImprover {
 public:
  PathImprover(std::span<const LengthPoint> pts, std::vector<int64_t>* path, int64_t neighbours,
               int64_t budget)
      : pts_(pts), p_(*path), budget_(budget) {
    const int64_t m = static_cast<int64_t>(p_.size());
    pos_.resize(p_.size());
    for (int64_t i = 0; i < m; ++i) pos_[p_[i]] = i;
    k_ = std::min<int64_t>(neighbours, m - 1);
  }

  void Run() {
    const int64_t m = static_cast<int64_t>(p_.size());
    if (m < 3 || k_ <= 0 || m * (m - 1) > budget_) return;
    BuildNeighbours();
    bool improved = true;
    while (improved && work_ < budget_) {
      improved = false;
      for (int64_t a = 0; a < m && work_ < budget_; ++a) {
        if (TwoOpt(a)) improved = true;
        if (OrOpt(a)) improved = true;
      }
    }
  }

 private:
  int64_t D(int64_t a, int64_t b) const { return Dist(pts_[a], pts_[b]); }

  void BuildNeighbours() {
    const int64_t m = static_cast<int64_t>(p_.size());
    nb_.assign(static_cast<size_t>(m * k_), 0);
    std::vector<std::pair<int64_t, int64_t>> best;  // (dist, index), sorted, size <= k
    for (int64_t a = 0; a < m; ++a) {
      best.clear();
      for (int64_t b = 0; b < m; ++b) {
        if (b == a) continue;
        const std::pair<int64_t, int64_t> c{D(a, b), b};
        if (static_cast<int64_t>(best.size()) == k_ && !(c < best.back())) continue;
        if (static_cast<int64_t>(best.size()) == k_) best.pop_back();
        best.insert(std::upper_bound(best.begin(), best.end(), c), c);
      }
      for (int64_t i = 0; i < k_; ++i) nb_[a * k_ + i] = best[i].second;
    }
    work_ += m * (m - 1);
  }

  // Change in length when p[l..r] is reversed.
  int64_t ReverseDelta(int64_t l, int64_t r) const {
    const int64_t m = static_cast<int64_t>(p_.size());
    int64_t d = 0;
    if (l > 0) d += D(p_[l - 1], p_[r]) - D(p_[l - 1], p_[l]);
    if (r < m - 1) d += D(p_[l], p_[r + 1]) - D(p_[r], p_[r + 1]);
    return d;
  }

  void Reverse(int64_t l, int64_t r) {
    std::reverse(p_.begin() + l, p_.begin() + r + 1);
    for (int64_t i = l; i <= r; ++i) pos_[p_[i]] = i;
    work_ += r - l + 1;
  }

  // 2-opt: make `a` adjacent to one of its neighbours by reversing the stretch between them.
  bool TwoOpt(int64_t a) {
    for (int64_t n = 0; n < k_; ++n) {
      const int64_t c = nb_[a * k_ + n];
      const int64_t i = pos_[a];
      const int64_t j = pos_[c];
      if (std::abs(i - j) <= 1) continue;
      const int64_t lo = std::min(i, j);
      const int64_t hi = std::max(i, j);
      // Reversing [lo+1, hi] joins p[lo] and p[hi] at lo, lo+1; reversing [lo, hi-1] joins them at
      // hi-1, hi.
      const int64_t cand[2][2] = {{lo + 1, hi}, {lo, hi - 1}};
      for (const auto& lr : cand) {
        work_ += 1;
        if (lr[0] < lr[1] && ReverseDelta(lr[0], lr[1]) < 0) {
          Reverse(lr[0], lr[1]);
          return true;
        }
      }
    }
    return false;
  }

  // Or-opt: move a segment of 1-3 points starting or ending at `a` next to one of a's neighbours.
  bool OrOpt(int64_t a) {
    const int64_t m = static_cast<int64_t>(p_.size());
    for (int64_t len = 1; len <= 3 && len < m; ++len) {
      // The segment starts at a, or (len > 1) ends at a.
      for (int64_t first : {pos_[a], len > 1 ? pos_[a] - len + 1 : int64_t{-1}}) {
        if (first < 0 || first + len > m) continue;
        if (TryMove(first, len, a)) return true;
      }
    }
    return false;
  }

  bool TryMove(int64_t i, int64_t len, int64_t a) {
    const int64_t m = static_cast<int64_t>(p_.size());
    const int64_t f = p_[i];
    const int64_t e = p_[i + len - 1];
    int64_t gain = 0;
    if (i > 0) gain += D(p_[i - 1], f);
    if (i + len < m) gain += D(e, p_[i + len]);
    if (i > 0 && i + len < m) gain -= D(p_[i - 1], p_[i + len]);
    for (int64_t n = 0; n < k_; ++n) {
      const int64_t c = nb_[a * k_ + n];
      const int64_t q = pos_[c];
      if (q >= i && q < i + len) continue;
      // Edges (q-1, q) and (q, q+1) around the neighbour, or an end of the path.
      for (int64_t x = q - 1; x <= q; ++x) {
        const int64_t y = x + 1;
        if ((x >= i && x < i + len) || (y >= i && y < i + len)) continue;
        if (x < -1 || y > m) continue;
        work_ += 1;
        const int64_t px = x >= 0 ? p_[x] : -1;
        const int64_t py = y < m ? p_[y] : -1;
        const int64_t base = (px >= 0 && py >= 0) ? D(px, py) : 0;
        // Forward: x f..e y; reversed: x e..f y.
        const int64_t fwd = (px >= 0 ? D(px, f) : 0) + (py >= 0 ? D(e, py) : 0) - base;
        const int64_t rev = (px >= 0 ? D(px, e) : 0) + (py >= 0 ? D(f, py) : 0) - base;
        const bool reversed = rev < fwd;
        if (std::min(fwd, rev) - gain < 0) {
          Move(i, len, y, reversed);
          return true;
        }
      }
    }
    return false;
  }

  // Moves p[i..i+len) to just before position `before` (in the current array; == m: the end).
  void Move(int64_t i, int64_t len, int64_t before, bool reversed) {
    std::vector<int64_t> seg(p_.begin() + i, p_.begin() + i + len);
    if (reversed) std::reverse(seg.begin(), seg.end());
    p_.erase(p_.begin() + i, p_.begin() + i + len);
    const int64_t at = before > i ? before - len : before;
    p_.insert(p_.begin() + at, seg.begin(), seg.end());
    const int64_t lo = std::min(i, at);
    const int64_t hi = std::max(i + len, at + len);
    for (int64_t k = lo; k < hi && k < static_cast<int64_t>(p_.size()); ++k) pos_[p_[k]] = k;
    work_ += hi - lo;
  }

  std::span<const LengthPoint> pts_;
  std::vector<int64_t>& p_;
  std::vector<int64_t> pos_;
  std::vector<int64_t> nb_;
  int64_t k_ = 0;
  int64_t budget_ = 0;
  int64_t work_ = 0;
};

// Nearest-neighbour open path over distinct points, from the largest one.
std::vector<int64_t> NearestNeighbourPath(std::span<const LengthPoint> pts) {
  const int64_t m = static_cast<int64_t>(pts.size());
  std::vector<int64_t> path;
  if (m == 0) return path;
  path.reserve(static_cast<size_t>(m));
  int64_t start = 0;
  for (int64_t i = 1; i < m; ++i) {
    if (Larger(pts[i], pts[start])) start = i;
  }
  std::vector<int64_t> left;  // unvisited, ascending index
  left.reserve(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) {
    if (i != start) left.push_back(i);
  }
  path.push_back(start);
  while (!left.empty()) {
    const LengthPoint& cur = pts[path.back()];
    size_t best = 0;
    int64_t best_d = Dist(cur, pts[left[0]]);
    for (size_t k = 1; k < left.size(); ++k) {
      const int64_t d = Dist(cur, pts[left[k]]);
      if (d < best_d) {  // strict: ties keep the smaller index
        best_d = d;
        best = k;
      }
    }
    path.push_back(left[best]);
    left.erase(left.begin() + static_cast<std::ptrdiff_t>(best));
  }
  return path;
}

}  // namespace

std::string_view SampleOrderName(SampleOrder order) { return kOrderNames[static_cast<int>(order)]; }

StatusOr<SampleOrder> ParseSampleOrder(std::string_view name) {
  for (int i = 0; i < 4; ++i) {
    if (kOrderNames[i] == name) return static_cast<SampleOrder>(i);
  }
  return InvalidArgumentError(
      fmt::format("unknown sample order '{}' (allowed: auto, sort, tsp, lexicographic)", name));
}

std::vector<int64_t> SortDescendingOrder(std::span<const LengthPoint> points) {
  std::vector<int64_t> idx(points.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int64_t a, int64_t b) { return Larger(points[a], points[b]); });
  return idx;
}

std::vector<int64_t> LexicographicOrder(std::span<const LengthPoint> points) {
  return LexOrder(points);
}

std::vector<int64_t> TspPathOrder(std::span<const LengthPoint> points, const TspOptions& options) {
  // Merge identical points: groups in lexicographic order, members by index.
  const std::vector<int64_t> lex = LexOrder(points);
  std::vector<LengthPoint> uniq;
  std::vector<int64_t> group_begin;
  for (size_t k = 0; k < lex.size(); ++k) {
    if (k == 0 || !(points[lex[k]] == points[lex[k - 1]])) {
      uniq.push_back(points[lex[k]]);
      group_begin.push_back(static_cast<int64_t>(k));
    }
  }
  group_begin.push_back(static_cast<int64_t>(lex.size()));
  std::vector<int64_t> path = NearestNeighbourPath(uniq);
  PathImprover(uniq, &path, options.neighbours, options.max_work).Run();
  if (path.size() > 1 && Larger(uniq[path.back()], uniq[path.front()])) {
    std::reverse(path.begin(), path.end());
  }
  std::vector<int64_t> out;
  out.reserve(points.size());
  for (int64_t g : path) {
    for (int64_t k = group_begin[g]; k < group_begin[g + 1]; ++k) out.push_back(lex[k]);
  }
  return out;
}

int64_t PathLength(std::span<const LengthPoint> points, std::span<const int64_t> order) {
  int64_t total = 0;
  for (size_t i = 1; i < order.size(); ++i) total += Dist(points[order[i - 1]], points[order[i]]);
  return total;
}

std::vector<LengthPoint> SamplePoints(std::span<const Sample> samples,
                                      const StageCostEvaluator& eval) {
  const bool encdec = eval.model().is_encoder_decoder();
  std::vector<LengthPoint> out;
  out.reserve(samples.size());
  for (const Sample& s : samples) {
    if (encdec) {
      out.push_back({eval.Pad(std::max<int64_t>(1, eval.SeqLen(s))),
                     eval.Pad(std::max<int64_t>(1, eval.DecLen(s)))});
    } else {
      out.push_back({eval.SeqLen(s), 0});
    }
  }
  return out;
}

std::vector<int64_t> OrderSamples(std::span<const Sample> samples, const StageCostEvaluator& eval,
                                  SampleOrder order, const TspOptions& options) {
  const bool encdec = eval.model().is_encoder_decoder();
  if (order == SampleOrder::kAuto) {
    order = encdec ? SampleOrder::kTspPath : SampleOrder::kSortDescending;
  }
  // Refine the samples' own order by raw lengths so that identical points keep a stable,
  // meaningful order; the orders below are stable (or group members by index).
  std::vector<int64_t> refine(samples.size());
  std::iota(refine.begin(), refine.end(), 0);
  std::stable_sort(refine.begin(), refine.end(), [&](int64_t a, int64_t b) {
    if (samples[a].input_len != samples[b].input_len) {
      return samples[a].input_len > samples[b].input_len;
    }
    return samples[a].target_len > samples[b].target_len;
  });
  const std::vector<LengthPoint> all = SamplePoints(samples, eval);
  std::vector<LengthPoint> pts;
  pts.reserve(all.size());
  for (int64_t i : refine) pts.push_back(all[i]);
  std::vector<int64_t> local;
  switch (order) {
    case SampleOrder::kAuto:
    case SampleOrder::kSortDescending:
      local = SortDescendingOrder(pts);
      break;
    case SampleOrder::kTspPath:
      local = TspPathOrder(pts, options);
      break;
    case SampleOrder::kLexicographic:
      local = LexicographicOrder(pts);
      break;
  }
  for (int64_t& i : local) i = refine[i];
  return local;
}

}  // namespace sluice
