#include "model/cluster_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "base/json_util.h"

namespace sluice {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

nlohmann::json CustomCluster() {
  return nlohmann::json::parse(R"({
    "name": "lab",
    "device": {"name": "l40s", "peak_tflops": 362.05, "memory_gib": 44.5, "hbm_gb_per_s": 864},
    "nodes": 3,
    "devices_per_node": 4,
    "intra_node": {"bandwidth_gb_per_s": 31.5, "latency_us": 2.5},
    "inter_node": {"bandwidth_gb_per_s": 12.5, "latency_us": 12}
  })");
}

std::string ErrorOf(const nlohmann::json& j) {
  StatusOr<ClusterSpec> spec = ClusterSpecFromJson(j, "c.json");
  EXPECT_FALSE(spec.ok()) << j.dump();
  return spec.status().message();
}

TEST(ClusterPresetTest, DeviceNumbers) {
  EXPECT_THAT(DevicePresetNames(), ElementsAre("a100-40g", "a100-80g", "h100-80g", "cpu"));
  ClusterSpec a100 = *ClusterPreset("a100-40g", 8);
  EXPECT_EQ(a100.name, "a100-40g:8");
  EXPECT_EQ(a100.device.name, "a100-40g");
  EXPECT_EQ(a100.device.peak_flops, 312e12);
  EXPECT_EQ(a100.device.memory, Bytes::GiB(40));
  EXPECT_EQ(a100.device.hbm_bandwidth, 1555e9);
  EXPECT_EQ(a100.intra_node.bandwidth, 300e9);
  EXPECT_EQ(a100.inter_node.bandwidth, 6.25e9);
  EXPECT_GT(a100.inter_node.latency, a100.intra_node.latency);

  ClusterSpec a100_80 = *ClusterPreset("a100-80g", 8);
  EXPECT_EQ(a100_80.device.memory, Bytes::GiB(80));
  EXPECT_EQ(a100_80.device.hbm_bandwidth, 2039e9);

  ClusterSpec h100 = *ClusterPreset("h100-80g", 8);
  EXPECT_EQ(h100.device.peak_flops, 989e12);
  EXPECT_EQ(h100.device.memory, Bytes::GiB(80));
  EXPECT_EQ(h100.device.hbm_bandwidth, 3350e9);
  EXPECT_EQ(h100.intra_node.bandwidth, 450e9);
  EXPECT_EQ(h100.inter_node.bandwidth, 50e9);
}

TEST(ClusterPresetTest, NodeLayout) {
  ClusterSpec four = *ClusterPreset("a100-40g", 4);
  EXPECT_EQ(four.nodes, 1);
  EXPECT_EQ(four.devices_per_node, 4);
  ClusterSpec one = *ClusterPreset("h100-80g", 1);
  EXPECT_EQ(one.num_devices(), 1);
  ClusterSpec sixty_four = *ClusterPreset("h100-80g", 64);
  EXPECT_EQ(sixty_four.nodes, 8);
  EXPECT_EQ(sixty_four.devices_per_node, 8);
  EXPECT_EQ(sixty_four.num_devices(), 64);
}

TEST(ClusterPresetTest, BadCountsAndNames) {
  StatusOr<ClusterSpec> twelve = ClusterPreset("a100-40g", 12);
  ASSERT_FALSE(twelve.ok());
  EXPECT_THAT(twelve.status().message(),
              AllOf(HasSubstr("'a100-40g:12'"), HasSubstr("whole nodes of 8"),
                    HasSubstr("multiple of 8"), HasSubstr("8 or 16")));
  EXPECT_THAT(ClusterPreset("a100-40g", 0).status().message(),
              HasSubstr("device count must be in [1, "));
  StatusOr<ClusterSpec> unknown = ClusterPreset("v100", 8);
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(),
              AllOf(HasSubstr("'v100'"), HasSubstr("'a100-40g', 'a100-80g', 'h100-80g' or 'cpu'")));
}

TEST(ClusterPresetTest, EveryPresetValidatesAndRoundTrips) {
  for (const std::string& device : DevicePresetNames()) {
    for (int64_t n : {1, 4, 8, 16, 64}) {
      SCOPED_TRACE(device + ":" + std::to_string(n));
      StatusOr<ClusterSpec> spec = ClusterPreset(device, n);
      ASSERT_TRUE(spec.ok()) << spec.status().ToString();
      EXPECT_TRUE(ValidateClusterSpec(*spec, "preset").ok());
      StatusOr<nlohmann::json> text = ParseJson(ClusterSpecToJson(*spec).dump(), "rt.json");
      ASSERT_TRUE(text.ok());
      StatusOr<ClusterSpec> back = ClusterSpecFromJson(*text, "rt.json");
      ASSERT_TRUE(back.ok()) << back.status().ToString();
      EXPECT_EQ(*back, *spec);
    }
  }
}

TEST(ClusterSpecTest, JsonUnitsAndRoundTrip) {
  StatusOr<ClusterSpec> spec = ClusterSpecFromJson(CustomCluster(), "c.json");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->device.peak_flops, 362.05e12);
  EXPECT_EQ(spec->device.memory, Bytes::MiB(44.5 * 1024));
  EXPECT_EQ(spec->device.hbm_bandwidth, 864e9);
  EXPECT_EQ(spec->intra_node.bandwidth, 31.5e9);
  EXPECT_EQ(spec->intra_node.latency, Duration::Nanos(2500));
  EXPECT_EQ(spec->num_devices(), 12);
  EXPECT_EQ(ClusterSpecToJson(*spec), CustomCluster());
  StatusOr<ClusterSpec> back = ClusterSpecFromJson(ClusterSpecToJson(*spec), "rt");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, *spec);
}

TEST(ClusterSpecTest, RoundTripsAwkwardNumbers) {
  ClusterSpec spec = *ClusterPreset("a100-40g", 16);
  const double values[] = {1e-3, 0.1, 1.0 / 3.0, 123.456789, 999.999, 7.77e5};
  for (double v : values) {
    spec.device.peak_flops = v * 1e12;
    spec.device.hbm_bandwidth = v * 1e9;
    spec.inter_node.bandwidth = v * 1e9;
    spec.intra_node.latency = Duration::Nanos(1234567);
    spec.device.memory = Bytes::Of(42949672961);
    StatusOr<nlohmann::json> text = ParseJson(ClusterSpecToJson(spec).dump(), "rt.json");
    ASSERT_TRUE(text.ok());
    StatusOr<ClusterSpec> back = ClusterSpecFromJson(*text, "rt.json");
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, spec) << v;
  }
}

TEST(ClusterSpecTest, DeviceByPresetNameTakesPresetLinks) {
  StatusOr<ClusterSpec> spec = ClusterSpecFromJson(
      nlohmann::json::parse(R"({"name": "x", "device": "h100-80g", "nodes": 2})"), "c.json");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  ClusterSpec preset = *ClusterPreset("h100-80g", 16);
  preset.name = "x";
  EXPECT_EQ(*spec, preset);

  spec = ClusterSpecFromJson(nlohmann::json::parse(R"({"name": "x", "device": "a100-40g",
      "inter_node": {"bandwidth_gb_per_s": 50, "latency_us": 5}})"),
                             "c.json");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->inter_node.bandwidth, 50e9);
  EXPECT_EQ(spec->intra_node.bandwidth, 300e9);
  EXPECT_EQ(spec->nodes, 1);
  EXPECT_EQ(spec->devices_per_node, 8);
}

TEST(ClusterSpecTest, SingleNodeNeedsNoInterNodeLink) {
  nlohmann::json j = CustomCluster();
  j["nodes"] = 1;
  j.erase("inter_node");
  StatusOr<ClusterSpec> spec = ClusterSpecFromJson(j, "c.json");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->inter_node, LinkSpec{});
  EXPECT_EQ(ClusterSpecToJson(*spec), j);
}

TEST(ClusterSpecTest, UnknownKeys) {
  nlohmann::json j = CustomCluster();
  j["gpus"] = 8;
  EXPECT_THAT(ErrorOf(j), AllOf(HasSubstr("c.json: field 'gpus': unknown key"),
                                HasSubstr("'devices_per_node'")));
  j = CustomCluster();
  j["device"]["memory_gb"] = 40;
  EXPECT_THAT(ErrorOf(j), AllOf(HasSubstr("c.json: field 'device.memory_gb': unknown key"),
                                HasSubstr("'memory_gib'")));
  j = CustomCluster();
  j["inter_node"]["bandwidth_gbps"] = 1;
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'inter_node.bandwidth_gbps': unknown key"));
}

TEST(ClusterSpecTest, WrongTypes) {
  nlohmann::json j = CustomCluster();
  j["nodes"] = "3";
  EXPECT_THAT(ErrorOf(j), AllOf(HasSubstr("c.json: field 'nodes'"), HasSubstr("got a string")));
  j = CustomCluster();
  j["device"]["peak_tflops"] = "312";
  EXPECT_THAT(ErrorOf(j), HasSubstr("c.json: field 'device.peak_tflops': must be a number"));
  j = CustomCluster();
  j["device"] = 7;
  EXPECT_THAT(ErrorOf(j), AllOf(HasSubstr("c.json: field 'device': must be a device preset"),
                                HasSubstr("'a100-40g'"), HasSubstr("got a number")));
  j = CustomCluster();
  j["intra_node"] = 300;
  EXPECT_THAT(ErrorOf(j), HasSubstr("c.json: field 'intra_node': expected a JSON object"));
}

// Links and devices so slow that a transfer or a layer outgrows int64 nanoseconds are refused by
// field, not left to overflow into "negative" times.
TEST(ClusterSpecTest, TooSlowLinksAndDevices) {
  nlohmann::json j = CustomCluster();
  j["inter_node"]["bandwidth_gb_per_s"] = 1e-15;
  EXPECT_THAT(ErrorOf(j), HasSubstr("c.json: field 'inter_node.bandwidth_gb_per_s': must be a "
                                    "number in [0.001, 1000000], got 1e-15"));
  j = CustomCluster();
  j["device"]["peak_tflops"] = 1e-9;
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'device.peak_tflops': must be a number in [0.001, "));
  j = CustomCluster();
  j["device"]["hbm_gb_per_s"] = 1e-300;
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'device.hbm_gb_per_s': must be a number in [0.001, "));
  j = CustomCluster();
  j["inter_node"]["bandwidth_gb_per_s"] = 0.001;
  EXPECT_TRUE(ClusterSpecFromJson(j, "c.json").ok());
}

TEST(ClusterSpecTest, ImpossibleValues) {
  nlohmann::json j = CustomCluster();
  j["device"]["memory_gib"] = 0;
  EXPECT_THAT(ErrorOf(j),
              HasSubstr("c.json: field 'device.memory_gib': must be a number in (0, 1000000]"));
  j = CustomCluster();
  j["inter_node"]["latency_us"] = -1;
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'inter_node.latency_us': must be a number in [0, "));
  j = CustomCluster();
  j["devices_per_node"] = 0;
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'devices_per_node': must be an integer in [1, 1024]"));
  j = CustomCluster();
  j.erase("inter_node");
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'inter_node': is required when nodes > 1"));
  j = CustomCluster();
  j["device"] = "a100";
  EXPECT_THAT(ErrorOf(j), AllOf(HasSubstr("field 'device': unknown device preset \"a100\""),
                                HasSubstr("'h100-80g'")));
  j = CustomCluster();
  j.erase("device");
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'device': is required"));
}

TEST(ClusterSpecTest, ValidateChecksStructsBuiltInCode) {
  ClusterSpec spec = *ClusterPreset("a100-40g", 16);
  spec.inter_node.bandwidth = 0;
  EXPECT_THAT(ValidateClusterSpec(spec, "code").message(),
              HasSubstr("code: field 'inter_node.bandwidth_gb_per_s'"));
  spec = *ClusterPreset("a100-40g", 8);
  spec.device.memory = Bytes::Zero();
  EXPECT_THAT(ValidateClusterSpec(spec, "code").message(), HasSubstr("'device.memory_gib'"));
}

TEST(ClusterSpecTest, RingCrossingDefaultsPresetsAndJson) {
  EXPECT_EQ(ClusterPreset("a100-40g", 16)->ring_crossing, RingCrossing::kAllMembers);
  EXPECT_EQ(ClusterPreset("h100-80g", 16)->ring_crossing, RingCrossing::kAllMembers);
  EXPECT_EQ(ClusterPreset("cpu", 16)->ring_crossing, RingCrossing::kOneConnection);
  StatusOr<ClusterSpec> custom = ClusterSpecFromJson(CustomCluster(), "c.json");
  ASSERT_TRUE(custom.ok());
  EXPECT_EQ(custom->ring_crossing, RingCrossing::kAllMembers);  // a device object's default

  nlohmann::json j = CustomCluster();
  j["ring_crossing"] = "one-connection";
  StatusOr<ClusterSpec> gloo = ClusterSpecFromJson(j, "c.json");
  ASSERT_TRUE(gloo.ok()) << gloo.status().ToString();
  EXPECT_EQ(gloo->ring_crossing, RingCrossing::kOneConnection);
  EXPECT_EQ(ClusterSpecToJson(*gloo), j);  // written when it is not the default

  // A preset's crossing is the default a file may replace.
  nlohmann::json cpu = {{"name", "hosts"}, {"device", "cpu"}, {"nodes", 2}};
  EXPECT_EQ(ClusterSpecFromJson(cpu, "c.json")->ring_crossing, RingCrossing::kOneConnection);
  cpu["ring_crossing"] = "all-members";
  EXPECT_EQ(ClusterSpecFromJson(cpu, "c.json")->ring_crossing, RingCrossing::kAllMembers);

  j["ring_crossing"] = "spread";
  EXPECT_THAT(ErrorOf(j), AllOf(HasSubstr("c.json: field 'ring_crossing'"),
                                HasSubstr("all-members"), HasSubstr("one-connection")));
  j["ring_crossing"] = 2;
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'ring_crossing'"));
}

// A ring crossing nodes moves over the inter-node shares of its fewest devices on one node
// under NCCL's crossing, over one share under Gloo's.
TEST(ClusterSpecTest, RingOverDevicesCountsTheCrossingShares) {
  ClusterSpec c = *ClusterPreset("a100-40g", 32);  // 4 nodes of 8
  const std::vector<int64_t> sixteen = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  EXPECT_EQ(RingOverDevices(c, sixteen), (CollectiveRing{.members = 16, .spans_nodes = true,
                                                         .crossing_shares = 8, .intra_hops = true}));
  EXPECT_EQ(RingOverDevices(c, std::vector<int64_t>{0, 8, 16, 24}),
            (CollectiveRing{.members = 4, .spans_nodes = true, .crossing_shares = 1}));
  // Uneven: 3 devices on node 0, 1 on node 1: the crossing into node 1 has one share.
  EXPECT_EQ(RingOverDevices(c, std::vector<int64_t>{0, 2, 4, 8}).crossing_shares, 1);
  EXPECT_EQ(RingOverDevices(c, std::vector<int64_t>{0, 1, 2, 3}),
            (CollectiveRing{.members = 4, .spans_nodes = false, .intra_hops = true}));
  EXPECT_EQ(RingOverDevices(c, std::vector<int64_t>{}), CollectiveRing{});
  c.ring_crossing = RingCrossing::kOneConnection;
  EXPECT_EQ(RingOverDevices(c, sixteen), (CollectiveRing{.members = 16, .spans_nodes = true,
                                                         .crossing_shares = 1, .intra_hops = true}));
}

TEST(ClusterSpecTest, ResolveCluster) {
  StatusOr<ClusterSpec> sixteen = ResolveCluster("a100-40g:16");
  ASSERT_TRUE(sixteen.ok()) << sixteen.status().ToString();
  EXPECT_EQ(*sixteen, *ClusterPreset("a100-40g", 16));
  StatusOr<ClusterSpec> bare = ResolveCluster("h100-80g");
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(bare->name, "h100-80g:8");
  EXPECT_EQ(bare->num_devices(), 8);

  EXPECT_THAT(ResolveCluster("a100-40g:x").status().message(),
              AllOf(HasSubstr("--cluster 'a100-40g:x'"), HasSubstr("positive integer")));
  EXPECT_THAT(ResolveCluster("a100-40g:-8").status().message(), HasSubstr("positive integer"));
  EXPECT_THAT(ResolveCluster("a100-40g:").status().message(), HasSubstr("positive integer"));
  EXPECT_THAT(ResolveCluster("a100-40g:12").status().message(), HasSubstr("whole nodes of 8"));
  StatusOr<ClusterSpec> unknown = ResolveCluster("v100:8");
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(unknown.status().message(),
              AllOf(HasSubstr("--cluster 'v100:8'"), HasSubstr("no such file"),
                    HasSubstr("'a100-40g', 'a100-80g', 'h100-80g' or 'cpu'")));

  const std::string path = ::testing::TempDir() + "/sluice_cluster.json";
  ASSERT_TRUE(WriteStringToFile(path, CustomCluster().dump()).ok());
  StatusOr<ClusterSpec> from_file = ResolveCluster(path);
  ASSERT_TRUE(from_file.ok()) << from_file.status().ToString();
  EXPECT_EQ(from_file->name, "lab");

  nlohmann::json bad = CustomCluster();
  bad["nodes"] = -2;
  ASSERT_TRUE(WriteStringToFile(path, bad.dump()).ok());
  EXPECT_THAT(ResolveCluster(path).status().message(), HasSubstr(path + ": field 'nodes'"));
}

}  // namespace
}  // namespace sluice
