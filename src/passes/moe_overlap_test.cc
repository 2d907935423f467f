// The MoE overlap passes (moe_overlap.h) on a sweep of MoE plans: every rewrite keeps the plan
// valid and simulates; the plain segmentation changes no simulated figure; the optimizer never
// lengthens a plan with them; sliced all-to-alls sum to the whole ones; the validator catches
// broken segmentations; the chain's DP pipelines a range whose all-to-all is long.
#include "passes/moe_overlap.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>

#include "passes/moe_chain.h"
#include "plan/memory_rule.h"
#include "plan/moe_segments.h"
#include "plan/plan_test_util.h"
#include "plan/validate.h"
#include "planner/optimizer.h"
#include "sim/simulator.h"

namespace sluice::passes {
namespace {

using ::sluice::testing::MakePlanFixture;
using ::sluice::testing::PlanCase;
using ::testing::HasSubstr;

constexpr MoeOverlap kAll[] = {
    MoeOverlap::kNone,      MoeOverlap::kTutel,  MoeOverlap::kMegatron,      MoeOverlap::kDw,
    MoeOverlap::kPartition, MoeOverlap::kLancet, MoeOverlap::kLancetMegatron};

PlanCase MoeCase(int64_t dp, int64_t pp, int64_t ep, uint64_t seed, bool t5 = false,
                 ScheduleKind kind = ScheduleKind::k1F1B) {
  PlanCase c;
  c.moe = true;
  c.encoder_decoder = t5;
  c.dp = dp;
  c.pp = pp;
  c.ep = ep;
  c.kind = kind;
  c.microbatches = 4;
  c.seed = seed;
  c.fixed_shapes = true;
  return c;
}

std::vector<PlanCase> Sweep() {
  std::vector<PlanCase> out;
  for (uint64_t seed : {5, 6}) {
    out.push_back(MoeCase(2, 1, 2, seed));
    out.push_back(MoeCase(2, 2, 2, seed));
    out.push_back(MoeCase(4, 1, 4, seed));
    out.push_back(MoeCase(4, 2, 2, seed));
    out.push_back(MoeCase(2, 2, 2, seed, true));
  }
  return out;
}

SimResult Sim(const ExecutionPlan& plan) {
  StatusOr<SimResult> r = Simulate(plan, {.record_memory = true});
  SLUICE_CHECK_MSG(r.ok(), r.status().ToString());
  return *r;
}

TEST(MoeOverlapTest, EveryRewriteKeepsEveryPlanValidAndRuns) {
  int64_t changed = 0;
  for (const PlanCase& c : Sweep()) {
    const auto f = MakePlanFixture(c);
    if (!f->no_schedule.empty()) continue;
    SCOPED_TRACE(testing::Describe(c));
    ASSERT_TRUE(ValidatePlan(f->plan).ok());
    for (const MoeOverlap overlap : kAll) {
      SCOPED_TRACE(std::string(MoeOverlapName(overlap)));
      StatusOr<PassResult> r = ApplyPass(MoeOverlapPass(overlap), f->plan);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      const Status valid = ValidatePlan(r->plan);
      ASSERT_TRUE(valid.ok()) << valid.ToString();
      if (!r->record.changed) {
        EXPECT_EQ(r->plan, f->plan);
        continue;
      }
      ++changed;
      const SimResult s = Sim(r->plan);
      EXPECT_EQ(s.outcome, SimOutcome::kOk) << s.problem;
    }
  }
  EXPECT_GT(changed, 30);
}

// DDP-style reduction (passes/grad_overlap.h): the same buckets in the same order on every rank,
// some posted before the last backward ends, the same compute and memory; the reduction then
// ends no later than when it waited for the whole backward.
TEST(MoeOverlapTest, GradientBucketsMoveIntoTheLastBackward) {
  int64_t moved_plans = 0;
  for (const PlanCase& c : Sweep()) {
    const auto f = MakePlanFixture(c);
    if (!f->no_schedule.empty() || f->plan.dp() < 2) continue;
    SCOPED_TRACE(testing::Describe(c));
    MoeOverlapOptions plain;
    plain.overlap_grad_reduction = false;
    StatusOr<PassResult> a = ApplyPass(MoeOverlapPass(MoeOverlap::kNone, plain), f->plan);
    StatusOr<PassResult> b = ApplyPass(MoeOverlapPass(MoeOverlap::kNone), f->plan);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_TRUE(b->record.rejected.empty()) << b->record.rejected;
    bool moved = false;
    for (size_t r = 0; r < a->plan.ranks.size(); ++r) {
      std::vector<Instruction> ca, cb, rest_a, rest_b;
      for (const Instruction& in : a->plan.ranks[r].instructions) {
        (IsCollective(in.op) ? ca : rest_a).push_back(in);
      }
      int64_t last_backward = -1, first_reduction = -1;
      const auto& prog = b->plan.ranks[r].instructions;
      for (size_t i = 0; i < prog.size(); ++i) {
        (IsCollective(prog[i].op) ? cb : rest_b).push_back(prog[i]);
        if (prog[i].op == OpKind::kBackward || prog[i].op == OpKind::kBackwardWeight) {
          last_backward = static_cast<int64_t>(i);
        }
        if (IsCollective(prog[i].op) && first_reduction < 0) {
          first_reduction = static_cast<int64_t>(i);
        }
      }
      EXPECT_EQ(ca, cb);          // the same buckets, in the same order
      EXPECT_EQ(rest_a, rest_b);  // and nothing else moved
      moved = moved || (first_reduction >= 0 && first_reduction < last_backward);
    }
    moved_plans += moved ? 1 : 0;
    const SimResult sa = Sim(a->plan), sb = Sim(b->plan);
    for (size_t k = 0; k < sa.ranks.size(); ++k) {
      EXPECT_EQ(sa.ranks[k].compute, sb.ranks[k].compute);
      EXPECT_EQ(sa.ranks[k].peak_memory, sb.ranks[k].peak_memory);
    }
  }
  EXPECT_GT(moved_plans, 0);
}

// Megatron's interleaving holds two micro-batches at once. Under a limit the whole plan just
// fits, where interleaving every B/F pair does not, the pass interleaves every 2nd, 3rd, ... pair
// (the first stride that fits) instead of giving up, and says so.
TEST(MoeOverlapTest, MegatronInterleavesFewerPairsWhereAllDoNotFit) {
  int64_t thinned = 0;
  for (const PlanCase& c : Sweep()) {
    const auto f = MakePlanFixture(c);
    if (!f->no_schedule.empty() || f->plan.pp() != 1) continue;
    SCOPED_TRACE(testing::Describe(c));
    MoeOverlapOptions o;
    o.overlap_grad_reduction = false;
    const Bytes device = f->plan.cluster.device.memory;
    auto peak = [&](const ExecutionPlan& p) {
      Bytes most;
      for (const RankProgram& r : p.ranks) {
        most = std::max(most, ReplayRankMemory(p, r, device).peak);
      }
      return most;
    };
    ExecutionPlan roomy = f->plan;
    roomy.parallel.memory_limit = device;
    StatusOr<PassResult> all = ApplyPass(MoeOverlapPass(MoeOverlap::kMegatron, o), roomy);
    ASSERT_TRUE(all.ok());
    ASSERT_TRUE(all->record.rejected.empty()) << all->record.rejected;
    const Bytes whole = peak(f->plan);
    if (peak(all->plan) <= whole) continue;
    ExecutionPlan tight = f->plan;
    tight.parallel.memory_limit = whole;
    ASSERT_TRUE(ValidatePlan(tight).ok());
    StatusOr<PassResult> r = ApplyPass(MoeOverlapPass(MoeOverlap::kMegatron, o), tight);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    if (!r->record.rejected.empty()) {
      EXPECT_THAT(r->record.rejected, HasSubstr("exceeds the limit"));
      continue;
    }
    ++thinned;
    EXPECT_TRUE(ValidatePlan(r->plan).ok());
    EXPECT_LE(peak(r->plan), whole);
    ASSERT_FALSE(r->record.changes.empty());
    EXPECT_THAT(r->record.degraded, HasSubstr("B/F pairs one interleaved (all of them: "));
  }
  EXPECT_GT(thinned, 0);
}

// lancet-megatron: Megatron's pairs, and Lancet's token slices only in forwards outside them
// (those lancet also cuts); pipelines are refused as for megatron. The plans' all-to-alls are
// made 20x dearer so that the partition DP cuts, and their micro-batches hold 1-4 rows.
TEST(MoeOverlapTest, LancetMegatronCutsOnlyTheUnpairedForwards) {
  int64_t paired_plans = 0, sliced_forwards = 0;
  std::vector<PlanCase> cases;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    cases.push_back(MoeCase(2, 1, 2, seed));
    cases.push_back(MoeCase(4, 1, 4, seed));
  }
  for (PlanCase c : cases) {
    c.fixed_shapes = false;
    const auto f = MakePlanFixture(c);
    if (!f->no_schedule.empty()) continue;
    SCOPED_TRACE(testing::Describe(c));
    ExecutionPlan roomy = f->plan;
    roomy.parallel.memory_limit = roomy.cluster.device.memory;
    for (RankProgram& p : roomy.ranks) {
      for (Instruction& in : p.instructions) {
        if (IsAllToAll(in.op)) in.duration = in.duration * 20;
      }
    }
    StatusOr<PassResult> r = ApplyPass(MoeOverlapPass(MoeOverlap::kLancetMegatron), roomy);
    StatusOr<PassResult> lancet = ApplyPass(MoeOverlapPass(MoeOverlap::kLancet), roomy);
    ASSERT_TRUE(r.ok() && lancet.ok());
    ASSERT_TRUE(r->record.rejected.empty()) << r->record.rejected;
    ASSERT_TRUE(lancet->record.rejected.empty()) << lancet->record.rejected;
    EXPECT_TRUE(ValidatePlan(r->plan).ok());
    ASSERT_FALSE(r->record.changes.empty());
    EXPECT_THAT(r->record.changes.front(), HasSubstr("B/F pairs interleaved"));
    for (size_t k = 0; k < r->plan.ranks.size(); ++k) {
      // Micro-batches whose forward lancet cuts on this rank.
      std::set<int64_t> cut_by_lancet;
      for (const Instruction& in : lancet->plan.ranks[k].instructions) {
        if (in.op == OpKind::kForward && in.chunks > 0) cut_by_lancet.insert(in.microbatch);
      }
      bool backward_open = false, paired = false;
      for (const Instruction& in : r->plan.ranks[k].instructions) {
        if (in.segment < 0) continue;
        if (in.op == OpKind::kBackward || in.op == OpKind::kBackwardInput) {
          // Its last piece is its last segment's (a first stage's backward has no outputs).
          backward_open = in.segment + 1 < NumSegments(r->plan, in.stage);
        }
        if (in.op != OpKind::kForward) continue;
        paired = paired || backward_open;
        if (in.chunks > 0) {
          EXPECT_FALSE(backward_open) << "a forward inside a pair is cut: " << InstructionText(in);
          EXPECT_EQ(cut_by_lancet.count(in.microbatch), 1u) << InstructionText(in);
          sliced_forwards += IsTokenSlice(in);
        }
      }
      paired_plans += paired;
    }
  }
  EXPECT_GT(paired_plans, 0);
  EXPECT_GT(sliced_forwards, 0);
  // Pipelines: refused, as megatron is.
  const auto f = MakePlanFixture(MoeCase(2, 2, 2, 5));
  ASSERT_TRUE(f->no_schedule.empty());
  StatusOr<PassResult> r = ApplyPass(MoeOverlapPass(MoeOverlap::kLancetMegatron), f->plan);
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->record.rejected, HasSubstr("lancet-megatron overlap needs pp = 1"));
  EXPECT_FALSE(r->record.changed);
}

// Where no stride of pairs fits the memory limit, lancet-megatron is Lancet's passes alone: never
// refused where lancet is not.
TEST(MoeOverlapTest, LancetMegatronWithoutRoomForPairsIsLancet) {
  int64_t alone = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    PlanCase c = MoeCase(2, 1, 2, seed);
    c.fixed_shapes = false;
    const auto f = MakePlanFixture(c);
    if (!f->no_schedule.empty()) continue;
    SCOPED_TRACE(testing::Describe(c));
    MoeOverlapOptions o;
    o.overlap_grad_reduction = false;
    // The limit: the peak of lancet's rewrite (room for no more than it holds).
    ExecutionPlan tight = f->plan;
    tight.parallel.memory_limit = tight.cluster.device.memory;
    StatusOr<PassResult> roomy = ApplyPass(MoeOverlapPass(MoeOverlap::kLancet, o), tight);
    ASSERT_TRUE(roomy.ok() && roomy->record.rejected.empty());
    Bytes peak;
    for (const RankProgram& r : roomy->plan.ranks) {
      peak = std::max(peak, ReplayRankMemory(roomy->plan, r, tight.cluster.device.memory).peak);
    }
    tight.parallel.memory_limit = peak;
    StatusOr<PassResult> lancet = ApplyPass(MoeOverlapPass(MoeOverlap::kLancet, o), tight);
    StatusOr<PassResult> both = ApplyPass(MoeOverlapPass(MoeOverlap::kLancetMegatron, o), tight);
    StatusOr<PassResult> megatron = ApplyPass(MoeOverlapPass(MoeOverlap::kMegatron, o), tight);
    ASSERT_TRUE(lancet.ok() && both.ok() && megatron.ok());
    if (!lancet->record.rejected.empty()) continue;
    ASSERT_TRUE(both->record.rejected.empty()) << both->record.rejected;
    EXPECT_TRUE(ValidatePlan(both->plan).ok());
    if (megatron->record.rejected.empty()) continue;
    // No pair fits: the record says so, and no forward runs inside a backward.
    ++alone;
    ASSERT_FALSE(both->record.changes.empty());
    EXPECT_THAT(both->record.degraded, HasSubstr("no B/F pair interleaved"));
    for (const RankProgram& p : both->plan.ranks) {
      bool backward_open = false;
      for (const Instruction& in : p.instructions) {
        if (in.segment < 0) continue;
        if (in.op == OpKind::kBackward || in.op == OpKind::kBackwardInput) {
          backward_open = in.segment + 1 < NumSegments(both->plan, in.stage);
        }
        EXPECT_FALSE(backward_open && in.op == OpKind::kForward) << InstructionText(in);
      }
    }
    EXPECT_EQ(both->plan, lancet->plan);
  }
  EXPECT_GT(alone, 0);
}

// Segments in order with blocking all-to-alls do the whole op's work.
TEST(MoeOverlapTest, PlainSegmentationChangesNoSimulatedFigure) {
  for (const PlanCase& c : Sweep()) {
    const auto f = MakePlanFixture(c);
    if (!f->no_schedule.empty()) continue;
    SCOPED_TRACE(testing::Describe(c));
    // The gradient reduction where the lowering put it (after the whole last backward).
    MoeOverlapOptions o;
    o.overlap_grad_reduction = false;
    StatusOr<PassResult> r = ApplyPass(MoeOverlapPass(MoeOverlap::kNone, o), f->plan);
    ASSERT_TRUE(r.ok() && r->record.changed) << r->record.rejected;
    const SimResult a = Sim(f->plan), b = Sim(r->plan);
    // The same work, exposed all-to-all and memory; the iteration can only grow by the members'
    // imbalance, which each all-to-all now meets per segment instead of per op.
    EXPECT_GE(b.iteration_time, a.iteration_time);
    EXPECT_LE(b.iteration_time, a.iteration_time.Scaled(1.02));
    for (size_t k = 0; k < a.ranks.size(); ++k) {
      EXPECT_EQ(a.ranks[k].all_to_all, b.ranks[k].all_to_all);
      EXPECT_EQ(a.ranks[k].exposed_all_to_all, b.ranks[k].exposed_all_to_all);
      EXPECT_EQ(a.ranks[k].peak_memory, b.ranks[k].peak_memory);
    }
  }
}

TEST(MoeOverlapTest, OptimizerWithTheRewritesNeverLengthensAPlan) {
  for (const PlanCase& c : Sweep()) {
    const auto f = MakePlanFixture(c);
    if (!f->no_schedule.empty()) continue;
    SCOPED_TRACE(testing::Describe(c));
    OptimizerOptions o;
    o.max_steps = 8;
    o.moe_overlaps.assign(std::begin(kAll), std::end(kAll));
    StatusOr<OptimizeResult> r = OptimizePlan(f->plan, o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_LE(r->after, r->before);
    EXPECT_TRUE(ValidatePlan(r->plan).ok());
    StatusOr<SimResult> s = Simulate(r->plan, o.sim);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->iteration_time, r->after);
  }
}

// Rows each (micro-batch, stage, layer, direction) moves, summed over slices.
std::map<std::tuple<int, int64_t, int64_t, int64_t, int64_t>, int64_t> Moved(
    const RankProgram& p) {
  std::map<std::tuple<int, int64_t, int64_t, int64_t, int64_t>, int64_t> out;
  for (const Instruction& in : p.instructions) {
    if (!IsAllToAll(in.op)) continue;
    for (size_t j = 0; j < in.send_splits.size(); ++j) {
      out[{static_cast<int>(in.op), in.microbatch, in.stage, in.layer,
           static_cast<int64_t>(j)}] += in.send_splits[j] + 1000000 * in.recv_splits[j];
    }
  }
  return out;
}

TEST(MoeOverlapTest, SlicedAllToAllsSumToTheWholeOnes) {
  int64_t sliced = 0;
  for (const PlanCase& c : Sweep()) {
    const auto f = MakePlanFixture(c);
    if (!f->no_schedule.empty()) continue;
    for (const MoeOverlap overlap : {MoeOverlap::kPartition, MoeOverlap::kTutel}) {
      MoeOverlapOptions o;
      o.slice_overhead = Duration::Zero();
      StatusOr<PassResult> r = ApplyPass(MoeOverlapPass(overlap, o), f->plan);
      ASSERT_TRUE(r.ok());
      for (size_t k = 0; k < f->plan.ranks.size(); ++k) {
        EXPECT_EQ(Moved(f->plan.ranks[k]), Moved(r->plan.ranks[k]));
        for (const Instruction& in : r->plan.ranks[k].instructions) {
          sliced += IsAllToAll(in.op) && in.chunks > 0;
        }
      }
    }
  }
  EXPECT_GT(sliced, 0);
}

// The sliced compute pieces of a rewritten plan: how many, and their total time.
std::pair<int64_t, Duration> SlicedPieces(const ExecutionPlan& plan) {
  int64_t n = 0;
  Duration total;
  for (const RankProgram& p : plan.ranks) {
    for (const Instruction& in : p.instructions) {
      if (IsAllToAll(in.op) || in.chunks <= 0 || in.segment < 0) continue;
      if (in.op != OpKind::kForward && in.op != OpKind::kBackward) continue;
      ++n;
      total += in.duration;
    }
  }
  return {n, total};
}

TEST(MoeOverlapTest, SlicesArePricedWithThePlansMeasuredOverhead) {
  auto f = MakePlanFixture(MoeCase(2, 1, 2, 5));
  ASSERT_TRUE(f->no_schedule.empty());
  ExecutionPlan plan = f->plan;
  EXPECT_EQ(SliceOverheadFor(plan, {}), kDefaultSliceOverhead);
  StatusOr<PassResult> base = ApplyPass(MoeOverlapPass(MoeOverlap::kTutel), plan);
  ASSERT_TRUE(base.ok());
  const auto [n, base_total] = SlicedPieces(base->plan);
  ASSERT_GT(n, 0);
  // A cost model that measured 1 ms per piece (`sluice profile`'s moe_parts) puts it in the plan.
  plan.moe_slice_overhead = Duration::Millis(1);
  EXPECT_EQ(SliceOverheadFor(plan, {}), Duration::Millis(1));
  StatusOr<PassResult> measured = ApplyPass(MoeOverlapPass(MoeOverlap::kTutel), plan);
  ASSERT_TRUE(measured.ok());
  const auto [n2, measured_total] = SlicedPieces(measured->plan);
  ASSERT_EQ(n2, n);
  EXPECT_EQ(measured_total - base_total, (Duration::Millis(1) - kDefaultSliceOverhead) * n);
  EXPECT_GT(Sim(measured->plan).iteration_time, Sim(base->plan).iteration_time);
  // An explicit option wins over the plan's.
  MoeOverlapOptions o;
  o.slice_overhead = kDefaultSliceOverhead;
  EXPECT_EQ(SliceOverheadFor(plan, o), kDefaultSliceOverhead);
  StatusOr<PassResult> forced = ApplyPass(MoeOverlapPass(MoeOverlap::kTutel, o), plan);
  ASSERT_TRUE(forced.ok());
  EXPECT_EQ(SlicedPieces(forced->plan).second, base_total);
}

// A Tutel plan with one thing broken at a time.
TEST(MoeOverlapTest, ValidatorCatchesBrokenSegmentations) {
  const auto f = MakePlanFixture(MoeCase(2, 1, 2, 5));
  StatusOr<PassResult> r = ApplyPass(MoeOverlapPass(MoeOverlap::kTutel), f->plan);
  ASSERT_TRUE(r.ok() && r->record.changed) << r->record.rejected;
  auto& list = r->plan.ranks[0].instructions;
  size_t wait = 0;
  while (list[wait].op != OpKind::kAllToAllWait) ++wait;
  {  // the piece after the wait moved before it
    ExecutionPlan bad = r->plan;
    auto& l = bad.ranks[0].instructions;
    std::swap(l[wait], l[wait + 1]);
    EXPECT_THAT(ValidatePlan(bad).ToString(), HasSubstr("before the all-to-all before it"));
  }
  {  // a slice that moves other rows
    ExecutionPlan bad = r->plan;
    for (Instruction& in : bad.ranks[0].instructions) {
      if (IsAllToAll(in.op) && in.chunks > 0) {
        in.send_splits[0] += 1;
        break;
      }
    }
    EXPECT_THAT(ValidatePlan(bad).ToString(), HasSubstr("SplitPart"));
  }
  {  // a wait removed
    ExecutionPlan bad = r->plan;
    auto& l = bad.ranks[0].instructions;
    l.erase(l.begin() + static_cast<std::ptrdiff_t>(wait));
    EXPECT_FALSE(ValidatePlan(bad).ok());
  }
  {  // a piece removed: the op never completes
    ExecutionPlan bad = r->plan;
    auto& l = bad.ranks[0].instructions;
    size_t k = 0;
    while (!(IsCompute(l[k].op) && l[k].segment == 1 && l[k].chunk == 1)) ++k;
    l.erase(l.begin() + static_cast<std::ptrdiff_t>(k));
    EXPECT_FALSE(ValidatePlan(bad).ok());
  }
}

TEST(MoeChainTest, DpPipelinesALongAllToAllAndNotAShortOne) {
  const Duration ms = Duration::Millis(1);
  const std::vector<Duration> seg = {ms * 4, ms * 4, ms * 4}, zero = {Duration::Zero(),
                                                                      Duration::Zero()};
  const std::vector<int64_t> cut =
      internal::PartitionDp(seg, {ms * 4, ms * 4}, zero, 8, Duration::Zero());
  EXPECT_GE(cut[1], 2);
  const std::vector<int64_t> steps_cut = cut;
  const Duration piped = internal::PipelinedTime(internal::ChainSteps(cut, false), cut, seg,
                                                 {ms * 4, ms * 4}, zero, Duration::Zero());
  EXPECT_LT(piped, ms * 20);
  // Negligible all-to-alls and a large per-slice overhead: nothing to gain.
  const std::vector<int64_t> none = internal::PartitionDp(
      seg, {Duration::Micros(1), Duration::Micros(1)}, zero, 8, ms);
  EXPECT_EQ(none, std::vector<int64_t>(5, 0));
}

}  // namespace
}  // namespace sluice::passes
