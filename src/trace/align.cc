#include "trace/align.h"

#include <fmt/core.h>

#include <algorithm>
#include <deque>
#include <map>
#include <tuple>

namespace sluice::trace {
namespace {

// What a send and its receive share: the key, and the instance when the trace gives one.
std::string MatchKey(const CommOp& op) {
  return op.instance.empty() ? op.key : op.key + ", " + op.instance;
}

int64_t Median(std::vector<int64_t> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Comm indices of `r` in posting order.
std::vector<int32_t> PostingOrder(const RankTrace& r) {
  std::vector<int32_t> order(r.comms.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return r.ops[r.comms[a].post].start_ns < r.ops[r.comms[b].post].start_ns;
  });
  return order;
}

}  // namespace

Matching MatchComms(const TraceSet& set) {
  Matching m;
  // (src, dst, key) -> sends in order; likewise receives.
  std::map<std::tuple<int64_t, int64_t, std::string>, std::vector<int32_t>> sends, recvs;
  std::map<std::string, std::vector<std::pair<int64_t, std::vector<int32_t>>>> colls;
  const int64_t n = static_cast<int64_t>(set.ranks.size());
  int64_t bad_peer = 0;
  for (const RankTrace& r : set.ranks) {
    std::map<std::string, std::vector<int32_t>> mine;
    for (int32_t c : PostingOrder(r)) {
      const CommOp& op = r.comms[c];
      if (op.kind == CommKind::kCollective) {
        mine[op.key].push_back(c);
      } else if (op.peer < 0 || op.peer >= n || op.peer == r.rank) {
        ++bad_peer;
      } else if (op.kind == CommKind::kSend) {
        sends[{r.rank, op.peer, MatchKey(op)}].push_back(c);
      } else {
        recvs[{op.peer, r.rank, MatchKey(op)}].push_back(c);
      }
    }
    for (auto& [key, list] : mine) colls[key].push_back({r.rank, std::move(list)});
  }
  if (bad_peer > 0) {
    m.unmatched += bad_peer;
    m.notes.push_back(fmt::format(
        "{} point-to-point op(s) have no peer among the {} ranks (annotate them 'to=N' / "
        "'from=N'); left out",
        bad_peer, n));
  }
  for (auto& [k, s] : sends) {
    const auto& r = recvs[k];
    const size_t both = std::min(s.size(), r.size());
    for (size_t i = 0; i < both; ++i) {
      m.messages.push_back({std::get<0>(k), s[i], std::get<1>(k), r[i]});
    }
    if (s.size() != r.size()) {
      m.unmatched += static_cast<int64_t>(std::max(s.size(), r.size()) - both);
      m.notes.push_back(fmt::format(
          "rank {} sends {} message(s){} to rank {}, which receives {}", std::get<0>(k), s.size(),
          std::get<2>(k).empty() ? "" : " (" + std::get<2>(k) + ")", std::get<1>(k), r.size()));
    }
  }
  for (auto& [k, r] : recvs) {
    if (!sends.contains(k) && !r.empty()) {
      m.unmatched += static_cast<int64_t>(r.size());
      m.notes.push_back(
          fmt::format("rank {} receives {} message(s){} from rank {}, which sends none; left out",
                      std::get<1>(k), r.size(),
                      std::get<2>(k).empty() ? "" : " (" + std::get<2>(k) + ")", std::get<0>(k)));
    }
  }
  for (auto& [key, members] : colls) {
    size_t count = SIZE_MAX, most = 0;
    for (const auto& [rank, list] : members) {
      count = std::min(count, list.size());
      most = std::max(most, list.size());
    }
    if (members.size() < 2) continue;  // a one-rank collective synchronises nothing
    for (size_t i = 0; i < count; ++i) {
      CollectiveMatch c{key, static_cast<int64_t>(i), {}};
      for (const auto& [rank, list] : members) c.members.push_back({rank, list[i]});
      m.collectives.push_back(std::move(c));
    }
    if (most != count) {
      int64_t extra = 0;
      for (const auto& [rank, list] : members) extra += static_cast<int64_t>(list.size() - count);
      m.unmatched += extra;
      m.notes.push_back(
          fmt::format("collectives{}: ranks run between {} and {}; the first {} are matched",
                      key.empty() ? "" : " '" + key + "'", count, most, count));
    }
  }
  return m;
}

ClockAlignment AlignClocks(TraceSet* set, const Matching& matching) {
  const size_t n = set->ranks.size();
  ClockAlignment a;
  a.offset_ns.assign(n, 0);
  a.how.assign(n, "own clock");  // becomes "own clock + causality" when a bound moves it
  if (n == 0) return a;
  a.how[0] = "reference";
  bool shared_clock = true;  // sluice's runtime writes one epoch for every rank of a host
  for (const RankTrace& r : set->ranks) shared_clock &= r.format == TraceFormat::kSluice;
  // 1. Collective ends: pairwise median differences, spread from rank 0 breadth first.
  std::vector<char> anchored(n, 0);
  anchored[0] = 1;
  if (!shared_clock) {
    std::map<std::pair<size_t, size_t>, std::vector<int64_t>> diffs;  // (r, s) -> end_r - end_s
    for (const CollectiveMatch& c : matching.collectives) {
      for (const auto& [r, ci] : c.members) {
        for (const auto& [s, cj] : c.members) {
          if (r == s) continue;
          const int64_t er = set->ranks[r].comms[ci].done_ns;
          const int64_t es = set->ranks[s].comms[cj].done_ns;
          if (er != kUnknownTime && es != kUnknownTime) diffs[{r, s}].push_back(er - es);
        }
      }
    }
    std::deque<size_t> queue{0};
    while (!queue.empty()) {
      const size_t r = queue.front();
      queue.pop_front();
      for (size_t s = 0; s < n; ++s) {
        auto it = diffs.find({r, s});
        if (anchored[s] || it == diffs.end()) continue;
        a.offset_ns[s] = a.offset_ns[r] + Median(it->second);
        a.how[s] = fmt::format("collective ends (n={})", it->second.size());
        anchored[s] = 1;
        queue.push_back(s);
      }
    }
  }
  // 2. Causality: theta_dst - theta_src >= send_post - recv_done, tightest per ordered pair.
  std::map<std::pair<int64_t, int64_t>, int64_t> bound;
  for (const MessageMatch& m : matching.messages) {
    const RankTrace& src = set->ranks[m.src];
    const RankTrace& dst = set->ranks[m.dst];
    const int64_t post = src.ops[src.comms[m.send].post].start_ns;
    const int64_t done = dst.comms[m.recv].done_ns;
    if (done == kUnknownTime) continue;
    auto [it, inserted] = bound.try_emplace({m.src, m.dst}, post - done);
    if (!inserted) it->second = std::max(it->second, post - done);
    ++a.causality_bounds;
  }
  // A collective is done on no member before every member posted it: bounds from the member
  // that posted last to every other member.
  for (const CollectiveMatch& c : matching.collectives) {
    int64_t last_rank = -1, last_post = INT64_MIN, last_raw = 0;
    for (const auto& [r, ci] : c.members) {
      const RankTrace& rank = set->ranks[r];
      const int64_t raw = rank.ops[rank.comms[ci].post].start_ns;
      if (raw + a.offset_ns[r] > last_post) {
        last_post = raw + a.offset_ns[r];
        last_rank = r;
        last_raw = raw;
      }
    }
    for (const auto& [r, ci] : c.members) {
      const int64_t done = set->ranks[r].comms[ci].done_ns;
      if (r == last_rank || done == kUnknownTime) continue;
      auto [it, inserted] = bound.try_emplace({last_rank, r}, last_raw - done);
      if (!inserted) it->second = std::max(it->second, last_raw - done);
      ++a.causality_bounds;
    }
  }
  for (size_t pass = 0; pass < 2 * n + 2; ++pass) {
    bool moved = false;
    for (const auto& [pair, lo] : bound) {
      const auto [src, dst] = pair;
      const int64_t gap = a.offset_ns[dst] - a.offset_ns[src] - lo;
      if (gap >= 0) continue;
      // Move the rank that no collective anchors, else the one that is not the reference.
      const bool move_dst = dst != 0 && (!anchored[dst] || anchored[src] || src == 0);
      if (move_dst) {
        a.offset_ns[dst] -= gap;
        if (!a.how[dst].ends_with("causality")) a.how[dst] += " + causality";
      } else {
        a.offset_ns[src] += gap;
        if (!a.how[src].ends_with("causality")) a.how[src] += " + causality";
      }
      moved = true;
    }
    if (!moved) break;
  }
  for (const auto& [pair, lo] : bound) {
    if (a.offset_ns[pair.second] - a.offset_ns[pair.first] < lo) ++a.violations;
  }
  for (size_t r = 0; r < n; ++r) {
    const int64_t d = a.offset_ns[r];
    if (d == 0) continue;
    for (TraceOp& op : set->ranks[r].ops) {
      op.start_ns += d;
      op.end_ns += d;
    }
    for (TraceOp& op : set->ranks[r].all_to_alls) {
      op.start_ns += d;
      op.end_ns += d;
    }
    for (CommOp& c : set->ranks[r].comms) {
      if (c.done_ns != kUnknownTime) c.done_ns += d;
    }
  }
  // 3. Receives posted before their send: their transfer starts at the send's post.
  for (const MessageMatch& m : matching.messages) {
    const RankTrace& src = set->ranks[m.src];
    const RankTrace& dst = set->ranks[m.dst];
    if (dst.ops[dst.comms[m.recv].post].start_ns < src.ops[src.comms[m.send].post].start_ns) {
      ++a.clipped_receives;
    }
  }
  return a;
}

}  // namespace sluice::trace
