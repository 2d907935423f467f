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

// An unsigned 64-bit value is shown as written (it used to wrap to -1), null as "null".
TEST(JsonObjectReaderTest, ShowsHugeUnsignedAndNullValuesAsWritten) {
  auto j = nlohmann::json::parse(R"({"u": 18446744073709551615, "n": null, "s": null})");
  JsonObjectReader r(j, "t.json");
  int64_t v = 0;
  EXPECT_EQ(r.OptionalInt("u", &v, 2, 64).message(),
            "t.json: field 'u': must be an integer in [2, 64], got 18446744073709551615");
  EXPECT_EQ(r.OptionalInt("n", &v, 2, 64).message(),
            "t.json: field 'n': must be an integer in [2, 64], got null");
  std::string s;
  EXPECT_EQ(r.OptionalString("s", &s).message(), "t.json: field 's': must be a string, got null");
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

// A value nested 100,000 deep used to crash every reader (the message dumped it recursively).
TEST(ParseJsonTest, DeepNestingIsRejectedWithoutRecursion) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  auto r = ParseJson(deep, "deep.json");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(),
              HasSubstr("deep.json: values nested deeper than 64 levels"));
  const std::string objects = "{\"a\":" + std::string(50000, '[') + std::string(50000, ']') + "}";
  EXPECT_FALSE(ParseJson(objects, "o.json").ok());
  // The limit itself is accepted.
  const std::string ok = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_TRUE(ParseJson(ok, "ok.json").ok()) << ParseJson(ok, "ok.json").status().message();
}

TEST(ParseJsonTest, DuplicateKeysAreRejectedNamingTheField) {
  auto r = ParseJson(R"({"model": {"layers": 2, "hidden": 8, "layers": 4}})", "m.json");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(),
              HasSubstr("m.json: field 'model.layers' is given twice"));
  // The same key in sibling objects is fine.
  EXPECT_TRUE(ParseJson(R"([{"a": 1}, {"a": 2}])", "s.json").ok());
  EXPECT_TRUE(ParseJson(R"({"x": {"a": 1}, "y": {"a": 2}})", "s.json").ok());
}

TEST(JsonPreviewTest, BoundedAndOneLevelDeep) {
  nlohmann::json deep = nlohmann::json::array();
  nlohmann::json* at = &deep;
  for (int i = 0; i < 1000; ++i) {
    at->push_back(nlohmann::json::array());
    at = &(*at)[0];
  }
  EXPECT_EQ(JsonPreview(deep), "[[...]]");
  EXPECT_EQ(JsonPreview(nlohmann::json::parse(R"({"a": 1, "b": [2]})")), R"({"a":1,"b":[...]})");
  EXPECT_EQ(JsonPreview(nlohmann::json(std::string(100, 'x')), 10), "\"xxxxxx...");
  // Errors of the object reader preview the value instead of dumping it.
  auto j = nlohmann::json::parse(R"({"name": [[[[1]]]]})");
  JsonObjectReader rd(j, "t.json");
  std::string name;
  EXPECT_THAT(rd.String("name", &name).message(), HasSubstr("[[...]]"));
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
