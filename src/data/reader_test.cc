#include "data/reader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "base/json_util.h"
#include "base/paths.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

StatusOr<Dataset> Parse(std::string_view text, LengthFormat format,
                        const ReaderOptions& options = {}) {
  return ParseLengths(text, format, options, "in.x");
}

// The message of a failed parse (empty when it unexpectedly succeeded).
std::string Error(std::string_view text, LengthFormat format, const ReaderOptions& options = {}) {
  StatusOr<Dataset> ds = Parse(text, format, options);
  if (ds.ok()) return "";
  EXPECT_EQ(ds.status().code(), StatusCode::kInvalidArgument);
  return ds.status().message();
}

std::vector<Sample> Samples(const StatusOr<Dataset>& ds) {
  EXPECT_TRUE(ds.ok()) << ds.status().ToString();
  return ds.ok() ? ds->samples() : std::vector<Sample>{};
}

// --- text -----------------------------------------------------------------------------------

TEST(TextReaderTest, OneOrTwoColumnsCommentsBlankLinesCrlf) {
  const auto ds = Parse("512\n128 64\n\n# a comment\n  7\t3 \r\n\n9.0 0.00\n", LengthFormat::kText);
  EXPECT_THAT(Samples(ds), ElementsAre(Sample{0, 512, 0, 0}, Sample{1, 128, 64, 0},
                                       Sample{2, 7, 3, 0}, Sample{3, 9, 0, 0}));
  EXPECT_THAT(ds->task_names(), ElementsAre("default"));
  EXPECT_EQ(ds->source(), "in.x");
}

TEST(TextReaderTest, DefaultTaskIsConfigurable) {
  ReaderOptions o;
  o.default_task = "web";
  EXPECT_THAT(Parse("5\n", LengthFormat::kText, o)->task_names(), ElementsAre("web"));
}

TEST(TextReaderTest, ErrorsNameFileLineAndExpectation) {
  EXPECT_EQ(Error("12\nabc\n", LengthFormat::kText),
            "in.x:2: input length: expected a non-negative integer, got 'abc'");
  EXPECT_EQ(Error("-5\n", LengthFormat::kText),
            "in.x:1: input length: a length must be >= 0, got '-5'");
  EXPECT_EQ(Error("5 1.5\n", LengthFormat::kText),
            "in.x:1: target length: expected a non-negative integer, got '1.5'");
  EXPECT_THAT(Error("1\n\n1 2 3\n", LengthFormat::kText),
              StartsWith("in.x:3: expected 'INPUT' or 'INPUT TARGET'"));
  EXPECT_THAT(Error("99999999999999999999\n", LengthFormat::kText),
              StartsWith("in.x:1: input length: a length must be at most 2147483647"));
  EXPECT_THAT(Error("2147483648\n", LengthFormat::kText), HasSubstr("at most 2147483647"));
  EXPECT_THAT(Error("0 0\n", LengthFormat::kText), StartsWith("in.x:1: empty sample"));
  EXPECT_THAT(Error("", LengthFormat::kText), StartsWith("in.x: no samples"));
  EXPECT_THAT(Error("\n# only a comment\n", LengthFormat::kText), StartsWith("in.x: no samples"));
  EXPECT_THAT(Error("+5\n", LengthFormat::kText), HasSubstr("got '+5'"));
  EXPECT_THAT(Error("5.\n", LengthFormat::kText), HasSubstr("got '5.'"));
  EXPECT_THAT(Error(".0\n", LengthFormat::kText), HasSubstr("got '.0'"));
  EXPECT_THAT(Error("-3.0\n", LengthFormat::kText), HasSubstr("a length must be >= 0, got '-3.0'"));
}

// --- JSON Lines ----------------------------------------------------------------------------

TEST(JsonLinesReaderTest, ReadsFieldsAndIgnoresOthers) {
  const auto ds = Parse(
      "{\"input_len\": 104, \"target_len\": 133, \"task\": \"py-docstring\"}\n"
      "\n"
      "{\"task\": \"py-file\", \"input_len\": 479, \"target_len\": 0, \"x\": [1, {\"a\": "
      "\"b\"}]}\r\n"
      "{\"input_len\": 9}\n"
      "{\"input_len\": 8, \"target_len\": null, \"task\": null, \"score\": 0.5}\n"
      "{\"input_len\": 12.0, \"target_len\": 1e1}\n",
      LengthFormat::kJsonLines);
  EXPECT_THAT(Samples(ds),
              ElementsAre(Sample{0, 104, 133, 0}, Sample{1, 479, 0, 1}, Sample{2, 9, 0, 2},
                          Sample{3, 8, 0, 2}, Sample{4, 12, 10, 2}));
  EXPECT_THAT(ds->task_names(), ElementsAre("py-docstring", "py-file", "default"));
}

TEST(JsonLinesReaderTest, NestedKeysWithTheFieldNameAreIgnored) {
  const auto ds =
      Parse("{\"meta\": {\"input_len\": -1}, \"input_len\": 3}\n", LengthFormat::kJsonLines);
  EXPECT_THAT(Samples(ds), ElementsAre(Sample{0, 3, 0, 0}));
}

TEST(JsonLinesReaderTest, FieldNamesAreConfigurable) {
  ReaderOptions o;
  o.input_field = "src";
  o.target_field = "tgt";
  o.task_field = "";
  const auto ds = Parse("{\"src\": 5, \"tgt\": 6, \"task\": 7}\n", LengthFormat::kJsonLines, o);
  EXPECT_THAT(Samples(ds), ElementsAre(Sample{0, 5, 6, 0}));
}

TEST(JsonLinesReaderTest, ByteOrderMarkIsSkipped) {
  EXPECT_THAT(Samples(Parse("\xEF\xBB\xBF{\"input_len\": 5}\n", LengthFormat::kJsonLines)),
              ElementsAre(Sample{0, 5, 0, 0}));
}

TEST(JsonLinesReaderTest, CustomOptionalFieldsMustOccurSomewhere) {
  ReaderOptions o;
  o.target_field = "tgt";
  EXPECT_EQ(
      Error("{\"input_len\": 5}\n{\"input_len\": 6, \"target\": 1}\n", LengthFormat::kJsonLines, o),
      "in.x: field 'tgt' (the configured target field) is on no line");
  EXPECT_TRUE(
      Parse("{\"input_len\": 5}\n{\"input_len\": 6, \"tgt\": null}\n", LengthFormat::kJsonLines, o)
          .ok());
  o = {};
  o.task_field = "kind";
  EXPECT_EQ(Error("{\"input_len\": 5}\n", LengthFormat::kJsonLines, o),
            "in.x: field 'kind' (the configured task field) is on no line");
}

TEST(JsonLinesReaderTest, ErrorsNameFileLineAndExpectation) {
  const LengthFormat j = LengthFormat::kJsonLines;
  EXPECT_EQ(Error("{\"input_len\": 1}\n{\"target_len\": 4}\n", j),
            "in.x:2: missing field 'input_len' (the input length; rename the field, or name it "
            "with `sluice data stats --input-field`)");
  EXPECT_EQ(Error("{\"input_len\": -3}\n", j),
            "in.x:1: field 'input_len': a length must be >= 0, got -3");
  EXPECT_EQ(Error("{\"input_len\": 12.5}\n", j),
            "in.x:1: field 'input_len': expected a non-negative integer, got the number '12.5'");
  EXPECT_EQ(Error("{\"input_len\": -2.0}\n", j),
            "in.x:1: field 'input_len': a length must be >= 0, got '-2.0'");
  EXPECT_EQ(Error("{\"input_len\": 1e300}\n", j),
            "in.x:1: field 'input_len': a length must be at most 2147483647, got '1e300'");
  EXPECT_EQ(Error("{\"input_len\": \"12\"}\n", j),
            "in.x:1: field 'input_len': expected a non-negative integer, got the string '12'");
  EXPECT_EQ(Error("{\"input_len\": 5, \"target_len\": true}\n", j),
            "in.x:1: field 'target_len': expected a non-negative integer, got true");
  EXPECT_EQ(Error("{\"input_len\": null}\n", j),
            "in.x:1: field 'input_len': expected a non-negative integer, got null");
  EXPECT_EQ(Error("{\"input_len\": [5]}\n", j),
            "in.x:1: field 'input_len': expected a non-negative integer, got an array");
  EXPECT_EQ(Error("{\"input_len\": 5, \"task\": 3}\n", j),
            "in.x:1: field 'task': expected a string, got the number 3");
  EXPECT_EQ(Error("{\"input_len\": 5, \"task\": \"\"}\n", j),
            "in.x:1: field 'task': a task name must not be empty");
  EXPECT_EQ(Error("{\"input_len\": 5, \"input_len\": 6}\n", j),
            "in.x:1: field 'input_len': duplicate field");
  EXPECT_EQ(Error("{\"input_len\": 3000000000}\n", j),
            "in.x:1: field 'input_len': a length must be at most 2147483647, got 3000000000");
  EXPECT_THAT(Error("[1, 2]\n", j), StartsWith("in.x:1: expected a JSON object like"));
  EXPECT_THAT(Error("42\n", j), StartsWith("in.x:1: expected a JSON object like"));
  EXPECT_THAT(Error("{\"input_len\": 1}\n{\"input_len\": 2,}\n", j),
              StartsWith("in.x:2:17: not valid JSON (syntax error"));
  EXPECT_THAT(Error("{\"input_len\": 1} {}\n", j), StartsWith("in.x:1:18: not valid JSON"));
  EXPECT_THAT(Error("{\"input_len\": 0}\n", j), StartsWith("in.x:1: empty sample"));
  EXPECT_THAT(Error("\n\n", j), StartsWith("in.x: no samples"));
}

// --- CSV ---------------------------------------------------------------------------------------

TEST(CsvReaderTest, HeaderColumnsQuotingAndExtraColumns) {
  const auto ds = Parse(
      "id,task,input_len,target_len\n"
      "a,\"sum, short\",100,5\n"
      "\n"
      "b, qa ,7,\r\n"
      "c,,8,2\n"
      "\"d\",\"say \"\"hi\"\"\" , 9 ,1\n",
      LengthFormat::kCsv);
  EXPECT_THAT(Samples(ds), ElementsAre(Sample{0, 100, 5, 0}, Sample{1, 7, 0, 1}, Sample{2, 8, 2, 2},
                                       Sample{3, 9, 1, 3}));
  EXPECT_THAT(ds->task_names(), ElementsAre("sum, short", "qa", "default", "say \"hi\""));
}

TEST(CsvReaderTest, OptionalColumnsMayBeAbsentAndNamesConfigured) {
  ReaderOptions o;
  o.input_field = "tokens";
  const auto ds = Parse("tokens\n5\n6\n", LengthFormat::kCsv, o);
  EXPECT_THAT(Samples(ds), ElementsAre(Sample{0, 5, 0, 0}, Sample{1, 6, 0, 0}));
}

TEST(CsvReaderTest, ErrorsNameFileLineAndExpectation) {
  const LengthFormat c = LengthFormat::kCsv;
  EXPECT_EQ(Error("len,task\n5,a\n", c),
            "in.x:1: header: no column 'input_len' (the input length); the header has 'len', "
            "'task'; rename the column, or name it with `sluice data stats --input-field`");
  EXPECT_EQ(Error("input_len,target_len\n5,1\n5\n", c),
            "in.x:3: expected 2 fields as in the header, got 1");
  EXPECT_EQ(Error("input_len,target_len\n5,x\n", c),
            "in.x:2: column 'target_len': expected a non-negative integer, got 'x'");
  EXPECT_EQ(Error("input_len\n-2\n", c),
            "in.x:2: column 'input_len': a length must be >= 0, got '-2'");
  EXPECT_EQ(Error("input_len,task\n,a\n", c),
            "in.x:2: column 'input_len': missing the input length");
  EXPECT_THAT(Error("input_len,task\n5,\"abc\n", c),
              StartsWith("in.x:2: field 2: unterminated quoted field"));
  EXPECT_THAT(Error("input_len,task\n5,\"a\"b\n", c),
              StartsWith("in.x:2: field 2: expected ',' after a closing quote"));
  EXPECT_THAT(Error("input_len,task\n5,a\"b\n", c), StartsWith("in.x:2: field 2: a quote inside"));
  ReaderOptions o;
  o.task_field = "kind";
  EXPECT_EQ(Error("input_len,task\n5,a\n", c, o),
            "in.x:1: header: no column 'kind' (the configured task column); the header has "
            "'input_len', 'task'");
  EXPECT_EQ(Error("input_len,input_len\n5,5\n", c),
            "in.x:1: header: column 'input_len' appears twice");
  EXPECT_THAT(Error("", c), StartsWith("in.x: empty file: expected a header row"));
  EXPECT_THAT(Error("input_len,target_len\n", c), StartsWith("in.x: no samples"));
}

// --- formats and files -----------------------------------------------------------------------

TEST(LengthFormatTest, NamesExtensionsAndOverride) {
  EXPECT_EQ(*LengthFormatFromPath("a/b.txt"), LengthFormat::kText);
  EXPECT_EQ(*LengthFormatFromPath("b.jsonl"), LengthFormat::kJsonLines);
  EXPECT_EQ(*LengthFormatFromPath("b.csv"), LengthFormat::kCsv);
  EXPECT_THAT(LengthFormatFromPath("b.dat").status().message(),
              HasSubstr("cannot tell the format from the extension"));
  EXPECT_EQ(*ParseLengthFormat("jsonl"), LengthFormat::kJsonLines);
  EXPECT_EQ(LengthFormatName(LengthFormat::kCsv), "csv");
  EXPECT_THAT(ParseLengthFormat("xml").status().message(),
              HasSubstr("allowed: 'auto', 'text', 'jsonl' or 'csv'"));
  EXPECT_THAT(Error("5\n", LengthFormat::kAuto), HasSubstr("the format must be given"));
}

TEST(ReadLengthsFileTest, ReadsByExtensionOrExplicitFormat) {
  const std::string dir = ::testing::TempDir();
  ASSERT_TRUE(WriteStringToFile(dir + "/lens.txt", "3\n4 5\n").ok());
  auto ds = ReadLengthsFile(dir + "/lens.txt");
  EXPECT_THAT(Samples(ds), ElementsAre(Sample{0, 3, 0, 0}, Sample{1, 4, 5, 0}));
  EXPECT_EQ(ds->source(), dir + "/lens.txt");

  ASSERT_TRUE(WriteStringToFile(dir + "/lens.dat", "input_len\n7\n").ok());
  EXPECT_FALSE(ReadLengthsFile(dir + "/lens.dat").ok());
  ReaderOptions o;
  o.format = LengthFormat::kCsv;
  EXPECT_THAT(Samples(ReadLengthsFile(dir + "/lens.dat", o)), ElementsAre(Sample{0, 7, 0, 0}));

  ASSERT_TRUE(
      WriteStringToFile(dir + "/bad.jsonl", "{\"input_len\": 1}\n{\"input_len\": -1}\n").ok());
  EXPECT_EQ(ReadLengthsFile(dir + "/bad.jsonl").status().message(),
            dir + "/bad.jsonl:2: field 'input_len': a length must be >= 0, got -1");

  EXPECT_EQ(ReadLengthsFile(dir + "/missing.txt").status().code(), StatusCode::kNotFound);
}

TEST(ReadLengthsFileTest, ReadsTheShippedMixture) {
  auto ds =
      ReadLengthsFile(std::string(SLUICE_TEST_SOURCE_DIR) + "/data/lengths/mixture-4task.jsonl");
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ(ds->size(), 30000u);
  EXPECT_EQ(ds->num_tasks(), 4);
  EXPECT_EQ((*ds)[0], (Sample{0, 104, 133, ds->FindTask("py-docstring")}));
  EXPECT_TRUE(ds->Validate().ok());
  // Same as the copy in the shared folder it came from, where that folder exists.
  const std::string shared_path =
      std::string(SLUICE_TEST_SHARED_DIR) + "/data/lengths/mixture-4task.jsonl";
  if (!FileExists(shared_path)) GTEST_SKIP() << shared_path << " is not here";
  auto shared = ReadLengthsFile(shared_path);
  ASSERT_TRUE(shared.ok()) << shared.status().ToString();
  EXPECT_EQ(shared->samples(), ds->samples());
}

}  // namespace
}  // namespace sluice
