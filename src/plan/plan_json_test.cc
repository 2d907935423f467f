#include "plan/plan_json.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <utility>

#include "base/json_util.h"
#include "plan/plan_test_util.h"
#include "plan/validate.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using testing::MakePlanFixture;
using testing::PlanCase;

std::vector<PlanCase> Cases() {
  std::vector<PlanCase> out;
  PlanCase a;
  a.pp = 4;
  a.dp = 2;
  a.kind = ScheduleKind::kZbH1;
  out.push_back(a);
  PlanCase b;
  b.encoder_decoder = true;
  b.pp = 2;
  b.vpp = 2;
  b.dp = 2;
  b.zero = 2;
  b.kind = ScheduleKind::kInterleaved;
  out.push_back(b);
  PlanCase c;
  c.pp = 1;
  c.kind = ScheduleKind::kGPipe;
  c.memory_limit_mb = 30000;
  out.push_back(c);
  return out;
}

TEST(PlanJsonTest, RoundTripsExactly) {
  for (const PlanCase& c : Cases()) {
    const auto f = MakePlanFixture(c);
    const std::string text = PlanToJsonText(f->plan);
    StatusOr<ExecutionPlan> back = PlanFromJsonText(text, "plan.json");
    ASSERT_TRUE(back.ok()) << back.status().message();
    EXPECT_EQ(*back, f->plan) << testing::Describe(c);
    EXPECT_EQ(PlanToJsonText(*back), text);
    StatusOr<ExecutionPlan> indented = PlanFromJsonText(PlanToJsonText(f->plan, 2), "plan.json");
    ASSERT_TRUE(indented.ok());
    EXPECT_EQ(*indented, f->plan);
    const std::vector<uint8_t> bin = PlanToMsgpack(f->plan);
    EXPECT_LT(bin.size(), text.size());
    StatusOr<ExecutionPlan> from_bin = PlanFromMsgpack(bin, "plan.msgpack");
    ASSERT_TRUE(from_bin.ok()) << from_bin.status().message();
    EXPECT_EQ(*from_bin, f->plan);
  }
}

// A varlen micro-batch's recorded segment lengths: written, read back exactly in both forms,
// checked by the validator; a plan without them (as written before them) still reads and passes.
TEST(PlanJsonTest, SegmentLengthsRoundTripAndAreChecked) {
  for (const PlanCase& c : {Cases()[0], Cases()[1]}) {
    const auto f = MakePlanFixture(c);
    ExecutionPlan plan = f->plan;
    ASSERT_TRUE(ValidatePlan(plan).ok());
    PlanMicroBatch& mb = plan.replicas[0].micro_batches[0];
    mb.varlen = true;
    for (const std::vector<int64_t>& row : mb.rows) {
      mb.seg_lens.emplace_back();
      if (c.encoder_decoder) mb.dec_seg_lens.emplace_back();
      for (int64_t id : row) {
        const Sample& s = *std::find_if(f->batch.begin(), f->batch.end(),
                                        [&](const Sample& x) { return x.id == id; });
        mb.seg_lens.back().push_back(c.encoder_decoder ? s.input_len : s.tokens());
        if (c.encoder_decoder) mb.dec_seg_lens.back().push_back(s.target_len);
      }
    }
    const Status valid = ValidatePlan(plan);
    ASSERT_TRUE(valid.ok()) << valid.message();
    const std::string text = PlanToJsonText(plan);
    EXPECT_THAT(text, HasSubstr("\"seg_lens\""));
    EXPECT_EQ(c.encoder_decoder, text.find("\"dec_seg_lens\"") != std::string::npos);
    StatusOr<ExecutionPlan> back = PlanFromJsonText(text, "plan.json");
    ASSERT_TRUE(back.ok()) << back.status().message();
    EXPECT_EQ(*back, plan);
    StatusOr<ExecutionPlan> from_bin = PlanFromMsgpack(PlanToMsgpack(plan), "plan.msgpack");
    ASSERT_TRUE(from_bin.ok()) << from_bin.status().message();
    EXPECT_EQ(*from_bin, plan);
    // Wrong counts, lengths, sums, and lengths on a padded micro-batch are refused by name.
    ExecutionPlan bad = plan;
    bad.replicas[0].micro_batches[0].seg_lens[0].push_back(1);
    EXPECT_THAT(ValidatePlan(bad).message(), HasSubstr("seg_lens[0] has"));
    bad = plan;
    bad.replicas[0].micro_batches[0].seg_lens[0][0] = bad.model.max_position + 1;
    EXPECT_THAT(ValidatePlan(bad).message(), HasSubstr("allowed: [1,"));
    bad.replicas[0].micro_batches[0].seg_lens[0][0] = 0;
    EXPECT_THAT(ValidatePlan(bad).message(), HasSubstr("allowed: [1,"));
    if (c.encoder_decoder) {  // a sample without a target has an empty decoder segment
      bad = plan;
      bad.replicas[0].micro_batches[0].dec_seg_lens[0][0] = 0;
      EXPECT_TRUE(ValidatePlan(bad).ok());
      StatusOr<ExecutionPlan> zero = PlanFromJsonText(PlanToJsonText(bad), "plan.json");
      ASSERT_TRUE(zero.ok()) << zero.status().message();
      EXPECT_EQ(*zero, bad);
      bad.replicas[0].micro_batches[0].dec_seg_lens[0][0] = -1;
      EXPECT_THAT(ValidatePlan(bad).message(), HasSubstr("allowed: [0,"));
    }
    bad = plan;
    bad.replicas[0].micro_batches[0].varlen = false;
    EXPECT_THAT(ValidatePlan(bad).message(), HasSubstr("not varlen"));
    if (c.encoder_decoder) {
      bad = plan;
      bad.replicas[0].micro_batches[0].dec_seg_lens.clear();
      EXPECT_THAT(ValidatePlan(bad).message(), HasSubstr("without dec_seg_lens"));
    }
    const std::string old_text = PlanToJsonText(f->plan);
    EXPECT_EQ(old_text.find("seg_lens"), std::string::npos);
  }
}

TEST(PlanJsonTest, DocumentNamesItsFormatAndCostModel) {
  PlanCase c;
  c.pp = 2;
  const auto f = MakePlanFixture(c);
  const nlohmann::json j = PlanToJson(f->plan);
  EXPECT_EQ(j["format"], "sluice-plan/1");
  EXPECT_EQ(j["cost_model"], f->setup->cost->Describe());
  const nlohmann::json& first = j["ranks"][0]["instructions"][0];
  EXPECT_EQ(first["op"], "load-input");
  EXPECT_EQ(first["mb"], 0);
  EXPECT_EQ(first["out"], nlohmann::json::array({0}));
  EXPECT_FALSE(first.contains("peer"));  // defaults are left out
  EXPECT_EQ(j["model_states_bytes"].size(), 2u);
}

TEST(PlanJsonTest, FilesInBothForms) {
  PlanCase c;
  c.pp = 2;
  c.dp = 2;
  const auto f = MakePlanFixture(c);
  const std::string dir = ::testing::TempDir();
  for (const std::string name : {"plan.json", "plan.msgpack"}) {
    const std::string path = dir + "/" + name;
    ASSERT_TRUE(WritePlanFile(f->plan, path).ok());
    StatusOr<ExecutionPlan> back = ReadPlanFile(path);
    ASSERT_TRUE(back.ok()) << back.status().message();
    EXPECT_EQ(*back, f->plan);
    EXPECT_TRUE(ValidatePlan(*back).ok());
    std::remove(path.c_str());
  }
  EXPECT_EQ(ReadPlanFile(dir + "/missing.json").status().code(), StatusCode::kNotFound);
}

// Files that are no plan at all say so (they used to read as a MessagePack document whose "top
// level must be an object"), and a folder is not read as an empty file.
TEST(PlanJsonTest, NonPlanFilesSayWhatIsAllowed) {
  const std::string dir = ::testing::TempDir();
  const std::string text = dir + "/not-a-plan.json", empty = dir + "/empty-plan.json";
  ASSERT_TRUE(WriteStringToFile(text, "not json").ok());
  ASSERT_TRUE(WriteStringToFile(empty, " \n").ok());
  for (const auto& [path, why] : {std::pair{text, "begins with neither"},
                                  std::pair{empty, "the file is empty"}}) {
    StatusOr<ExecutionPlan> r = ReadPlanFile(path);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr(path + ": not a plan file"));
    EXPECT_THAT(r.status().message(), HasSubstr(why));
    EXPECT_THAT(r.status().message(), HasSubstr("MessagePack (a map)"));
    std::remove(path.c_str());
  }
  StatusOr<ExecutionPlan> folder = ReadPlanFile(dir);
  ASSERT_FALSE(folder.ok());
  EXPECT_THAT(folder.status().message(), HasSubstr("is a folder"));
}

// A plan document with one change applied at a JSON pointer.
std::string Edited(const nlohmann::json& j, const std::string& pointer, const nlohmann::json& v) {
  nlohmann::json copy = j;
  copy[nlohmann::json::json_pointer(pointer)] = v;
  return copy.dump();
}

TEST(PlanJsonTest, ReaderIsStrictAndNamesTheField) {
  PlanCase c;
  c.pp = 2;
  const auto f = MakePlanFixture(c);
  const nlohmann::json j = PlanToJson(f->plan);
  auto error = [](const std::string& text) {
    return PlanFromJsonText(text, "p.json").status().message();
  };
  EXPECT_THAT(error(Edited(j, "/format", "sluice-plan/2")),
              HasSubstr("p.json: field 'format': this build reads 'sluice-plan/1'"));
  EXPECT_THAT(error(Edited(j, "/ranks/1/instructions/3/peer", "one")),
              HasSubstr("field 'ranks[1].instructions[3].peer': must be an integer"));
  EXPECT_THAT(error(Edited(j, "/ranks/0/instructions/2/colour", 1)),
              HasSubstr("field 'ranks[0].instructions[2].colour': unknown key"));
  EXPECT_THAT(error(Edited(j, "/ranks/0/instructions/2/op", "jump")),
              HasSubstr("field 'ranks[0].instructions[2].op': must be an op name"));
  EXPECT_THAT(error(Edited(j, "/ranks/0/instructions/1/rc", "none")),
              HasSubstr("omit it for 'none'"));
  EXPECT_THAT(error(Edited(j, "/replicas/0/micro_batches/1/stages/0/peak_bytes", -5)),
              HasSubstr("field 'replicas[0].micro_batches[1].stages[0].peak_bytes'"));
  EXPECT_THAT(error(Edited(j, "/replicas/0/micro_batches/1/recompute", "most")),
              HasSubstr("field 'replicas[0].micro_batches[1].recompute'"));
  EXPECT_THAT(error(Edited(j, "/extra", true)), HasSubstr("extra"));
  EXPECT_THAT(error(Edited(j, "/parallel/pp", 0)), HasSubstr("p.json (parallel)"));
  nlohmann::json no_ranks = j;
  no_ranks.erase("ranks");
  EXPECT_THAT(error(no_ranks.dump()), HasSubstr("field 'ranks': is required"));
  EXPECT_THAT(error("{\"format\": "), HasSubstr("p.json"));
  EXPECT_THAT(PlanFromMsgpack(std::vector<uint8_t>{0xc1}, "p.msgpack").status().message(),
              HasSubstr("p.msgpack: field '(top level)': must be an object"));
}

// The MessagePack reader is as strict as the JSON one, and reads nlohmann's encoding too.
TEST(PlanJsonTest, MsgpackReaderIsStrict) {
  PlanCase c;
  c.pp = 2;
  c.dp = 2;
  const auto f = MakePlanFixture(c);
  const nlohmann::json j = PlanToJson(f->plan);
  StatusOr<ExecutionPlan> generic = PlanFromMsgpack(nlohmann::json::to_msgpack(j), "n.msgpack");
  ASSERT_TRUE(generic.ok()) << generic.status().message();
  EXPECT_EQ(*generic, f->plan);
  // Our encoding decodes to the same document with a generic reader.
  EXPECT_EQ(nlohmann::json::from_msgpack(PlanToMsgpack(f->plan)), j);
  auto error = [&](const std::string& pointer, const nlohmann::json& v) {
    nlohmann::json copy = j;
    copy[nlohmann::json::json_pointer(pointer)] = v;
    return PlanFromMsgpack(nlohmann::json::to_msgpack(copy), "b.msgpack").status().message();
  };
  EXPECT_THAT(error("/ranks/3/instructions/4/tag", -1),
              HasSubstr("b.msgpack: field 'ranks[3].instructions[4].tag': must be an integer"));
  EXPECT_THAT(error("/ranks/0/instructions/0/x", 1),
              HasSubstr("field 'ranks[0].instructions[0].x': unknown key"));
  EXPECT_THAT(error("/replicas/1/micro_batches/0/stages/1/forward_ns", 0.5),
              HasSubstr("field 'replicas[1].micro_batches[0].stages[1].forward_ns'"));
  EXPECT_THAT(error("/format", "sluice-plan/9"), HasSubstr("this build reads 'sluice-plan/1'"));
  EXPECT_THAT(error("/model/layers", 0), HasSubstr("b.msgpack (model)"));
  nlohmann::json no_method = j;
  no_method.erase("method");
  EXPECT_THAT(PlanFromMsgpack(nlohmann::json::to_msgpack(no_method), "b").status().message(),
              HasSubstr("field 'method': is required"));
  // A key given twice: at the top level, inside a micro-batch, and inside the embedded model
  // (decoded by nlohmann, which would keep the last silently).
  std::vector<uint8_t> twice = PlanToMsgpack(f->plan);
  ASSERT_EQ(twice[0], 0x8b);  // fixmap of 11 keys: make it 12, the last one "method" again
  twice[0] = 0x8c;
  for (uint8_t c : std::string("\xa6method\xa1x")) twice.push_back(c);
  EXPECT_THAT(PlanFromMsgpack(twice, "d.msgpack").status().message(),
              HasSubstr("d.msgpack: field 'method': is given twice"));
  nlohmann::json model_twice = j;
  model_twice["model"]["zz_layers"] = 1;  // encoded last; renamed to a duplicate below
  const std::vector<uint8_t> encoded = nlohmann::json::to_msgpack(model_twice);
  std::string text(encoded.begin(), encoded.end());
  const size_t at = text.find("\xa9zz_layers");
  ASSERT_NE(at, std::string::npos);
  // Map headers count entries, not bytes: the key can shrink in place.
  text.replace(at, 10, "\xa6layers");
  const std::vector<uint8_t> bytes(text.begin(), text.end());
  EXPECT_THAT(PlanFromMsgpack(bytes, "m.msgpack").status().message(),
              HasSubstr("m.msgpack: field 'model': key 'layers' is given twice"));
  std::vector<uint8_t> cut = PlanToMsgpack(f->plan);
  cut.resize(cut.size() / 2);
  EXPECT_FALSE(PlanFromMsgpack(cut, "cut").ok());
  std::vector<uint8_t> longer = PlanToMsgpack(f->plan);
  longer.push_back(0);
  EXPECT_THAT(PlanFromMsgpack(longer, "long").status().message(),
              HasSubstr("long: not a valid MessagePack document"));
}

}  // namespace
}  // namespace sluice
