// Speed of trace replay (src/trace/, docs/trace.md), one thread.
//
// A synthetic run of 1,024 ranks in a ring, built as the readers would give it (a TraceSet):
// per iteration each rank runs `ops` compute ops, sends to the next rank and receives from the
// previous one (post, wait, the receive waited for), then all 1,024 ranks join one all-reduce
// (its wait the optimizer step). Iterations 8.
//
// BM_Analyze1024Ranks/<ops>: matching, clock alignment and the graph (Analyze).
// BM_Replay1024Ranks/<ops>/<mode>: one replay of that graph: "exact" (everything measured),
// "replay" (per-iteration, waited-for transfers measured, the others modelled) and "model" (every
// transfer and collective from the fitted model). Counters: nodes, edges, nodes_per_s (graph
// nodes replayed per second of wall time).
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "trace/analyze.h"

namespace sluice {
namespace {

constexpr int kRanks = 1024;
constexpr int kIterations = 8;

trace::TraceSet RingRun(int ops) {
  using trace::CommKind;
  using trace::TraceOpKind;
  trace::TraceSet set;
  for (int r = 0; r < kRanks; ++r) {
    trace::RankTrace rank;
    rank.rank = r;
    rank.source = "synthetic";
    rank.streams = {"compute"};
    int64_t t = 0;
    auto op = [&](TraceOpKind kind, const char* name, int64_t dur, int64_t it) {
      trace::TraceOp o;
      o.name = name;
      o.label = name;
      o.kind = kind;
      o.start_ns = t;
      o.end_ns = t + dur;
      o.iteration = it;
      rank.ops.push_back(o);
      t += dur + 1'000;  // 1 µs gap
      return static_cast<int32_t>(rank.ops.size() - 1);
    };
    for (int it = 0; it < kIterations; ++it) {
      t = it * (ops * 101'000 + 3'000'000);
      for (int k = 0; k < ops; ++k) op(TraceOpKind::kCompute, "forward", 100'000, it);
      trace::CommOp send{CommKind::kSend, (r + 1) % kRanks, "", "act", "", 4096};
      send.post = op(TraceOpKind::kCommPost, "send", 2'000, it);
      trace::CommOp recv{CommKind::kRecv, (r + kRanks - 1) % kRanks, "", "act", "", 4096};
      recv.post = op(TraceOpKind::kCommPost, "recv", 2'000, it);
      recv.wait = op(TraceOpKind::kCommWait, "recv.wait", 50'000 + (r % 7) * 1'000, it);
      recv.done_ns = rank.ops[recv.wait].end_ns;
      send.wait = op(TraceOpKind::kCommWait, "send.wait", 1'000, it);
      send.done_ns = rank.ops[send.wait].start_ns;
      trace::CommOp all{CommKind::kCollective, -1, "", "grad", "", 1 << 20};
      all.post = op(TraceOpKind::kCommPost, "all-reduce", 1'000, it);
      all.wait = op(TraceOpKind::kOptimizer, "step", 500'000, it);
      all.done_ns = rank.ops[all.wait].start_ns + 400'000;
      rank.comms.push_back(send);
      rank.comms.push_back(recv);
      rank.comms.push_back(all);
    }
    set.ranks.push_back(std::move(rank));
  }
  return set;
}

void BM_Analyze1024Ranks(benchmark::State& state) {
  const trace::TraceSet set = RingRun(static_cast<int>(state.range(0)));
  int64_t nodes = 0;
  for (auto _ : state) {
    trace::Analysis a = bench::Must(trace::Analyze(set));
    nodes = static_cast<int64_t>(a.graph.nodes.size());
    benchmark::DoNotOptimize(a.graph.topo_order.data());
  }
  state.counters["nodes"] = static_cast<double>(nodes);
  state.counters["nodes_per_s"] =
      benchmark::Counter(static_cast<double>(nodes), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Replay1024Ranks(benchmark::State& state, trace::CommModel comm, bool per_iteration) {
  const trace::Analysis a = bench::Must(trace::Analyze(RingRun(static_cast<int>(state.range(0)))));
  trace::ReplayOptions o;
  o.comm = comm;
  o.per_iteration = per_iteration;
  for (auto _ : state) {
    trace::ReplayResult r = bench::Must(trace::Replay(a.graph, a.set, o));
    benchmark::DoNotOptimize(r.end_ns.data());
  }
  state.counters["nodes"] = static_cast<double>(a.graph.nodes.size());
  state.counters["edges"] = static_cast<double>(a.graph.preds.size());
  state.counters["nodes_per_s"] = benchmark::Counter(static_cast<double>(a.graph.nodes.size()),
                                                     benchmark::Counter::kIsIterationInvariantRate);
}

void Register() {
  for (int ops : {16, 128}) {
    benchmark::RegisterBenchmark("BM_Analyze1024Ranks", BM_Analyze1024Ranks)
        ->Arg(ops)
        ->Unit(benchmark::kMillisecond)
        ->Iterations(3);
    const struct {
      const char* name;
      trace::CommModel comm;
      bool per_iteration;
    } modes[] = {{"exact", trace::CommModel::kMeasured, false},
                 {"replay", trace::CommModel::kWaitedElseFitted, true},
                 {"model", trace::CommModel::kFitted, true}};
    for (const auto& m : modes) {
      benchmark::RegisterBenchmark((std::string("BM_Replay1024Ranks/") + m.name).c_str(),
                                   BM_Replay1024Ranks, m.comm, m.per_iteration)
          ->Arg(ops)
          ->Unit(benchmark::kMillisecond)
          ->Iterations(5);
    }
  }
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  return sluice::bench::RunRegisteredBenchmarks(argc, argv, sluice::Register);
}
