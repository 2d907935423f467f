#include "plan/pytorch_csv.h"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <optional>

#include "plan/comm_replay.h"
#include "schedule/dependencies.h"

namespace sluice {
namespace {

// Bounds that keep a hostile file from allocating without limit.
constexpr int64_t kMaxStages = 1024;
constexpr int64_t kMaxMicrobatches = 65536;
constexpr int64_t kMaxCells = int64_t{1} << 22;  // stages x micro-batches

struct OpName {
  std::string_view name;
  PipeOp op;
};
// Longest names first, so that a prefix never shadows a longer name.
constexpr std::array<OpName, 9> kOpNames = {{{"REDUCE_GRAD", PipeOp::kReduceGrad},
                                             {"SEND_F", PipeOp::kSendF},
                                             {"RECV_F", PipeOp::kRecvF},
                                             {"SEND_B", PipeOp::kSendB},
                                             {"RECV_B", PipeOp::kRecvB},
                                             {"F", PipeOp::kForward},
                                             {"B", PipeOp::kBackward},
                                             {"I", PipeOp::kBackwardInput},
                                             {"W", PipeOp::kBackwardWeight}}};

std::string_view NameOf(PipeOp op) {
  for (const OpName& n : kOpNames) {
    if (n.op == op) return n.name;
  }
  return "?";
}

bool IsComputeOp(PipeOp op) { return op <= PipeOp::kBackwardWeight; }

struct Cell {
  std::string_view text;
  int64_t line = 0;
  int64_t column = 0;
};

// Rows of non-empty cells (empty cells are PyTorch's idle slots).
std::vector<std::vector<Cell>> SplitCsv(std::string_view text) {
  std::vector<std::vector<Cell>> rows;
  size_t pos = 0;
  int64_t line = 1;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view row = text.substr(pos, end - pos);
    if (!row.empty() && row.back() == '\r') row.remove_suffix(1);
    rows.emplace_back();
    size_t cell_start = 0;
    while (cell_start <= row.size()) {
      size_t comma = row.find(',', cell_start);
      if (comma == std::string_view::npos) comma = row.size();
      std::string_view cell = row.substr(cell_start, comma - cell_start);
      size_t lead = cell.find_first_not_of(" \t");
      if (lead != std::string_view::npos) {
        cell = cell.substr(lead, cell.find_last_not_of(" \t") - lead + 1);
        if (cell.size() >= 2 && cell.front() == '"' && cell.back() == '"') {
          cell = cell.substr(1, cell.size() - 2);
        }
        rows.back().push_back({cell, line, static_cast<int64_t>(cell_start + lead + 1)});
      }
      cell_start = comma + 1;
    }
    pos = end + 1;
    ++line;
  }
  return rows;
}

std::string Where(std::string_view source, const Cell& c) {
  return fmt::format("{}:{}:{}", source, c.line, c.column);
}

// Parses up to 9 digits at `pos`; nullopt when there are none or too many.
std::optional<int64_t> Digits(std::string_view s, size_t* pos) {
  const size_t begin = *pos;
  int64_t v = 0;
  while (*pos < s.size() && s[*pos] >= '0' && s[*pos] <= '9' && *pos - begin < 9) {
    v = v * 10 + (s[*pos] - '0');
    ++*pos;
  }
  if (*pos == begin || (*pos < s.size() && s[*pos] >= '0' && s[*pos] <= '9')) return std::nullopt;
  return v;
}

StatusOr<PipeAction> ParseCell(const Cell& c, std::string_view source) {
  auto bad = [&](std::string_view why) {
    return InvalidArgumentError(fmt::format(
        "{}: invalid action '{}': {}; expected <stage><F|B|I|W|SEND_F|RECV_F|SEND_B|RECV_B>"
        "<microbatch> or <stage>REDUCE_GRAD, e.g. 2F0 or 1SEND_F3",
        Where(source, c), c.text, why));
  };
  if (!c.text.empty() && c.text.front() == '(') {
    return bad("composite actions (OVERLAP_F_B) are not supported");
  }
  size_t pos = 0;
  const std::optional<int64_t> stage = Digits(c.text, &pos);
  if (!stage) return bad("it does not start with a stage index of at most 9 digits");
  const std::string_view rest = c.text.substr(pos);
  if (rest.starts_with("UNSHARD") || rest.starts_with("RESHARD")) {
    return bad("FSDP unshard/reshard actions are not supported");
  }
  const auto name = std::find_if(kOpNames.begin(), kOpNames.end(),
                                 [&](const OpName& n) { return rest.starts_with(n.name); });
  if (name == kOpNames.end()) return bad("unknown action type");
  pos += name->name.size();
  PipeAction a{*stage, name->op, -1};
  if (name->op == PipeOp::kReduceGrad) {
    if (pos != c.text.size()) return bad("REDUCE_GRAD takes no micro-batch");
    return a;
  }
  const std::optional<int64_t> mb = Digits(c.text, &pos);
  if (!mb || pos != c.text.size()) return bad("it needs a micro-batch index of at most 9 digits");
  a.microbatch = *mb;
  return a;
}

// Parsed rows with the position of every action, and the shape they imply.
struct ParsedCsv {
  std::vector<std::vector<PipeAction>> ranks;
  std::vector<std::vector<Cell>> cells;
  int64_t stages = 0;
  int64_t microbatches = 0;
};

StatusOr<ParsedCsv> Parse(std::string_view text, std::string_view source) {
  ParsedCsv out;
  out.cells = SplitCsv(text);
  const int64_t pp = static_cast<int64_t>(out.cells.size());
  if (pp == 0)
    return InvalidArgumentError(fmt::format("{}: no rows (one per pipeline rank)", source));
  if (pp > kMaxStages) {
    return InvalidArgumentError(
        fmt::format("{}: {} rows; at most {} ranks", source, pp, kMaxStages));
  }
  out.ranks.resize(pp);
  for (int64_t r = 0; r < pp; ++r) {
    for (const Cell& c : out.cells[r]) {
      SLUICE_ASSIGN_OR_RETURN(PipeAction a, ParseCell(c, source));
      if (a.stage >= kMaxStages || a.microbatch >= kMaxMicrobatches) {
        return InvalidArgumentError(
            fmt::format("{}: action '{}': at most {} stages and {} "
                        "micro-batches",
                        Where(source, c), c.text, kMaxStages, kMaxMicrobatches));
      }
      if (a.stage % pp != r) {
        return InvalidArgumentError(fmt::format(
            "{}: action '{}' is on rank {}, but stage {} runs on rank {} (stage % {} rows)",
            Where(source, c), c.text, r, a.stage, a.stage % pp, pp));
      }
      out.stages = std::max(out.stages, a.stage + 1);
      out.microbatches = std::max(out.microbatches, a.microbatch + 1);
      out.ranks[r].push_back(a);
    }
  }
  if (out.stages % pp != 0) {
    return InvalidArgumentError(fmt::format(
        "{}: stages 0..{} cannot be spread evenly over {} rows (stage s on row s % rows)", source,
        out.stages - 1, pp));
  }
  if (out.stages * out.microbatches > kMaxCells) {
    return InvalidArgumentError(fmt::format("{}: {} stages x {} micro-batches is too large", source,
                                            out.stages, out.microbatches));
  }
  return out;
}

using Positions = std::vector<std::vector<Cell>>;

// ValidatePipelineOrder with optional cell positions for messages.
Status CheckOrder(const PipelineOrder& order, std::string_view source, const Positions* where) {
  const int64_t pp = order.pp, S = order.num_stages(), m = order.num_microbatches;
  if (pp < 1 || order.vpp < 1 || m < 0 || static_cast<int64_t>(order.ranks.size()) != pp ||
      S > kMaxStages || m > kMaxMicrobatches) {
    return InvalidArgumentError(fmt::format("{}: {} rank rows for pp {}, vpp {}, {} micro-batches",
                                            source, order.ranks.size(), pp, order.vpp, m));
  }
  auto fail = [&](int64_t r, int64_t i, const std::string& why) {
    std::vector<std::string> labels;
    std::vector<std::vector<std::string>> cells(pp);
    for (int64_t k = 0; k < pp; ++k) {
      labels.push_back(fmt::format("Rank {}", k));
      for (const PipeAction& a : order.ranks[k]) cells[k].push_back(a.ToString());
    }
    const bool at_cell = where != nullptr && i < static_cast<int64_t>((*where)[r].size());
    return InvalidArgumentError(fmt::format(
        "{}: rank {} step {} ({}): {}\n{}", at_cell ? Where(source, (*where)[r][i]) : source, r, i,
        i < static_cast<int64_t>(order.ranks[r].size()) ? order.ranks[r][i].ToString() : "end", why,
        FormatStepGrid(labels, cells, i - 6, i + 7, i, fmt::format(" (rank {})", r))));
  };
  Schedule compute{"csv", pp, order.vpp, m, std::vector<std::vector<Action>>(pp)};
  for (int64_t r = 0; r < pp; ++r) {
    for (size_t i = 0; i < order.ranks[r].size(); ++i) {
      const PipeAction& a = order.ranks[r][i];
      const bool reduce = a.op == PipeOp::kReduceGrad;
      if (a.stage < 0 || a.stage >= S || a.stage % pp != r || (reduce != (a.microbatch < 0)) ||
          a.microbatch >= m) {
        return fail(r, i,
                    fmt::format("needs a stage in [0, {}) on this rank and a micro-batch in "
                                "[0, {}) (none for REDUCE_GRAD)",
                                S, m));
      }
      if (IsComputeOp(a.op)) {
        compute.ranks[r].push_back({a.stage, static_cast<ActionKind>(a.op), a.microbatch});
      }
    }
  }
  SLUICE_RETURN_IF_ERROR(CheckScheduleComplete(compute).WithPrefix(source));
  // Per rank: 0 none, 1 F done, 2 B or I done, 3 W done.
  std::vector<std::vector<CommOp>> ops(pp);
  for (int64_t r = 0; r < pp; ++r) {
    std::vector<int> state(m * S, 0);
    std::vector<int64_t> recv_f(m * S, -1), recv_b(m * S, -1);
    std::vector<int64_t> backwards(S, 0);
    ops[r].resize(order.ranks[r].size());
    for (size_t i = 0; i < order.ranks[r].size(); ++i) {
      const PipeAction& a = order.ranks[r][i];
      const int64_t s = a.stage, mb = a.microbatch, k = mb * S + s;
      CommOp& op = ops[r][i];
      auto remote = [&](int64_t other) { return other >= 0 && other < S && other % pp != r; };
      switch (a.op) {
        case PipeOp::kForward:
        case PipeOp::kBackward:
        case PipeOp::kBackwardInput: {
          // The boundary tensor it consumes (schedule/dependencies.h): received from another
          // rank, or produced earlier on this one.
          const bool forward = a.op == PipeOp::kForward;
          if (const auto in = ConsumedBoundary(static_cast<ActionKind>(a.op), s, S)) {
            const int64_t from = mb * S + in->from_stage;
            if (remote(in->from_stage)) {
              const int64_t recv = in->gradient ? recv_b[k] : recv_f[k];
              if (recv < 0) {
                return fail(r, i, forward ? "runs before its RECV_F on this rank"
                                          : "runs before its RECV_B on this rank");
              }
              op.kind = CommOp::Kind::kWait;
              op.wait_for = recv;
            } else if (state[from] < (in->gradient ? 2 : 1)) {
              return fail(r, i,
                          forward ? fmt::format("runs before {}F{} on this rank", s - 1, mb)
                                  : fmt::format("runs before the backward of stage {} on this rank",
                                                s + 1));
            }
          }
          if (forward) {
            state[k] = 1;
          } else {
            state[k] = a.op == PipeOp::kBackward ? 3 : 2;
            backwards[s] += a.op == PipeOp::kBackward ? 1 : 0;
          }
          break;
        }
        case PipeOp::kBackwardWeight:
          state[k] = 3;
          ++backwards[s];
          break;
        case PipeOp::kReduceGrad:
          if (backwards[s] != m) return fail(r, i, "reduces before the stage's last backward");
          break;
        default: {
          const bool send = a.op == PipeOp::kSendF || a.op == PipeOp::kSendB;
          const bool grad = a.op == PipeOp::kSendB || a.op == PipeOp::kRecvB;
          const OpKind kind = send ? (grad ? OpKind::kSendGradStart : OpKind::kSendActStart)
                                   : (grad ? OpKind::kRecvGradStart : OpKind::kRecvActStart);
          const std::optional<TransferLink> link = LinkOf(kind, s, S);
          const int64_t other = link ? link->peer_stage : ((grad == send) ? s - 1 : s + 1);
          if (!link || !remote(other)) {
            return fail(r, i,
                        fmt::format("stage {} has no neighbour {} on another rank", s, other));
          }
          if (send && state[k] < (grad ? 2 : 1)) {
            return fail(r, i, "sends before the compute that produces the tensor");
          }
          if (!send) {
            int64_t& slot = grad ? recv_b[k] : recv_f[k];
            if (slot >= 0) return fail(r, i, "receives the same tensor twice");
            slot = static_cast<int64_t>(i);
          }
          op.kind = CommOp::Kind::kPost;
          op.send = send;
          op.peer = other % pp;
          op.tag = MessageTag(mb, link->boundary, link->gradient, S);
        }
      }
    }
  }
  auto text = [&](int64_t r, int64_t i) { return order.ranks[r][i].ToString(); };
  if (auto p = CheckComms(ops, {}, text)) return fail(p->rank, p->index, p->message);
  return Status::Ok();
}

}  // namespace

std::string PipeAction::ToString() const {
  if (op == PipeOp::kReduceGrad) return fmt::format("{}REDUCE_GRAD", stage);
  return fmt::format("{}{}{}", stage, NameOf(op), microbatch);
}

PipelineOrder PipelineOrderOf(const ExecutionPlan& plan, int64_t dp_index, bool reduce_grad) {
  PipelineOrder order{plan.pp(), plan.vpp(),
                      static_cast<int64_t>(plan.replicas[dp_index].micro_batches.size()),
                      std::vector<std::vector<PipeAction>>(plan.pp())};
  for (int64_t r = 0; r < plan.pp(); ++r) {
    std::vector<PipeAction>& row = order.ranks[r];
    std::vector<int64_t> backwards(plan.num_stages(), 0);
    std::vector<PipeAction> pending;
    auto flush = [&] {
      row.insert(row.end(), pending.begin(), pending.end());
      pending.clear();
    };
    for (const Instruction& in : plan.ranks[plan.RankId(dp_index, r)].instructions) {
      PipeAction a{in.stage, PipeOp::kForward, in.microbatch};
      switch (in.op) {
        case OpKind::kForward:
        case OpKind::kBackward:
        case OpKind::kBackwardInput:
        case OpKind::kBackwardWeight:
          flush();
          a.op = static_cast<PipeOp>(static_cast<int>(in.op) - static_cast<int>(OpKind::kForward));
          row.push_back(a);
          if ((in.op == OpKind::kBackward || in.op == OpKind::kBackwardWeight) && reduce_grad &&
              ++backwards[in.stage] == order.num_microbatches) {
            pending.push_back({in.stage, PipeOp::kReduceGrad, -1});
          }
          continue;
        case OpKind::kSendActStart:
          a.op = PipeOp::kSendF;
          break;
        case OpKind::kRecvActStart:
          a.op = PipeOp::kRecvF;
          break;
        case OpKind::kSendGradStart:
          a.op = PipeOp::kSendB;
          break;
        case OpKind::kRecvGradStart:
          a.op = PipeOp::kRecvB;
          break;
        default:
          continue;
      }
      row.push_back(a);
    }
    flush();
  }
  return order;
}

std::string PipelineOrderToCsv(const PipelineOrder& order) {
  std::string out;
  for (const auto& row : order.ranks) {
    for (size_t i = 0; i < row.size(); ++i) {
      if (i > 0) out += ',';
      out += row[i].ToString();
    }
    out += '\n';
  }
  return out;
}

StatusOr<PipelineOrder> PipelineOrderFromCsv(std::string_view text, std::string_view source) {
  SLUICE_ASSIGN_OR_RETURN(ParsedCsv parsed, Parse(text, source));
  const int64_t pp = static_cast<int64_t>(parsed.ranks.size());
  PipelineOrder order{pp, std::max<int64_t>(parsed.stages / pp, 1), parsed.microbatches,
                      std::move(parsed.ranks)};
  SLUICE_RETURN_IF_ERROR(CheckOrder(order, source, &parsed.cells));
  return order;
}

Status ValidatePipelineOrder(const PipelineOrder& order, std::string_view source) {
  return CheckOrder(order, source, nullptr);
}

}  // namespace sluice
