// The simulator on plans and options a user (or a fuzzer) can hand it: slot ids anywhere in
// their range, durations and shapes at the readers' limits, out-of-range what-if scales, and a
// run stopped by SimOptions::cancelled. Each must give a result or a Status naming the field,
// never a crash, an allocation the size of the largest id, or an int64 overflow.
#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "plan/plan_json.h"
#include "plan/plan_test_util.h"
#include "plan/validate.h"
#include "sim/simulator.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using testing::MakePlanFixture;
using testing::PlanCase;

ExecutionPlan SmallPlan() {
  PlanCase c;
  c.dp = 2;
  c.pp = 2;
  return MakePlanFixture(c)->plan;
}

// Every slot id s of every program becomes s + offset (buffer_slots grows with it): the same
// plan under other labels.
ExecutionPlan ShiftSlots(ExecutionPlan plan, int64_t offset) {
  for (RankProgram& p : plan.ranks) {
    for (Instruction& in : p.instructions) {
      for (int64_t& s : in.inputs) s += offset;
      for (int64_t& s : in.outputs) s += offset;
    }
    p.buffer_slots += offset;
  }
  return plan;
}

// Found by review of the fuzz targets: a plan naming slot 2^31 - 2 made the simulator and the
// validator allocate per slot id up to it (a std::bad_alloc abort from a 5 KB file).
TEST(SimulatorInputTest, SlotIdsAreLabelsNotSizes) {
  const ExecutionPlan plan = SmallPlan();
  const ExecutionPlan shifted = ShiftSlots(plan, kPlanMaxIndex - 64);
  ASSERT_LE(shifted.ranks[0].buffer_slots, kPlanMaxIndex);
  // The reader takes it; the validator rejects it (slot ids must be dense, so nothing sized by
  // buffer_slots can outgrow the program); the simulator, run unchecked, does not allocate per id
  // and simulates the same plan.
  StatusOr<ExecutionPlan> read = PlanFromJsonText(PlanToJsonText(shifted), "shifted.json");
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_THAT(ValidatePlan(*read).message(), HasSubstr("slot ids must be dense"));
  StatusOr<SimResult> a = Simulate(plan);
  StatusOr<SimResult> b = Simulate(*read);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  // Messages name the plan's ids, not the engine's.
  ExecutionPlan broken = shifted;
  const int64_t free = testing::FindInstruction(
      broken, 0, [](const Instruction& in) { return in.op == OpKind::kFreeBuffer; });
  ASSERT_GE(free, 0);
  const int64_t slot = broken.ranks[0].instructions[free].inputs[0];
  broken.ranks[0].instructions.insert(broken.ranks[0].instructions.begin() + free,
                                      broken.ranks[0].instructions[free]);  // freed twice
  StatusOr<SimResult> twice = Simulate(broken);
  ASSERT_TRUE(twice.ok()) << twice.status().message();
  EXPECT_EQ(twice->outcome, SimOutcome::kDeadlock);
  EXPECT_THAT(twice->problem, HasSubstr(fmt::format("frees slot {}, which holds no buffer", slot)));
  EXPECT_THAT(ValidatePlan(broken).message(), HasSubstr("slot ids must be dense"));
}

// Durations are each at most 2^50 ns, but their sum times the what-if scales may leave int64;
// such a plan is refused up front (before: silent wrap-around to negative times).
TEST(SimulatorInputTest, WorkBeyondInt64TimesIsAStatus) {
  ExecutionPlan plan = SmallPlan();
  for (RankProgram& p : plan.ranks) {
    for (Instruction& in : p.instructions) {
      if (IsCompute(in.op)) in.duration = Duration::Nanos(kPlanMaxAmount);
    }
  }
  StatusOr<SimResult> fine = Simulate(plan);
  ASSERT_TRUE(fine.ok()) << fine.status().message();
  EXPECT_GT(fine->iteration_time, Duration::Nanos(kPlanMaxAmount));
  SimOptions o;
  o.compute_scale = 1e6;
  StatusOr<SimResult> huge = Simulate(plan, o);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(huge.status().message(), HasSubstr("allowed: at most 2^61 ns"));
}

TEST(SimulatorInputTest, SizesBeyondInt64AreAStatus) {
  ExecutionPlan plan = SmallPlan();
  plan.replicas[0].micro_batches[0].shape.mbs = kPlanMaxIndex;
  plan.replicas[0].micro_batches[0].shape.seqlen = kPlanMaxIndex;
  StatusOr<SimResult> r = Simulate(plan);
  ASSERT_FALSE(r.ok());
  // The plan's shapes are checked against the model first (plan/validate.h CheckPlanFitsModel):
  // lengths within max_position, at most kMaxMicroBatchTokens tokens per micro-batch.
  EXPECT_THAT(r.status().message(), HasSubstr("replica 0 micro-batch 0"));
  EXPECT_THAT(r.status().message(), HasSubstr("is longer than the model's max_position"));
  plan = SmallPlan();
  plan.replicas[0].micro_batches[0].shape.mbs = kPlanMaxIndex;
  r = Simulate(plan);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("allowed: at most 67108864 tokens per micro-batch"));
  plan = SmallPlan();
  for (PlanMicroBatch& mb : plan.replicas[1].micro_batches) {
    for (ChunkCost& c : mb.stages) c.stored = Bytes::Of(kPlanMaxAmount);
  }
  plan.model_states[0] = Bytes::Of(kPlanMaxAmount);
  ASSERT_TRUE(Simulate(plan).ok()) << "2^50-byte figures are still in range";
  for (RankProgram& p : plan.ranks) {
    for (Instruction& in : p.instructions) {
      // Output shapes whose Fp16Bytes saturate at INT64_MAX.
      if (p.dp_index == 1 && IsCompute(in.op)) in.shapes = {{kPlanMaxIndex, kPlanMaxIndex}};
    }
  }
  r = Simulate(plan);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("add up to"));
}

// The simulator checks the fields it indexes by with plan/program_check's
// CheckInstructionIndices, the first part of `sluice plan check`'s field check: a plan run
// unchecked is refused with the same finding, naming the instruction's field.
TEST(SimulatorInputTest, IndexFieldsAreCheckedAsThePlanCheckDoes) {
  const ExecutionPlan plan = SmallPlan();
  struct Case {
    OpKind op;  // the first such instruction of rank 1 is broken
    void (*breaks)(Instruction&);
    std::string field;
    std::string problem;
  };
  const std::vector<Case> cases = {
      {OpKind::kForward, [](Instruction& in) { in.stage = 0; }, "stage",
       "stage 0 does not run on pipeline rank 1"},
      {OpKind::kForward, [](Instruction& in) { in.microbatch = 99; }, "mb",
       "micro-batch 99 is not in [0, "},
      {OpKind::kFreeBuffer, [](Instruction& in) { in.inputs.push_back(in.inputs[0]); }, "in",
       "free-buffer needs 1 input and 0 output slots, has 2 and 0"},
      {OpKind::kRecvActStart, [](Instruction& in) { in.peer = 1; }, "peer",
       "peer 1 is not another rank of the plan (0..3)"},
      {OpKind::kRecvActStart, [](Instruction& in) { in.outputs.push_back(in.outputs[0]); }, "out",
       "recv-act-start needs 0 input and 1 output slots, has 0 and 2"},
      {OpKind::kSendGradStart, [](Instruction& in) { in.inputs[0] = 999999; }, "in",
       "slot 999999 is outside the program's"},
  };
  for (const Case& c : cases) {
    ExecutionPlan broken = plan;
    const int64_t i =
        testing::FindInstruction(broken, 1, [&](const Instruction& in) { return in.op == c.op; });
    ASSERT_GE(i, 0) << OpKindName(c.op);
    c.breaks(broken.ranks[1].instructions[i]);
    const StatusOr<SimResult> r = Simulate(broken);
    ASSERT_FALSE(r.ok()) << c.problem;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(),
                HasSubstr(fmt::format("field 'ranks[1].instructions[{}].{}'", i, c.field)));
    EXPECT_THAT(r.status().message(), HasSubstr(c.problem));
    EXPECT_THAT(ValidatePlan(broken).message(), HasSubstr(c.problem));
  }
}

TEST(SimulatorInputTest, ScalesOutsideTheirRangeNameTheField) {
  const ExecutionPlan plan = SmallPlan();
  SimOptions o;
  o.compute_scale = 1e300;  // used to reach Duration::Scaled, an out-of-range double -> int64
  EXPECT_THAT(Simulate(plan, o).status().message(),
              HasSubstr("'compute_scale' is 1e+300; allowed: a finite number > 0, in [1e-6, 1e6]"));
  o = {};
  o.intra_node.latency_scale = 1e12;
  EXPECT_THAT(Simulate(plan, o).status().message(), HasSubstr("intra_node.latency_scale"));
  o = {};
  o.stragglers = {{1, 1e-9}};
  EXPECT_THAT(Simulate(plan, o).status().message(), HasSubstr("stragglers[0].slowdown"));
  o = {};
  o.compute_scale = 1e6;
  o.inter_node.latency_scale = 0;
  EXPECT_TRUE(Simulate(plan, o).ok()) << "the ends of the ranges are allowed";
}

TEST(SimulatorInputTest, CancelledStopsTheRun) {
  PlanCase c;
  c.dp = 2;
  c.pp = 8;
  c.microbatches = 128;
  c.fixed_shapes = true;
  const ExecutionPlan plan = MakePlanFixture(c)->plan;
  StatusOr<SimResult> full = Simulate(plan);
  ASSERT_TRUE(full.ok()) << full.status().message();
  ASSERT_GT(full->events, 4096) << "enough events to be asked";
  int64_t asked = 0;
  SimOptions o;
  o.cancelled = [&] { return ++asked == 1; };
  StatusOr<SimResult> stopped = Simulate(plan, o);
  ASSERT_FALSE(stopped.ok());
  EXPECT_EQ(stopped.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(stopped.status().message(), HasSubstr("simulation interrupted at simulated time"));
  EXPECT_EQ(asked, 1);
  o.cancelled = [] { return false; };
  StatusOr<SimResult> again = Simulate(plan, o);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *full) << "asking changes nothing";
}

}  // namespace
}  // namespace sluice
