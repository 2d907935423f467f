// Tests of the plan passes: each keeps the plan valid (ValidatePlan after every run), records
// what it changed, and the bucketing pass is the lowering's bucketing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "passes/gradient_bucketing.h"
#include "passes/pass.h"
#include "passes/recompute.h"
#include "passes/reorder.h"
#include "plan/memory_rule.h"
#include "plan/plan_test_util.h"
#include "plan/validate.h"

namespace sluice::passes {
namespace {

using sluice::testing::MakePlanFixture;
using sluice::testing::PlanCase;
using ::testing::HasSubstr;

std::vector<PlanCase> DpCases() {
  std::vector<PlanCase> cases;
  for (int64_t zero : {1, 2}) {
    for (auto [pp, vpp, kind] :
         std::vector<std::tuple<int64_t, int64_t, ScheduleKind>>{{2, 1, ScheduleKind::k1F1B},
                                                                 {4, 1, ScheduleKind::kZbH1},
                                                                 {2, 2, ScheduleKind::kInterleaved},
                                                                 {4, 1, ScheduleKind::kGPipe}}) {
      PlanCase c;
      c.dp = 2;
      c.pp = pp;
      c.vpp = vpp;
      c.kind = kind;
      c.zero = zero;
      c.microbatches = 8;
      c.seed = static_cast<uint64_t>(pp * 10 + zero);
      cases.push_back(c);
    }
  }
  // Context parallelism over two nodes: the gradient ring is dp x cp = 8 devices, 4 per node.
  PlanCase cp;
  cp.dp = 4;
  cp.pp = 2;
  cp.cp = 2;
  cp.microbatches = 4;
  cp.seed = 7;
  cases.push_back(cp);
  return cases;
}

// The lowering's buckets are the pass's: lowering with bucket size X equals lowering with the
// default and then running the pass with X (and the default pass changes nothing).
TEST(BucketGradientsPassTest, IsTheLoweringsBucketing) {
  for (PlanCase c : DpCases()) {
    const auto base = MakePlanFixture(c);
    ASSERT_TRUE(base->no_schedule.empty());
    ExecutionPlan same = base->plan;
    StatusOr<PassRecord> r = BucketGradientsPass(c.lower.bucket_bytes).Run(&same);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_FALSE(r->changed);
    EXPECT_EQ(same, base->plan);
    for (Bytes cap : {Bytes::MB(8), Bytes::MB(3), Bytes::MB(200)}) {
      c.lower.bucket_bytes = cap;
      const auto lowered = MakePlanFixture(c);
      ExecutionPlan rebucketed = base->plan;
      r = BucketGradientsPass(cap).Run(&rebucketed);
      ASSERT_TRUE(r.ok());
      EXPECT_EQ(rebucketed, lowered->plan)
          << "zero " << c.zero << " pp " << c.pp << " cp " << c.cp << " cap " << cap.count();
      EXPECT_EQ(r->changed, !(rebucketed == base->plan));
      EXPECT_TRUE(ValidatePlan(rebucketed).ok());
    }
    c.lower = {};
  }
}

TEST(BucketGradientsPassTest, RecordsChangesAndRejectsBadSizes) {
  PlanCase c;
  c.dp = 2;
  const auto f = MakePlanFixture(c);
  ExecutionPlan p = f->plan;
  StatusOr<PassRecord> r = BucketGradientsPass(Bytes::MB(1)).Run(&p);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->changed);
  ASSERT_FALSE(r->changes.empty());
  EXPECT_THAT(r->changes.front(), HasSubstr("buckets ->"));
  EXPECT_EQ(r->pass, "bucket(976.6 KiB)");  // 1 MB
  EXPECT_FALSE(BucketGradientsPass(Bytes::Zero()).Run(&p).ok());
  // dp = 1: no reductions, a no-op.
  c.dp = 1;
  const auto single = MakePlanFixture(c);
  p = single->plan;
  r = BucketGradientsPass(Bytes::MB(1)).Run(&p);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->changed);
  EXPECT_EQ(p, single->plan);
}

// Every move of every compute op by one place, and every hoist of every Start by one place, on
// plans of several schedules: the result is valid, and a kept move changed the plan.
TEST(ReorderPassesTest, EveryOneStepMoveKeepsThePlanValid) {
  int64_t kept = 0, rejected = 0;
  for (auto [pp, vpp, dp, kind] : std::vector<std::tuple<int64_t, int64_t, int64_t, ScheduleKind>>{
           {2, 1, 2, ScheduleKind::kZbH1},
           {4, 1, 1, ScheduleKind::k1F1B},
           {2, 2, 1, ScheduleKind::kInterleaved}}) {
    PlanCase c;
    c.pp = pp;
    c.vpp = vpp;
    c.dp = dp;
    c.kind = kind;
    c.microbatches = 6;
    const auto f = MakePlanFixture(c);
    ASSERT_TRUE(ValidatePlan(f->plan).ok());
    for (int64_t rank = 0; rank < static_cast<int64_t>(f->plan.ranks.size()); ++rank) {
      const int64_t n = static_cast<int64_t>(ComputePositions(f->plan.ranks[rank]).size());
      for (int64_t k = 0; k + 1 < n; ++k) {
        ExecutionPlan p = f->plan;
        StatusOr<PassRecord> r = MoveComputePass(rank, k, k + 1).Run(&p);
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        const Status valid = ValidatePlan(p);
        ASSERT_TRUE(valid.ok()) << r->pass << ": " << valid.ToString();
        EXPECT_EQ(r->changed, !(p == f->plan));
        EXPECT_EQ(r->changed, r->rejected.empty()) << r->pass;
        (r->changed ? kept : rejected) += 1;
      }
      const std::vector<Instruction>& list = f->plan.ranks[rank].instructions;
      for (size_t i = 1; i < list.size(); ++i) {
        if (!IsCommStart(list[i].op)) continue;
        ExecutionPlan p = f->plan;
        StatusOr<PassRecord> r = HoistStartPass(rank, static_cast<int64_t>(i), 1).Run(&p);
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        ASSERT_TRUE(ValidatePlan(p).ok()) << r->pass;
        (r->changed ? kept : rejected) += 1;
      }
    }
  }
  // Both outcomes occur: the passes do move things, and the guard does reject.
  EXPECT_GT(kept, 20);
  EXPECT_GT(rejected, 0);
}

TEST(ReorderPassesTest, ZeroBubbleWMovesEarlierAndRecordsIt) {
  PlanCase c;
  c.pp = 2;
  c.kind = ScheduleKind::kZbH1;
  const auto f = MakePlanFixture(c);
  // The last W of rank 0 moved one place earlier (before the compute op before it).
  const std::vector<int64_t> pos = ComputePositions(f->plan.ranks[0]);
  int64_t w = -1;
  for (size_t k = 0; k < pos.size(); ++k) {
    if (f->plan.ranks[0].instructions[pos[k]].op == OpKind::kBackwardWeight) {
      w = static_cast<int64_t>(k);
    }
  }
  ASSERT_GT(w, 0);
  ExecutionPlan p = f->plan;
  StatusOr<PassRecord> r = MoveComputePass(0, w, w - 1).Run(&p);
  ASSERT_TRUE(r.ok());
  if (r->changed) {
    ASSERT_EQ(r->changes.size(), 1u);
    EXPECT_THAT(r->changes[0], HasSubstr("W"));
    EXPECT_THAT(r->changes[0], HasSubstr("before"));
    EXPECT_EQ(p.ranks[0].instructions[ComputePositions(p.ranks[0])[w - 1]].op,
              OpKind::kBackwardWeight);
  } else {
    EXPECT_FALSE(r->rejected.empty());
  }
  EXPECT_TRUE(ValidatePlan(p).ok());
}

TEST(ReorderPassesTest, RejectsParametersOutsideThePlan) {
  PlanCase c;
  const auto f = MakePlanFixture(c);
  ExecutionPlan p = f->plan;
  EXPECT_THAT(MoveComputePass(9, 0, 1).Run(&p).status().message(), HasSubstr("rank 9"));
  EXPECT_THAT(MoveComputePass(0, 0, 999).Run(&p).status().message(), HasSubstr("outside"));
  EXPECT_THAT(HoistStartPass(0, 0, 1).Run(&p).status().message(),
              HasSubstr("not a transfer start"));
  EXPECT_EQ(p, f->plan);
}

// A pricer for tests: the plan's recorded costs, with `forward_extra` added to B/I (what a full
// recompute replays) and stored bytes x `stored_scale`.
class FakePricer final : public RecomputePricer {
 public:
  FakePricer(Duration forward_extra, double stored_scale)
      : extra_(forward_extra), scale_(stored_scale) {}
  std::optional<std::vector<ChunkCost>> Price(const ExecutionPlan& plan, int64_t d, int64_t mb,
                                              Recompute) const override {
    std::vector<ChunkCost> out = plan.replicas[d].micro_batches[mb].stages;
    for (ChunkCost& c : out) {
      c.backward_input += extra_;
      c.stored = Bytes::Of(static_cast<int64_t>(static_cast<double>(c.stored.count()) * scale_));
      c.stored_until_w = std::min(c.stored_until_w, c.stored);
    }
    return out;
  }

 private:
  Duration extra_;
  double scale_;
};

TEST(RecomputePassTest, SetsOneMicroBatchAndStage) {
  PlanCase c;
  c.pp = 2;
  c.kind = ScheduleKind::kZbH1;
  const auto f = MakePlanFixture(c);
  ExecutionPlan p = f->plan;
  auto pricer = std::make_shared<FakePricer>(Duration::Millis(3), 0.5);
  StatusOr<PassRecord> r = RecomputePass(pricer, 0, 2, 1, Recompute::kFull).Run(&p);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->changed) << r->rejected;
  EXPECT_THAT(r->changes.at(0), HasSubstr("micro-batch 2 stage 1: none -> full"));
  ASSERT_TRUE(ValidatePlan(p).ok());
  EXPECT_EQ(RecomputeAt(p, 0, 2, 1), Recompute::kFull);
  EXPECT_EQ(RecomputeAt(p, 0, 2, 0), Recompute::kNone);  // the other stage keeps its level
  const ChunkCost& was = f->plan.replicas[0].micro_batches[2].stages[1];
  EXPECT_EQ(p.replicas[0].micro_batches[2].stages[1].backward_input,
            was.backward_input + Duration::Millis(3));
  for (const Instruction& in : p.ranks[1].instructions) {
    if (in.microbatch == 2 && in.stage == 1 && in.op == OpKind::kBackwardInput) {
      EXPECT_EQ(in.duration, was.backward_input + Duration::Millis(3));
      EXPECT_EQ(in.recompute, Recompute::kFull);
    }
  }
  // Already at that level: a no-op.
  ExecutionPlan q = p;
  r = RecomputePass(pricer, 0, 2, 1, Recompute::kFull).Run(&q);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->changed);
  EXPECT_EQ(q, p);
}

// Placement undoes recompute that saves time and fits: three pairs set to full (3 ms more each)
// come back to none, and the plan is the original again.
TEST(RecomputePassTest, PlacementLowersEveryLevelThatFits) {
  PlanCase c;
  c.pp = 2;
  c.kind = ScheduleKind::kZbH1;
  const auto f = MakePlanFixture(c);
  ExecutionPlan p = f->plan;
  auto slower = std::make_shared<FakePricer>(Duration::Millis(3), 1.0);
  for (auto [mb, stage] : std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {1, 1}, {3, 0}}) {
    StatusOr<PassRecord> r = RecomputePass(slower, 0, mb, stage, Recompute::kFull).Run(&p);
    ASSERT_TRUE(r.ok() && r->changed);
  }
  auto faster = std::make_shared<FakePricer>(Duration::Millis(-3), 1.0);
  StatusOr<PassRecord> r = RecomputePlacementPass(faster).Run(&p);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->changed);
  // Each pair is offered none (and selective, which it no longer needs): three changes.
  EXPECT_EQ(r->changes.size(), 3u);
  EXPECT_TRUE(ValidatePlan(p).ok());
  EXPECT_EQ(p, f->plan);
}

// A pricer as the planner's is: a function of the micro-batch and the level only (the lowered
// plan's costs, slower and smaller the more is recomputed).
class LevelPricer final : public RecomputePricer {
 public:
  explicit LevelPricer(const ExecutionPlan& plan) {
    for (const PlanReplica& r : plan.replicas) {
      auto& costs = base_.emplace_back();
      for (const PlanMicroBatch& mb : r.micro_batches) costs.push_back(mb.stages);
    }
  }
  std::optional<std::vector<ChunkCost>> Price(const ExecutionPlan&, int64_t d, int64_t mb,
                                              Recompute level) const override {
    const int64_t k = level == Recompute::kFull ? 2 : level == Recompute::kSelective ? 1 : 0;
    std::vector<ChunkCost> out = base_[d][mb];
    for (ChunkCost& c : out) {
      c.backward_input += Duration::Millis(2.0 * static_cast<double>(k));
      c.stored = Bytes::Of(c.stored.count() * (4 - k));
      c.stored_until_w = std::min(c.stored_until_w, c.stored);
    }
    return out;
  }

 private:
  std::vector<std::vector<std::vector<ChunkCost>>> base_;
};

// Under a limit that lets some (micro-batch, stage) pairs drop recompute and not others, the
// placement gives exactly the plan of its recorded changes applied one by one with
// RecomputePass, and a deadline already past leaves the plan as it was and says so.
TEST(RecomputePassTest, PlacementIsItsChangesAppliedInOrderAndStopsAtItsDeadline) {
  PlanCase c;
  c.pp = 2;
  c.dp = 2;
  const auto f = MakePlanFixture(c);
  ExecutionPlan full = f->plan;
  auto pricer = std::make_shared<LevelPricer>(f->plan);
  for (int64_t d = 0; d < full.dp(); ++d) {
    for (int64_t mb = 0; mb < static_cast<int64_t>(full.replicas[d].micro_batches.size()); ++mb) {
      for (int64_t s = 0; s < full.num_stages(); ++s) {
        StatusOr<PassRecord> r = RecomputePass(pricer, d, mb, s, Recompute::kFull).Run(&full);
        ASSERT_TRUE(r.ok() && r->changed) << (r.ok() ? r->rejected : r.status().ToString());
      }
    }
  }
  // A limit halfway between the largest rank at full recompute and at none.
  ExecutionPlan none = full;
  ASSERT_TRUE(RecomputePlacementPass(pricer).Run(&none).ok());
  Bytes at_full, at_none;
  for (const RankProgram& r : full.ranks) {
    at_full = std::max(at_full, ReplayRankMemory(full, r, Bytes::Of(INT64_MAX / 2)).peak);
  }
  for (const RankProgram& r : none.ranks) {
    at_none = std::max(at_none, ReplayRankMemory(none, r, Bytes::Of(INT64_MAX / 2)).peak);
  }
  ASSERT_GT(at_none, at_full);
  full.parallel.memory_limit = Bytes::Of((at_full.count() + at_none.count()) / 2);
  ASSERT_TRUE(ValidatePlan(full).ok());

  ExecutionPlan placed = full;
  StatusOr<PassRecord> r = RecomputePlacementPass(pricer).Run(&placed);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->changed) << r->rejected;
  EXPECT_TRUE(r->degraded.empty());
  EXPECT_TRUE(ValidatePlan(placed).ok());
  EXPECT_NE(placed, none);  // the limit kept some recompute
  // The same changes, one pass each, in the recorded order.
  ExecutionPlan one_by_one = full;
  for (const std::string& change : r->changes) {
    int64_t d = -1, mb = -1, s = -1;
    char from[16] = {}, to[16] = {};
    ASSERT_EQ(std::sscanf(change.c_str(), "replica %ld micro-batch %ld stage %ld: %15s -> %15s", &d,
                          &mb, &s, from, to),
              5)
        << change;
    const Recompute level = std::string(to) == "none" ? Recompute::kNone : Recompute::kSelective;
    StatusOr<PassRecord> one = RecomputePass(pricer, d, mb, s, level).Run(&one_by_one);
    ASSERT_TRUE(one.ok() && one->changed) << change;
  }
  EXPECT_EQ(one_by_one, placed);

  ExecutionPlan late = full;
  StatusOr<PassRecord> stopped =
      RecomputePlacementPass(pricer, std::chrono::steady_clock::now()).Run(&late);
  ASSERT_TRUE(stopped.ok());
  EXPECT_FALSE(stopped->changed);
  EXPECT_THAT(stopped->degraded, HasSubstr("while pricing: 0 of 12 micro-batches priced"));
  EXPECT_EQ(late, full);
}

TEST(RecomputePassTest, RefusesALevelOverTheMemoryLimit) {
  PlanCase c;
  c.pp = 2;
  c.memory_limit_mb = 30000;
  const auto f = MakePlanFixture(c);
  ExecutionPlan p = f->plan;
  // Stored activations x 1e6: far over any limit.
  auto pricer = std::make_shared<FakePricer>(Duration::Zero(), 1e6);
  StatusOr<PassRecord> r = RecomputePass(pricer, 0, 0, 0, Recompute::kSelective).Run(&p);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->changed);
  EXPECT_THAT(r->rejected, HasSubstr("MB limit"));
  EXPECT_EQ(p, f->plan);
  EXPECT_FALSE(RecomputePass(pricer, 3, 0, 0, Recompute::kNone).Run(&p).ok());
  EXPECT_FALSE(RecomputePass(pricer, 0, 99, 0, Recompute::kNone).Run(&p).ok());
}

}  // namespace
}  // namespace sluice::passes
