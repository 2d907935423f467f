#include "schedule/action.h"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <optional>

namespace sluice {

char ActionKindLetter(ActionKind kind) {
  switch (kind) {
    case ActionKind::kForward:
      return 'F';
    case ActionKind::kBackward:
      return 'B';
    case ActionKind::kBackwardInput:
      return 'I';
    case ActionKind::kBackwardWeight:
      return 'W';
  }
  return '?';
}

std::string Action::ToString() const {
  return fmt::format("{}{}{}", stage, ActionKindLetter(kind), microbatch);
}

namespace {

// Reads a run of 1..18 decimal digits at `*pos` (18 digits cannot overflow int64_t).
std::optional<int64_t> ReadNumber(std::string_view text, size_t* pos) {
  const size_t begin = *pos;
  int64_t v = 0;
  while (*pos < text.size() && text[*pos] >= '0' && text[*pos] <= '9') {
    if (*pos - begin == 18) return std::nullopt;
    v = v * 10 + (text[*pos] - '0');
    ++*pos;
  }
  if (*pos == begin) return std::nullopt;
  return v;
}

std::optional<ActionKind> KindOf(char c) {
  switch (c) {
    case 'F':
      return ActionKind::kForward;
    case 'B':
      return ActionKind::kBackward;
    case 'I':
      return ActionKind::kBackwardInput;
    case 'W':
      return ActionKind::kBackwardWeight;
    default:
      return std::nullopt;
  }
}

}  // namespace

StatusOr<Action> ParseAction(std::string_view text, std::string_view source) {
  auto error = [&](std::string_view why) {
    return InvalidArgumentError(fmt::format(
        "{}{}action '{}': {}; expected <stage><F|B|I|W><microbatch> with decimal numbers, "
        "e.g. '2F0'",
        source, source.empty() ? "" : ": ", text, why));
  };
  size_t pos = 0;
  const std::optional<int64_t> stage = ReadNumber(text, &pos);
  if (!stage) return error("the stage is not a number of 1 to 18 digits");
  if (pos == text.size()) return error("the kind letter is missing");
  const std::optional<ActionKind> kind = KindOf(text[pos]);
  if (!kind) {
    return error(
        fmt::format("'{}' is not a compute kind (F, B, I or W; communication and "
                    "FSDP actions are not part of a compute-only schedule)",
                    text.substr(pos)));
  }
  ++pos;
  const std::optional<int64_t> mb = ReadNumber(text, &pos);
  if (!mb) return error("the micro-batch is not a number of 1 to 18 digits");
  if (pos != text.size()) return error(fmt::format("trailing text '{}'", text.substr(pos)));
  return Action{*stage, *kind, *mb};
}

namespace {

// PyTorch's _format_pipeline_order: a step x rank grid of the action texts, the row of
// `error_step` marked "<-- ERROR HERE". Long schedules print a window of rows around the mark.
std::string FormatPipelineOrder(const Schedule& s, int64_t error_step) {
  size_t steps = 0;
  for (const std::vector<Action>& r : s.ranks) steps = std::max(steps, r.size());
  if (steps == 0) return "(no actions)\n";
  constexpr int64_t kContext = 8;
  int64_t first = 0;
  int64_t last = static_cast<int64_t>(steps) - 1;
  if (last - first + 1 > 2 * kContext + 1) {
    const int64_t center = error_step >= 0 ? std::min(error_step, last) : 0;
    first = std::max<int64_t>(0, center - kContext);
    last = std::min(last, first + 2 * kContext);
  }
  const size_t label_width = fmt::format("{}", steps - 1).size();
  std::vector<size_t> width(s.ranks.size());
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    width[r] = fmt::format("Rank {}", r).size();
    for (int64_t k = first; k <= last; ++k) {
      if (static_cast<size_t>(k) < s.ranks[r].size()) {
        width[r] = std::max(width[r], s.ranks[r][k].ToString().size());
      }
    }
  }
  std::string out(label_width + 7, ' ');
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    out += fmt::format("{}{:<{}}", r == 0 ? "" : " ", fmt::format("Rank {}", r), width[r]);
  }
  out += '\n';
  if (first > 0) out += fmt::format("({} earlier steps)\n", first);
  for (int64_t k = first; k <= last; ++k) {
    out += fmt::format("Step {:0>{}}:", k, label_width);
    for (size_t r = 0; r < s.ranks.size(); ++r) {
      const std::string cell =
          static_cast<size_t>(k) < s.ranks[r].size() ? s.ranks[r][k].ToString() : "";
      out += fmt::format(" {:<{}}", cell, width[r]);
    }
    if (k == error_step) out += " <-- ERROR HERE";
    out += '\n';
  }
  if (last + 1 < static_cast<int64_t>(steps)) {
    out += fmt::format("({} later steps)\n", static_cast<int64_t>(steps) - 1 - last);
  }
  return out;
}

}  // namespace

Status CheckScheduleComplete(const Schedule& s) {
  const std::string name = s.name.empty() ? "schedule" : fmt::format("schedule '{}'", s.name);
  if (s.pp < 1 || s.vpp < 1 || s.num_microbatches < 0) {
    return InvalidArgumentError(
        fmt::format("{}: pp = {}, vpp = {} and num_microbatches = {}; need pp >= 1, vpp >= 1 and "
                    "num_microbatches >= 0",
                    name, s.pp, s.vpp, s.num_microbatches));
  }
  if (static_cast<int64_t>(s.ranks.size()) != s.pp) {
    return InvalidArgumentError(
        fmt::format("{}: {} rank lists for pp = {}", name, s.ranks.size(), s.pp));
  }
  const int64_t stages = s.num_stages();
  const int64_t m = s.num_microbatches;
  // A complete schedule has at least an F per (micro-batch, stage); checking this first also
  // bounds the table below by the input's size.
  int64_t actions = 0;
  for (const std::vector<Action>& r : s.ranks) actions += static_cast<int64_t>(r.size());
  if (m > 0 && (m > actions || stages > actions || m * stages > actions)) {
    return InvalidArgumentError(fmt::format(
        "{}: {} actions cannot cover {} micro-batches x {} stages (an F and a B, or an I and a W, "
        "each)",
        name, actions, m, stages));
  }
  // Per (micro-batch, stage): how many F, B, I, W were seen so far.
  std::vector<std::array<int8_t, 4>> seen(static_cast<size_t>(m * stages), {0, 0, 0, 0});
  auto fail = [&](int64_t rank, int64_t step, const std::string& why) {
    return InvalidArgumentError(fmt::format("{}: rank {} step {}: action '{}' {}\n{}", name, rank,
                                            step, s.ranks[rank][step].ToString(), why,
                                            FormatPipelineOrder(s, step)));
  };
  for (int64_t r = 0; r < s.pp; ++r) {
    for (int64_t k = 0; k < static_cast<int64_t>(s.ranks[r].size()); ++k) {
      const Action& a = s.ranks[r][k];
      if (a.stage < 0 || a.stage >= stages) {
        return fail(r, k, fmt::format("names stage {}, outside 0..{}", a.stage, stages - 1));
      }
      if (a.microbatch < 0 || a.microbatch >= m) {
        return fail(r, k, fmt::format("names micro-batch {}, outside 0..{}", a.microbatch, m - 1));
      }
      if (s.RankOf(a.stage) != r) {
        return fail(
            r, k, fmt::format("runs stage {}, which lives on rank {}", a.stage, s.RankOf(a.stage)));
      }
      std::array<int8_t, 4>& c = seen[a.microbatch * stages + a.stage];
      const int kind = static_cast<int>(a.kind);
      if (c[kind] > 0) return fail(r, k, "appears twice");
      switch (a.kind) {
        case ActionKind::kForward:
          break;
        case ActionKind::kBackward:
        case ActionKind::kBackwardInput:
          if (c[0] == 0) return fail(r, k, "comes before the forward of its stage");
          if (c[1] + c[2] > 0) {
            return fail(r, k, "is a second backward (B and I are exclusive) of its stage");
          }
          break;
        case ActionKind::kBackwardWeight:
          if (c[1] > 0) return fail(r, k, "follows a full backward B, which already did W");
          if (c[2] == 0) return fail(r, k, "comes before the input-gradient I of its stage");
          break;
      }
      ++c[kind];
    }
  }
  for (int64_t mb = 0; mb < m; ++mb) {
    for (int64_t st = 0; st < stages; ++st) {
      const std::array<int8_t, 4>& c = seen[mb * stages + st];
      std::string missing;
      if (c[0] == 0) missing = fmt::format("{}F{}", st, mb);
      if (c[1] + c[2] == 0) {
        missing += fmt::format("{}{}B{} (or {}I{} + {}W{})", missing.empty() ? "" : ", ", st, mb,
                               st, mb, st, mb);
      } else if (c[2] > 0 && c[3] == 0) {
        missing += fmt::format("{}{}W{}", missing.empty() ? "" : ", ", st, mb);
      }
      if (!missing.empty()) {
        return InvalidArgumentError(fmt::format("{}: rank {} never runs {}\n{}", name, s.RankOf(st),
                                                missing, FormatPipelineOrder(s, -1)));
      }
    }
  }
  return Status::Ok();
}

}  // namespace sluice
