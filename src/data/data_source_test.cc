#include "data/data_source.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/json_util.h"
#include "data/generator.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

TEST(LoadDataTest, RealDatasetsLoadWithTheirSizes) {
  const std::pair<std::string_view, size_t> expected[] = {{"mixture-4task", 30000},
                                                          {"man-summarize", 3075},
                                                          {"py-docstring", 20000},
                                                          {"py-file", 8175},
                                                          {"gcide-define", 20000}};
  for (const auto& [name, n] : expected) {
    SCOPED_TRACE(name);
    StatusOr<Dataset> ds = LoadData(name);
    ASSERT_TRUE(ds.ok()) << ds.status().ToString();
    EXPECT_EQ(ds->size(), n);
    EXPECT_EQ(ds->source(), name);
  }
  EXPECT_EQ(LoadData(kDefaultDataPreset)->num_tasks(), 4);
}

TEST(LoadDataTest, NumSamplesTakesAPrefixOfRealData) {
  DataOptions o;
  o.num_samples = 10;
  const Dataset all = *LoadData("py-file");
  const Dataset ten = *LoadData("py-file", o);
  EXPECT_EQ(ten, all.Prefix(10));
  o.num_samples = 8176;
  EXPECT_THAT(LoadData("py-file", o).status().message(),
              HasSubstr("8176 samples asked for, but it has only 8175"));
}

TEST(LoadDataTest, GeneratorsUseSeedAndCount) {
  const Dataset def = *LoadData("web");
  EXPECT_EQ(def.size(), static_cast<size_t>(kDefaultGeneratedSamples));
  DataOptions o;
  o.num_samples = 100;
  o.seed = 5;
  EXPECT_EQ(*LoadData("flan-like", o), *GenerateDataset("flan-like", 100, 5));
  o.seed = 6;
  EXPECT_NE(LoadData("flan-like", o)->samples(), GenerateDataset("flan-like", 100, 5)->samples());
}

TEST(LoadDataTest, FilesWinAndUseReaderOptions) {
  const std::string path = ::testing::TempDir() + "/web";  // a file named like a preset
  ASSERT_TRUE(WriteStringToFile(path, "input_len,n\n5,1\n6,2\n").ok());
  DataOptions o;
  o.reader.format = LengthFormat::kCsv;
  StatusOr<Dataset> ds = LoadData(path, o);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ(ds->size(), 2u);
  EXPECT_EQ(ds->source(), path);
}

TEST(LoadDataTest, UnknownNamesListThePresets) {
  const StatusOr<Dataset> ds = LoadData("no-such-thing");
  EXPECT_EQ(ds.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(ds.status().message(), HasSubstr("no such file and no such preset"));
  EXPECT_THAT(ds.status().message(), HasSubstr("mixture-4task"));
  EXPECT_THAT(ds.status().message(), HasSubstr("flan-like"));
  EXPECT_FALSE(LoadData("").ok());
  DataOptions o;
  o.num_samples = -1;
  EXPECT_FALSE(LoadData("web", o).ok());
}

TEST(ListDataPresetsTest, RealDatasetsFirstThenGenerators) {
  const std::vector<DataPresetInfo> presets = ListDataPresets();
  std::vector<std::string> names;
  for (const DataPresetInfo& p : presets) {
    names.push_back(p.name);
    EXPECT_FALSE(p.description.empty());
  }
  EXPECT_THAT(names, ::testing::ElementsAre("mixture-4task", "man-summarize", "py-docstring",
                                            "py-file", "gcide-define", "web", "code", "web-code",
                                            "sft", "long-context", "flan-like"));
  EXPECT_EQ(presets.front().kind, DataPresetInfo::Kind::kRealDataset);
  EXPECT_EQ(presets.back().kind, DataPresetInfo::Kind::kGenerator);
  EXPECT_THAT(FormatDataPresets(), HasSubstr("real, default"));
}

}  // namespace
}  // namespace sluice
