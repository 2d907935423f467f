// The simulator against closed forms (pipelines, ring all-reduce, contention), an independent
// count of memory, the validator's memory rule, deadlocks and the what-if knobs. The sweep over
// planner plans is in simulator_sweep_test.cc.
#include "sim/simulator.h"

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include "batching/test_util.h"
#include "cost/comm_model.h"
#include "plan/plan_test_util.h"
#include "plan/validate.h"
#include "planner/planner.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using testing::MakePlanFixture;
using testing::PlanCase;

constexpr double kMB = 1e6;

// The plan simulated with `mode` collectives; a test failure (and nullopt) unless the
// simulation ran every rank to its end.
std::optional<SimResult> SimulateToTheEnd(const ExecutionPlan& plan, CollectiveMode mode) {
  SimOptions options;
  options.collectives = mode;
  StatusOr<SimResult> r = Simulate(plan, options);
  if (!r.ok()) {
    ADD_FAILURE() << r.status().ToString();
    return std::nullopt;
  }
  if (r->outcome != SimOutcome::kOk) {
    ADD_FAILURE() << r->problem;
    return std::nullopt;
  }
  return *std::move(r);
}

// A plan of `ranks` programs (dp x pp) with the test GPT model, for hand-written programs.
ExecutionPlan HandPlan(int64_t dp, int64_t pp, int64_t devices_per_node = 8) {
  ExecutionPlan plan;
  plan.model = testing::TestGptModel();
  plan.cluster = ClusterPreset("a100-40g", 8).value();
  plan.cluster.devices_per_node = devices_per_node;
  plan.cluster.nodes = std::max<int64_t>(1, (dp * pp + devices_per_node - 1) / devices_per_node);
  plan.parallel.dp = dp;
  plan.parallel.pp = pp;
  plan.model_states.assign(pp, Bytes::MB(1000));
  plan.replicas.resize(dp);
  for (int64_t r = 0; r < dp * pp; ++r) {
    RankProgram p;
    p.rank = r;
    p.dp_index = r / pp;
    p.pp_index = r % pp;
    plan.ranks.push_back(p);
  }
  return plan;
}

Instruction Op(OpKind op, int64_t mb = -1, int64_t stage = -1) {
  Instruction in;
  in.op = op;
  in.microbatch = mb;
  in.stage = stage;
  return in;
}

Instruction P2p(OpKind op, int64_t peer, int64_t tag, int64_t slot, Bytes bytes) {
  Instruction in = Op(op, 0, 0);
  in.peer = peer;
  in.tag = tag;
  in.bytes = bytes;
  (IsCommStart(op) && !IsSend(op) ? in.outputs : in.inputs).push_back(slot);
  return in;
}

// Sets every F, B and W of the plan to `f`, `b` and 0, and every link to zero latency and
// practically infinite bandwidth (so transfers take no time).
void MakeUniform(ExecutionPlan& plan, Duration f, Duration b) {
  for (RankProgram& p : plan.ranks) {
    for (Instruction& in : p.instructions) {
      if (in.op == OpKind::kForward) in.duration = f;
      if (in.op == OpKind::kBackward) in.duration = b;
    }
  }
  plan.cluster.intra_node = {1e30, Duration::Zero()};
  plan.cluster.inter_node = {1e30, Duration::Zero()};
}

TEST(SimulatorPipelineTest, UniformPipelinesMatchTheClosedForm) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
    for (int64_t pp : {2, 4}) {
      PlanCase c;
      c.pp = pp;
      c.kind = kind;
      c.microbatches = 8;
      c.fixed_shapes = true;
      auto fixture = MakePlanFixture(c);
      ASSERT_TRUE(fixture->no_schedule.empty()) << fixture->no_schedule;
      ExecutionPlan plan = fixture->plan;
      const Duration f = Duration::Millis(3), b = Duration::Millis(5);
      MakeUniform(plan, f, b);
      for (CollectiveMode mode : {CollectiveMode::kStepwise, CollectiveMode::kClosedForm}) {
        const std::optional<SimResult> r = SimulateToTheEnd(plan, mode);
        ASSERT_TRUE(r.has_value());
        const double want = static_cast<double>(((f + b) * (c.microbatches + pp - 1)).nanos());
        EXPECT_NEAR(static_cast<double>(r->iteration_time.nanos()), want, want * 1e-3)
            << ScheduleKindName(kind) << " pp " << pp;
        // Every rank computes m (f + b); the rest is bubble, (p - 1)(f + b).
        for (const RankSimStats& s : r->ranks) {
          EXPECT_EQ(s.compute, (f + b) * c.microbatches);
          EXPECT_NEAR(static_cast<double>(s.bubble.nanos()),
                      static_cast<double>(((f + b) * (pp - 1)).nanos()), want * 1e-3);
        }
        // The critical path ends the iteration and is a chain in time.
        ASSERT_FALSE(r->critical_path.empty());
        EXPECT_EQ(r->critical_path.back().end, r->iteration_time);
        for (size_t i = 1; i < r->critical_path.size(); ++i) {
          EXPECT_LE(r->critical_path[i - 1].end, r->critical_path[i].start);
        }
      }
    }
  }
}

// With a latency alpha per transfer: the forward wave pays p - 1 hops; the last stage's backwards
// each wait for the previous gradient send to finish (the plan's rule: at most one gradient send
// in flight per rank), m - 1 alphas; the last micro-batch's gradient pays p - 1 hops back.
TEST(SimulatorPipelineTest, GPipeWithLatencyMatchesTheClosedForm) {
  PlanCase c;
  c.pp = 4;
  c.kind = ScheduleKind::kGPipe;
  c.microbatches = 6;
  c.fixed_shapes = true;
  auto fixture = MakePlanFixture(c);
  ExecutionPlan plan = fixture->plan;
  const Duration f = Duration::Millis(2), b = Duration::Millis(4), alpha = Duration::Micros(50);
  MakeUniform(plan, f, b);
  plan.cluster.intra_node.latency = alpha;
  StatusOr<SimResult> r = Simulate(plan);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const double want = static_cast<double>(
      ((f + b) * (c.microbatches + c.pp - 1) + alpha * (2 * c.pp + c.microbatches - 3)).nanos());
  EXPECT_NEAR(static_cast<double>(r->iteration_time.nanos()), want, want * 1e-3);
}

// dp ranks that only all-reduce one bucket of `bytes` and step.
ExecutionPlan AllReducePlan(int64_t dp, Bytes bytes, int64_t devices_per_node) {
  ExecutionPlan plan = HandPlan(dp, 1, devices_per_node);
  for (RankProgram& p : plan.ranks) {
    Instruction ar = Op(OpKind::kAllReduceGrad, -1, 0);
    ar.bucket = 0;
    ar.bytes = bytes;
    p.instructions = {ar, Op(OpKind::kOptimizerStep)};
  }
  return plan;
}

TEST(SimulatorCollectiveTest, RingAllReduceMatchesTheAlphaBetaForm) {
  const Bytes size = Bytes::MiB(100);
  // One node (NVLink); two nodes of 4 whose crossings take one device's inter-node share (Gloo's
  // one connection per hop) or all 4 (NCCL's channels through every device's NIC); 8 nodes of 1.
  struct Case {
    int64_t per_node;
    RingCrossing crossing;
  };
  for (const Case c : {Case{8, RingCrossing::kAllMembers}, Case{4, RingCrossing::kOneConnection},
                       Case{4, RingCrossing::kAllMembers}, Case{1, RingCrossing::kAllMembers}}) {
    const int64_t per_node = c.per_node;
    ExecutionPlan plan = AllReducePlan(8, size, per_node);
    plan.cluster.ring_crossing = c.crossing;
    const LinkSpec link = per_node == 8 ? plan.cluster.intra_node : plan.cluster.inter_node;
    const double shares = per_node < 8 && c.crossing == RingCrossing::kAllMembers
                              ? static_cast<double>(per_node)
                              : 1.0;
    const double bandwidth =
        per_node == 8 ? link.bandwidth
                      : std::min(shares * link.bandwidth, plan.cluster.intra_node.bandwidth);
    const double n = 8;
    const double formula =
        2 * (n - 1) / n * static_cast<double>(size.count()) / bandwidth * 1e9 +
        2 * (n - 1) * static_cast<double>(link.latency.nanos());
    const CollectiveRing ring = GradientRing(plan.cluster, plan.parallel, 0);
    EXPECT_EQ(ring.spans_nodes, per_node != 8);
    EXPECT_EQ(ring.crossing_shares, static_cast<int64_t>(shares));
    const Duration closed =
        AlphaBetaCommModel(plan.cluster).Collective(CollectiveKind::kAllReduce, size, ring);
    EXPECT_NEAR(static_cast<double>(closed.nanos()), formula, 1);
    for (CollectiveMode mode : {CollectiveMode::kStepwise, CollectiveMode::kClosedForm}) {
      const std::optional<SimResult> r = SimulateToTheEnd(plan, mode);
      ASSERT_TRUE(r.has_value());
      EXPECT_NEAR(static_cast<double>(r->iteration_time.nanos()), formula, formula * 0.01)
          << "per node " << per_node << " crossing " << RingCrossingName(c.crossing) << " mode "
          << static_cast<int>(mode);
      for (const RankSimStats& s : r->ranks) {
        EXPECT_EQ(s.comm, r->iteration_time);
        EXPECT_EQ(s.exposed_comm, r->iteration_time);  // the step waits for it, compute idle
      }
    }
  }
}

// Rings with hops the members' first devices do not show: each member's cp devices (dp 4 x cp 8,
// one node per member, 8 shares per crossing, also with an intra-node link slow enough to cap
// the ring), members whose cp devices straddle nodes (dp 3 x cp 3 on nodes of 8), and a cp-only
// ring over two nodes. Stepwise and closed form agree, uncontended, within 1%.
TEST(SimulatorCollectiveTest, StepwiseAndClosedFormAgreeOnContextParallelRings) {
  const Bytes size = Bytes::MiB(64);
  struct Case {
    int64_t dp, cp;
    double intra_scale;
  };
  for (const Case c : {Case{4, 8, 1.0}, Case{4, 8, 0.05}, Case{3, 3, 1.0}, Case{1, 16, 1.0},
                       Case{1, 16, 0.05}}) {
    ExecutionPlan plan = AllReducePlan(c.dp, size, 8);
    plan.parallel.cp = c.cp;
    plan.cluster.nodes = (c.dp * c.cp + 7) / 8;
    plan.cluster.intra_node.bandwidth *= c.intra_scale;
    const CollectiveRing ring = GradientRing(plan.cluster, plan.parallel, 0);
    const Duration closed =
        AlphaBetaCommModel(plan.cluster).Collective(CollectiveKind::kAllReduce, size, ring);
    for (CollectiveMode mode : {CollectiveMode::kStepwise, CollectiveMode::kClosedForm}) {
      const std::optional<SimResult> r = SimulateToTheEnd(plan, mode);
      ASSERT_TRUE(r.has_value());
      EXPECT_NEAR(static_cast<double>(r->iteration_time.nanos()),
                  static_cast<double>(closed.nanos()), 0.01 * closed.nanos())
          << "dp " << c.dp << " cp " << c.cp << " intra x" << c.intra_scale << " mode "
          << static_cast<int>(mode);
    }
  }
}

TEST(SimulatorCollectiveTest, ReduceScatterAndAllGatherTakeHalfTheSteps) {
  ExecutionPlan plan = AllReducePlan(4, Bytes::MiB(64), 8);
  for (RankProgram& p : plan.ranks) {
    p.instructions[0].op = OpKind::kReduceScatterGrad;
    Instruction ag = p.instructions[0];
    ag.op = OpKind::kAllGatherParams;
    p.instructions.push_back(ag);
  }
  const AlphaBetaCommModel comm(plan.cluster);
  const CollectiveRing ring{.members = 4};
  const Duration want = comm.Collective(CollectiveKind::kReduceScatter, Bytes::MiB(64), ring) +
                        comm.Collective(CollectiveKind::kAllGather, Bytes::MiB(64), ring);
  StatusOr<SimResult> r = Simulate(plan);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_NEAR(static_cast<double>(r->iteration_time.nanos()), static_cast<double>(want.nanos()),
              want.nanos() * 0.01);
}

// Rank 1 of three loads a buffer and sends it to both neighbours at once: the two transfers
// share its egress port, so each moves at half the bandwidth.
TEST(SimulatorContentionTest, TransfersSharingAnEgressPortSplitItsBandwidth) {
  const Bytes size = Bytes::MiB(64);
  for (bool both : {false, true}) {
    ExecutionPlan plan = HandPlan(1, 3);
    for (RankProgram& p : plan.ranks) p.buffer_slots = 1;
    Instruction load = Op(OpKind::kLoadInput, 0, 1);
    load.bytes = size;
    load.outputs = {0};
    auto& r1 = plan.ranks[1].instructions;
    r1 = {load, P2p(OpKind::kSendActStart, 2, 0, 0, size)};
    if (both) r1.push_back(P2p(OpKind::kSendGradStart, 0, 1, 0, size));
    r1.push_back(P2p(OpKind::kSendActFinish, 2, 0, 0, size));
    if (both) r1.push_back(P2p(OpKind::kSendGradFinish, 0, 1, 0, size));
    r1.push_back(Op(OpKind::kFreeBuffer));
    r1.back().inputs = {0};
    plan.ranks[2].instructions = {P2p(OpKind::kRecvActStart, 1, 0, 0, size),
                                  P2p(OpKind::kRecvActFinish, 1, 0, 0, size)};
    if (both) {
      plan.ranks[0].instructions = {P2p(OpKind::kRecvGradStart, 1, 1, 0, size),
                                    P2p(OpKind::kRecvGradFinish, 1, 1, 0, size)};
    }
    StatusOr<SimResult> r = Simulate(plan);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    // Receivers hold their buffers at the end: the plan frees nothing there (memory only).
    const LinkSpec link = plan.cluster.intra_node;
    const double one = static_cast<double>(size.count()) / link.bandwidth * 1e9;
    const double want = static_cast<double>(link.latency.nanos()) + (both ? 2 : 1) * one;
    EXPECT_NEAR(static_cast<double>(r->iteration_time.nanos()), want, 2) << both;
  }
}

// Two ranks, one micro-batch, with the activation rule's numbers chosen by hand; the expected
// peaks are counted here from the program, independently of the simulator.
TEST(SimulatorMemoryTest, PeakEqualsAHandCountOfLiveBuffersAndActivations) {
  ExecutionPlan plan = HandPlan(1, 2);
  plan.model_states = {Bytes::MB(1000), Bytes::MB(900)};
  plan.parallel.memory_limit = Bytes::MB(2000);
  PlanMicroBatch mb;
  mb.rows = {{0}};
  mb.shape = {1, 64, 0};
  const Bytes p0 = Bytes::MB(100), s0 = Bytes::MB(60), p1 = Bytes::MB(50), s1 = Bytes::MB(45);
  mb.stages = {
      {Duration::Millis(1), Duration::Millis(1), Duration::Millis(1), s0, p0, s0.Scaled(0.5)},
      {Duration::Millis(1), Duration::Millis(1), Duration::Millis(1), s1, p1, s1.Scaled(0.5)}};
  plan.replicas[0].micro_batches = {mb};
  const std::vector<TensorShape> act = {{1, 64, 1024}};
  const Bytes a = Fp16Bytes(act), tokens = Bytes::Of(512), labels = Bytes::Of(512);
  plan.ranks[0].buffer_slots = 3;
  plan.ranks[1].buffer_slots = 3;
  Instruction load0 = Op(OpKind::kLoadInput, 0, 0);
  load0.bytes = tokens;
  load0.outputs = {0};
  Instruction f0 = Op(OpKind::kForward, 0, 0);
  f0.inputs = {0};
  f0.outputs = {1};
  f0.shapes = act;
  f0.duration = Duration::Millis(2);
  Instruction b0 = Op(OpKind::kBackward, 0, 0);
  b0.inputs = {0, 1, 2};
  b0.duration = Duration::Millis(4);
  auto free = [](int64_t slot) {
    Instruction in = Op(OpKind::kFreeBuffer);
    in.inputs = {slot};
    return in;
  };
  plan.ranks[0].instructions = {load0,
                                f0,
                                P2p(OpKind::kSendActStart, 1, 0, 1, a),
                                P2p(OpKind::kRecvGradStart, 1, 1, 2, a),
                                P2p(OpKind::kSendActFinish, 1, 0, 1, a),
                                P2p(OpKind::kRecvGradFinish, 1, 1, 2, a),
                                b0,
                                free(0),
                                free(1),
                                free(2),
                                Op(OpKind::kOptimizerStep)};
  Instruction load1 = Op(OpKind::kLoadInput, 0, 1);
  load1.bytes = labels;
  load1.outputs = {0};
  Instruction f1 = Op(OpKind::kForward, 0, 1);
  f1.inputs = {1, 0};
  f1.duration = Duration::Millis(3);
  Instruction b1 = Op(OpKind::kBackward, 0, 1);
  b1.inputs = {1, 0};
  b1.outputs = {2};
  b1.shapes = act;
  b1.duration = Duration::Millis(5);
  plan.ranks[1].instructions = {load1,
                                P2p(OpKind::kRecvActStart, 0, 0, 1, a),
                                P2p(OpKind::kRecvActFinish, 0, 0, 1, a),
                                f1,
                                b1,
                                P2p(OpKind::kSendGradStart, 0, 1, 2, a),
                                free(0),
                                free(1),
                                P2p(OpKind::kSendGradFinish, 0, 1, 2, a),
                                free(2),
                                Op(OpKind::kOptimizerStep)};
  StatusOr<SimResult> r = Simulate(plan);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->outcome, SimOutcome::kOk) << r->problem;
  // Rank 0: tokens + its output activation stay live throughout; F0 adds its peak; then it holds
  // `stored` and receives the gradient; B0 needs max(0, peak - stored) more.
  const Bytes want0 =
      plan.model_states[0] + tokens + a + std::max(p0, s0 + a + std::max(Bytes::Zero(), p0 - s0));
  // Rank 1: labels; the received activation until F1 takes it into its stored activations; F1's
  // peak; B1 on top of stored with its output gradient.
  const Bytes want1 =
      plan.model_states[1] + labels + std::max({a, p1, s1 + a + std::max(Bytes::Zero(), p1 - s1)});
  EXPECT_EQ(r->ranks[0].peak_memory, want0);
  EXPECT_EQ(r->ranks[1].peak_memory, want1);
  EXPECT_EQ(r->ranks[0].peak_instruction, 6);  // during B0
  // The timeline starts at model states and ends there, every buffer freed.
  ASSERT_FALSE(r->memory[0].empty());
  EXPECT_EQ(r->memory[0].front().time, Duration::Zero());
  EXPECT_EQ(r->memory[0].back().bytes, plan.model_states[0]);
  EXPECT_EQ(r->memory[1].back().bytes, plan.model_states[1]);

  // The plan's memory rule counts each receive from the earliest point its transfer can start
  // (here the program's start: no send-finish precedes them); the peaks are the same, since the
  // gradient is live at B0's peak and the activation before F1 in both.
  const std::vector<Bytes> predicted = PredictPeakMemory(plan);
  EXPECT_EQ(predicted[0], want0);
  EXPECT_EQ(predicted[1], want1);

  // Without buffers the activations rule alone: the validator's prediction without buffers.
  SimOptions no_buffers;
  no_buffers.count_buffers = false;
  StatusOr<SimResult> rule = Simulate(plan, no_buffers);
  ASSERT_TRUE(rule.ok());
  const std::vector<Bytes> activations = PredictPeakMemory(plan, {.count_buffers = false});
  EXPECT_EQ(rule->ranks[0].peak_memory, activations[0]);
  EXPECT_EQ(rule->ranks[1].peak_memory, activations[1]);

  // A limit above rank 1's peak and rank 0's model states, below F0's need: rank 0 runs out of
  // memory in F0 (instruction 1), and the run still ends.
  plan.parallel.memory_limit = Bytes::MB(1050);
  ASSERT_LT(want1, plan.parallel.memory_limit.value());
  StatusOr<SimResult> oom = Simulate(plan);
  ASSERT_TRUE(oom.ok());
  EXPECT_EQ(oom->outcome, SimOutcome::kOutOfMemory);
  EXPECT_TRUE(oom->memory_exceeded);
  EXPECT_EQ(oom->oom_rank, 0);
  EXPECT_EQ(oom->oom_instruction, 1);
  EXPECT_THAT(oom->problem, HasSubstr("rank 0"));
  EXPECT_EQ(oom->iteration_time, r->iteration_time);
  EXPECT_EQ(oom->instructions, r->instructions);
}

// The simulator's memory is the plan's rule whatever the timing: with the rule's peak as the
// limit every run fits; one byte less and it runs out of memory at the change the rule names,
// with stragglers and slow links as without.
TEST(SimulatorMemoryTest, TheRulesPeakIsTheLimitWhateverTheTiming) {
  for (ScheduleKind kind : {ScheduleKind::k1F1B, ScheduleKind::kZbH1, ScheduleKind::kAdaptive,
                            ScheduleKind::kInterleaved}) {
    PlanCase c;
    c.dp = 2;
    c.pp = 4;
    c.vpp = kind == ScheduleKind::kInterleaved ? 2 : 1;
    c.kind = kind;
    c.microbatches = 8;
    auto fixture = MakePlanFixture(c);
    ASSERT_TRUE(fixture->no_schedule.empty()) << testing::Describe(c);
    ExecutionPlan& plan = fixture->plan;
    const std::vector<Bytes> rule = PredictPeakMemory(plan);
    Bytes most;
    for (Bytes b : rule) most = std::max(most, b);
    std::vector<SimOptions> timings(3);
    timings[1].stragglers = {{1, 3.0}, {4, 0.5}};
    timings[2].intra_node.bandwidth_scale = 0.01;
    timings[2].collectives = CollectiveMode::kClosedForm;
    for (const SimOptions& options : timings) {
      plan.parallel.memory_limit = most;
      StatusOr<SimResult> fits = Simulate(plan, options);
      ASSERT_TRUE(fits.ok()) << fits.status().ToString();
      EXPECT_EQ(fits->outcome, SimOutcome::kOk) << testing::Describe(c) << fits->problem;
      for (size_t r = 0; r < rule.size(); ++r) {
        EXPECT_EQ(fits->ranks[r].peak_memory, rule[r]) << testing::Describe(c) << " rank " << r;
      }
      plan.parallel.memory_limit = most - Bytes::Of(1);
      StatusOr<SimResult> over = Simulate(plan, options);
      ASSERT_TRUE(over.ok());
      EXPECT_EQ(over->outcome, SimOutcome::kOutOfMemory) << testing::Describe(c);
      ASSERT_GE(over->oom_rank, 0);
      EXPECT_EQ(rule[over->oom_rank], most);
      const RankMemory m = ReplayRankMemory(plan, plan.ranks[over->oom_rank], plan.memory_limit());
      EXPECT_EQ(over->oom_instruction, m.first_over) << testing::Describe(c);
    }
  }
}

int64_t FindOp(const ExecutionPlan& plan, int64_t rank, OpKind op) {
  return testing::FindInstruction(plan, rank, [op](const Instruction& in) { return in.op == op; });
}

TEST(SimulatorDeadlockTest, AMissingReceiveIsADeadlockNamingTheRanks) {
  PlanCase c;
  c.pp = 4;
  c.dp = 2;
  c.microbatches = 6;
  auto fixture = MakePlanFixture(c);
  ExecutionPlan plan = fixture->plan;
  // Rank 2 (replica 0, stage 2) never posts its first activation receive.
  const int64_t at = FindOp(plan, 2, OpKind::kRecvActStart);
  ASSERT_GE(at, 0);
  plan.ranks[2].instructions.erase(plan.ranks[2].instructions.begin() + at);
  StatusOr<SimResult> r = Simulate(plan);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->outcome, SimOutcome::kDeadlock);
  std::vector<int64_t> blocked;
  for (const BlockedRank& b : r->blocked) blocked.push_back(b.rank);
  // The receiver stops at the Finish of the receive it never posted; its sender waits for the
  // send to be matched; the other replica's stage-2 peers wait for the all-reduce.
  EXPECT_THAT(blocked, ::testing::Contains(2));
  EXPECT_THAT(blocked, ::testing::Contains(1));
  const BlockedRank& two = *std::find_if(r->blocked.begin(), r->blocked.end(),
                                         [](const BlockedRank& b) { return b.rank == 2; });
  EXPECT_EQ(plan.ranks[2].instructions[two.instruction].op, OpKind::kRecvActFinish);
  EXPECT_THAT(two.text, HasSubstr("never posted"));
  EXPECT_THAT(r->problem, HasSubstr("deadlock"));
  EXPECT_THAT(r->problem, HasSubstr("rank 2"));

  // The whole receive (Start and Finish) gone: the forward reads a slot nothing wrote.
  ExecutionPlan both = fixture->plan;
  const int64_t finish = FindOp(both, 2, OpKind::kRecvActFinish);
  both.ranks[2].instructions.erase(both.ranks[2].instructions.begin() + finish);
  both.ranks[2].instructions.erase(both.ranks[2].instructions.begin() + at);
  StatusOr<SimResult> r2 = Simulate(both);
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  EXPECT_EQ(r2->outcome, SimOutcome::kDeadlock);
  EXPECT_THAT(r2->problem, HasSubstr("rank 1"));
}

TEST(SimulatorDeadlockTest, ACollectiveOneMemberNeverPostsBlocksTheGroup) {
  ExecutionPlan plan = AllReducePlan(4, Bytes::MiB(8), 8);
  plan.ranks[3].instructions.erase(plan.ranks[3].instructions.begin());
  plan.ranks[3].instructions.erase(plan.ranks[3].instructions.begin());  // and its step
  StatusOr<SimResult> r = Simulate(plan);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->outcome, SimOutcome::kDeadlock);
  ASSERT_EQ(r->blocked.size(), 3u);
  EXPECT_THAT(r->blocked[0].text, HasSubstr("not posted by rank(s) 3"));
}

TEST(SimulatorKnobsTest, ScalesAndStragglersChangeTimesAsSaid) {
  PlanCase c;
  c.pp = 4;
  c.microbatches = 8;
  c.fixed_shapes = true;
  auto fixture = MakePlanFixture(c);
  ExecutionPlan plan = fixture->plan;
  MakeUniform(plan, Duration::Millis(3), Duration::Millis(5));
  StatusOr<SimResult> base = Simulate(plan);
  ASSERT_TRUE(base.ok());
  SimOptions twice;
  twice.compute_scale = 2;
  StatusOr<SimResult> slow = Simulate(plan, twice);
  ASSERT_TRUE(slow.ok());
  EXPECT_NEAR(static_cast<double>(slow->iteration_time.nanos()),
              2.0 * static_cast<double>(base->iteration_time.nanos()), 1000);
  // A straggler on one stage sets the pace of the whole pipeline: m (f + b) * 1.5 at least.
  SimOptions straggler;
  straggler.stragglers = {{2, 1.5}};
  StatusOr<SimResult> st = Simulate(plan, straggler);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->ranks[2].compute, (Duration::Millis(8) * 8).Scaled(1.5));
  EXPECT_GT(st->iteration_time, base->iteration_time);
  EXPECT_NEAR(st->stage_imbalance, 1.5 / ((3 + 1.5) / 4) - 1, 1e-9);
  // Slower links make the transfers of a real plan longer.
  const ExecutionPlan& real = fixture->plan;
  StatusOr<SimResult> fast = Simulate(real);
  SimOptions narrow;
  narrow.intra_node.bandwidth_scale = 0.001;
  StatusOr<SimResult> slow_links = Simulate(real, narrow);
  ASSERT_TRUE(fast.ok() && slow_links.ok());
  EXPECT_GT(slow_links->ranks[0].comm, fast->ranks[0].comm * 100);
}

TEST(SimulatorOptionsTest, BadOptionsNameTheField) {
  const ExecutionPlan plan = AllReducePlan(2, Bytes::MiB(1), 8);
  SimOptions o;
  o.compute_scale = 0;
  EXPECT_THAT(Simulate(plan, o).status().message(), HasSubstr("compute_scale"));
  o = {};
  o.stragglers = {{5, 2.0}};
  EXPECT_THAT(Simulate(plan, o).status().message(), HasSubstr("stragglers[0].rank"));
  o = {};
  o.stragglers = {{1, -1.0}};
  EXPECT_THAT(Simulate(plan, o).status().message(), HasSubstr("stragglers[0].slowdown"));
  o = {};
  o.inter_node.bandwidth_scale = std::nan("");
  EXPECT_THAT(Simulate(plan, o).status().message(), HasSubstr("inter_node.bandwidth_scale"));
  o = {};
  o.samples = {{99, 10, 0, 0}};
  PlanCase c;
  auto fixture = MakePlanFixture(c);
  EXPECT_THAT(Simulate(fixture->plan, o).status().message(), HasSubstr("lacks sample id"));
  // A broken plan is a Status naming the field.
  ExecutionPlan broken = fixture->plan;
  broken.ranks[1].instructions[0].peer = 7;
  broken.ranks[1].instructions[0].op = OpKind::kRecvActStart;
  EXPECT_THAT(Simulate(broken).status().message(), HasSubstr("ranks[1].instructions[0]"));
}

TEST(SimulatorTokensTest, RealTokensCountSamplesAndPaddedFallsBack) {
  PlanCase c;
  c.microbatches = 8;
  auto fixture = MakePlanFixture(c);
  SimOptions with;
  with.samples = fixture->batch;
  StatusOr<SimResult> r = Simulate(fixture->plan, with);
  ASSERT_TRUE(r.ok());
  int64_t want = 0, padded = 0;
  for (const PlanMicroBatch& mb : fixture->plan.replicas[0].micro_batches) {
    padded += mb.shape.mbs * mb.shape.seqlen;
    for (const auto& row : mb.rows) {
      for (int64_t id : row) want += fixture->batch[id].tokens();
    }
  }
  EXPECT_EQ(r->real_tokens, want);
  EXPECT_EQ(r->padded_tokens, padded);
  EXPECT_NEAR(r->tokens_per_second, want / r->iteration_time.seconds(), 1e-6);
  StatusOr<SimResult> without = Simulate(fixture->plan);
  ASSERT_TRUE(without.ok());
  EXPECT_FALSE(without->tokens_from_samples);
  EXPECT_EQ(without->real_tokens, padded);
  EXPECT_GT(without->model_flops, r->model_flops);
}

}  // namespace
}  // namespace sluice
