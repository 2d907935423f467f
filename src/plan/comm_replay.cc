#include "plan/comm_replay.h"

#include <fmt/core.h>

#include <algorithm>
#include <map>

namespace sluice {
namespace {

using Text = std::function<std::string(int64_t, int64_t)>;
using Kind = CommOp::Kind;

struct Where {
  int64_t rank = -1;
  int64_t index = -1;
};

const char* Noun(bool send) { return send ? "send" : "receive"; }

class Matcher {
 public:
  Matcher(const std::vector<std::vector<CommOp>>& ranks, const Text& text)
      : ranks_(ranks), text_(text), partner_(ranks.size()), with_(ranks.size()) {
    for (size_t r = 0; r < ranks.size(); ++r) partner_[r].resize(ranks[r].size());
  }

  std::optional<CommProblem> Run() {
    const int64_t n = static_cast<int64_t>(ranks_.size());
    for (int64_t r = 0; r < n; ++r) {
      for (size_t i = 0; i < ranks_[r].size(); ++i) {
        const CommOp& op = ranks_[r][i];
        if (op.kind != Kind::kPost) continue;
        if (op.peer < 0 || op.peer >= n || op.peer == r) {
          return Problem(
              r, i, fmt::format("its peer must be another rank in [0, {}), got {}", n, op.peer));
        }
        with_[r][op.peer].push_back(static_cast<int64_t>(i));
      }
    }
    for (int64_t a = 0; a < n; ++a) {
      for (const auto& [b, list] : with_[a]) {
        if (b < a && with_[b].count(a) != 0) continue;  // compared from b's side
        if (auto p = Compare(a, b)) return p;
      }
    }
    return std::nullopt;
  }

  const Where& partner(int64_t r, int64_t i) const { return partner_[r][i]; }

 private:
  CommProblem Problem(int64_t r, int64_t i, std::string what) const {
    return {r, i, fmt::format("rank {} instruction {} ({}): {}", r, i, text_(r, i), what)};
  }

  const std::vector<int64_t>& List(int64_t a, int64_t b) const {
    const auto it = with_[a].find(b);
    return it == with_[a].end() ? empty_ : it->second;
  }

  std::optional<CommProblem> Compare(int64_t a, int64_t b) {
    const std::vector<int64_t>& la = List(a, b);
    const std::vector<int64_t>& lb = List(b, a);
    for (size_t k = 0; k < std::max(la.size(), lb.size()); ++k) {
      if (k >= lb.size() || k >= la.size()) {
        const bool a_longer = k >= lb.size();
        const int64_t r = a_longer ? a : b, peer = a_longer ? b : a;
        const int64_t i = a_longer ? la[k] : lb[k];
        return Problem(r, i,
                       fmt::format("no matching {} on rank {}: rank {} posts {} messages with rank "
                                   "{}, rank {} posts {}",
                                   Noun(!ranks_[r][i].send), peer, r, (a_longer ? la : lb).size(),
                                   peer, peer, (a_longer ? lb : la).size()));
      }
      const CommOp& x = ranks_[a][la[k]];
      const CommOp& y = ranks_[b][lb[k]];
      if (x.tag == y.tag && x.send != y.send) {
        if (x.shapes != nullptr && y.shapes != nullptr && *x.shapes != *y.shapes) {
          return Problem(
              a, la[k],
              fmt::format(
                  "shape mismatch with rank {} instruction {} ({}): rank {} {}s {}, rank {} {}s {}",
                  b, lb[k], text_(b, lb[k]), a, Noun(x.send), ShapesText(*x.shapes), b,
                  Noun(y.send), ShapesText(*y.shapes)));
        }
        partner_[a][la[k]] = {b, lb[k]};
        partner_[b][lb[k]] = {a, la[k]};
        continue;
      }
      auto match_in = [&](const std::vector<int64_t>& list, int64_t r, const CommOp& op) {
        return std::find_if(list.begin() + k, list.end(), [&](int64_t j) {
          return ranks_[r][j].tag == op.tag && ranks_[r][j].send != op.send;
        });
      };
      const auto later = match_in(lb, b, x);
      if (later != lb.end() && match_in(la, a, y) == la.end()) {
        return Problem(
            b, lb[k],
            fmt::format(
                "no matching {} on rank {} (tag {}); rank {}'s message {} with rank {} is {} "
                "(instruction {})",
                Noun(!y.send), a, y.tag, a, k, b, text_(a, la[k]), la[k]));
      }
      if (later != lb.end()) {
        return Problem(
            a, la[k],
            fmt::format(
                "message {} with rank {} is posted in a different order on the two ranks: rank {} "
                "posts {} here, rank {} posts {} (instruction {}) and only later the match "
                "(instruction {}); the ranks would deadlock or exchange the wrong tensors",
                k, b, a, text_(a, la[k]), b, text_(b, lb[k]), lb[k], *later));
      }
      return Problem(
          a, la[k],
          fmt::format("no matching {} on rank {} (tag {}); rank {}'s message {} with rank {} is {} "
                      "(instruction {})",
                      Noun(!x.send), b, x.tag, b, k, a, text_(b, lb[k]), lb[k]));
    }
    return std::nullopt;
  }

  const std::vector<std::vector<CommOp>>& ranks_;
  const Text& text_;
  std::vector<std::vector<Where>> partner_;
  std::vector<std::map<int64_t, std::vector<int64_t>>> with_;  // [rank][peer] -> post indices
  const std::vector<int64_t> empty_;
};

// [group] -> the rank's collectives in that group, as op indices in posting order.
using GroupPosts = std::map<int64_t, std::vector<int64_t>>;

std::optional<CommProblem> MatchCollectives(const std::vector<std::vector<CommOp>>& ranks,
                                            const std::vector<std::vector<int64_t>>& groups,
                                            const Text& text,
                                            std::vector<GroupPosts>* posts) {
  posts->assign(ranks.size(), {});
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (size_t i = 0; i < ranks[r].size(); ++i) {
      const CommOp& op = ranks[r][i];
      if (op.kind != Kind::kCollective && op.kind != Kind::kWaitCollectives) continue;
      if (op.group < 0 || op.group >= static_cast<int64_t>(groups.size())) {
        return CommProblem{static_cast<int64_t>(r), static_cast<int64_t>(i),
                           fmt::format("rank {} instruction {} ({}): no collective group {}", r, i,
                                       text(r, i), op.group)};
      }
      if (op.kind == Kind::kCollective) (*posts)[r][op.group].push_back(static_cast<int64_t>(i));
    }
  }
  const std::vector<int64_t> none;
  auto posts_of = [&](int64_t r, int64_t g) -> const std::vector<int64_t>& {
    const auto it = (*posts)[r].find(g);
    return it == (*posts)[r].end() ? none : it->second;
  };
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const std::vector<int64_t>& members = groups[gi];
    if (members.empty()) continue;
    const int64_t first = members[0];
    for (int64_t m : members) {
      const std::vector<int64_t>& a = posts_of(first, static_cast<int64_t>(gi));
      const std::vector<int64_t>& b = posts_of(m, static_cast<int64_t>(gi));
      for (size_t k = 0; k < std::max(a.size(), b.size()); ++k) {
        if (k < a.size() && k < b.size() &&
            ranks[first][a[k]].collective == ranks[m][b[k]].collective) {
          continue;
        }
        const bool m_has = k < b.size();
        const int64_t r = m_has ? m : first, i = m_has ? b[k] : a[k];
        const int64_t other = m_has ? first : m;
        const std::vector<int64_t>& other_list = m_has ? a : b;
        const std::string theirs =
            k < other_list.size()
                ? fmt::format("{} (instruction {})", text(other, other_list[k]), other_list[k])
                : std::string("nothing");
        return CommProblem{r, i,
                           fmt::format("rank {} instruction {} ({}): collective {} of its group "
                                       "does not match rank {}'s collective {}: {}",
                                       r, i, text(r, i), k, other, k, theirs)};
      }
    }
  }
  return std::nullopt;
}

}  // namespace

std::string ShapesText(const std::vector<TensorShape>& shapes) {
  std::string out;
  for (size_t t = 0; t < shapes.size(); ++t) {
    if (t > 0) out += " + ";
    out += '[';
    for (size_t d = 0; d < shapes[t].size(); ++d) {
      out += fmt::format("{}{}", d > 0 ? ", " : "", shapes[t][d]);
    }
    out += ']';
  }
  return out.empty() ? "[]" : out;
}

std::optional<CommProblem> CheckComms(const std::vector<std::vector<CommOp>>& ranks,
                                      const std::vector<std::vector<int64_t>>& groups,
                                      const Text& text) {
  Matcher matcher(ranks, text);
  if (auto p = matcher.Run()) return p;
  std::vector<GroupPosts> posts;
  if (auto p = MatchCollectives(ranks, groups, text, &posts)) return p;
  const int64_t n = static_cast<int64_t>(ranks.size());
  for (int64_t r = 0; r < n; ++r) {
    for (size_t i = 0; i < ranks[r].size(); ++i) {
      const CommOp& op = ranks[r][i];
      if (op.kind == Kind::kWait && (op.wait_for < 0 || op.wait_for >= static_cast<int64_t>(i) ||
                                     ranks[r][op.wait_for].kind != Kind::kPost)) {
        return CommProblem{r, static_cast<int64_t>(i),
                           fmt::format("rank {} instruction {} ({}): waits for a transfer this "
                                       "rank has not posted before it",
                                       r, i, text(r, i))};
      }
    }
  }
  std::vector<int64_t> pc(n, 0);
  std::vector<std::map<int64_t, int64_t>> collectives(n);  // [rank][group]: posted
  std::vector<bool> posted(n, false);  // the blocking collective at pc is counted already
  auto can_run = [&](int64_t r) {
    const CommOp& op = ranks[r][pc[r]];
    if (op.kind == Kind::kWait) {
      const Where& w = matcher.partner(r, op.wait_for);
      return pc[w.rank] > w.index;
    }
    const bool blocking = op.kind == Kind::kCollective && op.blocking;
    if (blocking && !posted[r]) {
      posted[r] = true;
      ++collectives[r][op.group];
    }
    if (op.kind == Kind::kWaitCollectives || blocking) {
      const int64_t mine = collectives[r][op.group];
      for (int64_t m : groups[op.group]) {
        if (collectives[m][op.group] < mine) return false;
      }
    }
    return true;
  };
  while (true) {
    bool progress = false, finished = true;
    for (int64_t r = 0; r < n; ++r) {
      while (pc[r] < static_cast<int64_t>(ranks[r].size()) && can_run(r)) {
        const CommOp& op = ranks[r][pc[r]];
        if (op.kind == Kind::kCollective && !op.blocking) ++collectives[r][op.group];
        posted[r] = false;
        ++pc[r];
        progress = true;
      }
      finished = finished && pc[r] == static_cast<int64_t>(ranks[r].size());
    }
    if (finished) return std::nullopt;
    if (!progress) break;
  }
  CommProblem problem;
  std::string blocked;
  int64_t listed = 0;
  for (int64_t r = 0; r < n; ++r) {
    if (pc[r] == static_cast<int64_t>(ranks[r].size())) continue;
    if (problem.rank < 0) problem = {r, pc[r], ""};
    if (++listed > 8) {
      blocked += "; ...";
      break;
    }
    const CommOp& op = ranks[r][pc[r]];
    std::string what;
    if (op.kind == Kind::kWait) {
      const Where& w = matcher.partner(r, op.wait_for);
      what = fmt::format("waits for rank {} to post instruction {} ({})", w.rank, w.index,
                         text(w.rank, w.index));
    } else if (op.kind == Kind::kCollective) {
      what = "waits for every member of its group to post it";
    } else {
      what = "waits for its group's collectives";
    }
    blocked += fmt::format("{}rank {} at instruction {} ({}) {}", listed > 1 ? "; " : "", r, pc[r],
                           text(r, pc[r]), what);
  }
  problem.message = "deadlock: the static replay of all ranks stops: " + blocked;
  return problem;
}

}  // namespace sluice
