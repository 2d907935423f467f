#include "passes/moe_overlap.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <utility>

#include "cost/comm_model.h"
#include "passes/grad_overlap.h"
#include "passes/moe_chain.h"
#include "plan/moe_segments.h"
#include "plan/validate.h"

namespace sluice::passes {
namespace {

using internal::ChainStep;
using Kind = ChainStep::Kind;

constexpr std::string_view kNames[] = {"none",      "tutel",  "megatron",       "dw",
                                       "partition", "lancet", "lancet-megatron"};

// A whole MoE compute op (F, B or I) of a rank's program with its all-to-alls and the
// FreeBuffers the lowering put between them.
struct Block {
  Instruction op;
  std::vector<Instruction> a2a;
  std::vector<Instruction> frees;
};

// A program as plain instructions and blocks, in order.
struct Unit {
  int64_t block = -1;  // >= 0: blocks[block]
  Instruction plain;
};
struct Parsed {
  std::vector<Unit> units;
  std::vector<Block> blocks;
};

std::optional<std::string> Parse(const ExecutionPlan& plan, const RankProgram& program,
                                 Parsed* out) {
  const auto& list = program.instructions;
  for (size_t i = 0; i < list.size(); ++i) {
    const Instruction& in = list[i];
    if (in.segment >= 0 || in.chunks > 0 || in.op == OpKind::kAllToAllWait ||
        (IsAllToAll(in.op) && in.tag >= 0)) {
      return fmt::format("rank {} instruction {} ({}) is already segmented", program.rank, i,
                         InstructionText(in));
    }
    const int64_t P = IsCompute(in.op) ? NumSegments(plan, in.stage) : 0;
    if (in.op == OpKind::kBackwardWeight || P == 0) {
      out->units.push_back({-1, in});
      continue;
    }
    Block b{in, {}, {}};
    size_t j = i + 1;
    for (; j < list.size() && static_cast<int64_t>(b.a2a.size()) < P - 1; ++j) {
      if (IsAllToAll(list[j].op)) {
        b.a2a.push_back(list[j]);
      } else if (list[j].op == OpKind::kFreeBuffer) {
        b.frees.push_back(list[j]);
      } else {
        break;
      }
    }
    if (static_cast<int64_t>(b.a2a.size()) != P - 1) {
      return fmt::format("rank {} instruction {} ({}) is not followed by its {} all-to-alls",
                         program.rank, i, InstructionText(in), P - 1);
    }
    out->units.push_back({static_cast<int64_t>(out->blocks.size()), {}});
    out->blocks.push_back(std::move(b));
    i = j - 1;
  }
  return std::nullopt;
}

// Splits `total` by `shares` in whole nanoseconds, the remainder on the last.
std::vector<Duration> SplitTime(Duration total, const std::vector<double>& shares) {
  std::vector<Duration> out;
  Duration used;
  for (size_t j = 0; j + 1 < shares.size(); ++j) {
    out.push_back(total.Scaled(shares[j]));
    used += out.back();
  }
  out.push_back(std::max(Duration::Zero(), total - used));
  return out;
}

// How one block is emitted.
struct Decision {
  std::vector<int64_t> cut;  // per chain element (0: whole)
  bool async = false;        // whole all-to-alls posted and waited
  bool dw = false;           // B -> I + W pieces, W packed into all-to-all windows
  bool tokens = false;       // the slices cut the tokens (the forward partition)
};

// The times of a block's chain on its rank.
struct ChainTimes {
  std::vector<Duration> seg, w, a2a, latency;
};

ChainTimes TimesOf(const ExecutionPlan& plan, int64_t rank, const Block& b, bool dw) {
  const RankProgram& p = plan.ranks[static_cast<size_t>(rank)];
  const Instruction& op = b.op;
  const bool backward = op.op != OpKind::kForward;
  std::vector<double> shares = MoeSegmentShares(plan, p.dp_index, op.microbatch, op.stage, false);
  std::vector<double> wshares = MoeSegmentShares(plan, p.dp_index, op.microbatch, op.stage, true);
  if (backward) {
    std::reverse(shares.begin(), shares.end());
    std::reverse(wshares.begin(), wshares.end());
  }
  ChainTimes t;
  if (dw && op.op == OpKind::kBackward) {
    const ChunkCost& c = plan.replicas[p.dp_index].micro_batches[op.microbatch].stages[op.stage];
    const double total = static_cast<double>(c.backward().nanos());
    const double wf = total > 0 ? static_cast<double>(c.backward_weight.nanos()) / total : 0.5;
    const Duration w = op.duration.Scaled(wf);
    t.w = SplitTime(w, wshares);
    t.seg = SplitTime(op.duration - w, shares);
  } else {
    t.seg = SplitTime(op.duration, shares);
  }
  const AlphaBetaCommModel comm(plan.cluster);
  for (const Instruction& a : b.a2a) {
    bool spans = false;
    for (int64_t g : a.group) spans = spans || plan.NodeOf(g) != plan.NodeOf(rank);
    const int64_t n = static_cast<int64_t>(a.group.size());
    t.a2a.push_back(a.duration);
    t.latency.push_back(
        std::min(a.duration, comm.PointToPoint(Bytes::Zero(), spans) * std::max<int64_t>(n - 1, 1)));
  }
  return t;
}

// Emits blocks of one rank as pieces, all-to-alls and waits.
class Emitter {
 public:
  Emitter(const ExecutionPlan& plan, int64_t rank, const MoeOverlapOptions& options)
      : plan_(plan), rank_(rank), options_(options) {}

  // One block alone.
  void Block1(const Block& b, const Decision& d, std::vector<Instruction>* out) {
    State s = Start(b, d);
    for (const ChainStep& step : s.steps) Step(s, step, out);
    Finish(s, out);
    for (const Instruction& f : b.frees) out->push_back(f);
  }

  // A backward block and the forward block after it, interleaved (Megatron's combined 1F1B):
  // forward steps up to and including a post, then backward steps likewise, and so on.
  void Pair(const Block& back, const Decision& db, const Block& fwd, const Decision& df,
            std::vector<Instruction>* out) {
    State f = Start(fwd, df), b = Start(back, db);
    size_t i = 0, j = 0;
    while (i < f.steps.size() || j < b.steps.size()) {
      while (i < f.steps.size()) {
        const ChainStep step = f.steps[i++];
        Step(f, step, out, &b);
        if (step.kind == Kind::kPost) break;
      }
      while (j < b.steps.size()) {
        const ChainStep step = b.steps[j++];
        Step(b, step, out, &b);
        if (step.kind == Kind::kPost) break;
      }
    }
    Finish(f, out);
    Finish(b, out);
  }

  int64_t packed() const { return packed_; }
  int64_t sliced() const { return sliced_; }
  int64_t posted() const { return posted_; }

 private:
  struct State {
    const Block* block = nullptr;
    Decision d;
    ChainTimes t;
    std::vector<ChainStep> steps;
    int64_t pieces_left = 0;
    bool started = false;
    std::map<std::pair<int64_t, int64_t>, int64_t> tag;  // (element, slice) -> tag
    std::vector<bool> w_ready, w_done;                    // W segments: I ran, W placed
    std::vector<int64_t> slices_left;                     // per segment: pieces not emitted
  };

  State Start(const Block& b, const Decision& d) {
    State s;
    s.block = &b;
    s.d = d;
    s.t = TimesOf(plan_, rank_, b, d.dw);
    s.steps = internal::ChainSteps(d.cut, d.async);
    for (const ChainStep& step : s.steps) s.pieces_left += step.kind == Kind::kPiece;
    const size_t P = s.t.seg.size();
    s.w_ready.assign(P, false);
    s.w_done.assign(P, false);
    for (size_t j = 0; j < P; ++j) {
      s.slices_left.push_back(std::max<int64_t>(d.cut[2 * j], 1));
    }
    return s;
  }

  Instruction PieceOf(const State& s, OpKind op, int64_t seg, int64_t slice, Duration d) const {
    const Instruction& whole = s.block->op;
    Instruction in;
    in.op = op;
    in.microbatch = whole.microbatch;
    in.stage = whole.stage;
    in.recompute = op == OpKind::kBackwardWeight ? Recompute::kNone : whole.recompute;
    in.segment = seg;
    const int64_t n = s.d.cut.empty() ? 0 : s.d.cut[2 * seg];
    if (slice >= 0 && op != OpKind::kBackwardWeight) {
      in.chunk = slice;
      in.chunks = n;
    }
    in.duration = d;
    return in;
  }

  // `packer`: the state whose W pieces fill this post's window (the block's own by default).
  void Step(State& s, const ChainStep& step, std::vector<Instruction>* out,
            State* packer = nullptr) {
    const Instruction& whole = s.block->op;
    const int64_t j = step.element / 2;
    const int64_t n = s.d.cut[step.element];
    if (step.kind == Kind::kPiece) {
      const OpKind op = s.d.dw && whole.op == OpKind::kBackward ? OpKind::kBackwardInput : whole.op;
      const Duration d =
          n > 0 ? Duration::Nanos(s.t.seg[j].nanos() / n) + *options_.slice_overhead : s.t.seg[j];
      Instruction in = PieceOf(s, op, j, step.slice, d);
      if (!s.started) in.inputs = whole.inputs;
      if (--s.pieces_left == 0) {
        in.outputs = whole.outputs;
        in.shapes = whole.shapes;
      }
      s.started = true;
      if (n > 0) ++sliced_;
      out->push_back(std::move(in));
      if (--s.slices_left[j] == 0 && !s.t.w.empty()) s.w_ready[j] = true;
      return;
    }
    if (step.kind == Kind::kPost) {
      const Instruction& a = s.block->a2a[j];
      Instruction in = n > 0 ? AllToAllSlice(a, step.slice, n, plan_.model.hidden, rank_) : a;
      if (n > 0) {
        in.duration = internal::SliceTime(a.duration, s.t.latency[j], n, j, s.d.tokens);
      }
      const bool async = n > 0 || s.d.async;
      if (async) {
        in.tag = next_tag_++;
        s.tag[{step.element, step.slice}] = in.tag;
        ++posted_;
      }
      out->push_back(in);
      State& p = packer != nullptr ? *packer : s;
      if (async && !p.t.w.empty()) Pack(p, in.duration, out);
      return;
    }
    Instruction w;
    w.op = OpKind::kAllToAllWait;
    w.microbatch = whole.microbatch;
    w.stage = whole.stage;
    w.layer = s.block->a2a[j].layer;
    w.tag = s.tag.at({step.element, step.slice});
    out->push_back(w);
  }

  // Lancet's greedy best fit: W segments whose I has run, closest to the time left, until the
  // window is used up or the best is over twice what is left (and something was placed).
  void Pack(State& s, Duration window, std::vector<Instruction>* out) {
    Duration left = window;
    bool placed = false;
    while (left > Duration::Zero()) {
      int64_t best = -1;
      for (size_t j = 0; j < s.w_ready.size(); ++j) {
        if (!s.w_ready[j] || s.w_done[j]) continue;
        const int64_t gap = std::abs((s.t.w[j] - left).nanos());
        if (best < 0 || gap < std::abs((s.t.w[best] - left).nanos())) {
          best = static_cast<int64_t>(j);
        }
      }
      if (best < 0 || (placed && s.t.w[best] > left * 2)) break;
      s.w_done[best] = true;
      out->push_back(PieceOf(s, OpKind::kBackwardWeight, best, -1, s.t.w[best]));
      left = left - s.t.w[best];
      placed = true;
      ++packed_;
    }
  }

  void Finish(State& s, std::vector<Instruction>* out) {
    for (size_t j = 0; j < s.w_done.size(); ++j) {
      if (s.t.w.empty() || s.w_done[j]) continue;
      s.w_done[j] = true;
      out->push_back(PieceOf(s, OpKind::kBackwardWeight, static_cast<int64_t>(j), -1, s.t.w[j]));
    }
  }

  const ExecutionPlan& plan_;
  const int64_t rank_;
  const MoeOverlapOptions& options_;
  int64_t next_tag_ = 0;
  int64_t packed_ = 0, sliced_ = 0, posted_ = 0;
};

}  // namespace

std::string_view MoeOverlapName(MoeOverlap overlap) { return kNames[static_cast<int>(overlap)]; }

StatusOr<MoeOverlap> ParseMoeOverlap(std::string_view name, std::string_view flag) {
  for (size_t i = 0; i < std::size(kNames); ++i) {
    if (kNames[i] == name) return static_cast<MoeOverlap>(i);
  }
  return InvalidArgumentError(fmt::format(
      "{} '{}' is not an MoE overlap; allowed: none, tutel, megatron, dw, partition, lancet, "
      "lancet-megatron",
      flag, name));
}

std::string MoeOverlapPass::Describe() const {
  switch (overlap_) {
    case MoeOverlap::kTutel:
      return fmt::format("moe-overlap(tutel, {} slices)", options_.tutel_degree);
    case MoeOverlap::kPartition:
    case MoeOverlap::kLancet:
    case MoeOverlap::kLancetMegatron:
      return fmt::format("moe-overlap({}, n <= {})", MoeOverlapName(overlap_), options_.max_chunks);
    default:
      return fmt::format("moe-overlap({})", MoeOverlapName(overlap_));
  }
}

StatusOr<PassRecord> MoeOverlapPass::Run(ExecutionPlan* plan) const {
  PassRecord record;
  record.pass = Describe();
  // The slice overhead: the options', else the one the plan's cost model measured, else 20 us.
  MoeOverlapOptions options = options_;
  options.slice_overhead = SliceOverheadFor(*plan, options_);
  const Duration slice_overhead = *options.slice_overhead;
  if (options_.tutel_degree < 2 || options_.max_chunks < 2) {
    return InvalidArgumentError(fmt::format(
        "moe-overlap: tutel_degree ({}) and max_chunks ({}) must be >= 2",
        options_.tutel_degree, options_.max_chunks));
  }
  if (plan->parallel.ep <= 1 || !plan->model.moe.has_value()) return record;
  // Megatron's B/F interleaving, alone or under Lancet's passes.
  const bool interleave =
      overlap_ == MoeOverlap::kMegatron || overlap_ == MoeOverlap::kLancetMegatron;
  if (interleave && plan->pp() > 1) {
    record.rejected = fmt::format("{} overlap needs pp = 1 (Megatron-Core: PP = 1 or virtual PP)",
                                  MoeOverlapName(overlap_));
    return record;
  }
  const size_t R = plan->ranks.size();
  std::vector<Parsed> parsed(R);
  for (size_t r = 0; r < R; ++r) {
    if (auto problem = Parse(*plan, plan->ranks[r], &parsed[r])) {
      record.rejected = *problem;
      return record;
    }
  }
  const bool dw = overlap_ == MoeOverlap::kDw || overlap_ == MoeOverlap::kLancet || interleave;
  const bool partition = overlap_ == MoeOverlap::kPartition || overlap_ == MoeOverlap::kLancet ||
                         overlap_ == MoeOverlap::kLancetMegatron;
  // Decisions per rank and block; the partition DP's are the group's (largest times).
  std::vector<std::vector<Decision>> decide(R);
  for (size_t r = 0; r < R; ++r) {
    for (const Block& b : parsed[r].blocks) {
      const int64_t P = NumSegments(*plan, b.op.stage);
      Decision d;
      d.cut.assign(static_cast<size_t>(2 * P - 1), 0);
      d.dw = dw && b.op.op == OpKind::kBackward;
      // Whole all-to-alls posted (megatron posts every one; lancet-megatron those of its pairs,
      // below, and Lancet's elsewhere).
      d.async = d.dw || overlap_ == MoeOverlap::kMegatron;
      if (overlap_ == MoeOverlap::kTutel) {
        for (int64_t e = 1; e + 2 < 2 * P - 1; e += 4) {
          d.cut[e] = d.cut[e + 1] = d.cut[e + 2] = options_.tutel_degree;
        }
      }
      decide[r].push_back(std::move(d));
    }
  }
  if (partition) {
    for (size_t r = 0; r < R; ++r) {
      const std::vector<int64_t> group = EpGroupOf(*plan, static_cast<int64_t>(r));
      if (group.front() != static_cast<int64_t>(r)) continue;
      for (size_t k = 0; k < parsed[r].blocks.size(); ++k) {
        // A forward the backward replays (recompute full) stays whole: the runtime replays a
        // forward whole, from what its all-to-alls received.
        if (parsed[r].blocks[k].op.op != OpKind::kForward ||
            parsed[r].blocks[k].op.recompute == Recompute::kFull) {
          continue;
        }
        ChainTimes worst;
        for (int64_t g : group) {
          if (k >= parsed[g].blocks.size()) continue;
          const ChainTimes t = TimesOf(*plan, g, parsed[g].blocks[k], false);
          if (worst.seg.empty()) worst = t;
          for (size_t j = 0; j < t.seg.size() && j < worst.seg.size(); ++j) {
            worst.seg[j] = std::max(worst.seg[j], t.seg[j]);
          }
          for (size_t j = 0; j < t.a2a.size() && j < worst.a2a.size(); ++j) {
            worst.a2a[j] = std::max(worst.a2a[j], t.a2a[j]);
            worst.latency[j] = std::max(worst.latency[j], t.latency[j]);
          }
        }
        // Token slices cut the micro-batch's rows (Lancet's batch dimension): at most as many
        // as the group's smallest micro-batch has.
        int64_t rows = options_.max_chunks;
        for (int64_t g : group) {
          if (k >= parsed[g].blocks.size()) continue;
          const RankProgram& p = plan->ranks[static_cast<size_t>(g)];
          rows = std::min(rows, plan->replicas[p.dp_index]
                                    .micro_batches[parsed[g].blocks[k].op.microbatch]
                                    .shape.mbs);
        }
        const std::vector<int64_t> cut =
            internal::PartitionDp(worst.seg, worst.a2a, worst.latency, rows, slice_overhead);
        for (int64_t g : group) {
          if (k < decide[g].size()) {
            decide[g][k].cut = cut;
            decide[g][k].tokens = true;
          }
        }
      }
    }
  }
  // One rewrite; megatron interleaves only every `stride`-th B/F pair of a rank (0: none; the ranks
  // of an ep group run identical schedules, so they pick the same pairs).
  struct Built {
    ExecutionPlan plan;
    std::vector<std::string> changes;
    std::string problem;  // the validator's first line; empty when valid
  };
  auto build = [&](int64_t stride) {
    Built out_plan{*plan, {}, {}};
    ExecutionPlan& candidate = out_plan.plan;
    std::vector<Parsed> parsed_copy = parsed;  // the megatron slot renaming edits blocks
  for (size_t r = 0; r < R; ++r) {
    std::vector<Parsed>& parsed = parsed_copy;
    Emitter emit(*plan, static_cast<int64_t>(r), options);
    RankProgram& program = candidate.ranks[r];
    std::vector<Unit>& units = parsed[r].units;
    std::vector<Instruction> out;
    int64_t pairs = 0, backward_blocks = 0;
    for (size_t u = 0; u < units.size(); ++u) {
      if (units[u].block < 0) {
        out.push_back(units[u].plain);
        continue;
      }
      const Block& b = parsed[r].blocks[units[u].block];
      const Decision& d = decide[r][units[u].block];
      if (interleave && stride > 0 && b.op.op == OpKind::kBackward &&
          backward_blocks++ % stride == 0) {
        // The forward block after it, past only loads and frees.
        size_t v = u + 1;
        while (v < units.size() && units[v].block < 0 &&
               (units[v].plain.op == OpKind::kFreeBuffer ||
                units[v].plain.op == OpKind::kLoadInput)) {
          ++v;
        }
        if (v < units.size() && units[v].block >= 0 &&
            parsed[r].blocks[units[v].block].op.op == OpKind::kForward) {
          // Loads move before the pair; a slot a moved free still holds gets a new id there.
          std::vector<int64_t> freed;
          for (const Instruction& f : b.frees) freed.push_back(f.inputs[0]);
          for (size_t x = u + 1; x < v; ++x) {
            if (units[x].plain.op == OpKind::kFreeBuffer) freed.push_back(units[x].plain.inputs[0]);
          }
          for (size_t x = u + 1; x < v; ++x) {
            Instruction& load = units[x].plain;
            if (load.op != OpKind::kLoadInput) continue;
            const int64_t old_slot = load.outputs[0];
            if (std::find(freed.begin(), freed.end(), old_slot) != freed.end()) {
              const int64_t fresh = program.buffer_slots++;
              auto rename = [&](std::vector<int64_t>& slots) {
                for (int64_t& s : slots) s = s == old_slot ? fresh : s;
              };
              rename(load.outputs);
              bool done = false;
              for (size_t y = x + 1; y < units.size() && !done; ++y) {
                if (units[y].block < 0) {
                  Instruction& in = units[y].plain;
                  done = in.op == OpKind::kFreeBuffer && in.inputs[0] == old_slot;
                  rename(in.inputs);
                  rename(in.outputs);
                  continue;
                }
                Block& nb = parsed[r].blocks[units[y].block];
                rename(nb.op.inputs);
                rename(nb.op.outputs);
                for (Instruction& f : nb.frees) {
                  if (!done && f.inputs[0] == old_slot) {
                    f.inputs[0] = fresh;
                    done = true;
                  }
                }
              }
            }
            out.push_back(load);
          }
          const Block& f = parsed[r].blocks[units[v].block];
          // A paired forward stays whole (lancet-megatron: its all-to-alls are under the
          // backward's computation already), its all-to-alls posted.
          Decision df = decide[r][units[v].block];
          std::fill(df.cut.begin(), df.cut.end(), 0);
          df.tokens = false;
          df.async = true;
          emit.Pair(b, d, f, df, &out);
          for (const Instruction& fr : b.frees) out.push_back(fr);
          for (size_t x = u + 1; x < v; ++x) {
            if (units[x].plain.op == OpKind::kFreeBuffer) out.push_back(units[x].plain);
          }
          for (const Instruction& fr : f.frees) out.push_back(fr);
          ++pairs;
          u = v;
          continue;
        }
      }
      emit.Block1(b, d, &out);
    }
    program.instructions = std::move(out);
    out_plan.changes.push_back(fmt::format(
        "rank {}: {} MoE ops segmented, {} sliced pieces, {} posted all-to-alls, {} W segments "
        "packed into all-to-all windows{}",
        r, parsed[r].blocks.size(), emit.sliced(), emit.posted(), emit.packed(),
        interleave ? fmt::format(", {} B/F pairs interleaved", pairs) : std::string()));
  }
  if (options_.overlap_grad_reduction) {
    const int64_t moved = OverlapGradientReduction(&candidate);
    if (moved > 0 && !out_plan.changes.empty()) {
      out_plan.changes.front() += fmt::format(
          "; {} gradient buckets over all ranks posted during the last backward (DDP-style)",
          moved);
    }
  }
  const Status valid = ValidatePlan(candidate, ValidateOptions{.grid_context = 0});
  if (!valid.ok()) {
    const std::string& m = valid.message();
    out_plan.problem = m.substr(0, m.find('\n'));
  }
  return out_plan;
  };
  // Megatron's interleaving holds a backward's and the next forward's activations at once: when
  // every pair breaks a check (the memory limit, where the planner filled it), every 2nd, 3rd, ...
  // pair is interleaved instead, the first stride that keeps the plan valid.
  int64_t max_backward = 1;
  for (const Parsed& p : parsed) {
    int64_t n = 0;
    for (const Block& blk : p.blocks) n += blk.op.op == OpKind::kBackward ? 1 : 0;
    max_backward = std::max(max_backward, n);
  }
  Built built = build(1);
  const std::string first_problem = built.problem;
  int64_t stride = 1;
  while (!built.problem.empty() && interleave && stride < max_backward) {
    built = build(++stride);
  }
  // lancet-megatron where no pair fits: Lancet's passes alone (what it is without pairs).
  if (!built.problem.empty() && overlap_ == MoeOverlap::kLancetMegatron) {
    built = build(stride = 0);
  }
  if (!built.problem.empty()) {
    // lancet-megatron: why Lancet's passes alone broke a check as well.
    record.rejected = stride == 0 && built.problem != first_problem
                          ? fmt::format("{} (with no B/F pair: {})", first_problem, built.problem)
                          : first_problem;
    return record;
  }
  record.changes = std::move(built.changes);
  if (stride == 0) {
    record.degraded = fmt::format(
        "no B/F pair interleaved, Lancet's passes alone (every stride of pairs breaks a check; "
        "all of them: {})",
        first_problem);
  } else if (stride > 1) {
    record.degraded =
        fmt::format("every {} B/F pairs one interleaved (all of them: {})", stride, first_problem);
  }
  ExecutionPlan& candidate = built.plan;
  record.changed = !(candidate == *plan);
  *plan = std::move(candidate);
  return record;
}

}  // namespace sluice::passes
