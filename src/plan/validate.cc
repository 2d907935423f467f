#include "plan/validate.h"

#include <fmt/core.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <string>

#include "plan/comm_replay.h"
#include "plan/memory_rule.h"
#include "plan/program_check.h"

namespace sluice {
namespace {

// A micro-batch's recorded segment lengths (seg_lens, dec_seg_lens): only on varlen micro-batches,
// one list per row with one length per sample, each in [1, max_position] ([0, max_position] on
// the decoder side: a sample without a target), each row's sum within the padded lengths;
// dec_seg_lens exactly when the model is encoder-decoder.
std::optional<std::string> CheckSegments(const ModelSpec& m, const PlanMicroBatch& mb) {
  if (mb.seg_lens.empty() && mb.dec_seg_lens.empty()) return std::nullopt;
  if (!mb.varlen) return "seg_lens are given but the micro-batch is not varlen";
  const bool enc_dec = m.is_encoder_decoder();
  if (enc_dec && mb.dec_seg_lens.empty()) {
    return "seg_lens without dec_seg_lens; allowed: both for an encoder-decoder model";
  }
  if (!enc_dec && !mb.dec_seg_lens.empty()) {
    return fmt::format("dec_seg_lens for decoder-only model {}; allowed: seg_lens only", m.name);
  }
  const auto check = [&](const std::vector<std::vector<int64_t>>& lens, std::string_view name,
                         int64_t padded, int64_t min_len) -> std::optional<std::string> {
    if (lens.size() != mb.rows.size()) {
      return fmt::format("{} has {} rows, the micro-batch {}", name, lens.size(), mb.rows.size());
    }
    for (size_t r = 0; r < lens.size(); ++r) {
      if (lens[r].size() != mb.rows[r].size()) {
        return fmt::format("{}[{}] has {} lengths for {} samples", name, r, lens[r].size(),
                           mb.rows[r].size());
      }
      int64_t sum = 0;
      for (int64_t len : lens[r]) {
        if (len < min_len || len > m.max_position) {
          return fmt::format("{}[{}] holds length {}; allowed: [{}, {}] (max_position of {})",
                             name, r, len, min_len, m.max_position, m.name);
        }
        sum += len;
      }
      if (sum > padded) {
        return fmt::format("{}[{}] sums to {} tokens, more than the padded {}", name, r, sum,
                           padded);
      }
    }
    return std::nullopt;
  };
  if (auto e = check(mb.seg_lens, "seg_lens", mb.shape.seqlen, 1)) return e;
  if (enc_dec) return check(mb.dec_seg_lens, "dec_seg_lens", mb.shape.dec_seqlen, 0);
  return std::nullopt;
}

// Check 1's shape part (CheckPlanFitsModel).
std::optional<std::string> CheckShapesFitModel(const ExecutionPlan& plan) {
  const ModelSpec& m = plan.model;
  for (size_t d = 0; d < plan.replicas.size(); ++d) {
    const auto& mbs = plan.replicas[d].micro_batches;
    for (size_t i = 0; i < mbs.size(); ++i) {
      const LayerShape& s = mbs[i].shape;
      const int64_t longest = std::max(s.seqlen, s.dec_seqlen);
      // A varlen row restarts positions at each sample (runtime/model.cc), so only its samples,
      // not the row, are bounded by max_position; other rows are one sequence.
      if (!mbs[i].varlen && longest > m.max_position) {
        return fmt::format(
            "replica {} micro-batch {}: {} {} is longer than the model's max_position {} ({}); "
            "allowed: lengths in [1, {}] (longer rows only when varlen)",
            d, i, s.dec_seqlen > s.seqlen ? "dec_seqlen" : "seqlen", longest, m.max_position,
            m.name, m.max_position);
      }
      // Both lengths are at most max_position (< 2^31) here, and mbs is bounded first, so the
      // product cannot overflow.
      const int64_t per_row = std::max<int64_t>(s.seqlen, 0) + std::max<int64_t>(s.dec_seqlen, 0);
      if (s.mbs > kMaxMicroBatchTokens || s.mbs * per_row > kMaxMicroBatchTokens) {
        return fmt::format(
            "replica {} micro-batch {}: mbs {} x seqlen {}{} holds more than {} tokens; allowed: "
            "at most {} tokens per micro-batch",
            d, i, s.mbs, s.seqlen,
            s.dec_seqlen > 0 ? fmt::format(" (+ dec_seqlen {})", s.dec_seqlen) : "",
            kMaxMicroBatchTokens, kMaxMicroBatchTokens);
      }
      if (std::optional<std::string> seg = CheckSegments(m, mbs[i])) {
        return fmt::format("replica {} micro-batch {}: {}", d, i, *seg);
      }
    }
  }
  return std::nullopt;
}

std::optional<std::string> CheckStructure(const ExecutionPlan& plan) {
  const ParallelConfig& par = plan.parallel;
  if (par.dp < 1 || par.pp < 1 || par.vpp < 1 || par.tp < 1) {
    return fmt::format("parallel degrees must be >= 1 (dp {}, pp {}, tp {}, vpp {})", par.dp,
                       par.pp, par.tp, par.vpp);
  }
  if (Status fits = CheckParallelFits(par, plan.model, &plan.cluster, "plan"); !fits.ok()) {
    return fits.message();
  }
  if (static_cast<int64_t>(plan.ranks.size()) != par.dp * par.pp) {
    return fmt::format("{} rank programs for dp {} x pp {}", plan.ranks.size(), par.dp, par.pp);
  }
  if (static_cast<int64_t>(plan.replicas.size()) != par.dp) {
    return fmt::format("{} replicas for dp {}", plan.replicas.size(), par.dp);
  }
  if (static_cast<int64_t>(plan.model_states.size()) != par.pp) {
    return fmt::format("{} model-state entries for pp {}", plan.model_states.size(), par.pp);
  }
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    const RankProgram& p = plan.ranks[r];
    const int64_t id = static_cast<int64_t>(r);
    if (p.rank != id || p.dp_index != id / par.pp || p.pp_index != id % par.pp ||
        p.buffer_slots < 0) {
      return fmt::format(
          "program {} says rank {}, dp {}, pp {}, {} slots; rank ids are "
          "dp_index * pp + pp_index",
          r, p.rank, p.dp_index, p.pp_index, p.buffer_slots);
    }
    // Slot ids are dense (0 .. buffer_slots-1, each allocated): a program cannot name more slots
    // than it allocates, so what a reader or runtime sizes by buffer_slots stays within the
    // program's own size.
    int64_t allocations = 0;
    for (const Instruction& in : p.instructions) {
      allocations += static_cast<int64_t>(in.outputs.size());
    }
    if (p.buffer_slots > allocations) {
      return fmt::format(
          "program {} declares {} buffer slots but allocates only {}: slot ids must be dense "
          "(0 .. buffer_slots-1, each allocated by some instruction)",
          r, p.buffer_slots, allocations);
    }
  }
  if (auto p = CheckShapesFitModel(plan)) return p;
  const int64_t S = plan.num_stages();
  for (size_t d = 0; d < plan.replicas.size(); ++d) {
    const auto& mbs = plan.replicas[d].micro_batches;
    for (size_t i = 0; i < mbs.size(); ++i) {
      const PlanMicroBatch& mb = mbs[i];
      const bool encdec = plan.model.is_encoder_decoder();
      if (mb.shape.mbs < 1 || mb.shape.seqlen < 1 || (encdec && mb.shape.dec_seqlen < 1) ||
          (!encdec && mb.shape.dec_seqlen != 0) ||
          static_cast<int64_t>(mb.rows.size()) != mb.shape.mbs ||
          static_cast<int64_t>(mb.stages.size()) != S) {
        return fmt::format(
            "replica {} micro-batch {}: {} rows, shape mbs {} seqlen {} "
            "dec_seqlen {}, {} stage costs; needs mbs rows, positive lengths "
            "(dec_seqlen only for encoder-decoder models) and {} stage costs",
            d, i, mb.rows.size(), mb.shape.mbs, mb.shape.seqlen, mb.shape.dec_seqlen,
            mb.stages.size(), S);
      }
    }
  }
  return std::nullopt;
}

std::optional<std::string> CheckSamples(const ExecutionPlan& plan) {
  const std::vector<int64_t>& ids = plan.sample_ids;
  for (size_t i = 1; i < ids.size(); ++i) {
    if (ids[i] <= ids[i - 1]) {
      return fmt::format("sample_ids must be ascending and unique; {} follows {}", ids[i],
                         ids[i - 1]);
    }
  }
  std::vector<std::string> where(ids.size());
  auto place = [&](int64_t id, std::string here) -> std::optional<std::string> {
    const auto it = std::lower_bound(ids.begin(), ids.end(), id);
    if (it == ids.end() || *it != id) {
      return fmt::format("{} holds sample {}, which is not in the global batch", here, id);
    }
    std::string& w = where[it - ids.begin()];
    if (!w.empty()) return fmt::format("sample {} appears twice: in {} and in {}", id, w, here);
    w = std::move(here);
    return std::nullopt;
  };
  for (size_t d = 0; d < plan.replicas.size(); ++d) {
    const auto& mbs = plan.replicas[d].micro_batches;
    for (size_t i = 0; i < mbs.size(); ++i) {
      for (size_t row = 0; row < mbs[i].rows.size(); ++row) {
        for (int64_t id : mbs[i].rows[row]) {
          if (auto p = place(id, fmt::format("replica {} micro-batch {} row {}", d, i, row))) {
            return p;
          }
        }
      }
    }
  }
  for (const UnplacedSample& s : plan.dropped) {
    if (auto p = place(s.id, "the dropped list")) return p;
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (where[i].empty()) {
      return fmt::format("sample {} of the global batch is in no micro-batch and not dropped",
                         ids[i]);
    }
  }
  return std::nullopt;
}

// The CommOps of one rank's program (CheckComms' input for that rank).
std::vector<CommOp> RankCommOps(const ExecutionPlan& plan, const RankProgram& program,
                                bool with_waits) {
  const auto& list = program.instructions;
  std::vector<CommOp> out(list.size());
  std::vector<int64_t> start_of;  // [tag]: latest Start on this rank
  for (size_t i = 0; i < list.size(); ++i) {
    const Instruction& in = list[i];
    CommOp& op = out[i];
    if (IsCommStart(in.op)) {
      op.kind = CommOp::Kind::kPost;
      op.send = IsSend(in.op);
      op.peer = in.peer;
      op.tag = in.tag;
      op.shapes = &in.shapes;
      if (in.tag >= static_cast<int64_t>(start_of.size())) start_of.resize(in.tag + 1, -1);
      start_of[in.tag] = static_cast<int64_t>(i);
    } else if (IsCommFinish(in.op) && with_waits) {
      op.kind = CommOp::Kind::kWait;
      op.wait_for = in.tag < static_cast<int64_t>(start_of.size()) ? start_of[in.tag] : -1;
    } else if (IsCollective(in.op)) {
      op.kind = CommOp::Kind::kCollective;
      op.group = program.pp_index;
      op.collective = {static_cast<int64_t>(in.op), in.bucket, in.bytes.count()};
    } else if (IsAllToAll(in.op)) {
      // The group's index after the pp data-parallel groups (EpGroups' order).
      op.kind = CommOp::Kind::kCollective;
      op.group = plan.pp() + program.pp_index * (plan.dp() / plan.parallel.ep) +
                 program.dp_index / plan.parallel.ep;
      // A slice of a cut all-to-all is its own collective (op, slice and count in one key).
      op.collective = {static_cast<int64_t>(in.op) + 64 * (in.chunk + 1) + 64 * 4096 * in.chunks,
                       in.layer, in.microbatch};
      op.blocking = with_waits && in.tag < 0;
    } else if (in.op == OpKind::kAllToAllWait && with_waits) {
      // Waits for every member to post what this rank posted in its group (a posted
      // all-to-all completes once all members posted it).
      op.kind = CommOp::Kind::kWaitCollectives;
      op.group = plan.pp() + program.pp_index * (plan.dp() / plan.parallel.ep) +
                 program.dp_index / plan.parallel.ep;
    } else if (in.op == OpKind::kOptimizerStep && with_waits) {
      op.kind = CommOp::Kind::kWaitCollectives;
      op.group = program.pp_index;
    }
  }
  return out;
}

std::vector<std::vector<CommOp>> CommOps(const ExecutionPlan& plan, bool with_waits) {
  std::vector<std::vector<CommOp>> out(plan.ranks.size());
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    out[r] = RankCommOps(plan, plan.ranks[r], with_waits);
  }
  return out;
}

std::vector<std::vector<int64_t>> DpGroups(const ExecutionPlan& plan) {
  std::vector<std::vector<int64_t>> groups(plan.pp());
  for (int64_t p = 0; p < plan.pp(); ++p) {
    for (int64_t d = 0; d < plan.dp(); ++d) groups[p].push_back(plan.RankId(d, p));
  }
  return groups;
}

Status Fail(const ExecutionPlan& plan, int64_t rank, int64_t index, const std::string& message,
            const ValidateOptions& options, bool prefixed) {
  const RankProgram& p = plan.ranks[rank];
  std::string text = "plan check: ";
  if (!prefixed) {
    text += fmt::format("rank {} (dp {}, pp {}) ", rank, p.dp_index, p.pp_index);
    text +=
        index < static_cast<int64_t>(p.instructions.size())
            ? fmt::format("instruction {} ({}): ", index, InstructionText(p.instructions[index]))
            : "at the end of its program: ";
  }
  text += message;
  text += "\n" + FormatPlanGrid(plan, p.dp_index, rank, index, options.grid_context);
  return InvalidArgumentError(std::move(text));
}

// Whether the communication ops of one rank (CommOps' list, with waits) are the same sequence in
// `a` and `b` once the ops that are not communication are left out: a wait's post is compared
// by its place among the rank's communication ops, not by its instruction index.
bool SameCommSequence(const std::vector<CommOp>& a, const std::vector<CommOp>& b) {
  auto ordinals = [](const std::vector<CommOp>& ops) {
    std::vector<int64_t> at(ops.size(), -1);
    int64_t k = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].kind != CommOp::Kind::kNone) at[i] = k++;
    }
    return at;
  };
  const std::vector<int64_t> oa = ordinals(a), ob = ordinals(b);
  size_t i = 0, j = 0;
  while (true) {
    while (i < a.size() && a[i].kind == CommOp::Kind::kNone) ++i;
    while (j < b.size() && b[j].kind == CommOp::Kind::kNone) ++j;
    if (i == a.size() || j == b.size()) return i == a.size() && j == b.size();
    const CommOp& x = a[i];
    const CommOp& y = b[j];
    if (x.kind != y.kind || x.send != y.send || x.peer != y.peer || x.tag != y.tag ||
        x.group != y.group || x.collective != y.collective || x.blocking != y.blocking) {
      return false;
    }
    if ((x.shapes == nullptr) != (y.shapes == nullptr) ||
        (x.shapes != nullptr && *x.shapes != *y.shapes)) {
      return false;
    }
    const int64_t wx = x.wait_for >= 0 ? oa[x.wait_for] : -1;
    const int64_t wy = y.wait_for >= 0 ? ob[y.wait_for] : -1;
    if (wx != wy) return false;
    ++i;
    ++j;
  }
}

}  // namespace

std::string FormatPlanGrid(const ExecutionPlan& plan, int64_t dp_index, int64_t rank,
                           int64_t error_step, int64_t context) {
  std::vector<std::string> labels;
  std::vector<std::vector<std::string>> cells;
  const int64_t first = error_step - context, end = error_step + context + 1;
  for (int64_t p = 0; p < plan.pp(); ++p) {
    const int64_t id = plan.RankId(dp_index, p);
    if (id >= static_cast<int64_t>(plan.ranks.size())) break;
    labels.push_back(fmt::format("Rank {}", id));
    const auto& list = plan.ranks[id].instructions;
    cells.emplace_back(list.size());
    for (int64_t i = std::max<int64_t>(first, 0); i < std::min<int64_t>(end, list.size()); ++i) {
      cells.back()[i] = InstructionText(list[i]);
    }
  }
  return FormatStepGrid(labels, cells, first, end, error_step, fmt::format(" (rank {})", rank));
}

std::vector<Bytes> PredictPeakMemory(const ExecutionPlan& plan, const MemoryRuleOptions& options) {
  std::vector<Bytes> out;
  out.reserve(plan.ranks.size());
  for (const RankProgram& program : plan.ranks) {
    out.push_back(
        ReplayRankMemory(plan, program, Bytes::Of(std::numeric_limits<int64_t>::max()), options)
            .peak);
  }
  return out;
}

namespace {

std::optional<MemoryProblem> RankMemoryProblem(const ExecutionPlan& plan,
                                               const RankProgram& program) {
  const Bytes limit = plan.memory_limit();
  const RankMemory m = ReplayRankMemory(plan, program, limit);
  if (m.first_over < 0) return std::nullopt;
  const Bytes states = plan.model_states[program.pp_index];
  return MemoryProblem{
      program.rank, m.first_over,
      fmt::format("predicted memory {} ({:.1f} MB: model states {:.1f} MB + activations "
                  "{:.1f} MB + buffers {:.1f} MB) exceeds the limit {:.1f} MB",
                  FormatBytes(m.over_level), m.over_level.mb(), states.mb(),
                  m.over_activations.mb(), m.over_buffers.mb(), limit.mb())};
}

}  // namespace

std::optional<MemoryProblem> CheckPlanMemory(const ExecutionPlan& plan) {
  for (const RankProgram& program : plan.ranks) {
    if (auto p = RankMemoryProblem(plan, program)) return p;
  }
  return std::nullopt;
}

Status CheckPlanFitsModel(const ExecutionPlan& plan) {
  if (auto p = CheckShapesFitModel(plan)) return InvalidArgumentError("plan check: " + *p);
  return Status::Ok();
}

Status ValidatePlan(const ExecutionPlan& plan, const ValidateOptions& options) {
  if (auto p = CheckStructure(plan)) return InvalidArgumentError("plan check: " + *p);
  if (auto p = CheckSamples(plan)) return InvalidArgumentError("plan check: " + *p);
  for (const RankProgram& program : plan.ranks) {
    if (auto p = CheckProgramFields(plan, program)) {
      return Fail(plan, program.rank, p->index, p->message, options, false);
    }
  }
  std::vector<std::vector<int64_t>> groups = DpGroups(plan);
  if (plan.parallel.ep > 1 && plan.dp() % plan.parallel.ep == 0) {
    // Expert-parallel groups (CommOps numbers them after the data-parallel ones).
    for (int64_t p = 0; p < plan.pp(); ++p) {
      for (int64_t first = 0; first < plan.dp(); first += plan.parallel.ep) {
        groups.push_back(EpGroupOf(plan, plan.RankId(first, p)));
      }
    }
  }
  auto text = [&](int64_t r, int64_t i) { return InstructionText(plan.ranks[r].instructions[i]); };
  if (auto p = CheckComms(CommOps(plan, false), groups, text)) {
    return Fail(plan, p->rank, p->index, p->message, options, true);
  }
  for (const RankProgram& program : plan.ranks) {
    if (auto p = CheckProgramOrder(plan, program)) {
      return Fail(plan, program.rank, p->index, p->message, options, false);
    }
  }
  if (auto p = CheckComms(CommOps(plan, true), groups, text)) {
    return Fail(plan, p->rank, p->index, p->message, options, true);
  }
  if (!options.check_memory) return Status::Ok();
  if (std::optional<MemoryProblem> p = CheckPlanMemory(plan)) {
    const int64_t index = p->instruction < 0 ? 0 : p->instruction;
    return Fail(plan, p->rank, index, p->message, options, false);
  }
  return Status::Ok();
}

Status ValidateRankRewrite(const ExecutionPlan& plan, int64_t rank, const RankProgram& original,
                           const ValidateOptions& options) {
  // The order of ValidatePlan's checks is kept, so the first failing check (and its message) is
  // the one ValidatePlan would report: every check of another rank passed before the rewrite.
  if (auto p = CheckStructure(plan)) return InvalidArgumentError("plan check: " + *p);
  if (rank < 0 || rank >= static_cast<int64_t>(plan.ranks.size())) {
    return InvalidArgumentError(fmt::format("plan check: rank {} outside 0..{}", rank,
                                            static_cast<int64_t>(plan.ranks.size()) - 1));
  }
  const RankProgram& program = plan.ranks[rank];
  if (auto p = CheckProgramFields(plan, program)) {
    return Fail(plan, program.rank, p->index, p->message, options, false);
  }
  // The communication replay reads a rank only through its CommOps (with waits: a superset of
  // the ops without); the same sequence as before replays as it did.
  const bool comms_changed = !SameCommSequence(RankCommOps(plan, original, true),
                                               RankCommOps(plan, program, true));
  std::vector<std::vector<int64_t>> groups;
  auto text = [&](int64_t r, int64_t i) { return InstructionText(plan.ranks[r].instructions[i]); };
  if (comms_changed) {
    groups = DpGroups(plan);
    if (plan.parallel.ep > 1 && plan.dp() % plan.parallel.ep == 0) {
      for (int64_t p = 0; p < plan.pp(); ++p) {
        for (int64_t first = 0; first < plan.dp(); first += plan.parallel.ep) {
          groups.push_back(EpGroupOf(plan, plan.RankId(first, p)));
        }
      }
    }
    if (auto p = CheckComms(CommOps(plan, false), groups, text)) {
      return Fail(plan, p->rank, p->index, p->message, options, true);
    }
  }
  if (auto p = CheckProgramOrder(plan, program)) {
    return Fail(plan, program.rank, p->index, p->message, options, false);
  }
  if (comms_changed) {
    if (auto p = CheckComms(CommOps(plan, true), groups, text)) {
      return Fail(plan, p->rank, p->index, p->message, options, true);
    }
  }
  if (!options.check_memory) return Status::Ok();
  if (std::optional<MemoryProblem> p = RankMemoryProblem(plan, program)) {
    const int64_t index = p->instruction < 0 ? 0 : p->instruction;
    return Fail(plan, p->rank, index, p->message, options, false);
  }
  return Status::Ok();
}

}  // namespace sluice
