#include "plan/instruction.h"

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <set>

#include "plan/comm_replay.h"
#include "plan/execution_plan.h"

namespace sluice {
namespace {

// A configuration of `pp` pipeline chunks (the even cut).
ParallelConfig Pipeline(int64_t pp) {
  ParallelConfig p;
  p.pp = pp;
  return p;
}

using ::testing::HasSubstr;

TEST(OpKindTest, NamesRoundTrip) {
  std::set<std::string_view> names;
  for (int i = 0; i < kNumOpKinds; ++i) {
    const OpKind op = static_cast<OpKind>(i);
    names.insert(OpKindName(op));
    EXPECT_EQ(OpKindFromName(OpKindName(op)), op);
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(kNumOpKinds));
  EXPECT_EQ(OpKindFromName("forwards"), std::nullopt);
}

TEST(OpKindTest, StartAndFinishPair) {
  for (OpKind s : {OpKind::kSendActStart, OpKind::kRecvActStart, OpKind::kSendGradStart,
                   OpKind::kRecvGradStart}) {
    EXPECT_TRUE(IsCommStart(s));
    EXPECT_TRUE(IsCommFinish(FinishOf(s)));
    EXPECT_EQ(StartOf(FinishOf(s)), s);
    EXPECT_EQ(IsSend(s), IsSend(FinishOf(s)));
  }
  EXPECT_TRUE(IsCompute(OpKind::kBackwardWeight));
  EXPECT_FALSE(IsCompute(OpKind::kLoadInput));
  EXPECT_TRUE(IsCollective(OpKind::kAllGatherParams));
}

TEST(InstructionTest, TextFollowsPyTorchNames) {
  Instruction in;
  in.op = OpKind::kForward;
  in.stage = 2;
  in.microbatch = 0;
  EXPECT_EQ(InstructionText(in), "2F0");
  in.op = OpKind::kSendActStart;
  EXPECT_EQ(InstructionText(in), "2SEND_F0");
  in.op = OpKind::kRecvGradFinish;
  EXPECT_EQ(InstructionText(in), "2RECV_B0.wait");
  in.op = OpKind::kFreeBuffer;
  in.inputs = {4};
  EXPECT_EQ(InstructionText(in), "FREE(s4)");
  in.op = OpKind::kAllReduceGrad;
  in.bucket = 3;
  EXPECT_EQ(InstructionText(in), "ALLREDUCE(b3)");
  in.op = OpKind::kOptimizerStep;
  EXPECT_EQ(InstructionText(in), "STEP");
}

TEST(InstructionTest, TagsAreUniquePerMessage) {
  std::set<int64_t> tags;
  const int64_t stages = 8;
  for (int64_t mb = 0; mb < 5; ++mb) {
    for (int64_t b = 0; b + 1 < stages; ++b) {
      EXPECT_TRUE(tags.insert(MessageTag(mb, b, false, stages)).second);
      EXPECT_TRUE(tags.insert(MessageTag(mb, b, true, stages)).second);
    }
  }
}

TEST(InstructionTest, NumElementsSaturates) {
  EXPECT_EQ(NumElements({2, 3, 4}), 24);
  EXPECT_EQ(NumElements({}), 1);
  const int64_t big = int64_t{1} << 40;
  EXPECT_EQ(NumElements({big, big}), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(NumElements({-1, 2}), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(Fp16Bytes({{big, big}, {2}}).count(), std::numeric_limits<int64_t>::max());
}

TEST(StepGridTest, MarksTheErrorRow) {
  const std::string grid = FormatStepGrid(
      {"Rank 0", "Rank 1"}, {{"0F0", "0F1", "0B0"}, {"1F0", "1B0"}}, 0, 3, 1, " (rank 1)");
  EXPECT_EQ(grid,
            "        Rank 0 Rank 1\n"
            "Step 0: 0F0    1F0\n"
            "Step 1: 0F1    1B0    <-- ERROR HERE (rank 1)\n"
            "Step 2: 0B0\n");
  const std::string window = FormatStepGrid({"Rank 0"}, {{"a", "b", "c", "d", "e"}}, 1, 3, -1, "");
  EXPECT_EQ(window, "        Rank 0\n...\nStep 1: b\nStep 2: c\n...\n");
}

TEST(ShapesTest, BoundaryShapesFollowTheModel) {
  ModelSpec gpt;
  gpt.hidden = 1024;
  const LayerShape shape{2, 128, 0};
  EXPECT_EQ(BoundaryShapes(gpt, shape, 0, Pipeline(4)), (std::vector<TensorShape>{{2, 128, 1024}}));
  EXPECT_EQ(LoadShapes(gpt, shape, 0, 4), (std::vector<TensorShape>{{2, 128}}));
  EXPECT_EQ(LoadShapes(gpt, shape, 3, 4), (std::vector<TensorShape>{{2, 128}}));
  EXPECT_TRUE(LoadShapes(gpt, shape, 1, 4).empty());
  EXPECT_EQ(LoadShapes(gpt, shape, 0, 1), (std::vector<TensorShape>{{2, 128}, {2, 128}}));
  ModelSpec t5 = gpt;
  t5.kind = ModelKind::kEncoderDecoder;
  t5.layers = 4;
  t5.decoder_layers = 4;
  const LayerShape ed{2, 128, 32};
  EXPECT_EQ(BoundaryShapes(t5, ed, 0, Pipeline(8)), (std::vector<TensorShape>{{2, 128, 1024}}));
  EXPECT_EQ(BoundaryShapes(t5, ed, 3, Pipeline(8)),
            (std::vector<TensorShape>{{2, 128, 1024}, {2, 32, 1024}}));
  EXPECT_EQ(LoadShapes(t5, ed, 0, 8), (std::vector<TensorShape>{{2, 128}, {2, 32}}));
  EXPECT_EQ(LoadShapes(t5, ed, 7, 8), (std::vector<TensorShape>{{2, 32}}));
  EXPECT_EQ(TokenBytes(LoadShapes(t5, ed, 7, 8)).count(), 8 * 64);
  // 3 + 3 layers in 3 stages: stage 1 ends the encoder (and starts the decoder).
  ModelSpec t5_3 = t5;
  t5_3.layers = 3;
  t5_3.decoder_layers = 3;
  EXPECT_EQ(BoundaryShapes(t5_3, ed, 0, Pipeline(3)), (std::vector<TensorShape>{{2, 128, 1024}}));
  EXPECT_EQ(BoundaryShapes(t5_3, ed, 1, Pipeline(3)),
            (std::vector<TensorShape>{{2, 128, 1024}, {2, 32, 1024}}));
  EXPECT_TRUE(IsBoundaryShapes(BoundaryShapes(t5_3, ed, 1, Pipeline(3)), t5_3, ed, 1, Pipeline(3)));
  EXPECT_FALSE(
      IsBoundaryShapes(BoundaryShapes(t5_3, ed, 0, Pipeline(3)), t5_3, ed, 1, Pipeline(3)));
  // IsBoundaryShapes agrees with BoundaryShapes everywhere.
  for (const ModelSpec* m : {&gpt, &t5}) {
    for (int64_t b = 0; b < 7; ++b) {
      const std::vector<TensorShape> want = BoundaryShapes(*m, ed, b, Pipeline(8));
      EXPECT_TRUE(IsBoundaryShapes(want, *m, ed, b, Pipeline(8)));
      std::vector<TensorShape> off = want;
      off.back()[1] += 8;
      EXPECT_FALSE(IsBoundaryShapes(off, *m, ed, b, Pipeline(8)));
      off = want;
      off.push_back({1});
      EXPECT_FALSE(IsBoundaryShapes(off, *m, ed, b, Pipeline(8)));
    }
  }
}

// The replay engine on hand-made ops.
CommOp Post(bool send, int64_t peer, int64_t tag) {
  CommOp op;
  op.kind = CommOp::Kind::kPost;
  op.send = send;
  op.peer = peer;
  op.tag = tag;
  return op;
}
CommOp Wait(int64_t index) {
  CommOp op;
  op.kind = CommOp::Kind::kWait;
  op.wait_for = index;
  return op;
}
std::string Text(int64_t r, int64_t i) { return fmt::format("op{}.{}", r, i); }

TEST(CommReplayTest, RingOfWaitsDeadlocks) {
  // Each rank waits for the message from its left neighbour before sending to its right one.
  std::vector<std::vector<CommOp>> ranks(3);
  for (int64_t r = 0; r < 3; ++r) {
    const int64_t left = (r + 2) % 3, right = (r + 1) % 3;
    ranks[r] = {Post(false, left, left), Wait(0), Post(true, right, r)};
  }
  // Pairs (r, right) exchange exactly one message each, in one order: no mismatch.
  std::optional<CommProblem> p = CheckComms(ranks, {}, Text);
  ASSERT_TRUE(p.has_value());
  EXPECT_THAT(p->message, HasSubstr("deadlock"));
  EXPECT_THAT(p->message, HasSubstr("rank 0 at instruction 1 (op0.1) waits for rank 2"));
  EXPECT_EQ(p->rank, 0);
  EXPECT_EQ(p->index, 1);
  // Sending first breaks the ring.
  ranks[0] = {Post(true, 1, 0), Post(false, 2, 2), Wait(1)};
  EXPECT_EQ(CheckComms(ranks, {}, Text), std::nullopt);
}

TEST(CommReplayTest, MismatchedShapesAndCollectives) {
  const std::vector<TensorShape> a = {{1, 8, 16}}, b = {{1, 16, 16}};
  std::vector<std::vector<CommOp>> ranks = {{Post(true, 1, 5)}, {Post(false, 0, 5)}};
  ranks[0][0].shapes = &a;
  ranks[1][0].shapes = &b;
  std::optional<CommProblem> p = CheckComms(ranks, {}, Text);
  ASSERT_TRUE(p.has_value());
  EXPECT_THAT(p->message, HasSubstr("shape mismatch"));
  EXPECT_THAT(p->message, HasSubstr("[1, 8, 16]"));
  CommOp c;
  c.kind = CommOp::Kind::kCollective;
  c.group = 0;
  c.collective = {1, 0, 100};
  CommOp d = c;
  d.collective = {1, 0, 200};
  p = CheckComms({{c}, {d}}, {{0, 1}}, Text);
  ASSERT_TRUE(p.has_value());
  EXPECT_THAT(p->message, HasSubstr("does not match rank 0's collective 0"));
}

}  // namespace
}  // namespace sluice
