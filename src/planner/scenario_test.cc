// The scenario resolver shared by the CLI and `sluice compare`: the memory-limit rule (one place,
// within the device), errors that name the field through the caller's namer, the description.
#include "planner/scenario.h"

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sluice {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

ScenarioSpec Small() {
  ScenarioSpec s;
  s.data = "web";
  s.samples = 200;
  s.tokens_per_batch = 16384;
  s.iterations = 2;
  ParallelConfig p;
  p.dp = 2;
  p.pp = 4;
  p.zero = 1;
  s.parallel = p;
  return s;
}

// A namer like the CLI's: every field is a flag.
std::string Flag(std::string_view field) { return fmt::format("--{}", field); }

TEST(ScenarioTest, ResolvesEveryPart) {
  auto sc = ResolveScenario(Small(), FileFieldNamer("s.json"));
  ASSERT_TRUE(sc.ok()) << sc.status().ToString();
  EXPECT_EQ(sc->model.name, "gpt-6.7b");
  EXPECT_EQ(sc->cluster.num_devices(), 8);
  ASSERT_TRUE(sc->parallel.has_value());
  EXPECT_EQ(sc->parallel->pp, 4);
  EXPECT_FALSE(sc->memory_limit.has_value());
  EXPECT_EQ(sc->MemoryLimit(),
            sc->cluster.device.memory - DefaultMemoryReserve(sc->cluster.device));
  EXPECT_EQ(sc->parallel->MemoryLimit(sc->cluster), sc->MemoryLimit()) << "one rule";
  ASSERT_NE(sc->cost, nullptr);
  EXPECT_EQ(sc->dataset.size(), 200u);
  ASSERT_TRUE(sc->batcher.has_value());
  GlobalBatch batch;
  EXPECT_TRUE(sc->batcher->Next(&batch));
  EXPECT_LE(batch.tokens, 16384);
  EXPECT_THAT(sc->Describe(), HasSubstr("dp 2 x pp 4 x tp 1, ZeRO-1, memory limit 38655 MB (the "
                                        "device's 42950 MB less a 4295 MB reserve)"));
  EXPECT_THAT(sc->Describe(), HasSubstr("max seqlen 2048, 2 batches"));
  const std::string compare_form = sc->Describe({.parallel = false, .batches_taken = 1});
  EXPECT_THAT(compare_form, HasSubstr("(8 devices), memory limit 38655 MB per device"));
  EXPECT_THAT(compare_form, HasSubstr("max seqlen 2048 (clip), 1 batches"));
}

TEST(ScenarioTest, DescriptionSaysWhatTheLengthLimitsCostAndNoBatchSaysWhy) {
  ScenarioSpec s = Small();
  s.max_seqlen = 1024;
  auto sc = ResolveScenario(s, FileFieldNamer("s.json"));
  ASSERT_TRUE(sc.ok()) << sc.status().ToString();
  const DataLoss loss = sc->Loss();
  EXPECT_EQ(loss.samples, 200);
  EXPECT_GT(loss.clipped_samples, 0);
  EXPECT_GT(loss.clipped_tokens, 0);
  EXPECT_THAT(sc->Describe(), HasSubstr("\nlost:     "));
  EXPECT_THAT(sc->Describe(), HasSubstr("longer than max seqlen 1024 were clipped, removing"));
  // Every sample longer than max_seqlen and dropped: the error says so.
  s.max_seqlen = 1;
  s.long_samples = "drop";
  sc = ResolveScenario(s, FileFieldNamer("s.json"));
  ASSERT_TRUE(sc.ok()) << sc.status().ToString();
  GlobalBatch batch;
  EXPECT_FALSE(sc->batcher->Next(&batch));
  const Status none = sc->NoBatchError(Flag);
  EXPECT_EQ(none.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(none.message(), HasSubstr("--data: 'web' yields no global batch of 16384 tokens: all "
                                        "200 samples were dropped: 200 longer than max seqlen 1"));
}

TEST(ScenarioTest, SmallInputsAreWarnedAbout) {
  auto batch = [](int64_t samples) {
    GlobalBatch b;
    for (int64_t i = 0; i < samples; ++i) b.samples.push_back(Sample{.id = i, .input_len = 10});
    return b;
  };
  SmallInputCheck fine(2, 8, "dp x pp = 8", 8, "the 8 devices");
  fine.Add(batch(8));
  fine.Add(batch(9));
  EXPECT_TRUE(fine.Warnings().empty());
  SmallInputCheck tiny(20, 8, "dp x pp = 8", 8, "the 8 devices");
  tiny.Add(batch(1));
  const std::vector<std::string> w = tiny.Warnings();
  ASSERT_EQ(w.size(), 3u);
  EXPECT_THAT(w[0], HasSubstr("only 1 global batch, fewer than the 20 asked for"));
  EXPECT_THAT(w[1], HasSubstr("only 1 sample in all, fewer than the 8 devices"));
  EXPECT_THAT(w[2], HasSubstr("1 of 1 global batches hold fewer samples than dp x pp = 8"));
  SmallInputCheck all(0, 0, "", 0, "");  // every batch asked for, no sample thresholds
  all.Add(batch(1));
  EXPECT_TRUE(all.Warnings().empty());
}

TEST(ScenarioTest, MemoryLimitIsGivenInOnePlaceWithinTheDevice) {
  // As memory_limit_mb: the scenario's limit, and the parallel configuration's.
  ScenarioSpec s = Small();
  s.memory_limit_mb = 36000;
  auto sc = ResolveScenario(s, FileFieldNamer("s.json"));
  ASSERT_TRUE(sc.ok()) << sc.status().ToString();
  EXPECT_EQ(sc->MemoryLimit(), Bytes::MB(36000));
  EXPECT_EQ(sc->parallel->memory_limit, Bytes::MB(36000));
  // In the parallel configuration: the same.
  s = Small();
  s.parallel->memory_limit = Bytes::MB(30000);
  sc = ResolveScenario(s, FileFieldNamer("s.json"));
  ASSERT_TRUE(sc.ok()) << sc.status().ToString();
  EXPECT_EQ(sc->MemoryLimit(), Bytes::MB(30000));
  // In both: an error naming both fields.
  s.memory_limit_mb = 36000;
  sc = ResolveScenario(s, Flag);
  ASSERT_FALSE(sc.ok());
  EXPECT_EQ(sc.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(sc.status().message(),
            "--memory_limit_mb: the memory limit is also given as memory_limit_mb in --parallel; "
            "give it in one place");
  // Above one device's memory, wherever it is given.
  s = Small();
  s.memory_limit_mb = 90000;
  sc = ResolveScenario(s, FileFieldNamer("s.json"));
  ASSERT_FALSE(sc.ok());
  EXPECT_THAT(sc.status().message(),
              StartsWith("s.json: field 'memory_limit_mb': 90000 MB exceeds"));
  s = Small();
  s.parallel->memory_limit = Bytes::MB(90000);
  sc = ResolveScenario(s, FileFieldNamer("s.json"));
  ASSERT_FALSE(sc.ok());
  EXPECT_THAT(sc.status().message(), StartsWith("s.json: field 'parallel'"));
  EXPECT_THAT(sc.status().message(), HasSubstr("exceeds"));
  // Without a parallel configuration (sluice compare searches one) the check still holds.
  s = Small();
  s.parallel.reset();
  s.memory_limit_mb = 90000;
  sc = ResolveScenario(s, FileFieldNamer(""));
  ASSERT_FALSE(sc.ok());
  EXPECT_THAT(sc.status().message(), StartsWith("field 'memory_limit_mb': 90000 MB exceeds"));
}

TEST(ScenarioTest, MemoryReserveAppliesWithoutALimitAndIsOneField) {
  // The default: the device's memory less 2 GiB + 5%, in the scenario and its configuration.
  ScenarioSpec s = Small();
  auto sc = ResolveScenario(s, FileFieldNamer("s.json"));
  ASSERT_TRUE(sc.ok()) << sc.status().ToString();
  EXPECT_EQ(sc->MemoryLimit(), Bytes::GiB(36));
  EXPECT_EQ(sc->MemoryReserve(), Bytes::GiB(4));
  // Given: overrides the default, and travels with the parallel configuration (plans carry it).
  s.memory_reserve_mb = 0;
  sc = ResolveScenario(s, FileFieldNamer("s.json"));
  ASSERT_TRUE(sc.ok()) << sc.status().ToString();
  EXPECT_EQ(sc->MemoryLimit(), sc->cluster.device.memory);
  s.memory_reserve_mb = 10000;
  sc = ResolveScenario(s, FileFieldNamer("s.json"));
  ASSERT_TRUE(sc.ok()) << sc.status().ToString();
  EXPECT_EQ(sc->MemoryLimit(), sc->cluster.device.memory - Bytes::MB(10000));
  ASSERT_TRUE(sc->parallel->memory_reserve.has_value());
  EXPECT_EQ(sc->parallel->MemoryLimit(sc->cluster), sc->MemoryLimit());
  EXPECT_THAT(sc->Describe(), HasSubstr("less a 10000 MB reserve"));
  // With an explicit limit: the limit is the budget, and a reserve beside it is an error.
  s.memory_limit_mb = 36000;
  sc = ResolveScenario(s, Flag);
  ASSERT_FALSE(sc.ok());
  EXPECT_EQ(sc.status().message(),
            "--memory_reserve_mb: applies only without --memory_limit_mb (an explicit limit is "
            "the budget as given); give one of them");
  s.memory_reserve_mb = -1;
  sc = ResolveScenario(s, Flag);
  ASSERT_TRUE(sc.ok()) << sc.status().ToString();
  EXPECT_EQ(sc->MemoryLimit(), Bytes::MB(36000));
  EXPECT_EQ(sc->MemoryReserve(), Bytes::Zero());
  // In both places, or more than the device: errors naming the field.
  s = Small();
  s.memory_reserve_mb = 1000;
  s.parallel->memory_reserve = Bytes::MB(2000);
  sc = ResolveScenario(s, Flag);
  ASSERT_FALSE(sc.ok());
  EXPECT_THAT(sc.status().message(), HasSubstr("give it in one place"));
  s = Small();
  s.memory_reserve_mb = 50000;
  sc = ResolveScenario(s, Flag);
  ASSERT_FALSE(sc.ok());
  EXPECT_THAT(sc.status().message(),
              StartsWith("--memory_reserve_mb: 50000 MB leaves nothing of the 42950 MB"));
}

TEST(ScenarioTest, ErrorsNameTheFieldThroughTheNamer) {
  ScenarioSpec s = Small();
  s.model = "gpt-7b";
  auto sc = ResolveScenario(s, Flag);
  ASSERT_FALSE(sc.ok());
  EXPECT_THAT(sc.status().message(), StartsWith("--model: "));
  EXPECT_THAT(sc.status().message(), HasSubstr("gpt-6.7b"));
  s = Small();
  s.max_seqlen = 100000;
  sc = ResolveScenario(s, FileFieldNamer("s.json"));
  ASSERT_FALSE(sc.ok());
  EXPECT_THAT(sc.status().message(),
              StartsWith("s.json: field 'max_seqlen': 100000 exceeds the max position"));
  s = Small();
  s.parallel->pp = 3;
  sc = ResolveScenario(s, Flag);
  ASSERT_FALSE(sc.ok());
  EXPECT_THAT(sc.status().message(), StartsWith("--parallel: "));
  s = Small();
  s.data = "no-such-data";
  sc = ResolveScenario(s, FileFieldNamer("s.json"));
  ASSERT_FALSE(sc.ok());
  EXPECT_THAT(sc.status().message(), StartsWith("s.json: field 'data': "));
  s = Small();
  s.long_samples = "keep";
  sc = ResolveScenario(s, Flag);
  ASSERT_FALSE(sc.ok());
  EXPECT_THAT(sc.status().message(), StartsWith("--long: "));
}

}  // namespace
}  // namespace sluice
