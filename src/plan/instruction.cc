#include "plan/instruction.h"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <limits>

namespace sluice {
namespace {

constexpr std::array<std::string_view, kNumOpKinds> kOpNames = {
    "load-input",        "forward",         "backward",         "backward-input",
    "backward-weight",   "send-act-start",  "send-act-finish",  "recv-act-start",
    "recv-act-finish",   "send-grad-start", "send-grad-finish", "recv-grad-start",
    "recv-grad-finish",  "free-buffer",     "all-reduce-grad",  "reduce-scatter-grad",
    "all-gather-params", "optimizer-step",  "all-to-all-dispatch", "all-to-all-combine",
    "all-to-all-wait",
};

// PyTorch's names of the point-to-point actions.
std::string_view CommName(OpKind op) {
  switch (op) {
    case OpKind::kSendActStart:
    case OpKind::kSendActFinish:
      return "SEND_F";
    case OpKind::kRecvActStart:
    case OpKind::kRecvActFinish:
      return "RECV_F";
    case OpKind::kSendGradStart:
    case OpKind::kSendGradFinish:
      return "SEND_B";
    default:
      return "RECV_B";
  }
}

}  // namespace

std::string_view OpKindName(OpKind op) { return kOpNames[static_cast<size_t>(op)]; }

std::optional<OpKind> OpKindFromName(std::string_view name) {
  for (size_t i = 0; i < kOpNames.size(); ++i) {
    if (kOpNames[i] == name) return static_cast<OpKind>(i);
  }
  return std::nullopt;
}

bool IsCompute(OpKind op) {
  return op == OpKind::kForward || op == OpKind::kBackward || op == OpKind::kBackwardInput ||
         op == OpKind::kBackwardWeight;
}

Duration ComputeDuration(OpKind op, const ChunkCost& cost) {
  switch (op) {
    case OpKind::kForward:
      return cost.forward;
    case OpKind::kBackward:
      return cost.backward();
    case OpKind::kBackwardInput:
      return cost.backward_input;
    default:
      return cost.backward_weight;
  }
}

bool IsCommStart(OpKind op) {
  return op == OpKind::kSendActStart || op == OpKind::kRecvActStart ||
         op == OpKind::kSendGradStart || op == OpKind::kRecvGradStart;
}

bool IsCommFinish(OpKind op) {
  return op == OpKind::kSendActFinish || op == OpKind::kRecvActFinish ||
         op == OpKind::kSendGradFinish || op == OpKind::kRecvGradFinish;
}

bool IsSend(OpKind op) {
  return op == OpKind::kSendActStart || op == OpKind::kSendActFinish ||
         op == OpKind::kSendGradStart || op == OpKind::kSendGradFinish;
}

bool IsCollective(OpKind op) {
  return op == OpKind::kAllReduceGrad || op == OpKind::kReduceScatterGrad ||
         op == OpKind::kAllGatherParams;
}

bool IsAllToAll(OpKind op) {
  return op == OpKind::kAllToAllDispatch || op == OpKind::kAllToAllCombine;
}

// Each Finish follows its Start in the enum.
OpKind StartOf(OpKind finish) {
  SLUICE_CHECK(IsCommFinish(finish));
  return static_cast<OpKind>(static_cast<int>(finish) - 1);
}

OpKind FinishOf(OpKind start) {
  SLUICE_CHECK(IsCommStart(start));
  return static_cast<OpKind>(static_cast<int>(start) + 1);
}

int64_t NumElements(const TensorShape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return std::numeric_limits<int64_t>::max();
  }
  return n;
}

std::string InstructionText(const Instruction& in) {
  switch (in.op) {
    case OpKind::kLoadInput:
      return fmt::format("{}LOAD{}", in.stage, in.microbatch);
    case OpKind::kForward:
    case OpKind::kBackward:
    case OpKind::kBackwardInput:
    case OpKind::kBackwardWeight: {
      const char kind = in.op == OpKind::kForward    ? 'F'
                        : in.op == OpKind::kBackward ? 'B'
                        : in.op == OpKind::kBackwardInput ? 'I'
                                                          : 'W';
      std::string text = fmt::format("{}{}{}", in.stage, kind, in.microbatch);
      if (in.segment >= 0) text += fmt::format(".s{}", in.segment);
      if (in.chunks > 0) text += fmt::format("[{}/{}]", in.chunk, in.chunks);
      return text;
    }
    case OpKind::kFreeBuffer:
      return fmt::format("FREE(s{})", in.inputs.empty() ? -1 : in.inputs[0]);
    case OpKind::kAllReduceGrad:
      return fmt::format("ALLREDUCE(b{})", in.bucket);
    case OpKind::kReduceScatterGrad:
      return fmt::format("REDUCE_SCATTER(b{})", in.bucket);
    case OpKind::kAllGatherParams:
      return fmt::format("ALLGATHER(b{})", in.bucket);
    case OpKind::kOptimizerStep:
      return "STEP";
    case OpKind::kAllToAllDispatch:
    case OpKind::kAllToAllCombine: {
      std::string text = fmt::format("{}A2A_{}{}(L{})", in.stage,
                                     in.op == OpKind::kAllToAllDispatch ? 'D' : 'C',
                                     in.microbatch, in.layer);
      if (in.chunks > 0) text += fmt::format("[{}/{}]", in.chunk, in.chunks);
      if (in.tag >= 0) text += fmt::format("#{}", in.tag);
      return text;
    }
    case OpKind::kAllToAllWait:
      return fmt::format("{}A2A{}(L{})#{}.wait", in.stage, in.microbatch, in.layer, in.tag);
    default:
      break;
  }
  return fmt::format("{}{}{}{}", in.stage, CommName(in.op), in.microbatch,
                     IsCommFinish(in.op) ? ".wait" : "");
}

int64_t MessageTag(int64_t microbatch, int64_t boundary, bool gradient, int64_t num_stages) {
  return (microbatch * num_stages + boundary) * 2 + (gradient ? 1 : 0);
}

std::string FormatStepGrid(const std::vector<std::string>& labels,
                           const std::vector<std::vector<std::string>>& cells, int64_t first_step,
                           int64_t last_step, int64_t error_step, std::string_view error_note) {
  first_step = std::max<int64_t>(first_step, 0);
  int64_t steps = 0;
  for (const auto& column : cells) steps = std::max<int64_t>(steps, column.size());
  last_step = std::min(last_step, steps);
  const size_t digits = std::to_string(std::max<int64_t>(steps - 1, 0)).size();
  auto cell = [&](size_t c, int64_t step) -> std::string_view {
    if (c >= cells.size() || step >= static_cast<int64_t>(cells[c].size())) return "";
    return cells[c][step];
  };
  std::vector<size_t> width(labels.size());
  for (size_t c = 0; c < labels.size(); ++c) {
    width[c] = labels[c].size();
    for (int64_t s = first_step; s < last_step; ++s)
      width[c] = std::max(width[c], cell(c, s).size());
  }
  std::string out(digits + 7, ' ');
  for (size_t c = 0; c < labels.size(); ++c) {
    out += fmt::format("{:<{}}", labels[c], width[c]);
    if (c + 1 < labels.size()) out += ' ';
  }
  out.erase(out.find_last_not_of(' ') + 1);
  out += '\n';
  if (first_step > 0) out += "...\n";
  for (int64_t s = first_step; s < last_step; ++s) {
    std::string line = fmt::format("Step {:0>{}}: ", s, digits);
    for (size_t c = 0; c < labels.size(); ++c) {
      line += fmt::format("{:<{}}", cell(c, s), width[c]);
      if (c + 1 < labels.size()) line += ' ';
    }
    if (s == error_step) {
      line += fmt::format(" <-- ERROR HERE{}", error_note);
    } else {
      line.erase(line.find_last_not_of(' ') + 1);
    }
    out += line;
    out += '\n';
  }
  if (last_step < steps) out += "...\n";
  return out;
}

}  // namespace sluice
