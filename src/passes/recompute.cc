#include "passes/recompute.h"

#include <fmt/core.h>

#include <algorithm>
#include <utility>

#include "plan/memory_rule.h"

namespace sluice::passes {

std::string RecomputePass::Describe() const {
  return fmt::format("recompute(replica {}, mb {}, stage {}, {})", dp_index_, microbatch_, stage_,
                     RecomputeName(level_));
}

std::optional<Recompute> RecomputeAt(const ExecutionPlan& plan, int64_t dp_index,
                                     int64_t microbatch, int64_t stage) {
  const RankProgram& p = plan.ranks[plan.RankId(dp_index, plan.PipelineRankOf(stage))];
  for (const Instruction& in : p.instructions) {
    if (in.op == OpKind::kForward && in.microbatch == microbatch && in.stage == stage) {
      return in.recompute;
    }
  }
  return std::nullopt;
}

namespace {

// The compute instructions (F, B, I, W) of (micro-batch `mb`, stage `stage`) in `p`, in order.
std::vector<size_t> ComputeOf(const RankProgram& p, int64_t mb, int64_t stage) {
  std::vector<size_t> out;
  for (size_t i = 0; i < p.instructions.size(); ++i) {
    const Instruction& in = p.instructions[i];
    if (IsCompute(in.op) && in.microbatch == mb && in.stage == stage) out.push_back(i);
  }
  return out;
}

// The level the F among `indices` of `p` runs at; nullopt without an F.
std::optional<Recompute> LevelOf(const RankProgram& p, const std::vector<size_t>& indices) {
  for (size_t i : indices) {
    if (p.instructions[i].op == OpKind::kForward) return p.instructions[i].recompute;
  }
  return std::nullopt;
}

// Sets (micro-batch `mb`, stage `stage`) of replica `d` to `level` at `cost`: its instructions
// `indices` on rank `rank` and the plan's per-stage cost. Only durations, levels and that cost
// change, so the structure stays as valid as before and only the rank's memory (ValidatePlan's
// check 7) can change: with `check`, the rank's memory is replayed, and when it no longer fits
// everything is put back and the replay that failed is returned (first_over >= 0); without, the
// caller knows it fits and an empty RankMemory is returned.
RankMemory SetLevel(ExecutionPlan* plan, int64_t d, int64_t mb, int64_t stage, int64_t rank,
                    const std::vector<size_t>& indices, const ChunkCost& cost, Recompute level,
                    bool check = true) {
  ChunkCost& recorded = plan->replicas[d].micro_batches[mb].stages[stage];
  const ChunkCost old_cost = recorded;
  // What is overwritten, to put back (a copy of the whole rank program per attempt was most of
  // the placement pass's time).
  struct Saved {
    Duration duration;
    Recompute recompute;
  };
  std::vector<Saved> saved;
  saved.reserve(indices.size());
  recorded = cost;
  std::vector<Instruction>& instructions = plan->ranks[rank].instructions;
  for (size_t i : indices) {
    Instruction& in = instructions[i];
    saved.push_back({in.duration, in.recompute});
    in.duration = ComputeDuration(in.op, cost);
    if (in.op != OpKind::kBackwardWeight) in.recompute = level;
  }
  if (!check) return RankMemory{};
  RankMemory memory = ReplayRankMemory(*plan, plan->ranks[rank], plan->memory_limit());
  if (memory.first_over >= 0) {
    for (size_t k = 0; k < indices.size(); ++k) {
      instructions[indices[k]].duration = saved[k].duration;
      instructions[indices[k]].recompute = saved[k].recompute;
    }
    recorded = old_cost;
  }
  return memory;
}

// The most a rank's memory level can rise anywhere when one (micro-batch, stage) goes from cost
// `was` to `now`. Under the memory rule (plan/memory_rule.h) the pair's own changes shift the
// level by peak while its F runs, by stored from the F's end to its B or I, by max(peak, stored)
// while the B or I runs, by stored_until_w from an I's end to its W's end, and by nothing
// elsewhere; everything else on the rank is the same.
Bytes RiseBound(const ChunkCost& was, const ChunkCost& now) {
  const auto held = [](const ChunkCost& c) { return std::max(c.peak, c.stored); };
  return std::max({Bytes::Zero(), now.peak - was.peak, now.stored - was.stored,
                   held(now) - held(was), now.stored_until_w - was.stored_until_w});
}

std::string ChangeText(int64_t d, int64_t mb, int64_t stage, Recompute from, Recompute to) {
  return fmt::format("replica {} micro-batch {} stage {}: {} -> {}", d, mb, stage,
                     RecomputeName(from), RecomputeName(to));
}

}  // namespace

StatusOr<PassRecord> RecomputePass::Run(ExecutionPlan* plan) const {
  if (dp_index_ < 0 || dp_index_ >= plan->dp()) {
    return InvalidArgumentError(
        fmt::format("recompute pass: replica {} outside 0..{}", dp_index_, plan->dp() - 1));
  }
  PlanReplica& replica = plan->replicas[dp_index_];
  const int64_t m = static_cast<int64_t>(replica.micro_batches.size());
  if (microbatch_ < 0 || microbatch_ >= m || stage_ < 0 || stage_ >= plan->num_stages()) {
    return InvalidArgumentError(fmt::format(
        "recompute pass: micro-batch {} stage {} outside replica {}'s micro-batches 0..{} and "
        "stages 0..{}",
        microbatch_, stage_, dp_index_, m - 1, plan->num_stages() - 1));
  }
  PassRecord record;
  record.pass = Describe();
  const int64_t rank = plan->RankId(dp_index_, plan->PipelineRankOf(stage_));
  const std::vector<size_t> indices = ComputeOf(plan->ranks[rank], microbatch_, stage_);
  const std::optional<Recompute> now = LevelOf(plan->ranks[rank], indices);
  if (!now.has_value() || *now == level_) return record;
  const std::optional<std::vector<ChunkCost>> costs =
      pricer_->Price(*plan, dp_index_, microbatch_, level_);
  if (!costs.has_value() || static_cast<int64_t>(costs->size()) != plan->num_stages()) {
    record.rejected = fmt::format("the cost model cannot price micro-batch {} at '{}'", microbatch_,
                                  RecomputeName(level_));
    return record;
  }
  const RankMemory memory =
      SetLevel(plan, dp_index_, microbatch_, stage_, rank, indices, (*costs)[stage_], level_);
  if (memory.first_over >= 0) {
    record.rejected = fmt::format("rank {} would need {:.0f} MB of its {:.0f} MB limit", rank,
                                  memory.over_level.mb(), plan->memory_limit().mb());
    return record;
  }
  record.changed = true;
  record.changes.push_back(ChangeText(dp_index_, microbatch_, stage_, *now, level_));
  return record;
}

std::string RecomputePlacementPass::Describe() const { return "recompute-placement"; }

StatusOr<PassRecord> RecomputePlacementPass::Run(ExecutionPlan* plan) const {
  PassRecord record;
  record.pass = Describe();
  const int64_t stages = plan->num_stages();
  // The compute instructions of every (replica, micro-batch, stage), found in one scan per rank.
  std::vector<std::vector<std::vector<size_t>>> at(static_cast<size_t>(plan->dp()));
  for (int64_t d = 0; d < plan->dp(); ++d) {
    at[d].resize(plan->replicas[d].micro_batches.size() * static_cast<size_t>(stages));
  }
  for (const RankProgram& p : plan->ranks) {
    const int64_t d = p.dp_index;
    if (d < 0 || d >= plan->dp()) continue;
    const int64_t m = static_cast<int64_t>(plan->replicas[d].micro_batches.size());
    for (size_t i = 0; i < p.instructions.size(); ++i) {
      const Instruction& in = p.instructions[i];
      if (!IsCompute(in.op) || in.microbatch < 0 || in.microbatch >= m || in.stage < 0 ||
          in.stage >= stages || plan->RankId(d, plan->PipelineRankOf(in.stage)) != p.rank) {
        continue;
      }
      at[d][in.microbatch * stages + in.stage].push_back(i);
    }
  }
  auto rank_of = [&](int64_t d, int64_t s) { return plan->RankId(d, plan->PipelineRankOf(s)); };
  // Every (replica, micro-batch, stage) that recomputes, with the time a lower level saves and
  // the prices of that level (one Price call per (micro-batch, level), kept for the rewrite).
  struct Option {
    Duration saved;
    int64_t d, mb, stage;
    Recompute level;
    size_t price;  // index into `prices`
  };
  std::vector<Option> options;
  std::vector<std::vector<ChunkCost>> prices;
  int64_t pairs = 0;  // (replica, micro-batch) pairs, and of them priced
  for (int64_t d = 0; d < plan->dp(); ++d) {
    pairs += static_cast<int64_t>(plan->replicas[d].micro_batches.size());
  }
  int64_t priced = 0;
  for (int64_t d = 0; d < plan->dp(); ++d) {
    const int64_t m = static_cast<int64_t>(plan->replicas[d].micro_batches.size());
    for (int64_t mb = 0; mb < m; ++mb) {
      // Pricing a T5 plan's micro-batches takes milliseconds: the deadline holds here too, and
      // the plan is then left as it was.
      if (deadline_.has_value() && std::chrono::steady_clock::now() >= *deadline_) {
        record.degraded = fmt::format(
            "the time budget ended the placement while pricing: {} of {} micro-batches priced, "
            "nothing placed",
            priced, pairs);
        return record;
      }
      ++priced;
      for (Recompute level : {Recompute::kNone, Recompute::kSelective}) {
        std::optional<size_t> price;
        for (int64_t s = 0; s < stages; ++s) {
          const std::optional<Recompute> now =
              LevelOf(plan->ranks[rank_of(d, s)], at[d][mb * stages + s]);
          if (!now.has_value() || *now == Recompute::kNone) continue;
          if (level == Recompute::kSelective && *now != Recompute::kFull) continue;
          if (!price.has_value()) {
            std::optional<std::vector<ChunkCost>> costs = pricer_->Price(*plan, d, mb, level);
            if (!costs.has_value() || static_cast<int64_t>(costs->size()) != stages) break;
            price = prices.size();
            prices.push_back(std::move(*costs));
          }
          const ChunkCost& was = plan->replicas[d].micro_batches[mb].stages[s];
          const ChunkCost& cost = prices[*price][s];
          const Duration saved = was.forward + was.backward() - cost.forward - cost.backward();
          if (saved > Duration::Zero()) options.push_back({saved, d, mb, s, level, *price});
        }
      }
    }
  }
  // Largest saving first; ties by position (deterministic).
  std::stable_sort(options.begin(), options.end(),
                   [](const Option& a, const Option& b) { return a.saved > b.saved; });
  const Bytes limit = plan->memory_limit();
  std::vector<std::optional<Bytes>> peak_bound(plan->ranks.size());  // per rank, >= its peak
  for (size_t k = 0; k < options.size(); ++k) {
    const Option& o = options[k];
    if (deadline_.has_value() && std::chrono::steady_clock::now() >= *deadline_) {
      record.degraded = fmt::format("the time budget ended the placement: {} of {} options untried",
                                    options.size() - k, options.size());
      break;
    }
    const int64_t rank = rank_of(o.d, o.stage);
    const std::vector<size_t>& indices = at[o.d][o.mb * stages + o.stage];
    const std::optional<Recompute> now = LevelOf(plan->ranks[rank], indices);
    if (!now.has_value() || *now == Recompute::kNone ||
        (o.level == Recompute::kSelective && *now != Recompute::kFull)) {
      continue;
    }
    // A replay of the rank's memory per offer was most of the pass's time: an offer whose
    // largest possible rise (RiseBound) stays within the limit over a known upper bound of the
    // rank's peak is applied without one, and the bound grows by that rise; otherwise the rank
    // is replayed, which also makes its bound exact again. The decisions are the replays'.
    const ChunkCost& cost = prices[o.price][o.stage];
    const Bytes rise = RiseBound(plan->replicas[o.d].micro_batches[o.mb].stages[o.stage], cost);
    if (!peak_bound[rank].has_value()) {
      peak_bound[rank] = ReplayRankMemory(*plan, plan->ranks[rank], limit).peak;
    }
    if (*peak_bound[rank] + rise <= limit) {
      SetLevel(plan, o.d, o.mb, o.stage, rank, indices, cost, o.level, /*check=*/false);
      *peak_bound[rank] += rise;
    } else {
      const RankMemory memory = SetLevel(plan, o.d, o.mb, o.stage, rank, indices, cost, o.level);
      if (memory.first_over >= 0) continue;
      peak_bound[rank] = memory.peak;
    }
    record.changed = true;
    record.changes.push_back(ChangeText(o.d, o.mb, o.stage, *now, o.level));
  }
  if (!record.changed && !options.empty()) {
    record.rejected = record.degraded.empty() ? "no lower recompute level fits the memory limit"
                                              : record.degraded;
  }
  return record;
}

}  // namespace sluice::passes
