// Tests of src/trace/: the graph, replay, what-ifs and calibration on small documents (readers,
// matching and clock alignment: trace_readers_test.cc). Real traces (torch 1.13 runs of the
// shipped example, sluice train runs) are read by tests/trace_cli_test.sh.
#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "base/json_util.h"
#include "trace/analyze.h"
#include "trace/calibration.h"
#include "trace/plan_whatif.h"
#include "trace/trace_test_util.h"

namespace sluice::trace {
namespace {

using ::testing::HasSubstr;

TEST(Replay, MeasuredDurationsReproduceTheTrace) {
  auto a = AnalyzeText(Doc(PipelineEvents(3)));
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->matching.messages.size(), 6u);
  EXPECT_EQ(a->matching.unmatched, 0);
  EXPECT_EQ(a->clocks.offset_ns, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(a->clocks.violations, 0);
  auto r = Replay(a->graph, a->set, ReplayOptions{});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->max_deviation_ns, 0);
  EXPECT_EQ(r->replayed_span_ns, r->measured_span_ns);
  ASSERT_EQ(r->iterations.size(), 3u);
  for (const IterationTime& it : r->iterations) EXPECT_EQ(it.measured_ns, it.replayed_ns);
  // F -> B data edges on both ranks, one post edge per side and one done edge per side.
  EXPECT_EQ(a->graph.edges_by_kind[static_cast<int>(EdgeKind::kData)], 6);
  EXPECT_EQ(a->graph.edges_by_kind[static_cast<int>(EdgeKind::kDone)], 12);
  // The critical path runs through both ranks and a transfer.
  ASSERT_FALSE(r->critical_path.empty());
  EXPECT_GT(r->critical_by_kind_ns[static_cast<int>(NodeKind::kTransfer)], 0);
  EXPECT_GT(r->critical_by_kind_ns[static_cast<int>(NodeKind::kCompute)], 0);
}

TEST(Replay, WhatIfFasterComputeShortensTheIteration) {
  auto a = AnalyzeText(Doc(PipelineEvents(2)));
  ASSERT_TRUE(a.ok());
  ReplayOptions half;
  half.what_if = {{"compute", 0.5}};
  auto base = Replay(a->graph, a->set, ReplayOptions{});
  auto fast = Replay(a->graph, a->set, half);
  ASSERT_TRUE(base.ok() && fast.ok());
  EXPECT_LT(fast->mean_iteration_replayed_ns, 0.8 * base->mean_iteration_replayed_ns);
  ReplayOptions bad;
  bad.what_if = {{"compute", -1}};
  EXPECT_FALSE(Replay(a->graph, a->set, bad).ok());
  // A target that matches no op would change nothing: an error naming it.
  ReplayOptions none;
  none.what_if = {{"no-such-op", 2.0}};
  auto nothing = Replay(a->graph, a->set, none);
  ASSERT_FALSE(nothing.ok());
  EXPECT_THAT(nothing.status().message(), HasSubstr("'no-such-op' matches no op of the trace"));
}

// The plan PipelineEvents ran (one micro-batch, two stages); `split`: rank 1's backward as
// zb-h1's halves (I 60%, W 40% planned), W after the gradient's send.
ExecutionPlan PipelinePlan(bool split) {
  ExecutionPlan plan;
  plan.parallel.pp = 2;
  plan.sample_ids = {7};
  plan.model_states = {Bytes::MB(1), Bytes::MB(1)};
  plan.replicas.resize(1);
  PlanMicroBatch mb;
  mb.rows = {{7}};
  mb.shape = {1, 64, 0};
  plan.replicas[0].micro_batches = {mb};
  auto in = [](OpKind op, int64_t stage, int64_t peer = -1, int64_t us = 0) {
    Instruction x;
    x.op = op;
    x.stage = op == OpKind::kOptimizerStep ? -1 : stage;
    x.microbatch = op == OpKind::kOptimizerStep ? -1 : 0;
    x.peer = peer;
    if (peer >= 0) {
      const bool grad = op == OpKind::kSendGradStart || op == OpKind::kSendGradFinish ||
                        op == OpKind::kRecvGradStart || op == OpKind::kRecvGradFinish;
      x.tag = MessageTag(0, 0, grad, 2);
    }
    x.duration = Duration::Micros(us);
    return x;
  };
  plan.ranks.resize(2);
  plan.ranks[0].rank = 0;
  plan.ranks[0].instructions = {in(OpKind::kLoadInput, 0),          in(OpKind::kForward, 0),
                                in(OpKind::kSendActStart, 0, 1),    in(OpKind::kSendActFinish, 0, 1),
                                in(OpKind::kRecvGradStart, 0, 1),   in(OpKind::kRecvGradFinish, 0, 1),
                                in(OpKind::kBackward, 0, -1, 200),  in(OpKind::kOptimizerStep, 0)};
  plan.ranks[1].rank = 1;
  plan.ranks[1].pp_index = 1;
  plan.ranks[1].instructions = {in(OpKind::kLoadInput, 1), in(OpKind::kRecvActStart, 1, 0),
                                in(OpKind::kRecvActFinish, 1, 0), in(OpKind::kForward, 1)};
  auto& r1 = plan.ranks[1].instructions;
  if (split) {
    for (const Instruction& x :
         {in(OpKind::kBackwardInput, 1, -1, 60), in(OpKind::kSendGradStart, 1, 0),
          in(OpKind::kSendGradFinish, 1, 0), in(OpKind::kBackwardWeight, 1, -1, 40)}) {
      r1.push_back(x);
    }
  } else {
    for (const Instruction& x : {in(OpKind::kBackward, 1, -1, 100), in(OpKind::kSendGradStart, 1, 0),
                                 in(OpKind::kSendGradFinish, 1, 0)}) {
      r1.push_back(x);
    }
  }
  r1.push_back(in(OpKind::kOptimizerStep, 1));
  return plan;
}

TEST(PlanWhatIf, OwnPlansReproduceTheReplayAndAnotherOrderIsPredicted) {
  auto a = AnalyzeText(Doc(PipelineEvents(3)));
  ASSERT_TRUE(a.ok()) << a.status().message();
  auto replays = ReplayAll(*a, ClassStat::kMean);
  ASSERT_TRUE(replays.ok());
  const std::vector<ExecutionPlan> ran(3, PipelinePlan(false));
  const std::vector<std::string> files = {"q0.json", "q1.json", "q2.json"};
  // The run's own plans: every instruction measured, the per-iteration replay reproduced.
  auto same = BuildPlanWhatIf(*a, ran, ran, files);
  ASSERT_TRUE(same.ok()) << same.status().message();
  EXPECT_EQ(same->pricing.measured, 3 * 16);
  EXPECT_EQ(same->pricing.transfers_measured, 3 * 2);
  EXPECT_EQ(same->pricing.by_class + same->pricing.derived + same->pricing.plan, 0);
  Replays r = *replays;
  ASSERT_TRUE(ReplayPlanWhatIf(*same, {}, "own", &r).ok());
  ASSERT_EQ(r.what_if_per_iteration.iterations.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(r.what_if_per_iteration.iterations[i].replayed_ns,
              replays->per_iteration.iterations[i].replayed_ns);
    EXPECT_EQ(r.what_if_per_iteration.iterations[i].measured_ns,
              replays->per_iteration.iterations[i].measured_ns);
  }
  // zb-h1's order on rank 1: the gradient leaves after I (60% of the measured 180 µs B), so rank
  // 0's backward starts 72 µs earlier (W's share) less W's gap.
  const std::vector<ExecutionPlan> zb(3, PipelinePlan(true));
  auto split = BuildPlanWhatIf(*a, ran, zb, files);
  ASSERT_TRUE(split.ok()) << split.status().message();
  EXPECT_EQ(split->pricing.derived, 3 * 2);
  EXPECT_EQ(split->pricing.measured, 3 * 15);
  ASSERT_TRUE(ReplayPlanWhatIf(*split, {}, "zb", &r).ok());
  EXPECT_THAT(FormatWhatIfReport(r), HasSubstr("what-if zb: iteration times predicted"));
  for (size_t i = 0; i < 3; ++i) {
    const int64_t base = replays->per_iteration.iterations[i].replayed_ns;
    const int64_t pred = r.what_if_per_iteration.iterations[i].replayed_ns;
    EXPECT_LT(pred, base - 60'000) << "iteration " << i;
    EXPECT_GT(pred, base - 80'000) << "iteration " << i;
  }
  // Errors name the file and what differs.
  std::vector<ExecutionPlan> other = zb;
  other[1].sample_ids = {8};
  auto batch = BuildPlanWhatIf(*a, ran, other, files);
  ASSERT_FALSE(batch.ok());
  EXPECT_THAT(batch.status().message(), HasSubstr("--what-if-plan q1.json: another batch"));
  other = zb;
  other[2].parallel.pp = 4;
  auto layout = BuildPlanWhatIf(*a, ran, other, files);
  ASSERT_FALSE(layout.ok());
  EXPECT_THAT(layout.status().message(), HasSubstr("q2.json: another parallel layout"));
  auto count = BuildPlanWhatIf(*a, ran, {zb[0]}, {"q0.json"});
  ASSERT_FALSE(count.ok());
  EXPECT_THAT(count.status().message(), HasSubstr("1 file(s) given but --plan has 3"));
  // A what-if plan that deadlocks: rank 0 waits for the gradient before it sends the activation.
  other = ran;
  for (ExecutionPlan& p : other) {
    auto& r0 = p.ranks[0].instructions;
    std::swap(r0[2], r0[4]);
    std::swap(r0[3], r0[5]);
  }
  auto cycle = BuildPlanWhatIf(*a, ran, other, files);
  ASSERT_FALSE(cycle.ok());
  EXPECT_THAT(cycle.status().message(), HasSubstr("form a cycle through"));
  EXPECT_THAT(cycle.status().message(), HasSubstr("the plan deadlocks"));
}

TEST(WhatIf, ParsesFactorsAndDurations) {
  auto w = ParseWhatIf("comm=0.5");
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_EQ(w->match, "comm");
  EXPECT_EQ(w->factor, 0.5);
  EXPECT_EQ(w->add_ns, 0);
  EXPECT_EQ(WhatIfText(*w), "comm=0.5");
  w = ParseWhatIf("link+=2ms");
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_EQ(w->match, "link");
  EXPECT_EQ(w->factor, 1.0);
  EXPECT_EQ(w->add_ns, 2'000'000);
  EXPECT_EQ(WhatIfText(*w), "link+=2ms");
  const std::pair<const char*, int64_t> adds[] = {
      {"forward+=150us", 150'000}, {"gap+=1.5us", 1'500}, {"x+=2s", 2'000'000'000},
      {"send-act+=7ns", 7},        {"link+=0ms", 0},      {"link+=1500us", 1'500'000}};
  for (const auto& [text, ns] : adds) {
    auto a = ParseWhatIf(text);
    ASSERT_TRUE(a.ok()) << text << ": " << a.status().message();
    EXPECT_EQ(a->add_ns, ns) << text;
    EXPECT_EQ(a->factor, 1.0) << text;
  }
  EXPECT_EQ(WhatIfText(*ParseWhatIf("link+=1500us")), "link+=1500us");
  EXPECT_EQ(ParseWhatIf("forward=1.2")->match, "forward");
  for (const char* bad :
       {"link+=2", "=2", "+=2ms", "comm=", "comm", "comm=-1", "link+=-1ms", "link+=ms",
        "link+=2 ms", "comm=nan", "comm=inf", "comm=1x", "link+=2msx", "link+=1e300s",
        "compute=1e300", "compute=1000001", "compute=2=3"}) {
    auto b = ParseWhatIf(bad);
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_THAT(b.status().message(), HasSubstr("WHAT+=DURATION")) << bad;
    EXPECT_THAT(b.status().message(), HasSubstr(bad)) << bad;
  }
}

TEST(Replay, LinkDelayStartsEachTransferLaterThanItsSendsPost) {
  // The act transfer (rank 0 -> 1) is posted by both sides before it starts at rank 0's send
  // post (t + 106 µs); the grad transfer at rank 1's send post. With link+=1ms each starts 1 ms
  // later: rank 1 waits 1 ms longer for its input and rank 0 1 ms longer for its gradient (the
  // delay lies on the path twice per iteration), while rank 0's compute up to its send is not
  // delayed (the sender computes on).
  auto a = AnalyzeText(Doc(PipelineEvents(2)));
  ASSERT_TRUE(a.ok()) << a.status().message();
  auto base = Replay(a->graph, a->set, ReplayOptions{});
  ReplayOptions o;
  o.what_if = {*ParseWhatIf("link+=1ms")};
  auto w = Replay(a->graph, a->set, o);
  ASSERT_TRUE(base.ok() && w.ok());
  ASSERT_EQ(w->iterations.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(w->iterations[i].replayed_ns, base->iterations[i].replayed_ns + 2'000'000);
  }
  int checked = 0;
  for (size_t v = 0; v < a->graph.nodes.size(); ++v) {
    const GraphNode& n = a->graph.nodes[v];
    if (n.kind == NodeKind::kTransfer || n.kind == NodeKind::kCollective) continue;
    const TraceOp& op = a->set.ranks[n.rank].ops[n.op];
    if (n.rank != 0 || op.iteration != 0) continue;
    const int64_t shift = w->end_ns[v] - base->end_ns[v];
    int64_t expected = -1;
    if (op.name == "0F0" || op.name == "0SEND_F0") expected = 0;
    if (op.name == "0SEND_F0.wait") expected = 1'000'000;
    if (op.name == "0B0") expected = 2'000'000;
    if (expected < 0) continue;
    EXPECT_EQ(shift, expected) << op.name;
    ++checked;
  }
  EXPECT_EQ(checked, 4);
  // The same delay as a factor-free scale of the transfers changes nothing; link=FACTOR scales
  // point-to-point transfers (30 and 25 µs on the path: x3 adds 110 µs), not collectives.
  o.what_if = {*ParseWhatIf("link=3")};
  auto s = Replay(a->graph, a->set, o);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->iterations[0].replayed_ns, base->iterations[0].replayed_ns + 110'000);
  // Additions to ops: every forward 50 µs longer (one per rank on the path).
  o.what_if = {*ParseWhatIf("forward+=50us")};
  auto f = Replay(a->graph, a->set, o);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->iterations[0].replayed_ns, base->iterations[0].replayed_ns + 100'000);
  o.what_if = {WhatIf{"link", 1.0, -5}};
  EXPECT_FALSE(Replay(a->graph, a->set, o).ok());
}

TEST(Replay, ReplayAllPredictsWithWhatIfsAndWritesThemToJson) {
  auto a = AnalyzeText(Doc(PipelineEvents(3)));
  ASSERT_TRUE(a.ok()) << a.status().message();
  auto r = ReplayAll(*a, ClassStat::kMean, {*ParseWhatIf("link+=1ms")});
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->what_if_per_iteration.iterations.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(r->what_if_per_iteration.iterations[i].replayed_ns,
              r->per_iteration.iterations[i].replayed_ns + 2'000'000);
  }
  EXPECT_GT(r->what_if_whole_run.mean_iteration_replayed_ns,
            r->whole_run.mean_iteration_replayed_ns + 1.9e6);
  const std::string text = FormatWhatIfReport(*r);
  EXPECT_THAT(text, HasSubstr("what-if link+=1ms"));
  EXPECT_THAT(text, HasSubstr("whole-run what-if ms"));
  auto j = ParseJson(ReplayJson(*a, *r), "replay.json");
  ASSERT_TRUE(j.ok());
  ASSERT_TRUE(j->contains("what_if"));
  EXPECT_EQ((*j)["what_if"]["what_if"][0], "link+=1ms");
  EXPECT_EQ((*j)["what_if"]["per_iteration"]["iterations"].size(), 3u);
  auto none = ReplayAll(*a, ClassStat::kMean);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(FormatWhatIfReport(*none), "");
  EXPECT_FALSE(ParseJson(ReplayJson(*a, *none), "replay.json")->contains("what_if"));
}

TEST(Replay, PerIterationReplayRecomputesWaitsFromFittedTransfers) {
  // Four iterations; in iteration 2 rank 0's forward is 300 µs longer, and rank 1's receive of
  // it waits 300 µs longer. The fitted transfer model (the median of the class) keeps the
  // transfer at its usual time, so the replay must find the wait from the dependency alone.
  std::vector<std::string> e = PipelineEvents(4);
  auto a0 = AnalyzeText(Doc(e));
  ASSERT_TRUE(a0.ok()) << a0.status().message();
  ReplayOptions o;
  o.comm = CommModel::kFitted;
  o.per_iteration = true;
  auto r = Replay(a0->graph, a0->set, o);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->iterations.size(), 4u);
  EXPECT_GT(r->comm_models, 0);
  for (const IterationTime& it : r->iterations) EXPECT_EQ(it.replayed_ns, it.measured_ns);
  // Rank 0's forward of iteration 2 runs 300 µs longer, everything after it on both ranks later.
  auto a = AnalyzeText(Doc(PipelineEvents(4, 0, 2, 300)));
  ASSERT_TRUE(a.ok()) << a.status().message();
  auto exact = Replay(a->graph, a->set, ReplayOptions{});
  ASSERT_TRUE(exact.ok());
  EXPECT_EQ(exact->max_deviation_ns, 0);
  auto p = Replay(a->graph, a->set, o);
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->iterations.size(), 4u);
  EXPECT_EQ(p->iterations[2].measured_ns, p->iterations[0].measured_ns + 300'000);
  for (const IterationTime& it : p->iterations) EXPECT_EQ(it.replayed_ns, it.measured_ns);
  // A what-if on the fitted replay: transfers 10x slower lengthen every iteration.
  ReplayOptions slow_comm = o;
  slow_comm.what_if = {{"comm", 10}};
  auto w = Replay(a->graph, a->set, slow_comm);
  ASSERT_TRUE(w.ok());
  // (the act and grad transfers, 30 and 25 µs, lie on the path: +9 x 55 µs)
  EXPECT_EQ(w->mean_iteration_replayed_ns, p->mean_iteration_replayed_ns + 495'000);
}

TEST(Replay, FittedCommTimesFollowSize) {
  // Transfers of 10,000..80,000 bytes taking 10 µs + 1 ns/byte, one of them 5 ms more (a wait on
  // a busy core), that the receiver waits for; the sender's wait comes after they are done. The
  // fit keeps the line.
  std::vector<std::string> e;
  for (int it = 0; it < 8; ++it) {
    const double t = it * 10000.0;
    const int bytes = 10000 * (it + 1);
    const double wire = 10 + bytes / 1000.0 + (it == 5 ? 5000 : 0);
    e.push_back(Ev(0, 0, "0F0", "forward", t, 100, it, 0, 0));
    e.push_back(Ev(0, 0, "0SEND_F0", "send-act-start", t + 100, 1, it, 0, 0, 1, bytes));
    e.push_back(Ev(0, 0, "0F1", "forward", t + 101, wire + 100, it, 1, 0));
    e.push_back(Ev(0, 1, "0SEND_F0", "send-act-start", t + 100, wire + 103, it, 0, 0, 1, bytes));
    e.push_back(Ev(0, 0, "0SEND_F0.wait", "send-act-finish", t + 201 + wire, 2, it, 0, 0, 1));
    e.push_back(Ev(1, 0, "1RECV_F0", "recv-act-start", t + 50, 1, it, 0, 1, 0, bytes));
    e.push_back(Ev(1, 2, "1RECV_F0", "recv-act-start", t + 50, 50 + wire, it, 0, 1, 0, bytes));
    e.push_back(Ev(1, 0, "1RECV_F0.wait", "recv-act-finish", t + 51, 49 + wire, it, 0, 1, 0));
    e.push_back(Ev(1, 0, "1F0", "forward", t + 100 + wire, 100, it, 0, 1));
  }
  auto a = AnalyzeText(Doc(e));
  ASSERT_TRUE(a.ok()) << a.status().message();
  int64_t groups = 0;
  const std::vector<int64_t> own = FittedCommTimes(a->graph, &groups);
  EXPECT_EQ(groups, 1);
  int hubs = 0;
  for (size_t v = 0; v < own.size(); ++v) {
    const GraphNode& n = a->graph.nodes[v];
    if (n.kind != NodeKind::kTransfer) continue;
    ++hubs;
    EXPECT_TRUE(n.waited);
    EXPECT_NEAR(static_cast<double>(own[v]), 10'000 + static_cast<double>(n.bytes), 1000)
        << n.bytes;
  }
  EXPECT_EQ(hubs, 8);
}

TEST(Calibration, JsonRoundTripAndApply) {
  Calibration c;
  c.source = "test";
  c.ops.push_back({0, "forward", 2.0, 10.0, 5, 0.5, 0.1});
  c.ops.push_back({-1, "backward", 1.5, 0.0, 9, 0.3, 0.05});
  c.link = {true, 100.0, 2.5, 7};
  auto back = CalibrationFromJson(CalibrationToJson(c), "c.json");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(*back, c);
  ExecutionPlan plan;
  plan.ranks.resize(1);
  Instruction f;
  f.op = OpKind::kForward;
  f.stage = 0;
  f.duration = Duration::Micros(100);
  Instruction b = f;
  b.op = OpKind::kBackward;
  b.stage = 3;
  Instruction w = f;
  w.op = OpKind::kBackwardWeight;
  plan.ranks[0].instructions = {f, b, w};
  ApplyCalibration(c, &plan);
  EXPECT_EQ(plan.ranks[0].instructions[0].duration, Duration::Micros(210));
  EXPECT_EQ(plan.ranks[0].instructions[1].duration, Duration::Micros(150));  // the any-stage entry
  EXPECT_EQ(plan.ranks[0].instructions[2].duration, Duration::Micros(100));  // no entry: kept
  EXPECT_EQ(plan.cluster.intra_node.latency, Duration::Micros(100));
  EXPECT_DOUBLE_EQ(plan.cluster.intra_node.bandwidth, 2.5e9);
  auto bad = CalibrationFromJson(
      R"({"format":"sluice-calibration/1","ops":[{"stage":0,"op":"send-act-start","scale":1,"offset_us":0}]})",
      "bad.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("bad.json: field 'ops[0].op'"));
}

TEST(Replay, LargeSyntheticGraphIsFast) {
  // 1,024 ranks in a ring, 100 ops each per iteration, 2 iterations: about 0.2 M nodes.
  std::vector<std::string> e;
  constexpr int kRanks = 1024;
  for (int r = 0; r < kRanks; ++r) {
    const int next = (r + 1) % kRanks, prev = (r + kRanks - 1) % kRanks;
    for (int it = 0; it < 2; ++it) {
      double t = it * 10000.0;
      for (int k = 0; k < 100; ++k, t += 10) {
        e.push_back(Ev(r, 0, fmt::format("{}F{}", r, k), "forward", t, 9, it, k, 0));
      }
      e.push_back(
          Ev(r, 0, fmt::format("{}SEND_F{}", r, it), "send-act-start", t, 1, it, it, 0, next, 64));
      e.push_back(Ev(r, 0, fmt::format("{}RECV_F{}", r, it), "recv-act-start", t + 1, 1, it, it, 0,
                     prev, 64));
      e.push_back(Ev(r, 0, fmt::format("{}RECV_F{}.wait", r, it), "recv-act-finish", t + 2, 5, it,
                     it, 0, prev));
      e.push_back(Ev(r, 0, fmt::format("{}SEND_F{}.wait", r, it), "send-act-finish", t + 7, 1, it,
                     it, 0, next));
    }
  }
  auto a = AnalyzeText(Doc(e));
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->matching.messages.size(), 2u * kRanks);
  EXPECT_EQ(a->clocks.violations, 0);
  auto r = Replay(a->graph, a->set, ReplayOptions{});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->max_deviation_ns, 0);
  EXPECT_GT(a->graph.nodes.size(), 200'000u);
}

}  // namespace
}  // namespace sluice::trace
