// Tests of the torch-free runtime parts: the chunk layout against the plan's (stage costs and
// the lowering's gradient buckets), bucket ranges, token streams, micro-batch layouts, plan
// packages and the plan/job check, traces, dumps and the torchrun environment.
#include <gtest/gtest.h>
#include <stdlib.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>

#include "base/json_util.h"
#include "batching/stage_cost.h"
#include "batching/test_util.h"
#include "cost/cost_factory.h"
#include "planner/planner.h"
#include "runtime/batch_layout.h"
#include "runtime/cpu_bind.h"
#include "runtime/dump.h"
#include "runtime/host_allocator.h"
#include "runtime/launcher.h"
#include "runtime/layout.h"
#include "runtime/plan_package.h"
#include "runtime/token_source.h"
#include "runtime/trace_recorder.h"

namespace sluice::runtime {
namespace {

ModelSpec Preset(const std::string& name) {
  StatusOr<ModelSpec> m = ModelPreset(name);
  SLUICE_CHECK_MSG(m.ok(), m.status().message());
  return *m;
}

// gpt-tiny with 6 layers (cuts into 3 and 6 chunks), t5-tiny with 3 + 3 layers.
ModelSpec Gpt6() {
  ModelSpec m = Preset("gpt-tiny");
  m.name = "gpt-tiny-6";
  m.layers = 6;
  return m;
}
ModelSpec T5With3() {
  ModelSpec m = Preset("t5-tiny");
  m.name = "t5-tiny-3";
  m.layers = 3;
  m.decoder_layers = 3;
  return m;
}

struct Setup {
  ModelSpec model;
  ClusterSpec cluster;
  ParallelConfig parallel;
  std::unique_ptr<CostModel> cost;
  std::optional<StageCostEvaluator> eval;
};

std::unique_ptr<Setup> MakeSetup(const ModelSpec& model, int64_t dp, int64_t pp, int64_t vpp) {
  auto s = std::make_unique<Setup>();
  s->model = model;
  s->cluster = *ResolveCluster("a100-40g:8");
  s->parallel.dp = dp;
  s->parallel.pp = pp;
  s->parallel.vpp = vpp;
  s->parallel.memory_limit = Bytes::MB(60);
  CostModelOptions co;
  co.kind = "analytic";
  s->cost = std::move(MakeCostModel(model, s->cluster, co)).value();
  s->eval.emplace(std::move(StageCostEvaluator::Create(*s->cost, s->parallel, s->cluster)).value());
  return s;
}

struct LayoutCase {
  std::string name;
  ModelSpec model;
  int64_t pp, vpp;
};

void PrintTo(const LayoutCase& c, std::ostream* os) { *os << c.name; }

std::vector<LayoutCase> LayoutCases() {
  return {{"gpt_pp2", Preset("gpt-tiny"), 2, 1},
          {"gpt_pp2_vpp2", Preset("gpt-tiny"), 2, 2},
          {"gpt6_pp3", Gpt6(), 3, 1},
          {"gpt6_pp3_vpp2", Gpt6(), 3, 2},
          {"t5_pp1", Preset("t5-tiny"), 1, 1},
          {"t5_pp2", Preset("t5-tiny"), 2, 1},
          {"t5_pp2_vpp2", Preset("t5-tiny"), 2, 2},
          {"t5x3_pp3", T5With3(), 3, 1},
          {"t5x3_pp3_vpp2", T5With3(), 3, 2}};
}

class LayoutTest : public ::testing::TestWithParam<LayoutCase> {};

// The runtime's chunks sum, per device, to the layers the stage-cost evaluator prices.
TEST_P(LayoutTest, ChunksSumToTheEvaluatorsStages) {
  const LayoutCase& c = GetParam();
  auto s = MakeSetup(c.model, 1, c.pp, c.vpp);
  const std::vector<ChunkSpec> chunks = ChunkLayout(c.model, c.pp * c.vpp, {});
  std::vector<StageLayers> sums(c.pp);
  for (const ChunkSpec& ch : chunks) {
    StageLayers& l = sums[ch.index % c.pp];
    l.encoder_layers += ch.layers.encoder_layers;
    l.decoder_layers += ch.layers.decoder_layers;
    l.embedding = l.embedding || ch.layers.embedding;
    l.output_head = l.output_head || ch.layers.output_head;
    l.decoder_embedding = l.decoder_embedding || ch.layers.decoder_embedding;
  }
  EXPECT_EQ(sums, s->eval->stage_layers());
  // Every layer of every stack exactly once, in order.
  int64_t enc = 0, dec = 0, ends = 0;
  for (const ChunkSpec& ch : chunks) {
    EXPECT_EQ(ch.first_encoder_layer, ch.layers.encoder_layers > 0 ? enc : ch.first_encoder_layer);
    EXPECT_EQ(ch.first_decoder_layer, ch.layers.decoder_layers > 0 ? dec : ch.first_decoder_layer);
    enc += ch.layers.encoder_layers;
    dec += ch.layers.decoder_layers;
    ends += ch.ends_encoder ? 1 : 0;
  }
  EXPECT_EQ(enc, c.model.layers);
  EXPECT_EQ(dec, c.model.decoder_layers);
  EXPECT_EQ(ends, c.model.is_encoder_decoder() ? 1 : 0);
}

// The lowering cuts gradient buckets per chunk from the cost model's parameters of its own
// chunk layout: the runtime's layout must give the same parameters per chunk.
TEST_P(LayoutTest, ChunksMatchThePlansGradientBuckets) {
  const LayoutCase& c = GetParam();
  auto s = MakeSetup(c.model, 2, c.pp, c.vpp);
  PlannerOptions po;
  po.schedule = c.vpp > 1 ? ScheduleKind::kInterleaved : ScheduleKind::k1F1B;
  po.batching.max_seqlen = 128;
  StatusOr<Planner> planner = Planner::Create(*s->cost, s->parallel, s->cluster, po);
  ASSERT_TRUE(planner.ok()) << planner.status().message();
  const std::vector<Sample> batch =
      testing::RandomTokenBatch(3, 1500, 128, c.model.is_encoder_decoder());
  StatusOr<PlanResult> r = planner->Plan(batch);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->outcome, PlanOutcome::kOk) << r->infeasible_reason;
  const std::vector<ChunkSpec> chunks = ChunkLayout(c.model, c.pp * c.vpp, {});
  for (const RankProgram& prog : r->plan.ranks) {
    std::map<int64_t, int64_t> bytes;  // stage -> bucket bytes
    for (const Instruction& in : prog.instructions) {
      if (in.op == OpKind::kAllReduceGrad) bytes[in.stage] += in.bytes.count();
    }
    for (const ChunkSpec& ch : chunks) {
      if (ch.index % c.pp != prog.pp_index) continue;
      EXPECT_EQ(bytes[ch.index], 2 * s->cost->ModelStates(ch.layers, s->parallel).params)
          << "chunk " << ch.index;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cuts, LayoutTest, ::testing::ValuesIn(LayoutCases()),
                         [](const auto& info) { return info.param.name; });

TEST(LayoutTest, WordEmbeddingRanks) {
  ModelSpec gpt = Preset("gpt-tiny");
  EXPECT_EQ(WordEmbeddingRanks(gpt, 1, 1, {}), (std::vector<int64_t>{0}));
  EXPECT_EQ(WordEmbeddingRanks(gpt, 2, 1, {}), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(WordEmbeddingRanks(gpt, 2, 2, {}), (std::vector<int64_t>{0, 1}));
  gpt.tied_embeddings = false;
  EXPECT_EQ(WordEmbeddingRanks(gpt, 2, 1, {}), (std::vector<int64_t>{0}));
  // T5 at 6 chunks on 3 ranks: chunk 0 (rank 0), the last encoder chunk 2 (rank 2), chunk 5
  // (rank 2, tied head).
  EXPECT_EQ(WordEmbeddingRanks(T5With3(), 3, 2, {}), (std::vector<int64_t>{0, 2}));
  ModelSpec t5 = T5With3();
  t5.tied_embeddings = false;
  EXPECT_EQ(WordEmbeddingRanks(t5, 3, 2, {}), (std::vector<int64_t>{0, 2}));
  // T5 3 + 3 at 3 chunks: chunk 1 holds encoder layer 2 and decoder layer 0, so it ends the
  // encoder and embeds the decoder inputs (rank 1); the tied head is on rank 2.
  const std::vector<ChunkSpec> spans = ChunkLayout(T5With3(), 3, {});
  EXPECT_EQ(spans[1].layers.encoder_layers, 1);
  EXPECT_EQ(spans[1].layers.decoder_layers, 1);
  EXPECT_TRUE(spans[1].ends_encoder);
  EXPECT_EQ(spans[2].first_decoder_layer, 1);
  EXPECT_EQ(WordEmbeddingRanks(T5With3(), 3, 1, {}), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(WordEmbeddingRanks(t5, 3, 1, {}), (std::vector<int64_t>{0, 1}));
}

TEST(BucketRangesTest, CoverEveryElementOnceInProportion) {
  const std::vector<Bytes> one = {Bytes::Of(100)};
  EXPECT_EQ(BucketRanges(one, 7), (std::vector<std::pair<int64_t, int64_t>>{{0, 7}}));
  const std::vector<Bytes> three = {Bytes::Of(10), Bytes::Of(10), Bytes::Of(20)};
  EXPECT_EQ(BucketRanges(three, 100),
            (std::vector<std::pair<int64_t, int64_t>>{{0, 25}, {25, 50}, {50, 100}}));
  const auto r = BucketRanges(three, 3);
  EXPECT_EQ(r.front().first, 0);
  EXPECT_EQ(r.back().second, 3);
  for (size_t i = 1; i < r.size(); ++i) EXPECT_EQ(r[i].first, r[i - 1].second);
}

TEST(TokenSourceTest, DeterministicPrefixStableAndLearnable) {
  const TokenSource a(8192, 7), b(8192, 7), c(8192, 8);
  const std::vector<int64_t> t = a.Tokens(42, 300);
  EXPECT_EQ(t, b.Tokens(42, 300));
  EXPECT_NE(t, c.Tokens(42, 300));
  EXPECT_NE(t, a.Tokens(43, 300));
  const std::vector<int64_t> prefix = a.Tokens(42, 17);
  EXPECT_TRUE(std::equal(prefix.begin(), prefix.end(), t.begin()));
  for (const int64_t x : t) {
    EXPECT_GE(x, 0);
    EXPECT_LT(x, 8192);
  }
  EXPECT_TRUE(a.Tokens(1, 0).empty());
  // Far below uniform guessing (ln 8192 = 9.01 nats): the chain is learnable.
  const double h = a.ConditionalEntropy();
  EXPECT_GT(h, 1.0);
  EXPECT_LT(h, 4.0);
}

TEST(BatchLayoutTest, PackedAndPaddedRows) {
  ModelSpec gpt = Preset("gpt-tiny");
  const std::vector<Sample> samples = {{1, 10, 2, 0}, {2, 5, 0, 0}, {3, 20, 0, 0}};
  const SampleTable table = MakeSampleTable(samples);
  PlanMicroBatch mb;
  mb.rows = {{1, 2}, {3}};
  mb.shape = LayerShape{2, 24, 0};
  mb.varlen = true;
  StatusOr<MicroBatchLayout> l = LayoutMicroBatch(gpt, mb, table);
  ASSERT_TRUE(l.ok()) << l.status().message();
  EXPECT_EQ(l->rows[0][1].begin, 12);
  EXPECT_EQ(l->rows[0][1].length, 5);
  EXPECT_EQ(l->label_tokens, 12 + 5 + 20);
  mb.varlen = false;  // a packed row that attends across itself (Megatron packing)
  StatusOr<MicroBatchLayout> packed = LayoutMicroBatch(gpt, mb, table);
  ASSERT_TRUE(packed.ok());
  EXPECT_FALSE(packed->varlen);
  EXPECT_EQ(packed->rows[0][1].begin, 12);
  mb.varlen = true;
  mb.shape.seqlen = 16;
  StatusOr<MicroBatchLayout> tight = LayoutMicroBatch(gpt, mb, table);
  ASSERT_FALSE(tight.ok());
  EXPECT_NE(tight.status().message().find("row 0 needs 17 tokens"), std::string::npos);
  mb.rows = {{1}, {9}};
  mb.shape.seqlen = 24;
  EXPECT_NE(LayoutMicroBatch(gpt, mb, table).status().message().find("sample 9"),
            std::string::npos);
  // Encoder-decoder: the target counts as labels and needs the decoder length.
  ModelSpec t5 = Preset("t5-tiny");
  PlanMicroBatch e;
  e.rows = {{1}};
  e.shape = LayerShape{1, 16, 1};
  EXPECT_FALSE(LayoutMicroBatch(t5, e, table).ok());
  e.shape.dec_seqlen = 8;
  StatusOr<MicroBatchLayout> el = LayoutMicroBatch(t5, e, table);
  ASSERT_TRUE(el.ok());
  EXPECT_EQ(el->label_tokens, 2);
}

ExecutionPlan SmallPlan(const ModelSpec& model, int64_t dp, int64_t pp,
                        std::vector<Sample>* batch_out) {
  auto s = MakeSetup(model, dp, pp, 1);
  PlannerOptions po;
  po.batching.max_seqlen = 128;
  StatusOr<Planner> planner = Planner::Create(*s->cost, s->parallel, s->cluster, po);
  SLUICE_CHECK_MSG(planner.ok(), "test planner");
  *batch_out = testing::RandomTokenBatch(5, 1200, 128, model.is_encoder_decoder());
  StatusOr<PlanResult> r = planner->Plan(*batch_out);
  SLUICE_CHECK_MSG(r.ok() && r->outcome == PlanOutcome::kOk, "test plan");
  return r->plan;
}

TEST(PlanPackageTest, RoundTripsAndRejectsDamage) {
  PlanPackage p;
  p.iteration = 3;
  p.batch_index = 9;
  p.plan = SmallPlan(Preset("gpt-tiny"), 1, 2, &p.samples);
  for (Sample& s : p.samples) s.task = 0;
  const std::vector<uint8_t> bytes = EncodePackage(p);
  StatusOr<PlanPackage> back = DecodePackage(bytes, "test");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(*back, p);
  EXPECT_EQ(Fnv1a64(bytes), Fnv1a64(EncodePackage(*back)));
  std::vector<uint8_t> cut(bytes.begin(), bytes.end() - 5);
  EXPECT_NE(DecodePackage(cut, "test").status().message().find("truncated"), std::string::npos);
  std::vector<uint8_t> bad = bytes;
  bad[0] = 'X';
  EXPECT_NE(DecodePackage(bad, "test").status().message().find("magic"), std::string::npos);
  std::vector<uint8_t> flipped = bytes;
  flipped[flipped.size() / 2] ^= 0x40;
  EXPECT_NE(Fnv1a64(flipped), Fnv1a64(bytes));
  PlanPackage end;
  end.kind = PackageKind::kEnd;
  EXPECT_EQ(*DecodePackage(EncodePackage(end), "t"), end);
  PlanPackage err;
  err.kind = PackageKind::kError;
  err.error = "no memory";
  EXPECT_EQ(DecodePackage(EncodePackage(err), "t")->error, "no memory");
}

TEST(PlanPackageTest, MismatchNamesTheField) {
  std::vector<Sample> batch;
  const ExecutionPlan plan = SmallPlan(Preset("gpt-tiny"), 1, 2, &batch);
  JobConfig job{plan.model, plan.parallel, 2};
  EXPECT_TRUE(CheckPlanMatches(plan, job, "p.json").ok());
  job.model.name = "renamed";  // a label only
  EXPECT_TRUE(CheckPlanMatches(plan, job, "p.json").ok());
  JobConfig deeper = job;
  deeper.model.layers = 6;
  Status s = CheckPlanMatches(plan, deeper, "p.json");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("p.json: field 'model.layers': the plan has 4, this run has 6"),
            std::string::npos)
      << s.message();
  JobConfig t5{Preset("t5-tiny"), plan.parallel, 2};
  EXPECT_NE(CheckPlanMatches(plan, t5, "p.json").message().find("field 'model."),
            std::string::npos);
  JobConfig pp3 = job;
  pp3.parallel.pp = 3;
  EXPECT_NE(CheckPlanMatches(plan, pp3, "p.json")
                .message()
                .find("field 'parallel.pp': the plan has 2, this run has 3"),
            std::string::npos);
  JobConfig world = job;
  world.world_size = 4;
  EXPECT_NE(CheckPlanMatches(plan, world, "p.json").message().find("needs dp * pp * tp * cp = 2"),
            std::string::npos);
}

TEST(GlobalLabelTokensTest, CountsEveryPlacedSample) {
  std::vector<Sample> batch;
  const ExecutionPlan plan = SmallPlan(Preset("gpt-tiny"), 2, 2, &batch);
  int64_t expect = 0;
  std::set<int64_t> placed;
  for (const PlanReplica& r : plan.replicas) {
    for (const PlanMicroBatch& mb : r.micro_batches) {
      for (const auto& row : mb.rows) placed.insert(row.begin(), row.end());
    }
  }
  for (const Sample& s : batch) {
    if (placed.count(s.id)) expect += s.input_len + s.target_len;
  }
  EXPECT_EQ(*GlobalLabelTokens(plan, MakeSampleTable(batch)), expect);
}

TEST(TraceTest, ChromeJsonAndMerge) {
  TraceRecorder a(0, 0, 0), b(1, 0, 1);
  a.Add(TraceEvent{"0F0", "forward", TraceStream::kCompute, 0, 0, 0, -1, 1000, 3000, 0});
  b.Add(TraceEvent{"1RECV_F0", "recv-act-start", TraceStream::kRecv, 0, 0, 1, 0, 500, 3500, 64});
  const nlohmann::json ja = nlohmann::json::parse(a.ToChromeJson());
  int complete = 0;
  for (const auto& e : ja["traceEvents"]) {
    if (e["ph"] == "X") {
      ++complete;
      EXPECT_EQ(e["ts"], 1.0);
      EXPECT_EQ(e["dur"], 2.0);
      EXPECT_EQ(e["tid"], 0);
      EXPECT_EQ(e["args"]["mb"], 0);
    }
  }
  EXPECT_EQ(complete, 1);
  const std::vector<std::string> docs = {a.ToChromeJson(), b.ToChromeJson()};
  StatusOr<std::string> merged = MergeChromeTraces(docs);
  ASSERT_TRUE(merged.ok());
  std::set<int64_t> pids;
  const nlohmann::json doc = nlohmann::json::parse(*merged);
  for (const auto& e : doc["traceEvents"]) pids.insert(e["pid"].get<int64_t>());
  EXPECT_EQ(pids, (std::set<int64_t>{0, 1}));
  const std::vector<std::string> broken = {"{}"};
  EXPECT_FALSE(MergeChromeTraces(broken).ok());
}

TEST(DumpTest, RoundTrip) {
  const std::string path = ::testing::TempDir() + "/sluice_dump_test.bin";
  const std::vector<NamedValues> v = {{"wte", {1.5f, -2.0f}}, {"layers.0.ln1.weight", {}}};
  ASSERT_TRUE(WriteNamedValues(path, v).ok());
  EXPECT_EQ(*ReadNamedValues(path), v);
  ASSERT_TRUE(WriteStringToFile(path, "SLGDxx").ok());
  EXPECT_FALSE(ReadNamedValues(path).ok());
  std::filesystem::remove(path);
}

TEST(DistEnvTest, ReadsTorchrunVariables) {
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                        "MASTER_PORT", kLaunchedEnv}) {
    unsetenv(v);
  }
  StatusOr<DistEnv> single = ReadDistEnv();
  ASSERT_TRUE(single.ok());
  EXPECT_EQ(single->world_size, 1);
  EXPECT_EQ(single->master_port, kDefaultMasterPort);
  setenv("RANK", "2", 1);
  setenv("WORLD_SIZE", "4", 1);
  setenv("MASTER_ADDR", "10.0.0.1", 1);
  setenv("MASTER_PORT", "1234", 1);
  StatusOr<DistEnv> env = ReadDistEnv();
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(env->rank, 2);
  EXPECT_EQ(env->local_rank, 2);
  EXPECT_EQ(env->master_addr, "10.0.0.1");
  EXPECT_EQ(env->master_port, 1234);
  setenv("RANK", "4", 1);
  EXPECT_NE(ReadDistEnv().status().message().find("RANK='4'"), std::string::npos);
  setenv("RANK", "1", 1);
  setenv("MASTER_PORT", "http", 1);
  EXPECT_NE(ReadDistEnv().status().message().find("MASTER_PORT"), std::string::npos);
  unsetenv("WORLD_SIZE");
  EXPECT_FALSE(ReadDistEnv().ok());
  for (const char* v : {"RANK", "MASTER_ADDR", "MASTER_PORT"}) unsetenv(v);
}

}  // namespace

// --host-allocator: the names, the environment's precedence, and on glibc that `cache` serves a
// block glibc's own policy always maps (48 MiB: past its mmap threshold, which it raises to 32 MiB
// at most) from the heap.
TEST(HostAllocatorTest, ParsesPoliciesHonoursTheEnvironmentAndKeepsBlocksOnTheHeap) {
  EXPECT_EQ(*ParseHostAllocator("cache", "--host-allocator"), HostAllocator::kCache);
  EXPECT_EQ(*ParseHostAllocator("system", "--host-allocator"), HostAllocator::kSystem);
  const StatusOr<HostAllocator> bad = ParseHostAllocator("jemalloc", "--host-allocator");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "--host-allocator: 'jemalloc' is not a host allocator policy (allowed: cache, system)");
  EXPECT_EQ(ConfigureHostAllocator(HostAllocator::kSystem), "system (the C library's own policy)");
  ASSERT_EQ(::setenv("MALLOC_TRIM_THRESHOLD_", "131072", 1), 0);
  EXPECT_EQ(ConfigureHostAllocator(HostAllocator::kCache),
            "system (MALLOC_TRIM_THRESHOLD_ is set in the environment; left as it says)");
  ASSERT_EQ(::unsetenv("MALLOC_TRIM_THRESHOLD_"), 0);
  ASSERT_EQ(::setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=65536", 1), 0);
  EXPECT_EQ(ConfigureHostAllocator(HostAllocator::kCache),
            "system (GLIBC_TUNABLES is set in the environment; left as it says)");
  ASSERT_EQ(::unsetenv("GLIBC_TUNABLES"), 0);
#if defined(__GLIBC__)
  const std::string note = ConfigureHostAllocator(HostAllocator::kCache);
  EXPECT_EQ(note.rfind("cache (", 0), 0u) << note;
  const size_t mapped_before = mallinfo2().hblkhd;
  constexpr size_t kBlock = size_t{48} << 20;
  auto* block = static_cast<volatile char*>(std::malloc(kBlock));
  ASSERT_NE(block, nullptr);
  block[0] = 1;
  block[kBlock - 1] = 1;
  EXPECT_EQ(mallinfo2().hblkhd, mapped_before) << "the 48 MiB block was mapped, not heap memory";
  std::free(const_cast<char*>(block));
#endif
}

// --cpu-bind cores: the allowed CPUs cut into contiguous parts, one per local rank.
TEST(CpuBindTest, CutsTheAllowedCpusIntoOnePartPerLocalRank) {
  EXPECT_EQ(*ParseCpuBind("cores", "--cpu-bind"), CpuBind::kCores);
  EXPECT_EQ(*ParseCpuBind("none", "--cpu-bind"), CpuBind::kNone);
  EXPECT_EQ(ParseCpuBind("numa", "--cpu-bind").status().message(),
            "--cpu-bind: 'numa' is not a CPU binding (allowed: none, cores)");
  const std::vector<int> eight = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(CpusOfLocalRank(eight, 0, 2), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(CpusOfLocalRank(eight, 1, 2), (std::vector<int>{4, 5, 6, 7}));
  // 8 CPUs over 3 ranks: 3, 3, 2; every CPU once.
  EXPECT_EQ(CpusOfLocalRank(eight, 0, 3), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(CpusOfLocalRank(eight, 1, 3), (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(CpusOfLocalRank(eight, 2, 3), (std::vector<int>{6, 7}));
  // The allowed set need not start at 0 or be contiguous (taskset -c 2,5,9).
  EXPECT_EQ(CpusOfLocalRank({2, 5, 9}, 1, 3), (std::vector<int>{5}));
  // Fewer CPUs than ranks: they share, round robin.
  EXPECT_EQ(CpusOfLocalRank({0, 1}, 2, 3), (std::vector<int>{0}));
  EXPECT_EQ(*BindCpus(CpuBind::kNone, 0, 2), "none");
}

}  // namespace sluice::runtime
