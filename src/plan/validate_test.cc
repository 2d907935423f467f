#include "plan/validate.h"

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>

#include "plan/plan_test_util.h"

namespace sluice {
namespace {

using ::testing::AllOf;
using testing::FindInstruction;
using ::testing::HasSubstr;
using testing::MakePlanFixture;
using testing::PlanCase;

// A valid pp = 4, dp = 2 plan to corrupt.
std::unique_ptr<testing::PlanFixture> Fixture(ScheduleKind kind = ScheduleKind::k1F1B) {
  PlanCase c;
  c.pp = 4;
  c.dp = 2;
  c.kind = kind;
  c.microbatches = 6;
  c.seed = 3;
  auto f = MakePlanFixture(c);
  Status s = ValidatePlan(f->plan);
  SLUICE_CHECK_MSG(s.ok(), s.message());
  return f;
}

auto Is(OpKind op, int64_t mb) {
  return [op, mb](const Instruction& in) { return in.op == op && in.microbatch == mb; };
}

std::string Check(const ExecutionPlan& plan) { return ValidatePlan(plan).message(); }

// Names the rank and the instruction, and prints the grid.
auto Names(int64_t rank, int64_t index) {
  return AllOf(HasSubstr(fmt::format("rank {}", rank)),
               HasSubstr(fmt::format("instruction {}", index)), HasSubstr("<-- ERROR HERE"));
}

TEST(ValidatePlanTest, DroppedReceiveIsCaught) {
  auto f = Fixture();
  auto& list = f->plan.ranks[1].instructions;
  const int64_t start = FindInstruction(f->plan, 1, Is(OpKind::kRecvActStart, 2));
  ASSERT_GE(start, 0);
  list.erase(list.begin() + start);
  const int64_t finish = FindInstruction(f->plan, 1, Is(OpKind::kRecvActFinish, 2));
  list.erase(list.begin() + finish);
  const int64_t send = FindInstruction(f->plan, 0, Is(OpKind::kSendActStart, 2));
  EXPECT_THAT(Check(f->plan), AllOf(Names(0, send), HasSubstr("no matching receive on rank 1")));
}

TEST(ValidatePlanTest, SwappedSendOrderIsCaughtAsDeadlock) {
  auto f = Fixture();
  auto& list = f->plan.ranks[0].instructions;
  const int64_t a = FindInstruction(f->plan, 0, Is(OpKind::kSendActStart, 0));
  const int64_t b = FindInstruction(f->plan, 0, Is(OpKind::kSendActStart, 1));
  ASSERT_LT(a, b);
  std::swap(list[a].microbatch, list[b].microbatch);
  std::swap(list[a].tag, list[b].tag);
  std::swap(list[a].shapes, list[b].shapes);
  std::swap(list[a].bytes, list[b].bytes);
  std::swap(list[a].inputs, list[b].inputs);
  std::swap(list[a].duration, list[b].duration);
  // Micro-batch 1's send now comes first, before its own forward: the per-rank check would say
  // so, but the pair check runs first and reports the order.
  EXPECT_THAT(Check(f->plan),
              AllOf(Names(0, a), HasSubstr("different order"), HasSubstr("deadlock")));
}

TEST(ValidatePlanTest, ShapeMismatchIsCaught) {
  auto f = Fixture();
  const int64_t i = FindInstruction(f->plan, 2, Is(OpKind::kRecvGradStart, 1));
  ASSERT_GE(i, 0);
  f->plan.ranks[2].instructions[i].shapes[0][1] += 8;
  EXPECT_THAT(Check(f->plan), AllOf(Names(2, i), HasSubstr("tensor shapes")));
}

TEST(ValidatePlanTest, BufferFreedTwiceIsCaught) {
  auto f = Fixture();
  auto& list = f->plan.ranks[1].instructions;
  const int64_t i = FindInstruction(
      f->plan, 1, [](const Instruction& in) { return in.op == OpKind::kFreeBuffer; });
  list.insert(list.begin() + i + 1, list[i]);
  EXPECT_THAT(Check(f->plan), AllOf(Names(1, i + 1), HasSubstr("which is not allocated")));
}

// Slot ids are dense (0 .. buffer_slots-1, each allocated): a plan naming slot 2^31 - 1 is
// rejected by the structure check, before the validator (or the runtime, which sizes a vector by
// buffer_slots) allocates anything per slot. It used to be accepted here and abort `sluice train`
// with std::bad_alloc.
TEST(ValidatePlanTest, SparseOrHugeSlotIdsAreRejected) {
  auto f = Fixture();
  const int64_t offset = (int64_t{1} << 31) - 64;
  ExecutionPlan shifted = f->plan;
  for (RankProgram& p : shifted.ranks) {
    for (Instruction& in : p.instructions) {
      for (int64_t& s : in.inputs) s += offset;
      for (int64_t& s : in.outputs) s += offset;
    }
    p.buffer_slots += offset;
  }
  EXPECT_THAT(Check(shifted), AllOf(HasSubstr("program 0 declares 2147483"),
                                    HasSubstr("slot ids must be dense")));
  // A huge buffer_slots alone, with the program's ids untouched.
  ExecutionPlan wide = f->plan;
  wide.ranks[1].buffer_slots = int64_t{1} << 40;
  EXPECT_THAT(Check(wide), HasSubstr("program 1 declares 1099511627776 buffer slots"));
  // One id skipped inside the bound: slot 1 is renamed to a fresh id at the end.
  ExecutionPlan gap = f->plan;
  RankProgram& p = gap.ranks[2];
  const int64_t fresh = p.buffer_slots;
  for (Instruction& in : p.instructions) {
    for (int64_t& s : in.inputs) s = s == 1 ? fresh : s;
    for (int64_t& s : in.outputs) s = s == 1 ? fresh : s;
  }
  p.buffer_slots = fresh + 1;
  EXPECT_THAT(Check(gap), HasSubstr("slot 1 of the program's"));
  EXPECT_TRUE(ValidatePlan(f->plan).ok());
}

TEST(ValidatePlanTest, UseAfterFreeIsCaught) {
  auto f = Fixture();
  auto& list = f->plan.ranks[3].instructions;
  const int64_t b = FindInstruction(f->plan, 3, Is(OpKind::kBackward, 0));
  ASSERT_GE(b, 0);
  // The free right after the backward releases one of its inputs: move it before.
  ASSERT_EQ(list[b + 1].op, OpKind::kFreeBuffer);
  std::rotate(list.begin() + b, list.begin() + b + 1, list.begin() + b + 2);
  EXPECT_THAT(Check(f->plan), AllOf(Names(3, b + 1), HasSubstr("not allocated")));
}

TEST(ValidatePlanTest, LeakAndUnfinishedTransferAreCaught) {
  auto f = Fixture();
  auto& list = f->plan.ranks[0].instructions;
  const int64_t i = FindInstruction(
      f->plan, 0, [](const Instruction& in) { return in.op == OpKind::kFreeBuffer; });
  const Instruction first_free = list[i];
  list.erase(list.begin() + i);
  // The slot is still live when the program allocates it again.
  EXPECT_THAT(Check(f->plan), AllOf(HasSubstr("rank 0"), HasSubstr("which still holds")));
  list.insert(list.begin() + i, first_free);
  const auto last = std::find_if(list.rbegin(), list.rend(), [](const Instruction& in) {
    return in.op == OpKind::kFreeBuffer;
  });
  list.erase(std::next(last).base());
  EXPECT_THAT(Check(f->plan), AllOf(HasSubstr("rank 0"), HasSubstr("at the end of its program"),
                                    HasSubstr("is never freed")));
  auto g = Fixture();
  auto& list2 = g->plan.ranks[1].instructions;
  const int64_t fin = FindInstruction(g->plan, 1, Is(OpKind::kSendGradFinish, 5));
  ASSERT_GE(fin, 0);
  list2.erase(list2.begin() + fin);
  EXPECT_THAT(Check(g->plan), HasSubstr("rank 1"));
}

TEST(ValidatePlanTest, ForwardAfterBackwardAndWBeforeIAreCaught) {
  auto f = Fixture();
  auto& list = f->plan.ranks[3].instructions;
  const int64_t fw = FindInstruction(f->plan, 3, Is(OpKind::kForward, 1));
  const int64_t bw = FindInstruction(f->plan, 3, Is(OpKind::kBackward, 1));
  ASSERT_LT(fw, bw);
  list[fw].op = OpKind::kBackward;
  list[fw].shapes = list[bw].shapes;
  EXPECT_THAT(Check(f->plan), AllOf(Names(3, fw), HasSubstr("precedes its F")));

  auto z = Fixture(ScheduleKind::kZbH1);
  auto& zl = z->plan.ranks[2].instructions;
  const int64_t in = FindInstruction(z->plan, 2, Is(OpKind::kBackwardInput, 0));
  const int64_t w = FindInstruction(z->plan, 2, Is(OpKind::kBackwardWeight, 0));
  ASSERT_LT(in, w);
  const Instruction weight = zl[w];
  zl.erase(zl.begin() + w);
  zl.insert(zl.begin() + in, weight);
  EXPECT_THAT(Check(z->plan), AllOf(Names(2, in), HasSubstr("needs its I first")));
}

TEST(ValidatePlanTest, MissingAndDuplicatedSamplesAreCaught) {
  auto f = Fixture();
  ASSERT_FALSE(f->plan.dropped.empty());
  const int64_t dropped = f->plan.dropped[0].id;
  f->plan.dropped.erase(f->plan.dropped.begin());
  EXPECT_THAT(Check(f->plan), HasSubstr(fmt::format(
                                  "sample {} of the global batch is in no micro-batch", dropped)));
  auto g = Fixture();
  const int64_t id = g->plan.replicas[1].micro_batches[0].rows[0][0];
  g->plan.dropped.push_back({id, "twice"});
  EXPECT_THAT(Check(g->plan), AllOf(HasSubstr(fmt::format("sample {} appears twice", id)),
                                    HasSubstr("replica 1 micro-batch 0 row 0")));
}

TEST(ValidatePlanTest, MemoryOverTheLimitIsCaught) {
  auto f = Fixture();
  // Room for the model states and a sliver of activations.
  Bytes states;
  for (Bytes b : f->plan.model_states) states = std::max(states, b);
  f->plan.parallel.memory_limit = states + Bytes::MB(1);
  const std::string message = Check(f->plan);
  EXPECT_THAT(message, AllOf(HasSubstr("exceeds the limit"), HasSubstr("instruction"),
                             HasSubstr("<-- ERROR HERE")));
  ValidateOptions no_memory;
  no_memory.check_memory = false;
  EXPECT_TRUE(ValidatePlan(f->plan, no_memory).ok());
}

// Check 7 is the plan's memory rule with buffers: a limit that holds every rank's activations but
// not its buffers on top fails, naming the buffers; the rule's own peak as the limit passes.
TEST(ValidatePlanTest, MemoryCheckCountsBuffers) {
  auto f = Fixture();
  const std::vector<Bytes> full = PredictPeakMemory(f->plan);
  const std::vector<Bytes> activations = PredictPeakMemory(f->plan, {.count_buffers = false});
  ASSERT_EQ(full.size(), f->plan.ranks.size());
  Bytes most_full, most_activations;
  for (size_t r = 0; r < full.size(); ++r) {
    EXPECT_GT(full[r], activations[r]) << "rank " << r;  // every rank holds some buffer
    most_full = std::max(most_full, full[r]);
    most_activations = std::max(most_activations, activations[r]);
  }
  ASSERT_LT(most_activations, most_full);
  f->plan.parallel.memory_limit = most_full;
  EXPECT_TRUE(ValidatePlan(f->plan).ok()) << Check(f->plan);
  EXPECT_FALSE(CheckPlanMemory(f->plan).has_value());
  f->plan.parallel.memory_limit = std::max(most_activations, most_full - Bytes::Of(1));
  const std::optional<MemoryProblem> p = CheckPlanMemory(f->plan);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(full[p->rank], most_full);
  EXPECT_THAT(p->message, AllOf(HasSubstr("buffers"), HasSubstr("exceeds the limit")));
  EXPECT_THAT(Check(f->plan), AllOf(HasSubstr("buffers"), HasSubstr("<-- ERROR HERE")));
  // The rule's figures on that rank: the first change over the limit, and the parts of the peak.
  const RankMemory m = ReplayRankMemory(f->plan, f->plan.ranks[p->rank], f->plan.memory_limit());
  EXPECT_EQ(m.first_over, p->instruction);
  EXPECT_EQ(m.peak, most_full);
  EXPECT_EQ(m.peak, f->plan.model_states[f->plan.ranks[p->rank].pp_index] + m.peak_activations +
                        m.peak_buffers);
  EXPECT_GT(m.peak_buffers, Bytes::Zero());
}

TEST(ValidatePlanTest, WrongPeerTagAndRecomputeAreCaught) {
  auto f = Fixture();
  const int64_t i = FindInstruction(f->plan, 5, Is(OpKind::kSendActStart, 3));
  ASSERT_GE(i, 0);
  f->plan.ranks[5].instructions[i].peer = 2;  // replica 0's rank: messages never cross replicas
  EXPECT_THAT(Check(f->plan), AllOf(Names(5, i), HasSubstr("peer 2 is not rank 6")));
  auto g = Fixture();
  g->plan.ranks[5].instructions[i].tag += 2;
  EXPECT_THAT(Check(g->plan), AllOf(Names(5, i), HasSubstr("MessageTag")));
  auto h = Fixture();
  const int64_t fw = FindInstruction(h->plan, 4, Is(OpKind::kForward, 0));
  h->plan.ranks[4].instructions[fw].recompute = Recompute::kFull;
  // Recompute is per (micro-batch, stage): the B of that F is the one that disagrees.
  const int64_t bw = FindInstruction(h->plan, 4, [&](const Instruction& in) {
    return (in.op == OpKind::kBackward || in.op == OpKind::kBackwardInput) &&
           in.microbatch == h->plan.ranks[4].instructions[fw].microbatch &&
           in.stage == h->plan.ranks[4].instructions[fw].stage;
  });
  ASSERT_GT(bw, fw);
  EXPECT_THAT(Check(h->plan), AllOf(Names(4, bw), HasSubstr("differs from its F's 'full'")));
}

TEST(ValidatePlanTest, ReceiveUsedBeforeItFinishesIsCaught) {
  auto f = Fixture();
  auto& list = f->plan.ranks[1].instructions;
  const int64_t fin = FindInstruction(f->plan, 1, Is(OpKind::kRecvActFinish, 0));
  ASSERT_EQ(list[fin + 1].op, OpKind::kForward);
  std::swap(list[fin], list[fin + 1]);
  EXPECT_THAT(Check(f->plan), AllOf(Names(1, fin), HasSubstr("before its receive")));
}

TEST(ValidatePlanTest, CollectiveMismatchAcrossReplicasIsCaught) {
  auto f = Fixture();
  auto& list = f->plan.ranks[6].instructions;  // dp 1, pp 2
  const int64_t i = FindInstruction(
      f->plan, 6, [](const Instruction& in) { return in.op == OpKind::kAllReduceGrad; });
  ASSERT_GE(i, 0);
  list[i].bytes = list[i].bytes + Bytes::Of(2);
  EXPECT_THAT(Check(f->plan), AllOf(Names(6, i), HasSubstr("collective 0 of its group")));
}

TEST(ValidatePlanTest, MissingGradientReductionIsCaught) {
  auto f = Fixture();
  for (RankProgram& p : f->plan.ranks) {
    std::erase_if(p.instructions,
                  [](const Instruction& in) { return in.op == OpKind::kAllReduceGrad; });
  }
  EXPECT_THAT(Check(f->plan), HasSubstr("steps before reducing stage 0's gradients across the 2 "
                                        "data-parallel replicas"));
  PlanCase c;
  c.pp = 2;
  c.dp = 2;
  c.zero = 2;
  auto z = MakePlanFixture(c);
  auto& list = z->plan.ranks[3].instructions;
  ASSERT_EQ(list.back().op, OpKind::kAllGatherParams);
  list.back().bytes = list.back().bytes + Bytes::Of(2);
  // The other replica's rank posts different collectives: caught before the per-rank check.
  EXPECT_THAT(Check(z->plan), HasSubstr("does not match"));
  list.pop_back();
  z->plan.ranks[1].instructions.pop_back();
  EXPECT_THAT(Check(z->plan), HasSubstr("must match one to one"));
}

TEST(ValidatePlanTest, StructureErrors) {
  auto f = Fixture();
  f->plan.ranks.pop_back();
  EXPECT_THAT(Check(f->plan), HasSubstr("7 rank programs for dp 2 x pp 4"));
  auto g = Fixture();
  g->plan.replicas[0].micro_batches[1].rows.pop_back();
  g->plan.replicas[0].micro_batches[1].rows.emplace_back();
  g->plan.replicas[0].micro_batches[1].stages.pop_back();
  EXPECT_THAT(Check(g->plan), HasSubstr("replica 0 micro-batch 1"));
}

// A plan whose shapes the model cannot take (a plan file edited, or made for another model) is
// refused by check 1 and by CheckPlanFitsModel, before anything is sized by it.
TEST(ValidatePlanTest, ShapesBeyondTheModelAreRejected) {
  auto f = Fixture();
  int64_t longest = 0;
  for (const PlanReplica& r : f->plan.replicas) {
    for (const PlanMicroBatch& mb : r.micro_batches) longest = std::max(longest, mb.shape.seqlen);
  }
  ASSERT_GT(longest, 1);
  EXPECT_TRUE(CheckPlanFitsModel(f->plan).ok());
  f->plan.model.max_position = longest - 1;
  EXPECT_THAT(Check(f->plan),
              AllOf(HasSubstr("plan check: replica "),
                    HasSubstr(fmt::format("seqlen {} is longer than the model's max_position {}",
                                          longest, longest - 1))));
  EXPECT_THAT(CheckPlanFitsModel(f->plan).message(), HasSubstr("max_position"));
  f->plan.model.max_position = longest;
  f->plan.replicas[0].micro_batches[0].shape.mbs = int64_t{1} << 40;
  EXPECT_THAT(CheckPlanFitsModel(f->plan).message(),
              HasSubstr("tokens; allowed: at most 67108864 tokens per micro-batch"));
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

// ValidateRankRewrite gives ValidatePlan's result (ok, or the same message) for every rewrite of
// one rank the passes make and for rewrites that break a plan: every swap of two neighbouring
// instructions and every move of an instruction 3 places later, on every rank of valid plans of
// several schedules (1F1B, ZB-H1 with split backward, interleaved, encoder-decoder), at a memory
// limit some rewrites exceed. Both outcomes occur, and rewrites that change the communication
// order (the replay runs) as well as ones that do not.
TEST(ValidateRankRewriteTest, SameResultAsValidatePlan) {
  int64_t ok = 0, failed = 0;
  for (auto [pp, vpp, dp, kind, encdec] :
       std::vector<std::tuple<int64_t, int64_t, int64_t, ScheduleKind, bool>>{
           {4, 1, 2, ScheduleKind::k1F1B, false},
           {2, 1, 2, ScheduleKind::kZbH1, false},
           {2, 2, 1, ScheduleKind::kInterleaved, false},
           {2, 1, 1, ScheduleKind::k1F1B, true}}) {
    PlanCase c;
    c.pp = pp;
    c.vpp = vpp;
    c.dp = dp;
    c.kind = kind;
    c.encoder_decoder = encdec;
    c.microbatches = 5;
    c.seed = 7;
    auto f = MakePlanFixture(c);
    ASSERT_TRUE(ValidatePlan(f->plan).ok());
    // A limit just above the plan's peak, so that some reorders go over it.
    Bytes peak;
    for (Bytes b : PredictPeakMemory(f->plan, {})) peak = std::max(peak, b);
    f->plan.parallel.memory_limit = Bytes::Of(peak.count() + peak.count() / 10000);
    ASSERT_TRUE(ValidatePlan(f->plan).ok());
    for (int64_t rank = 0; rank < static_cast<int64_t>(f->plan.ranks.size()); ++rank) {
      const RankProgram& original = f->plan.ranks[rank];
      const int64_t n = static_cast<int64_t>(original.instructions.size());
      for (int64_t shift : {1, 3}) {
        for (int64_t i = 0; i + shift < n; ++i) {
          ExecutionPlan p = f->plan;
          std::vector<Instruction>& list = p.ranks[rank].instructions;
          std::rotate(list.begin() + i, list.begin() + i + 1, list.begin() + i + shift + 1);
          const Status full = ValidatePlan(p, ValidateOptions{.grid_context = 1});
          const Status partial =
              ValidateRankRewrite(p, rank, original, ValidateOptions{.grid_context = 1});
          ASSERT_EQ(full.ok(), partial.ok()) << "rank " << rank << " move " << i << " by " << shift
                                             << ": " << full.message();
          ASSERT_EQ(full.message(), partial.message());
          (full.ok() ? ok : failed) += 1;
        }
      }
    }
  }
  EXPECT_GT(ok, 50);
  EXPECT_GT(failed, 50);
}

}  // namespace
}  // namespace sluice
