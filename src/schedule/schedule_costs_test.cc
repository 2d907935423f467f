#include "schedule/schedule_costs.h"

#include <gtest/gtest.h>

#include <vector>

#include "batching/test_util.h"
#include "cost/comm_model.h"
#include "schedule/generators.h"

namespace sluice {
namespace {

using testing::MakeTestSetup;
using testing::TestParallel;

// Micro-batches of 1..4 rows of 128..512 tokens, priced by the setup's evaluator.
std::vector<MicroBatch> Priced(const testing::TestSetup& setup, std::vector<Sample>* samples) {
  std::vector<MicroBatch> out;
  int64_t id = 0;
  for (int64_t rows = 1; rows <= 4; ++rows) {
    MicroBatch mb;
    for (int64_t r = 0; r < rows; ++r) {
      samples->push_back(Sample{.id = id, .input_len = 512 / rows, .target_len = 0});
      mb.rows.push_back({id++});
    }
    out.push_back(mb);
  }
  const BatchIndex index(*samples);
  for (MicroBatch& mb : out) SLUICE_CHECK(PriceMicroBatch(setup.evaluator(), index, &mb));
  return out;
}

TEST(BuildScheduleCostsTest, OneChunkPerStageCopiesTheMicroBatchFigures) {
  auto setup = MakeTestSetup("gpt-6.7b", TestParallel(1, 4));
  std::vector<Sample> samples;
  const std::vector<MicroBatch> mbs = Priced(*setup, &samples);
  StatusOr<ScheduleCosts> c = BuildScheduleCosts(mbs, setup->evaluator(), setup->cluster);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->num_microbatches(), 4);
  EXPECT_EQ(c->pp, 4);
  EXPECT_EQ(c->vpp, 1);
  const AlphaBetaCommModel comm(setup->cluster);
  for (size_t i = 0; i < mbs.size(); ++i) {
    for (int64_t s = 0; s < 4; ++s) {
      const ChunkCost& cc = c->chunks[i][s];
      EXPECT_EQ(cc.forward, mbs[i].stages[s].forward);
      EXPECT_EQ(cc.backward_input + cc.backward_weight, mbs[i].stages[s].backward());
      EXPECT_EQ(cc.backward_weight, mbs[i].stages[s].backward_weight);
      EXPECT_EQ(cc.stored, mbs[i].stages[s].stored);
      EXPECT_EQ(cc.peak, mbs[i].stages[s].peak);
      EXPECT_EQ(cc.stored_until_w, cc.stored.Scaled(32.0 / 34.0));
      if (s < 3) {
        EXPECT_EQ(c->p2p[i][s],
                  comm.PointToPoint(setup->evaluator().BoundaryBytes(mbs[i].shape, s), false));
      }
    }
  }
  // Held buffers per micro-batch and stage; each rank's budget keeps room for the transient
  // buffers of its largest micro-batch.
  for (size_t i = 0; i < mbs.size(); ++i) {
    for (int64_t s = 0; s < 4; ++s) {
      EXPECT_EQ(c->held[i][s], setup->evaluator().HeldBuffers(mbs[i].shape, s));
    }
  }
  for (int64_t r = 0; r < 4; ++r) {
    Bytes transient;
    for (const MicroBatch& mb : mbs) {
      transient = std::max(transient, setup->evaluator().TransientBuffers(mb.shape, r));
    }
    EXPECT_GT(transient, Bytes::Zero());
    EXPECT_EQ(c->budget[r], setup->evaluator().ActivationBudget(r) - transient);
  }
  // The costs drive every generator.
  for (ScheduleKind k : AllScheduleKinds()) {
    StatusOr<ScheduleResult> r = GenerateSchedule(k, *c);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->outcome, PlanOutcome::kOk) << ScheduleKindName(k) << r->infeasible_reason;
  }
}

TEST(BuildScheduleCostsTest, ChunksSplitTheirDevicesFigures) {
  auto setup = MakeTestSetup("gpt-6.7b", TestParallel(1, 4, 1, 36000, 1, 2));
  std::vector<Sample> samples;
  const std::vector<MicroBatch> mbs = Priced(*setup, &samples);
  StatusOr<ScheduleCosts> c = BuildScheduleCosts(mbs, setup->evaluator(), setup->cluster);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->chunks[0].size(), 8u);
  for (size_t i = 0; i < mbs.size(); ++i) {
    for (int64_t d = 0; d < 4; ++d) {
      const ChunkCost& a = c->chunks[i][d];
      const ChunkCost& b = c->chunks[i][d + 4];
      EXPECT_NEAR((a.forward + b.forward).nanos(), mbs[i].stages[d].forward.nanos(), 1);
      EXPECT_NEAR((a.stored + b.stored).count(), mbs[i].stages[d].stored.count(), 1);
      EXPECT_LE(a.peak, mbs[i].stages[d].peak);
    }
    // The wrap from rank 3 (stage 3) to rank 0 (stage 4) costs a transfer too.
    EXPECT_GT(c->p2p[i][3], Duration::Zero());
  }
  StatusOr<ScheduleResult> r = GenerateSchedule(ScheduleKind::kInterleaved, *c);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->outcome, PlanOutcome::kOk) << r->infeasible_reason;
}

TEST(BuildScheduleCostsTest, BoundariesAcrossNodesUseTheInterNodeLink) {
  // pp = 4 x tp = 4 = 16 devices on two 8-device nodes: rank 1 -> rank 2 crosses.
  auto setup = MakeTestSetup("gpt-6.7b", TestParallel(1, 4, 4));
  std::vector<Sample> samples;
  const std::vector<MicroBatch> mbs = Priced(*setup, &samples);
  StatusOr<ScheduleCosts> c = BuildScheduleCosts(mbs, setup->evaluator(), setup->cluster);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const AlphaBetaCommModel comm(setup->cluster);
  const Bytes bytes = setup->evaluator().ChunkBoundaryBytes(mbs[0].shape, 1);
  EXPECT_EQ(c->p2p[0][0], comm.PointToPoint(bytes, false));
  EXPECT_EQ(c->p2p[0][1], comm.PointToPoint(bytes, true));
  EXPECT_EQ(c->p2p[0][2], comm.PointToPoint(bytes, false));
  EXPECT_GT(c->p2p[0][1], c->p2p[0][0]);
}

TEST(BuildScheduleCostsTest, Errors) {
  auto setup = MakeTestSetup("gpt-6.7b", TestParallel(1, 4));
  std::vector<Sample> samples;
  std::vector<MicroBatch> mbs = Priced(*setup, &samples);
  const StageCostEvaluator& e = setup->evaluator();
  EXPECT_FALSE(BuildScheduleCosts({}, e, setup->cluster).ok());
  EXPECT_FALSE(BuildScheduleCosts(mbs, e, setup->cluster, {.w_stored_fraction = 1.5}).ok());
  StatusOr<ScheduleCosts> far = BuildScheduleCosts(mbs, e, setup->cluster, {.replica = 2});
  ASSERT_FALSE(far.ok());
  EXPECT_NE(far.status().message().find("replica 2 of dp 1 needs 4 devices"), std::string::npos)
      << far.status().message();
  mbs[1].stages.pop_back();
  EXPECT_FALSE(BuildScheduleCosts(mbs, e, setup->cluster).ok());
}

TEST(PermuteMicroBatchesTest, ReordersChunksAndTransfers) {
  ScheduleCosts c;
  c.pp = 2;
  c.budget = {Bytes::MB(1), Bytes::MB(2)};
  for (int64_t i = 0; i < 3; ++i) {
    ChunkCost cc;
    cc.forward = Duration::Micros(static_cast<double>(i));
    c.chunks.push_back({cc, cc});
    c.p2p.push_back({Duration::Micros(10.0 * static_cast<double>(i))});
  }
  ScheduleCosts out;
  const std::vector<int64_t> order = {2, 0, 1};
  PermuteMicroBatches(c, order, &out);
  EXPECT_EQ(out.chunks[0], c.chunks[2]);
  EXPECT_EQ(out.p2p[1], c.p2p[0]);
  EXPECT_EQ(out.budget, c.budget);
  EXPECT_EQ(out.pp, 2);
}

}  // namespace
}  // namespace sluice
