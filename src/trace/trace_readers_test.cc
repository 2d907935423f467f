// Tests of src/trace/'s readers on small documents of each format (sluice, torch 1.13 CPU,
// Kineto), bad documents, send/receive matching and clock alignment.
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

TEST(SluiceReader, ReadsOpsCommsAndWaits) {
  auto ranks = ReadTraceDocument(Doc(PipelineEvents(1)), "t.json", -1);
  ASSERT_TRUE(ranks.ok()) << ranks.status().message();
  ASSERT_EQ(ranks->size(), 2u);
  const RankTrace& r0 = (*ranks)[0];
  EXPECT_EQ(r0.format, TraceFormat::kSluice);
  EXPECT_EQ(r0.ops.size(), 8u);  // compute stream only; stream intervals give done times
  ASSERT_EQ(r0.comms.size(), 2u);
  const CommOp& send = r0.comms[0];
  EXPECT_EQ(send.kind, CommKind::kSend);
  EXPECT_EQ(send.peer, 1);
  EXPECT_EQ(send.key, "act");
  EXPECT_EQ(r0.ops[send.wait].name, "0SEND_F0.wait");
  EXPECT_EQ(send.done_ns, 136'000);  // the send stream's end (= the wait's end)
}

TEST(Align, CausalityRecoversAClockOffBySeconds) {
  // Rank 1's clock reads 3 s early: its receives would end before the sends were posted.
  auto a = AnalyzeText(Doc(PipelineEvents(2, -3e6)));
  ASSERT_TRUE(a.ok()) << a.status().message();
  const int64_t off = a->clocks.offset_ns[1];
  EXPECT_NEAR(static_cast<double>(off), 3e9, 200e3) << a->clocks.how[1];
  EXPECT_EQ(a->clocks.violations, 0);
  auto r = Replay(a->graph, a->set, ReplayOptions{});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->max_deviation_ns, 0);
  for (size_t v = 0; v < a->graph.nodes.size(); ++v) {
    const GraphNode& n = a->graph.nodes[v];
    if (n.stream >= 0 && r->end_ns[v] != n.measured_end_ns - a->graph.origin_ns) {
      ADD_FAILURE() << NodeText(a->graph, a->set, a->matching, static_cast<int32_t>(v)) << " "
                    << r->start_ns[v] << " " << n.measured_start_ns - a->graph.origin_ns;
      break;
    }
  }
}

TEST(Matching, UnmatchedSendIsReportedNotFatal) {
  std::vector<std::string> e = PipelineEvents(1);
  e.push_back(Ev(0, 0, "0SEND_F1", "send-act-start", 900, 1, 0, 1, 0, 1, 16));
  auto a = AnalyzeText(Doc(e));
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->matching.unmatched, 1);
  ASSERT_FALSE(a->matching.notes.empty());
  EXPECT_THAT(a->matching.notes[0],
              HasSubstr("rank 0 sends 1 message(s) (act, iteration 0 mb 1) to rank 1, which "
                        "receives 0"));
}

TEST(Readers, BadDocumentsNameFileEventAndField) {
  auto truncated = ReadTraceDocument(Doc(PipelineEvents(1)).substr(0, 300), "cut.json", -1);
  ASSERT_FALSE(truncated.ok());
  EXPECT_THAT(truncated.status().message(), HasSubstr("cut.json"));
  std::vector<std::string> e = PipelineEvents(1);
  e[3] = R"({"name":"x","cat":"send","ph":"X","pid":0,"tid":1,"ts":1,"dur":-2,"args":{}})";
  auto negative = ReadTraceDocument(Doc(e), "neg.json", -1);
  ASSERT_FALSE(negative.ok());
  EXPECT_THAT(negative.status().message(), HasSubstr("neg.json: traceEvents[3]"));
  EXPECT_THAT(negative.status().message(), HasSubstr("'dur'"));
  e = PipelineEvents(1);
  e[1] = Ev(0, 0, "0F0", "jump", 5, 100, 0);
  auto op = ReadTraceDocument(Doc(e), "op.json", -1);
  ASSERT_FALSE(op.ok());
  EXPECT_THAT(op.status().message(), HasSubstr("traceEvents[1] ('0F0'): field 'args.op'"));
  auto dup = ReadTraceDocument(R"({"traceEvents":[],"traceEvents":[]})", "dup.json", -1);
  EXPECT_FALSE(dup.ok());
  auto other = ReadTraceDocument(R"({"events":[]})", "o.json", -1);
  ASSERT_FALSE(other.ok());
  EXPECT_THAT(other.status().message(), HasSubstr("o.json: not a trace sluice reads"));
}

TEST(Readers, MissingRankIsNamed) {
  const std::string dir = ::testing::TempDir() + "/trace_missing_rank";
  std::filesystem::create_directories(dir);
  std::vector<std::string> e;
  for (const std::string& ev : PipelineEvents(1)) {
    if (ev.find(R"("pid":0)") != std::string::npos) e.push_back(ev);
  }
  ASSERT_TRUE(WriteStringToFile(dir + "/trace-rank-0.json", Doc(e)).ok());
  std::string moved = Doc(e);
  for (size_t at = 0; (at = moved.find(R"("pid":0)", at)) != std::string::npos;) {
    moved.replace(at, 7, R"("pid":2)");
  }
  ASSERT_TRUE(WriteStringToFile(dir + "/trace-rank-2.json", moved).ok());
  auto set = ReadTraces({dir});
  ASSERT_FALSE(set.ok());
  EXPECT_THAT(set.status().message(), HasSubstr("rank(s) 1 missing"));
  EXPECT_FALSE(ReadTraces({dir + "/nope"}).ok());
  EXPECT_EQ(RankFromFileName("/a/b/trace-rank-12.json"), 12);
  EXPECT_EQ(RankFromFileName("worker_rank3.json"), 3);
  EXPECT_EQ(RankFromFileName("trace.json"), -1);
}

// torch 1.13 export_chrome_trace form: an array; c10d calls on the main thread, the all-reduce's
// Gloo work on a worker thread.
std::string TorchCpuDoc(int rank, double shift_us) {
  auto x = [&](const std::string& name, double ts, double dur, int tid = 1) {
    return fmt::format(
        R"({{"name":"{}","ph":"X","ts":{},"dur":{},"tid":{},"pid":"CPU functions","args":{{}}}})",
        name, ts + shift_us, dur, tid);
  };
  std::vector<std::string> e;
  for (int it = 0; it < 2; ++it) {
    const double t = 10 + it * 1000;
    e.push_back(x(fmt::format("ProfilerStep#{}", it), t, 900));
    if (rank == 0) {
      e.push_back(x("forward mb=0", t + 1, 300));
      e.push_back(x("aten::linear", t + 2, 200));
      e.push_back(x("aten::addmm", t + 3, 190));
      e.push_back(x("send act mb=0 to=1", t + 210, 80));
      e.push_back(x("c10d::send", t + 211, 5));
      e.push_back(x("gloo:send", t + 215, 70));
    } else {
      e.push_back(x("forward mb=0", t + 1, 400));
      e.push_back(x("recv act mb=0 from=0", t + 2, 290));
      e.push_back(x("c10d::recv_", t + 3, 280));
      e.push_back(x("gloo:recv", t + 282, 5));
      e.push_back(x("aten::linear", t + 295, 100));
    }
    e.push_back(x("allreduce grad norm", t + 500, 300));
    e.push_back(x("c10d::allreduce_", t + 501, 20));
    e.push_back(x("gloo:all_reduce", t + 530, rank == 0 ? 250 : 240, 7));
    e.push_back(x("optimizer step", t + 810, 50));
    e.push_back(x("Optimizer.step#SGD.step", t + 811, 45));
  }
  std::string out = "[";
  for (size_t i = 0; i < e.size(); ++i) out += (i ? "," : "") + e[i];
  return out + "]";
}

TEST(TorchCpuReader, FlattensPairsAndMatchesByOrderAndAnnotation) {
  TraceSet set;
  for (int r = 0; r < 2; ++r) {
    auto ranks = ReadTraceDocument(TorchCpuDoc(r, r == 1 ? 5000 : 0),
                                   fmt::format("trace-rank-{}.json", r), r);
    ASSERT_TRUE(ranks.ok()) << ranks.status().message();
    set.ranks.push_back(std::move((*ranks)[0]));
  }
  const RankTrace& r0 = set.ranks[0];
  EXPECT_EQ(r0.format, TraceFormat::kTorchCpu);
  ASSERT_EQ(r0.comms.size(), 4u);  // per iteration: one send, one all-reduce (gloo absorbed)
  EXPECT_EQ(r0.comms[0].kind, CommKind::kSend);
  EXPECT_EQ(r0.comms[0].peer, 1);
  EXPECT_EQ(r0.comms[0].text, "send act mb=0 to=1");
  EXPECT_EQ(r0.comms[1].kind, CommKind::kCollective);
  EXPECT_EQ(r0.comms[1].done_ns, 790'000);  // the worker thread's gloo:all_reduce end
  // aten::linear is one compute op labelled with its annotation; the optimizer is recognised.
  int compute = 0, optimizer = 0;
  for (const TraceOp& op : r0.ops) {
    if (op.kind == TraceOpKind::kCompute && op.name == "aten::linear") {
      ++compute;
      EXPECT_EQ(op.label, "forward mb=0");
      EXPECT_GE(op.iteration, 0);
    }
    optimizer += op.kind == TraceOpKind::kOptimizer;
  }
  EXPECT_EQ(compute, 2);
  EXPECT_EQ(optimizer, 2);
  auto a = Analyze(std::move(set));
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->matching.messages.size(), 2u);
  EXPECT_EQ(a->matching.collectives.size(), 2u);
  // Rank 1's profiler clock started 5 ms later: the all-reduce ends say so.
  EXPECT_NEAR(static_cast<double>(a->clocks.offset_ns[1]), -5e6, 20e3);
  auto r = Replay(a->graph, a->set, ReplayOptions{});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->max_deviation_ns, 0);
  ReplayOptions mean;
  mean.durations = ClassStat::kMean;
  auto m = Replay(a->graph, a->set, mean);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->iterations.size(), 2u);
}

// Kineto (torch >= 2) on the documented schema: launches with correlation ids, kernels per
// stream, NCCL kernels with their args, an ac2g flow for one kernel.
std::string KinetoDoc(int rank) {
  const double b = rank * 7.0;  // each rank's clock
  std::string peer_args = rank == 0 ? R"("Collective name":"send","Dst Rank":1)"
                                    : R"("Collective name":"recv","Src Rank":0)";
  return fmt::format(R"({{
  "schemaVersion": 1, "distributedInfo": {{"backend": "nccl", "rank": {0}, "world_size": 2}},
  "deviceProperties": [], "displayTimeUnit": "ms", "baseTimeNanoseconds": 1700000000000000000,
  "traceEvents": [
    {{"ph":"X","cat":"user_annotation","name":"ProfilerStep#3","pid":100,"tid":100,"ts":{1},"dur":500}},
    {{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":100,"tid":100,"ts":{2},"dur":5,"args":{{"correlation":11}}}},
    {{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":100,"tid":100,"ts":{3},"dur":5,"args":{{"correlation":12}}}},
    {{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":100,"tid":100,"ts":{4},"dur":5,"args":{{"correlation":13}}}},
    {{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":100,"tid":100,"ts":{5},"dur":5}},
    {{"ph":"s","cat":"ac2g","name":"ac2g","id":14,"pid":100,"tid":100,"ts":{6}}},
    {{"ph":"X","cat":"kernel","name":"ampere_sgemm_128x64_tn","pid":0,"tid":7,"ts":{7},"dur":100,"args":{{"correlation":11,"stream":7,"device":0}}}},
    {{"ph":"X","cat":"kernel","name":"ncclDevKernel_SendRecv","pid":0,"tid":20,"ts":{8},"dur":40,"args":{{"correlation":12,{9},"In msg nelems":1024,"dtype":"Float"}}}},
    {{"ph":"X","cat":"kernel","name":"ncclDevKernel_AllReduce_Sum_f32_RING_LL","pid":0,"tid":20,"ts":{10},"dur":60,"args":{{"correlation":13,"Collective name":"allreduce","In msg nelems":4096,"dtype":"BFloat16","Process Group Ranks":"[0, 1]"}}}},
    {{"ph":"f","cat":"ac2g","name":"ac2g","id":14,"pid":0,"tid":7,"ts":{11},"bp":"e"}},
    {{"ph":"X","cat":"kernel","name":"elementwise_kernel","pid":0,"tid":7,"ts":{11},"dur":20}}
  ]}})",
                     rank, b + 0, b + 10, b + 20, b + 30, b + 40, b + 42, b + 50, b + 160,
                     peer_args, b + 250, b + 200);
}

TEST(KinetoReader, KernelsLaunchesAndNcclArgs) {
  TraceSet set;
  for (int r = 0; r < 2; ++r) {
    auto ranks = ReadTraceDocument(KinetoDoc(r), "k.json", -1);
    ASSERT_TRUE(ranks.ok()) << ranks.status().message();
    set.ranks.push_back(std::move((*ranks)[0]));
  }
  const RankTrace& r1 = set.ranks[1];
  EXPECT_EQ(r1.rank, 1);
  EXPECT_EQ(r1.format, TraceFormat::kKineto);
  ASSERT_EQ(r1.comms.size(), 2u);
  int launched = 0;
  for (const TraceOp& op : r1.ops) {
    if (op.launched_by >= 0) {
      ++launched;
      EXPECT_EQ(op.iteration, 3);
    }
  }
  EXPECT_EQ(launched, 6);  // sgemm, the flow-linked kernel, and each NCCL kernel's post and wait
  auto a = Analyze(std::move(set));
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_EQ(a->matching.messages.size(), 1u);
  ASSERT_EQ(a->matching.collectives.size(), 1u);
  EXPECT_EQ(a->matching.collectives[0].key, "group=0,1");
  EXPECT_EQ(a->set.ranks[0].comms[1].bytes, 8192);  // 4096 BFloat16
  EXPECT_NEAR(static_cast<double>(a->clocks.offset_ns[1]), -7000, 1);
  EXPECT_GT(a->graph.edges_by_kind[static_cast<int>(EdgeKind::kLaunch)], 0);
  auto r = Replay(a->graph, a->set, ReplayOptions{});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->max_deviation_ns, 0);
}

}  // namespace
}  // namespace sluice::trace
