// Scenario files of `sluice compare`: defaults, strict validation with messages naming the file,
// the field and the allowed values, and the JSON round trip.
#include "compare/compare_scenario.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

#include "base/json_util.h"

namespace sluice {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

StatusOr<CompareScenario> Parse(const std::string& text) {
  auto j = ParseJson(text, "s.json");
  if (!j.ok()) return j.status();
  return CompareScenarioFromJson(*j, "s.json");
}

TEST(CompareScenarioTest, DefaultsAreTheEmbeddedScenario) {
  const CompareScenario s;
  EXPECT_TRUE(ValidateCompareScenario(s, "default").ok());
  EXPECT_EQ(s.model, "gpt-6.7b");
  EXPECT_EQ(s.cluster, "a100-40g:8");
  EXPECT_EQ(s.data, "mixture-4task");
  std::vector<std::string> names;
  for (const MethodSpec& m : ScenarioMethods(s)) names.push_back(m.name);
  EXPECT_EQ(names, (std::vector<std::string>{"packing", "token-budget", "multipack", "dynapipe",
                                             "hydraulis", "sluice"}));
  // An empty object is the default scenario.
  auto parsed = Parse("{}");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(*parsed, s);
}

TEST(CompareScenarioTest, MethodShorthandsCarryTheirSystemsSchedules) {
  auto packing = MethodSpecFor("packing", "t");
  ASSERT_TRUE(packing.ok());
  EXPECT_EQ(packing->schedules,
            (std::vector<ScheduleKind>{ScheduleKind::kGPipe, ScheduleKind::k1F1B,
                                       ScheduleKind::kInterleaved}));
  auto hydraulis = MethodSpecFor("hydraulis", "t");
  ASSERT_TRUE(hydraulis.ok());
  EXPECT_EQ(hydraulis->schedules, std::vector<ScheduleKind>{ScheduleKind::k1F1B});
  auto best = MethodSpecFor("sluice", "t");
  ASSERT_TRUE(best.ok());
  EXPECT_EQ(best->schedules, AllScheduleKinds());
  EXPECT_GE(best->batching.size(), 2u);
  auto composed = MethodSpecFor("balanced+dynapipe", "t");
  ASSERT_TRUE(composed.ok());
  EXPECT_EQ(composed->batching, std::vector<std::string>{"balanced+dynapipe"});
  auto bad = MethodSpecFor("fastest", "--methods");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(),
              AllOf(HasSubstr("--methods"), HasSubstr("fastest"), HasSubstr("'packing'")));
}

TEST(CompareScenarioTest, RoundTripsThroughJson) {
  auto s = Parse(R"({
    "name": "t5-grid", "model": "t5-11b", "cluster": "a100-40g:16", "data": "flan-like",
    "samples": 5000, "tokens_per_batch": 32768, "max_seqlen": 1024, "long": "drop",
    "iterations": "all", "memory_limit_mb": 36000, "seed": 7,
    "methods": ["packing", {"name": "dp-zb", "batching": ["dynapipe"], "schedules": ["zb-h1"]}],
    "reference": "packing", "controlled": {"dp": 2, "pp": 4, "tp": 2, "zero": 1},
    "search": {"tp": [8, 2], "pp": [4], "zero": [2], "vpp": [2, 3], "score_batches": 3,
               "simulate_top": 4, "all_devices": false},
    "simulator": {"collectives": "stepwise"}})");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->iterations, 0);
  EXPECT_EQ(s->search.tp, (std::vector<int64_t>{2, 8}));
  ASSERT_EQ(s->methods.size(), 2u);
  EXPECT_EQ(s->methods[1].schedules, std::vector<ScheduleKind>{ScheduleKind::kZbH1});
  ASSERT_TRUE(s->controlled.has_value());
  EXPECT_EQ(s->controlled->tp, 2);
  EXPECT_TRUE(s->stepwise_collectives);
  auto again = CompareScenarioFromJson(CompareScenarioToJson(*s), "round-trip");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, *s);
  // The memory reserve: absent (-1) is the default; given, it round-trips.
  auto reserve = Parse(R"({"memory_reserve_mb": 2500.5})");
  ASSERT_TRUE(reserve.ok()) << reserve.status().ToString();
  EXPECT_EQ(reserve->memory_reserve_mb, 2500.5);
  auto reserve_again = CompareScenarioFromJson(CompareScenarioToJson(*reserve), "round-trip");
  ASSERT_TRUE(reserve_again.ok()) << reserve_again.status().ToString();
  EXPECT_EQ(*reserve_again, *reserve);
  EXPECT_EQ(CompareScenario{}.memory_reserve_mb, -1);
  EXPECT_FALSE(CompareScenarioToJson(CompareScenario{}).contains("memory_reserve_mb"));
  // Score batches: "all" (0) and without the extremes.
  auto all = Parse(R"({"search": {"score_batches": "all", "score_extremes": false}})");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(all->search.score_batches, 0);
  EXPECT_FALSE(all->search.score_extremes);
  auto all_again = CompareScenarioFromJson(CompareScenarioToJson(*all), "round-trip");
  ASSERT_TRUE(all_again.ok()) << all_again.status().ToString();
  EXPECT_EQ(*all_again, *all);
  // Device orders: both by default (not written), or one for every configuration.
  EXPECT_FALSE(CompareScenario{}.search.only_order.has_value());
  EXPECT_FALSE(CompareScenarioToJson(CompareScenario{})["search"].contains("orders"));
  auto inner = Parse(R"({"search": {"orders": "tp-cp-pp-dp"}})");
  ASSERT_TRUE(inner.ok()) << inner.status().ToString();
  EXPECT_EQ(inner->search.only_order, RankOrder::kPipelineInner);
  auto inner_again = CompareScenarioFromJson(CompareScenarioToJson(*inner), "round-trip");
  ASSERT_TRUE(inner_again.ok()) << inner_again.status().ToString();
  EXPECT_EQ(*inner_again, *inner);
  const CompareScenario defaults;
  auto d = CompareScenarioFromJson(CompareScenarioToJson(defaults), "round-trip");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(*d, defaults);
}

TEST(CompareScenarioTest, ErrorsNameTheFileTheFieldAndTheAllowedValues) {
  struct Case {
    const char* json;
    std::vector<const char*> wants;
  };
  const Case cases[] = {
      {R"({"modle": "gpt-6.7b"})", {"s.json", "modle", "max_seqlen"}},
      {R"({"iterations": 0})", {"s.json", "iterations", "all"}},
      {R"({"iterations": "many"})", {"s.json", "iterations"}},
      {R"({"long": "keep"})", {"s.json", "long", "clip"}},
      {R"({"methods": ["packing", "fastest"]})", {"s.json", "methods[1]", "fastest", "dynapipe"}},
      {R"({"methods": [{"name": "x", "batching": ["nope"]}]})", {"s.json", "batching"}},
      {R"({"methods": [{"name": "packing", "schedules": ["zigzag"]}]})",
       {"s.json", "methods[0].schedules", "zb-h1"}},
      {R"({"methods": [{"name": "packing", "colour": 1}]})", {"s.json", "colour"}},
      {R"({"methods": [{"name": "mine"}]})", {"s.json", "mine", "packing"}},
      {R"({"methods": ["packing", "packing"]})", {"s.json", "listed twice"}},
      {R"({"methods": ["dynapipe"], "controlled": "dynapipe"})",
       {"s.json", "reference", "packing"}},
      {R"({"reference": "dynapipe", "controlled": "nobody"})", {"s.json", "controlled"}},
      {R"({"controlled": {"dp": 2, "qq": 1}})", {"s.json", "controlled", "qq"}},
      {R"({"search": {"zero": [4]}})", {"s.json", "search.zero", "[0, 3]"}},
      {R"({"search": {"vpp": [1]}})", {"s.json", "search.vpp"}},
      {R"({"search": {"tpp": [1]}})", {"s.json", "search.tpp"}},
      {R"({"search": {"score_batches": 0}})", {"s.json", "search.score_batches"}},
      {R"({"search": {"orders": "dp-pp"}})", {"s.json", "search.orders", "tp-cp-pp-dp"}},
      {R"({"memory_reserve_mb": -5})", {"s.json", "memory_reserve_mb"}},
      {R"({"simulator": {"collectives": "exact"}})",
       {"s.json", "simulator.collectives", "closed-form"}},
      {R"({"tokens_per_batch": 0})", {"s.json", "tokens_per_batch"}},
      {R"([1, 2])", {"s.json"}},
      // The name is an output folder under --scenario-dir: nothing that leaves OUT.
      {R"({"name": "../escape"})", {"s.json", "name", "folder name"}},
      {R"({"name": "a/b"})", {"s.json", "name", "'/'"}},
      {R"({"name": ".."})", {"s.json", "name"}},
      {R"({"name": ""})", {"s.json", "name", "not empty"}},
  };
  for (const Case& c : cases) {
    auto s = Parse(c.json);
    ASSERT_FALSE(s.ok()) << c.json;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << c.json;
    for (const char* want : c.wants) {
      EXPECT_THAT(s.status().message(), HasSubstr(want)) << c.json;
    }
  }
}

// Values the JSON reader cannot produce but flags can (`--memory-limit nan`, `--seed` above
// INT64_MAX, which the results file could not read back): the validator rejects them too.
TEST(CompareScenarioTest, ValidateRejectsWhatOnlyFlagsCanSet) {
  CompareScenario s;
  s.memory_limit_mb = std::nan("");
  Status st = ValidateCompareScenario(s, "flags");
  EXPECT_THAT(st.message(), HasSubstr("field 'memory_limit_mb'"));
  s.memory_limit_mb = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(ValidateCompareScenario(s, "flags").ok());
  s.memory_limit_mb = 0;
  s.seed = uint64_t{1} << 63;
  st = ValidateCompareScenario(s, "flags");
  EXPECT_THAT(st.message(), HasSubstr("field 'seed'"));
  EXPECT_THAT(st.message(), HasSubstr("9223372036854775807"));
  s.seed = INT64_MAX;
  EXPECT_TRUE(ValidateCompareScenario(s, "flags").ok());
}

TEST(CompareScenarioTest, FileNamesTheScenarioAndResolvesRelativePaths) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "sluice_compare_scenario_test";
  std::filesystem::create_directories(dir / "sub");
  {
    std::ofstream(dir / "sub" / "lengths.txt") << "5\n6\n";
    std::ofstream(dir / "sub" / "grid-point.json") << R"({"data": "lengths.txt", "iterations": 2})";
  }
  auto s = ReadCompareScenarioFile((dir / "sub" / "grid-point.json").string());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->name, "grid-point");
  EXPECT_EQ(s->data, (dir / "sub" / "lengths.txt").string());
  EXPECT_EQ(s->model, "gpt-6.7b");  // a preset stays a preset
  auto missing = ReadCompareScenarioFile((dir / "nope.json").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("nope.json"));
  std::filesystem::remove_all(dir);
}

// The shipped scenarios (examples/compare-*.json and the benchmark grids) stay valid.
TEST(CompareScenarioTest, ShippedScenariosParse) {
  const std::filesystem::path root(SLUICE_TEST_SOURCE_DIR);
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(root / "bench" / "scenarios")) {
    if (e.path().extension() == ".json") files.push_back(e.path());
  }
  EXPECT_GE(files.size(), 36u) << "the DynaPipe grid (32 points) and the Hydraulis-style ones";
  files.push_back(root / "examples" / "compare-small.json");
  files.push_back(root / "examples" / "compare-t5-custom.json");
  for (const auto& f : files) {
    auto s = ReadCompareScenarioFile(f.string());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(s->name, f.stem().string()) << "the name is the file's stem";
    if (s->model.find('/') != std::string::npos) {
      EXPECT_TRUE(std::filesystem::exists(s->model)) << s->model << " of " << f;
    }
  }
}

}  // namespace
}  // namespace sluice
