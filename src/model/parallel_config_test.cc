#include "model/parallel_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "base/json_util.h"

namespace sluice {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

ParallelConfig Parse(std::string_view flag) {
  StatusOr<ParallelConfig> config = ResolveParallel(flag);
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  return config.ok() ? *config : ParallelConfig{};
}

std::string FlagError(std::string_view flag) {
  StatusOr<ParallelConfig> config = ResolveParallel(flag);
  EXPECT_FALSE(config.ok()) << flag;
  return config.status().message();
}

std::string FitError(std::string_view flag, const ModelSpec& model,
                     const ClusterSpec* cluster = nullptr) {
  Status s = CheckParallelFits(Parse(flag), model, cluster, "--parallel");
  EXPECT_FALSE(s.ok()) << flag;
  return s.message();
}

bool Fits(std::string_view flag, const ModelSpec& model, const ClusterSpec* cluster = nullptr) {
  Status s = CheckParallelFits(Parse(flag), model, cluster, "--parallel");
  EXPECT_TRUE(s.ok()) << flag << ": " << s.ToString();
  return s.ok();
}

TEST(ParallelFlagTest, ParsesPairsWithDefaults) {
  ParallelConfig c = Parse("dp=2,pp=4");
  EXPECT_EQ(c.dp, 2);
  EXPECT_EQ(c.pp, 4);
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.ep, 1);
  EXPECT_EQ(c.vpp, 1);
  EXPECT_EQ(c.zero, 0);
  EXPECT_FALSE(c.memory_limit.has_value());
  EXPECT_EQ(c.devices(), 8);
  EXPECT_EQ(c.chunks(), 4);

  c = Parse("tp=8,pp=2,dp=1,ep=1,vpp=3,zero=0,memory_limit_mb=36000");
  EXPECT_EQ(c.tp, 8);
  EXPECT_EQ(c.vpp, 3);
  EXPECT_EQ(c.chunks(), 6);
  ASSERT_TRUE(c.memory_limit.has_value());
  EXPECT_EQ(*c.memory_limit, Bytes::MB(36000));
  EXPECT_EQ(c.MemoryLimit(*ClusterPreset("a100-40g", 8)), Bytes::MB(36000));
  EXPECT_EQ(Parse("zero=3").zero, 3);
  // Without a limit: the device's memory less the default reserve (2 GiB + 5%: 36 of 40 GiB).
  EXPECT_EQ(Parse("dp=2").MemoryLimit(*ClusterPreset("a100-40g", 8)), Bytes::GiB(36));
  c = Parse("dp=2,memory_reserve_mb=0");
  ASSERT_TRUE(c.memory_reserve.has_value());
  EXPECT_EQ(c.MemoryLimit(*ClusterPreset("a100-40g", 8)), Bytes::GiB(40));
}

TEST(ParallelConfigTest, MemoryReserveIsHeldBackOnlyWithoutAnExplicitLimit) {
  const ClusterSpec a100 = *ClusterPreset("a100-40g", 8);
  const ClusterSpec h100 = *ClusterPreset("h100-80g", 8);
  EXPECT_EQ(DefaultMemoryReserve(a100.device), Bytes::GiB(4));
  EXPECT_EQ(DefaultMemoryReserve(h100.device), Bytes::GiB(6));
  // A small device keeps at least half its memory.
  DeviceSpec small;
  small.memory = Bytes::GiB(2);
  EXPECT_EQ(DefaultMemoryReserve(small), Bytes::GiB(1));
  ParallelConfig c;
  EXPECT_EQ(c.MemoryLimit(a100), Bytes::GiB(36));
  EXPECT_EQ(c.MemoryLimit(h100), Bytes::GiB(74));
  c.memory_reserve = Bytes::MB(1000);
  EXPECT_EQ(c.MemoryLimit(a100), a100.device.memory - Bytes::MB(1000));
  // An explicit limit is the budget as given; a reserve beside it is an error.
  ParallelConfig limited;
  limited.memory_limit = Bytes::MB(40000);
  EXPECT_EQ(limited.MemoryLimit(a100), Bytes::MB(40000));
  EXPECT_EQ(MemoryBudget(Bytes::MB(40000), std::nullopt, a100.device), Bytes::MB(40000));
  limited.memory_reserve = Bytes::MB(1000);
  EXPECT_THAT(ValidateParallelConfig(limited, "code").message(),
              AllOf(HasSubstr("code: field 'memory_reserve_mb'"), HasSubstr("give one of them")));
  // A reserve of the whole device leaves nothing.
  c.memory_reserve = a100.device.memory;
  EXPECT_THAT(CheckParallelFits(c, *ModelPreset("gpt-6.7b"), &a100, "p").message(),
              HasSubstr("p: field 'memory_reserve_mb': 42950 MB leaves nothing"));
}

TEST(ParallelFlagTest, UnknownKeyListsAllowedKeys) {
  EXPECT_THAT(
      FlagError("dp=2,pipeline=4"),
      AllOf(HasSubstr("--parallel 'dp=2,pipeline=4'"), HasSubstr("field 'pipeline': unknown key"),
            HasSubstr("'dp', 'pp', 'tp', 'cp', 'ep', 'vpp', 'zero', 'memory_limit_mb', "
                      "'memory_reserve_mb', 'layer_cut' or 'order'")));
  EXPECT_THAT(FlagError("DP=2"), HasSubstr("field 'DP': unknown key"));
}

TEST(ParallelFlagTest, BadValuesNameTheKey) {
  EXPECT_THAT(FlagError("dp=2,dp=4"), HasSubstr("field 'dp': is given twice"));
  EXPECT_THAT(FlagError("pp=x"),
              HasSubstr("field 'pp': must be an integer in [1, 1048576], got 'x'"));
  EXPECT_THAT(FlagError("tp=1.5"), HasSubstr("field 'tp': must be an integer"));
  EXPECT_THAT(FlagError("dp=0"),
              HasSubstr("field 'dp': must be an integer in [1, 1048576], got 0"));
  EXPECT_THAT(FlagError("vpp=-2"), HasSubstr("field 'vpp': must be an integer in [1, 1048576]"));
  EXPECT_THAT(FlagError("ep="), HasSubstr("field 'ep': must be an integer"));
  EXPECT_THAT(FlagError("dp= 2"), HasSubstr("field 'dp'"));
  EXPECT_THAT(FlagError("zero=4"), HasSubstr("field 'zero': must be an integer in [0, 3], got 4"));
  EXPECT_THAT(FlagError("memory_limit_mb=0"), HasSubstr("field 'memory_limit_mb'"));
  EXPECT_THAT(FlagError("dp=99999999999999999999999"), HasSubstr("field 'dp'"));
  EXPECT_THAT(FlagError("dp=2048576"), HasSubstr("field 'dp': must be an integer in [1, 1048576]"));
}

TEST(ParallelFlagTest, BadSyntax) {
  EXPECT_THAT(FlagError("dp=2,pp"), AllOf(HasSubstr("'pp' is not K=V"), HasSubstr("'dp'")));
  EXPECT_THAT(FlagError("dp=2,"), HasSubstr("'' is not K=V"));
  EXPECT_THAT(FlagError("dp=2,,pp=2"), HasSubstr("'' is not K=V"));
  EXPECT_THAT(FlagError("=2"), HasSubstr("field '': unknown key"));
  EXPECT_THAT(FlagError(""), HasSubstr("expected K=V pairs"));
  EXPECT_THAT(FlagError("dp2"), AllOf(HasSubstr("--parallel 'dp2'"), HasSubstr("expected K=V"),
                                      HasSubstr("no such file")));
}

TEST(ParallelFlagTest, ReadsJsonFile) {
  const std::string path = ::testing::TempDir() + "/sluice_parallel.json";
  ASSERT_TRUE(WriteStringToFile(path, R"({"dp": 4, "tp": 2, "zero": 1})").ok());
  ParallelConfig c = Parse(path);
  EXPECT_EQ(c.dp, 4);
  EXPECT_EQ(c.tp, 2);
  EXPECT_EQ(c.zero, 1);
  ASSERT_TRUE(WriteStringToFile(path, R"({"dp": 4, "tensor": 2})").ok());
  EXPECT_THAT(FlagError(path), HasSubstr(path + ": field 'tensor': unknown key"));
}

TEST(ParallelConfigTest, JsonRoundTrip) {
  ParallelConfig defaults;
  ParallelConfig full;
  full.dp = 3;
  full.pp = 5;
  full.tp = 2;
  full.ep = 2;
  full.vpp = 7;
  full.cp = 4;
  full.zero = 2;
  full.memory_limit = Bytes::MB(36000.5);
  ParallelConfig odd_bytes;
  odd_bytes.memory_limit = Bytes::Of(123456789);
  ParallelConfig reserved;
  reserved.memory_reserve = Bytes::MB(2500.5);
  ParallelConfig no_reserve;
  no_reserve.memory_reserve = Bytes::Zero();
  for (const ParallelConfig& c : {defaults, full, odd_bytes, reserved, no_reserve}) {
    StatusOr<nlohmann::json> text = ParseJson(ParallelConfigToJson(c).dump(), "rt.json");
    ASSERT_TRUE(text.ok());
    StatusOr<ParallelConfig> back = ParallelConfigFromJson(*text, "rt.json");
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, c);
  }
  EXPECT_EQ(ParallelConfigToJson(Parse("dp=2,pp=4,memory_limit_mb=36000")),
            nlohmann::json::parse(R"({"dp":2,"pp":4,"tp":1,"ep":1,"vpp":1,"zero":0,
                                      "memory_limit_mb":36000})"));
  StatusOr<ParallelConfig> empty = ParallelConfigFromJson(nlohmann::json::object(), "p.json");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, ParallelConfig{});
}

TEST(ParallelConfigTest, JsonErrors) {
  auto error_of = [](std::string_view text) {
    StatusOr<ParallelConfig> c = ParallelConfigFromJson(nlohmann::json::parse(text), "p.json");
    EXPECT_FALSE(c.ok()) << text;
    return c.status().message();
  };
  EXPECT_THAT(error_of(R"({"dp": 2, "micro_batches": 4})"),
              AllOf(HasSubstr("p.json: field 'micro_batches': unknown key"), HasSubstr("'vpp'")));
  EXPECT_THAT(error_of(R"({"dp": "2"})"),
              AllOf(HasSubstr("p.json: field 'dp'"), HasSubstr("got a string")));
  EXPECT_THAT(error_of(R"({"pp": 0})"),
              HasSubstr("p.json: field 'pp': must be an integer in [1, "));
  EXPECT_THAT(error_of(R"({"zero": 4})"), HasSubstr("p.json: field 'zero'"));
  EXPECT_THAT(error_of(R"({"memory_limit_mb": -1})"),
              HasSubstr("p.json: field 'memory_limit_mb': must be a number in (0, "));
  EXPECT_THAT(error_of(R"([1, 2])"), HasSubstr("p.json: top level"));
}

// The device order: Megatron-Core's tp-cp-dp-pp by default (a stage's replicas are neighbours),
// tp-cp-pp-dp on request (a replica's stages are); written only when not the default.
TEST(ParallelConfigTest, Order) {
  const ParallelConfig megatron = Parse("dp=2,pp=3,cp=2");
  EXPECT_EQ(megatron.order, RankOrder::kDataInner);
  const ParallelConfig inner = Parse("dp=2,pp=3,cp=2,order=tp-cp-pp-dp");
  EXPECT_EQ(inner.order, RankOrder::kPipelineInner);
  // rank = dp_index * pp + pp_index; blocks of tp * cp = 2 devices.
  const std::vector<int64_t> megatron_blocks = {0, 2, 4, 1, 3, 5};
  for (int64_t r = 0; r < 6; ++r) {
    EXPECT_EQ(megatron.DeviceBlock(r), megatron_blocks[r]) << r;
    EXPECT_EQ(megatron.RankOfBlock(megatron.DeviceBlock(r)), r);
    EXPECT_EQ(megatron.FirstDevice(r), 2 * megatron_blocks[r]);
    EXPECT_EQ(inner.DeviceBlock(r), r);
    EXPECT_EQ(inner.RankOfBlock(r), r);
  }
  EXPECT_FALSE(ParallelConfigToJson(megatron).contains("order"));
  EXPECT_EQ(ParallelConfigToJson(inner)["order"], "tp-cp-pp-dp");
  StatusOr<ParallelConfig> back = ParallelConfigFromJson(ParallelConfigToJson(inner), "rt.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, inner);
  EXPECT_EQ(Parse("order=tp-cp-dp-pp"), ParallelConfig{});
  EXPECT_THAT(FlagError("dp=2,order=dp-pp"),
              AllOf(HasSubstr("field 'order'"), HasSubstr("tp-cp-dp-pp, tp-cp-pp-dp"),
                    HasSubstr("got 'dp-pp'")));
  StatusOr<ParallelConfig> bad =
      ParallelConfigFromJson(nlohmann::json::parse(R"({"order": 3})"), "p.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(),
              AllOf(HasSubstr("p.json"), HasSubstr("'order'"), HasSubstr("got 3")));
  // Nodes and crossings follow the order: dp 2 x pp 2 x tp 4 on two nodes of 8.
  const ClusterSpec c16 = *ClusterPreset("a100-40g", 16);
  const ParallelConfig m = Parse("dp=2,pp=2,tp=4");
  const ParallelConfig p = Parse("dp=2,pp=2,tp=4,order=tp-cp-pp-dp");
  EXPECT_EQ(NodeOfRank(c16, m, 1), 1);  // replica 0's stage 1: block 2, devices 8..11
  EXPECT_EQ(NodeOfRank(c16, p, 1), 0);  // block 1, devices 4..7
  EXPECT_TRUE(RanksCrossNodes(c16, m, 0, 1));
  EXPECT_FALSE(RanksCrossNodes(c16, p, 0, 1));
  EXPECT_TRUE(SearchesOrder(c16, m));
  EXPECT_FALSE(SearchesOrder(*ClusterPreset("a100-40g", 8), Parse("dp=2,pp=4")));
  EXPECT_FALSE(SearchesOrder(c16, Parse("dp=1,pp=16")));
}

TEST(ParallelConfigTest, LayerCut) {
  const ParallelConfig c = Parse("dp=2,pp=4,layer_cut=9+8+8+7");
  EXPECT_EQ(c.layer_cut, (std::vector<int64_t>{9, 8, 8, 7}));
  EXPECT_EQ(ParallelConfigToJson(c)["layer_cut"], nlohmann::json::parse("[9, 8, 8, 7]"));
  StatusOr<ParallelConfig> back = ParallelConfigFromJson(ParallelConfigToJson(c), "rt.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, c);
  EXPECT_FALSE(ParallelConfigToJson(Parse("pp=4")).contains("layer_cut"));
  const ModelSpec gpt = *ModelPreset("gpt-6.7b");
  EXPECT_TRUE(Fits("pp=4,layer_cut=9+8+8+7", gpt));
  EXPECT_TRUE(Fits("pp=3,layer_cut=11+11+10", gpt));  // no even cut into 3, an explicit one
  EXPECT_TRUE(Fits("pp=2,vpp=2,layer_cut=9+7+8+8", gpt));
  EXPECT_THAT(FitError("pp=4,layer_cut=9+8+8+8", gpt),
              AllOf(HasSubstr("--parallel"), HasSubstr("'layer_cut'"),
                    HasSubstr("the 4 chunks hold 33 layers, but the model has 32 (layers = 32")));
  const ModelSpec t5 = *ModelPreset("t5-11b");
  EXPECT_TRUE(Fits("pp=4,layer_cut=14+14+10+10", t5));
  EXPECT_THAT(FitError("pp=4,layer_cut=12+12+12+13", t5),
              HasSubstr("layers + decoder_layers = 24 + 24"));
  EXPECT_THAT(FlagError("pp=4,layer_cut=9+8+8"),
              AllOf(HasSubstr("'layer_cut'"),
                    HasSubstr("has 3 entries, but pp*vpp = 4*1 = 4 chunks need one each")));
  EXPECT_THAT(FlagError("pp=2,layer_cut=32+0"), AllOf(HasSubstr("'layer_cut'"), HasSubstr("[1, ")));
  EXPECT_THAT(FlagError("pp=2,layer_cut=16,16"), HasSubstr("is not K=V"));
  EXPECT_THAT(FlagError("pp=2,layer_cut=16+x"),
              AllOf(HasSubstr("'layer_cut'"), HasSubstr("joined by '+'")));
  EXPECT_THAT(FlagError("pp=2,layer_cut="), HasSubstr("joined by '+'"));
  auto json_error = [](std::string_view text) {
    StatusOr<ParallelConfig> r = ParallelConfigFromJson(nlohmann::json::parse(text), "p.json");
    EXPECT_FALSE(r.ok()) << text;
    return r.status().message();
  };
  EXPECT_THAT(json_error(R"({"pp": 2, "layer_cut": "16+16"})"),
              HasSubstr("p.json: field 'layer_cut': must be a non-empty array"));
  EXPECT_THAT(json_error(R"({"pp": 2, "layer_cut": [16, 1.5]})"), HasSubstr("must hold integers"));
  EXPECT_THAT(json_error(R"({"pp": 2, "layer_cut": []})"), HasSubstr("non-empty array"));
  EXPECT_THAT(json_error(R"({"pp": 2, "layer_cut": [16, 16, 0]})"), HasSubstr("has 3 entries"));
}

TEST(ParallelConfigTest, ValidateChecksStructsBuiltInCode) {
  ParallelConfig c;
  c.tp = 0;
  EXPECT_THAT(ValidateParallelConfig(c, "code").message(), HasSubstr("code: field 'tp'"));
  c = ParallelConfig{};
  c.memory_limit = Bytes::Zero();
  EXPECT_THAT(ValidateParallelConfig(c, "code").message(), HasSubstr("'memory_limit_mb'"));
}

// The gradient ring of a pipeline rank: dp * cp devices (tensor-parallel copy 0 of each), placed
// as plans place them.
TEST(GradientRingTest, MembersNodesAndCrossingShares) {
  const ClusterSpec c16 = *ClusterPreset("a100-40g", 16);
  auto ring = [&](const char* spec, int64_t p) {
    return GradientRing(c16, *ResolveParallel(spec), p);
  };
  EXPECT_EQ(ring("dp=16", 0),
            (CollectiveRing{
                .members = 16, .spans_nodes = true, .crossing_shares = 8, .intra_hops = true}));
  // dp 2 x pp 4 x tp 2 in the default order (tp-cp-dp-pp): the two replicas of a stage are
  // neighbours (devices 4s..4s+3), one node.
  EXPECT_EQ(ring("dp=2,pp=4,tp=2", 3), (CollectiveRing{.members = 2, .intra_hops = true}));
  // tp-cp-pp-dp: each replica fills a node; the two members of a stage's ring sit on different
  // nodes, one device each.
  EXPECT_EQ(ring("dp=2,pp=4,tp=2,order=tp-cp-pp-dp", 3),
            (CollectiveRing{.members = 2, .spans_nodes = true, .crossing_shares = 1}));
  // dp 4 x pp 4: stage p on devices 4p..4p+3 (one node), or tp-cp-pp-dp's p, 4 + p, 8 + p,
  // 12 + p, two on each node.
  EXPECT_EQ(ring("dp=4,pp=4", 1), (CollectiveRing{.members = 4, .intra_hops = true}));
  EXPECT_EQ(ring("dp=4,pp=4,order=tp-cp-pp-dp", 1),
            (CollectiveRing{
                .members = 4, .spans_nodes = true, .crossing_shares = 2, .intra_hops = true}));
  // The cp ranks reduce with the replicas: dp 2 x cp 4 in one node, dp 2 x cp 8 over two.
  EXPECT_EQ(ring("dp=2,cp=4", 0), (CollectiveRing{.members = 8, .intra_hops = true}));
  EXPECT_EQ(ring("dp=2,cp=8", 0),
            (CollectiveRing{
                .members = 16, .spans_nodes = true, .crossing_shares = 8, .intra_hops = true}));
  // dp 3 x cp 3: the third member's cp devices (6, 7, 8) straddle the two nodes.
  EXPECT_EQ(ring("dp=3,cp=3", 0),
            (CollectiveRing{
                .members = 9, .spans_nodes = true, .crossing_shares = 1, .intra_hops = true}));
  EXPECT_EQ(ring("dp=1,pp=2", 1), CollectiveRing{});
  // Gloo's crossing: one share whatever the ring.
  ClusterSpec cpu = *ClusterPreset("cpu", 16);
  EXPECT_EQ(GradientRing(cpu, *ResolveParallel("dp=16"), 0).crossing_shares, 1);
}

TEST(ParallelFitsTest, PipelineChunksDivideLayers) {
  const ModelSpec gpt = *ModelPreset("gpt-6.7b");
  EXPECT_TRUE(Fits("pp=4", gpt));
  EXPECT_TRUE(Fits("pp=4,vpp=8", gpt));
  EXPECT_TRUE(Fits("pp=32", gpt));
  EXPECT_THAT(FitError("pp=2,vpp=3", gpt), AllOf(HasSubstr("--parallel: model 'gpt-6.7b'"),
                                                 HasSubstr("pp*vpp = 6 does not divide layers = 32 "
                                                           "(allowed: 1, 2, 4, 8, 16, 32)")));
  EXPECT_THAT(FitError("pp=64", gpt), HasSubstr("pp*vpp = 64 exceeds layers = 32"));
}

TEST(ParallelFitsTest, EncoderDecoderSplitsStagesBetweenStacks) {
  const ModelSpec t5 = *ModelPreset("t5-11b");
  EXPECT_TRUE(Fits("pp=1", t5));
  EXPECT_TRUE(Fits("pp=2", t5));
  EXPECT_TRUE(Fits("pp=3", t5));  // runs of 16 over [24 encoder; 24 decoder]
  EXPECT_TRUE(Fits("pp=4,vpp=2", t5));
  EXPECT_TRUE(Fits("pp=48", t5));
  EXPECT_THAT(FitError("pp=5", t5),
              AllOf(HasSubstr("model 't5-11b'"), HasSubstr("pp*vpp = 5"),
                    HasSubstr("layers + decoder_layers = 24 + 24"),
                    HasSubstr("(allowed: 1, 2, 3, 4, 6, 8, 12, 16, 24, 48)")));
  EXPECT_THAT(FitError("pp=10", t5), HasSubstr("pp*vpp = 10"));
  ModelSpec uneven = t5;
  uneven.decoder_layers = 6;
  EXPECT_TRUE(Fits("pp=4", uneven));  // middle split: 12 + 12 encoder, 3 + 3 decoder
  EXPECT_TRUE(Fits("pp=5", uneven));  // runs of 6 over 30 layers
  EXPECT_THAT(FitError("pp=8", uneven), HasSubstr("(allowed: 1, 2, 3, 4, 5, 6, 10, 12, 15, 30)"));
}

TEST(ParallelFitsTest, TensorParallelSplitsHeads) {
  const ModelSpec gpt = *ModelPreset("gpt-6.7b");
  EXPECT_TRUE(Fits("tp=8", gpt));
  EXPECT_THAT(FitError("tp=3", gpt), AllOf(HasSubstr("tp = 3 does not divide heads = 32"),
                                           HasSubstr("(allowed tp: 1, 2, 4, 8, 16, 32)")));
  EXPECT_THAT(FitError("tp=64", gpt), HasSubstr("tp = 64 does not divide heads = 32"));

  ModelSpec gqa = *ModelPreset("gpt-tiny");
  gqa.hidden = 768;
  gqa.heads = 12;
  gqa.kv_heads = 6;
  gqa.ffn_hidden = 3072;
  EXPECT_TRUE(Fits("tp=3", gqa));   // 6 % 3 == 0
  EXPECT_TRUE(Fits("tp=12", gqa));  // 12 % 6 == 0
  EXPECT_THAT(FitError("tp=4", gqa),
              AllOf(HasSubstr("tp = 4 and kv_heads = 6: neither divides the other"),
                    HasSubstr("(allowed tp: 1, 2, 3, 6, 12)")));

  ModelSpec narrow_mlp = *ModelPreset("gpt-tiny");
  narrow_mlp.ffn_hidden = 510;
  EXPECT_THAT(
      FitError("tp=4", narrow_mlp),
      AllOf(HasSubstr("tp = 4 does not divide ffn_hidden = 510"), HasSubstr("(allowed tp: 1, 2)")));
}

TEST(ParallelFitsTest, ExpertParallelNeedsMoe) {
  const ModelSpec dense = *ModelPreset("gpt-tiny");
  EXPECT_THAT(FitError("dp=2,ep=2", dense),
              AllOf(HasSubstr("ep = 2 needs an MoE model"), HasSubstr("(allowed ep: 1)")));
  const ModelSpec moe = *ModelPreset("gpt-tiny-moe");
  EXPECT_TRUE(Fits("dp=2,ep=2", moe));
  EXPECT_TRUE(Fits("dp=2,tp=2,ep=2", moe));
  EXPECT_TRUE(Fits("dp=4,tp=2,ep=4", moe));
  EXPECT_THAT(FitError("dp=2,ep=4", moe),
              AllOf(HasSubstr("ep = 4 must divide both moe.experts = 4 and dp = 2"),
                    HasSubstr("(allowed ep: 1, 2)")));
  // Groups inside tensor-parallel ranks are not lowered: ep divides dp, not dp * tp.
  EXPECT_THAT(FitError("dp=2,tp=2,ep=4", moe), HasSubstr("(allowed ep: 1, 2)"));
  EXPECT_THAT(FitError("dp=1,tp=2,ep=2", moe), HasSubstr("(allowed ep: 1)"));
  EXPECT_THAT(FitError("dp=3,ep=3", moe), HasSubstr("(allowed ep: 1)"));
}

TEST(ParallelFitsTest, ClusterDevicesAndMemory) {
  const ModelSpec gpt = *ModelPreset("gpt-6.7b");
  const ClusterSpec eight = *ClusterPreset("a100-40g", 8);
  EXPECT_TRUE(Fits("dp=2,pp=4", gpt, &eight));
  EXPECT_TRUE(Fits("dp=1", gpt, &eight));
  EXPECT_THAT(FitError("dp=4,pp=4", gpt, &eight),
              AllOf(HasSubstr("cluster 'a100-40g:8'"),
                    HasSubstr("dp*pp*tp = 4*4*1 = 16 devices, but the cluster has 8")));
  EXPECT_TRUE(Fits("dp=2,memory_limit_mb=36000", gpt, &eight));
  EXPECT_TRUE(Fits("dp=2,memory_limit_mb=40960", gpt, &eight));
  EXPECT_THAT(FitError("memory_limit_mb=50000", gpt, &eight),
              AllOf(HasSubstr("field 'memory_limit_mb': 50000 MB exceeds the 42950 MB"),
                    HasSubstr("a100-40g")));
  EXPECT_TRUE(Fits("dp=16,memory_limit_mb=50000", gpt, nullptr));
}

TEST(ParallelFitsTest, ContextParallelCountsDevicesAndNeedsADecoderOnlyModel) {
  const ParallelConfig c = Parse("dp=2,tp=2,cp=2");
  EXPECT_EQ(c.cp, 2);
  EXPECT_EQ(c.devices(), 8);
  EXPECT_EQ(c.devices_per_rank(), 4);
  EXPECT_EQ(Parse("dp=2").cp, 1);
  EXPECT_THAT(FlagError("cp=0"), HasSubstr("field 'cp'"));
  const ModelSpec gpt = *ModelPreset("gpt-6.7b");
  const ClusterSpec eight = *ClusterPreset("a100-40g", 8);
  EXPECT_TRUE(Fits("dp=2,tp=2,cp=2", gpt, &eight));
  EXPECT_THAT(FitError("dp=2,tp=2,cp=4", gpt, &eight),
              HasSubstr("dp*pp*tp*cp = 2*1*2*4 = 16 devices, but the cluster has 8"));
  EXPECT_THAT(FitError("cp=2", *ModelPreset("t5-11b")),
              AllOf(HasSubstr("cp = 2 needs a decoder-only model"), HasSubstr("allowed cp: 1")));
  // cp = 1 is not written, so files without context parallelism keep their bytes; cp > 1 is.
  EXPECT_FALSE(ParallelConfigToJson(Parse("dp=2")).contains("cp"));
  EXPECT_EQ(ParallelConfigToJson(c)["cp"], 2);
  // The product of the degrees stays inside int64.
  ParallelConfig huge;
  huge.dp = huge.pp = huge.tp = huge.cp = int64_t{1} << 20;
  EXPECT_THAT(ValidateParallelConfig(huge, "p").message(), HasSubstr("field 'cp'"));
}

TEST(ParallelFitsTest, RejectsBrokenInputs) {
  ModelSpec broken = *ModelPreset("gpt-tiny");
  broken.heads = 0;
  EXPECT_THAT(CheckParallelFits(ParallelConfig{}, broken, nullptr, "--parallel").message(),
              HasSubstr("model 'gpt-tiny': field 'heads'"));
  ParallelConfig bad;
  bad.pp = 0;
  EXPECT_THAT(CheckParallelFits(bad, *ModelPreset("gpt-tiny"), nullptr, "p.json").message(),
              HasSubstr("p.json: field 'pp'"));
}

}  // namespace
}  // namespace sluice
