// The Chrome trace, the terminal summary and the JSON document of a simulation.
#include "sim/summary.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "plan/plan_test_util.h"
#include "sim/chrome_trace.h"
#include "sim/sim_report.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

struct Simulated {
  std::unique_ptr<testing::PlanFixture> fixture;
  SimResult result;
};

Simulated SimulateFixture(int64_t dp, int64_t pp) {
  testing::PlanCase c;
  c.dp = dp;
  c.pp = pp;
  c.microbatches = 4;
  Simulated s;
  s.fixture = testing::MakePlanFixture(c);
  SimOptions options;
  options.samples = s.fixture->batch;
  StatusOr<SimResult> r = Simulate(s.fixture->plan, options);
  SLUICE_CHECK_MSG(r.ok(), r.status().ToString());
  s.result = *r;
  return s;
}

TEST(ChromeTraceTest, OneProcessPerRankOneThreadPerStreamAndEveryInterval) {
  const Simulated s = SimulateFixture(2, 2);
  const nlohmann::json trace = nlohmann::json::parse(ChromeTraceJson(s.fixture->plan, s.result));
  ASSERT_TRUE(trace.contains("traceEvents"));
  std::map<int64_t, std::string> processes;
  std::set<std::pair<int64_t, int64_t>> threads;
  std::set<std::pair<int64_t, int64_t>> used;
  int64_t complete = 0, critical = 0, counters = 0;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    const std::string ph = e["ph"];
    if (ph == "M" && e["name"] == "process_name")
      processes[e["pid"].get<int64_t>()] = e["args"]["name"];
    if (ph == "M" && e["name"] == "thread_name")
      threads.insert({e["pid"].get<int64_t>(), e["tid"].get<int64_t>()});
    if (ph == "C") ++counters;
    if (ph != "X") continue;
    ++complete;
    used.insert({e["pid"].get<int64_t>(), e["tid"].get<int64_t>()});
    ASSERT_TRUE(e["ts"].is_number());
    ASSERT_GE(e["dur"].get<double>(), 0.0);
    ASSERT_TRUE(e["args"].contains("microbatch") && e["args"].contains("stage") &&
                e["args"].contains("shapes") && e["args"].contains("bytes"));
    if (e["args"].contains("critical")) ++critical;
  }
  EXPECT_EQ(processes.size(), 4u);
  EXPECT_EQ(processes[3], "rank 3 (dp 1, pp 1)");
  EXPECT_EQ(complete, static_cast<int64_t>(s.result.timeline.size()));
  EXPECT_GE(critical, static_cast<int64_t>(s.result.critical_path.size()) / 2);
  EXPECT_GT(counters, 0);
  for (const auto& t : used) EXPECT_TRUE(threads.count(t)) << t.first << "/" << t.second;
  // A forward's event carries the instruction text and microseconds.
  const SimInterval& first = s.result.timeline.front();
  const Instruction& in = s.fixture->plan.ranks[first.rank].instructions[first.instruction];
  bool found = false;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (e["ph"] == "X" && e["pid"] == first.rank && e["name"] == InstructionText(in)) {
      EXPECT_NEAR(e["dur"].get<double>(), (first.end - first.start).micros(), 1e-3);
      found = true;
      break;
    }
  }
  EXPECT_TRUE(found);
}

TEST(SimSummaryTest, TableHasARowPerRankAndTheHeadline) {
  const Simulated s = SimulateFixture(2, 2);
  const std::string text = FormatSimSummary(s.fixture->plan, s.result);
  EXPECT_THAT(text, HasSubstr("outcome: ok"));
  EXPECT_THAT(text, HasSubstr("tokens/s"));
  EXPECT_THAT(text, HasSubstr("MFU"));
  EXPECT_THAT(text, HasSubstr("mean"));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("padded shapes")));
  int rows = 0;
  for (size_t at = 0; (at = text.find("\n    ", at)) != std::string::npos; ++at) ++rows;
  EXPECT_EQ(rows, 4);  // rank ids 0..3 right-aligned in 5 columns
}

TEST(SimSummaryTest, DeadlockAndOutOfMemoryAreProminent) {
  Simulated s = SimulateFixture(1, 2);
  s.result.outcome = SimOutcome::kDeadlock;
  s.result.blocked = {{1, 3, "1RECV_F0.wait: waits for ..."}};
  s.result.memory_exceeded = true;
  s.result.oom_rank = 0;
  s.result.oom_instruction = 1;
  const std::string text = FormatSimSummary(s.fixture->plan, s.result);
  EXPECT_EQ(text.rfind("DEADLOCK", 0), 0u);
  EXPECT_THAT(text, HasSubstr("rank 1 at instruction 3"));
  EXPECT_THAT(text, HasSubstr("exceeds the memory limit"));
}

TEST(SimResultJsonTest, DocumentHoldsTheFigures) {
  const Simulated s = SimulateFixture(2, 2);
  const nlohmann::json j = SimResultToJson(s.fixture->plan, s.result);
  EXPECT_EQ(j["format"], kSimResultFormat);
  EXPECT_EQ(j["outcome"], "ok");
  EXPECT_EQ(j["iteration_time_ns"], s.result.iteration_time.nanos());
  EXPECT_EQ(j["real_tokens"], s.result.real_tokens);
  ASSERT_EQ(j["ranks"].size(), 4u);
  EXPECT_EQ(j["ranks"][2]["dp"], 1);
  EXPECT_EQ(j["ranks"][2]["peak_memory_bytes"], s.result.ranks[2].peak_memory.count());
  EXPECT_EQ(j["critical_path"].size(), s.result.critical_path.size());
  EXPECT_EQ(j["stage_compute_ns"].size(), 2u);
  EXPECT_TRUE(j["blocked"].empty());
}

TEST(SimReportTest, ReportHasTheSectionsAndDrawsEveryRankOfASmallPlan) {
  const Simulated s = SimulateFixture(2, 2);
  const report::HtmlReport rep = BuildSimulationReport(s.fixture->plan, s.result);
  std::vector<std::string> headings;
  for (const report::Section& section : rep.sections) headings.push_back(section.heading);
  EXPECT_THAT(headings, ::testing::ElementsAre("Summary", "Pipeline timeline", "Memory over time",
                                               "Where time went"));
  const auto& timeline = std::get<report::Timeline>(rep.sections[1].blocks[0]);
  int compute_rows = 0;
  for (const report::TimelineRow& row : timeline.rows) {
    compute_rows += row.label.find("compute") != std::string::npos;
    for (const report::TimelineBar& bar : row.bars) EXPECT_LE(bar.start, bar.end);
  }
  EXPECT_EQ(compute_rows, 4);
  const auto& memory = std::get<report::LineChart>(rep.sections[2].blocks[0]);
  EXPECT_EQ(memory.series.size(), 4u);
  ASSERT_TRUE(memory.limit.has_value());
  EXPECT_DOUBLE_EQ(*memory.limit, s.fixture->plan.memory_limit().mb());
  const std::string html = report::RenderHtml(rep);
  EXPECT_THAT(html, HasSubstr("sluice-timeline"));
  EXPECT_THAT(html, HasSubstr("sluice-line-chart"));
}

TEST(SimReportTest, BigPlansDrawReplicaZeroOnlyAndSaySo) {
  const Simulated s = SimulateFixture(3, 8);
  const report::HtmlReport rep = BuildSimulationReport(s.fixture->plan, s.result);
  const report::Section& timeline = rep.sections[1];
  EXPECT_THAT(timeline.text, HasSubstr("replica 0 only"));
  int compute_rows = 0;
  for (const report::TimelineRow& row : std::get<report::Timeline>(timeline.blocks[0]).rows) {
    compute_rows += row.label.find("compute") != std::string::npos;
  }
  EXPECT_EQ(compute_rows, 8);
}

TEST(SimReportTest, DeadlockComesFirst) {
  Simulated s = SimulateFixture(1, 2);
  s.result.outcome = SimOutcome::kDeadlock;
  s.result.problem = "deadlock: 1 rank(s) cannot finish";
  s.result.blocked = {{1, 3, "1RECV_F0.wait: waits"}};
  const report::HtmlReport rep = BuildSimulationReport(s.fixture->plan, s.result);
  EXPECT_EQ(rep.sections[0].heading, "Deadlock");
}

}  // namespace
}  // namespace sluice
