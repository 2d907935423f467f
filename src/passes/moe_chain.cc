#include "passes/moe_chain.h"

#include <algorithm>
#include <map>

#include "base/status.h"

namespace sluice::passes::internal {

std::vector<ChainStep> ChainSteps(const std::vector<int64_t>& cut, bool async_whole) {
  using Kind = ChainStep::Kind;
  const int64_t E = static_cast<int64_t>(cut.size());
  std::vector<ChainStep> steps;
  std::map<int64_t, std::vector<int64_t>> pending;  // [all-to-all element]: slices not waited
  auto wait = [&](int64_t e, int64_t slice) {       // slice -1: all of it
    auto it = pending.find(e);
    if (it == pending.end()) return;
    std::vector<int64_t>& list = it->second;
    for (size_t k = 0; k < list.size();) {
      if (slice < 0 || list[k] == slice) {
        steps.push_back({Kind::kWait, e, list[k]});
        list.erase(list.begin() + static_cast<std::ptrdiff_t>(k));
      } else {
        ++k;
      }
    }
  };
  auto post = [&](int64_t e, int64_t slice, bool async) {
    steps.push_back({Kind::kPost, e, slice});
    if (async) pending[e].push_back(slice);
  };
  auto piece = [&](int64_t e, int64_t slice) {
    if (e > 0) {
      const bool same = cut[e] > 0 && cut[e - 1] == cut[e];
      wait(e - 1, same ? slice : -1);
    }
    steps.push_back({Kind::kPiece, e, slice});
  };
  for (int64_t e = 0; e < E;) {
    if (cut[e] == 0) {
      if (e % 2 == 0) {
        piece(e, -1);
      } else {
        post(e, -1, async_whole);
      }
      ++e;
      continue;
    }
    const int64_t n = cut[e];
    int64_t f = e;
    while (f < E && cut[f] == n) ++f;
    if (e % 2 == 1) {  // the run starts with an all-to-all: all its slices go at once
      for (int64_t c = 0; c < n; ++c) post(e, c, true);
    }
    for (int64_t s = e % 2 == 0 ? e : e + 1; s < f; s += 2) {
      for (int64_t c = 0; c < n; ++c) {
        piece(s, c);
        if (s + 1 < f) post(s + 1, c, true);
      }
    }
    e = f;
  }
  for (auto& [e, list] : pending) {
    while (!list.empty()) wait(e, list.front());
  }
  return steps;
}

Duration SliceTime(Duration a2a, Duration latency, int64_t n, int64_t j, bool token_slices) {
  Duration d = latency + Duration::Nanos((a2a - latency).nanos() / n);
  if (token_slices && j % 2 == 0) d += latency;
  return d;
}

Duration PipelinedTime(const std::vector<ChainStep>& steps, const std::vector<int64_t>& cut,
                       const std::vector<Duration>& seg, const std::vector<Duration>& a2a,
                       const std::vector<Duration>& latency, Duration overhead,
                       bool token_slices) {
  Duration host, compute, stream;
  std::map<std::pair<int64_t, int64_t>, Duration> done;  // all-to-all slice -> its end
  for (const ChainStep& s : steps) {
    const int64_t n = std::max<int64_t>(cut[s.element], 1);
    if (s.kind == ChainStep::Kind::kPiece) {
      const Duration d = n > 1 ? Duration::Nanos(seg[s.element / 2].nanos() / n) + overhead : seg[s.element / 2];
      compute = std::max(compute, host) + d;
    } else if (s.kind == ChainStep::Kind::kPost) {
      const int64_t j = s.element / 2;
      const Duration d = n > 1 ? SliceTime(a2a[j], latency[j], n, j, token_slices) : a2a[j];
      stream = std::max({stream, compute, host}) + d;
      done[{s.element, s.slice}] = stream;
      // A blocking one (never waited) holds the host until it ends.
      if (std::none_of(steps.begin(), steps.end(), [&](const ChainStep& w) {
            return w.kind == ChainStep::Kind::kWait && w.element == s.element &&
                   w.slice == s.slice;
          })) {
        host = std::max(host, stream);
      }
    } else {
      host = std::max(host, done[{s.element, s.slice}]);
    }
  }
  return std::max({host, compute, stream});
}

std::vector<int64_t> PartitionDp(const std::vector<Duration>& seg, const std::vector<Duration>& a2a,
                                 const std::vector<Duration>& latency, int64_t max_chunks,
                                 Duration overhead) {
  const int64_t P = static_cast<int64_t>(seg.size());
  SLUICE_CHECK(P >= 1 && static_cast<int64_t>(a2a.size()) == P - 1);
  // c(j, i): segments [j, i) with the all-to-alls between them, whole or cut into n. The
  // segment offsets keep the all-to-all parity (dispatch at even j) of the whole chain.
  auto range_time = [&](int64_t j, int64_t i, int64_t n) {
    std::vector<int64_t> cut(static_cast<size_t>(2 * (i - j) - 1), n);
    std::vector<Duration> s(seg.begin() + j, seg.begin() + i);
    std::vector<Duration> a(a2a.begin() + j, a2a.begin() + (i - 1));
    std::vector<Duration> l(latency.begin() + j, latency.begin() + (i - 1));
    return PipelinedTime(ChainSteps(cut, false), cut, s, a, l, overhead, /*token_slices=*/true);
  };
  // One DP per n (runs whole or cut into n), the best of them.
  Duration best_total = Duration::Nanos(INT64_MAX / 4);
  std::vector<int64_t> best_from, best_chunks;
  for (int64_t n = 2; n <= std::max<int64_t>(max_chunks, 2); ++n) {
    std::vector<Duration> D(static_cast<size_t>(P + 1), Duration::Nanos(INT64_MAX / 4));
    std::vector<int64_t> from(static_cast<size_t>(P + 1), 0), chunks(static_cast<size_t>(P + 1), 0);
    D[0] = Duration::Zero();
    for (int64_t i = 1; i <= P; ++i) {
      for (int64_t j = 0; j < i; ++j) {
        const Duration before = D[j] + (j > 0 ? a2a[j - 1] : Duration::Zero());
        Duration best = range_time(j, i, 0);
        int64_t best_n = 0;
        if (max_chunks >= 2 && i - j >= 2 && j % 2 == 0) {
          const Duration t = range_time(j, i, n);
          if (t < best) {
            best = t;
            best_n = n;
          }
        }
        if (before + best < D[i]) {
          D[i] = before + best;
          from[i] = j;
          chunks[i] = best_n;
        }
      }
    }
    if (D[P] < best_total) {
      best_total = D[P];
      best_from = from;
      best_chunks = chunks;
    }
  }
  const std::vector<int64_t>& from = best_from;
  const std::vector<int64_t>& chunks = best_chunks;
  std::vector<int64_t> cut(static_cast<size_t>(2 * P - 1), 0);
  for (int64_t i = P; i > 0; i = from[i]) {
    for (int64_t e = 2 * from[i]; e <= 2 * (i - 1); ++e) cut[e] = chunks[i];
  }
  return cut;
}

}  // namespace sluice::passes::internal
