#include "base/json_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sluice {
namespace {

using ::testing::HasSubstr;

constexpr std::string_view kColors[] = {"red", "green"};

TEST(JsonObjectReaderTest, ReadsTypedFields) {
  auto j = nlohmann::json::parse(R"({"n": 4, "x": 2.5, "s": "hi", "b": true, "c": "red",
                                     "f": 3.0})");
  JsonObjectReader r(j, "t.json");
  int64_t n = 0, f = 0;
  double x = 0;
  std::string s, c;
  bool b = false;
  ASSERT_TRUE(r.Int("n", &n, 1, 10).ok());
  ASSERT_TRUE(r.OptionalInt("f", &f, 0, 10).ok());
  ASSERT_TRUE(r.Double("x", &x, 0, 10).ok());
  ASSERT_TRUE(r.String("s", &s).ok());
  ASSERT_TRUE(r.OptionalBool("b", &b).ok());
  ASSERT_TRUE(r.Enum("c", &c, kColors).ok());
  EXPECT_TRUE(r.Finish().ok());
  EXPECT_EQ(n, 4);
  EXPECT_EQ(f, 3);
  EXPECT_EQ(x, 2.5);
  EXPECT_EQ(s, "hi");
  EXPECT_TRUE(b);
  EXPECT_EQ(c, "red");
}

TEST(JsonObjectReaderTest, ErrorsNameFileFieldAndAllowed) {
  auto j = nlohmann::json::parse(R"({"n": -1, "c": "blue", "z": 1, "w": "str"})");
  JsonObjectReader r(j, "m.json", "device");
  int64_t n = 0;
  Status s = r.Int("n", &n, 1, 10);
  EXPECT_EQ(s.message(), "m.json: field 'device.n': must be an integer in [1, 10], got -1");
  std::string c;
  EXPECT_THAT(r.Enum("c", &c, kColors).message(),
              HasSubstr("must be one of 'red' or 'green', got \"blue\""));
  int64_t w = 0;
  EXPECT_THAT(r.OptionalInt("w", &w, 0, 5).message(), HasSubstr("got a string"));
  EXPECT_THAT(r.Int("missing", &n, 1, 2).message(), HasSubstr("'device.missing': is required"));
  Status fin = r.Finish();
  EXPECT_THAT(fin.message(), HasSubstr("field 'device.z': unknown key"));
  EXPECT_THAT(fin.message(), HasSubstr("'c', 'missing', 'n' or 'w'"));
}

TEST(JsonObjectReaderTest, RejectsFractionalInteger) {
  auto j = nlohmann::json::parse(R"({"n": 2.5})");
  JsonObjectReader r(j, "t.json");
  int64_t n = 0;
  EXPECT_FALSE(r.Int("n", &n, 0, 10).ok());
}

TEST(JsonObjectReaderTest, NonObject) {
  auto j = nlohmann::json::parse("[1,2]");
  JsonObjectReader r(j, "t.json");
  EXPECT_THAT(r.status().message(), HasSubstr("t.json: top level: expected a JSON object"));
  EXPECT_FALSE(r.Finish().ok());
}

TEST(ParseJsonTest, SyntaxErrorHasLineAndColumn) {
  auto r = ParseJson("{\n  \"a\": 1,\n  \"b\": }\n", "x.json");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("x.json:3:"));
}

TEST(ReadFileTest, MissingFileNamesPath) {
  auto r = ReadFileToString("/nonexistent/sluice.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("/nonexistent/sluice.json"));
}

// A folder opens as a stream and reads as "": it must be an error naming it, not an empty file.
TEST(ReadFileTest, FolderIsAnError) {
  auto r = ReadFileToString(::testing::TempDir());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("is a folder; expected a file"));
  EXPECT_FALSE(ReadJsonFile(::testing::TempDir()).ok());
}

}  // namespace
}  // namespace sluice
