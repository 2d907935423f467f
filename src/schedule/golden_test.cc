// Golden compute-only CSV files of every schedule for a small fixed case, under
// tests/golden/schedules/<name>_pp<p>_vpp<v>_m<m>.csv. Regenerate them (after checking that a
// change is intended) with: SLUICE_UPDATE_GOLDEN=1 ./build/src/schedule/schedule_test
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "schedule/generators.h"
#include "schedule/schedule_csv.h"
#include "schedule/test_util.h"

namespace sluice {
namespace {

struct GoldenCase {
  ScheduleKind kind;
  int64_t pp;
  int64_t vpp;
  int64_t m;
};

constexpr GoldenCase kCases[] = {
    {ScheduleKind::kGPipe, 4, 1, 6},       {ScheduleKind::k1F1B, 4, 1, 6},
    {ScheduleKind::kInterleaved, 4, 1, 6}, {ScheduleKind::kInterleaved, 4, 2, 6},
    {ScheduleKind::kZbH1, 4, 1, 6},        {ScheduleKind::kAdaptive, 4, 1, 6},
    {ScheduleKind::kAdaptive, 4, 2, 6},
};

bool UpdateGolden() {
  const char* v = std::getenv("SLUICE_UPDATE_GOLDEN");
  return v != nullptr && std::string(v) == "1";
}

TEST(GoldenScheduleTest, CsvMatchesTheCheckedInFile) {
  for (const GoldenCase& g : kCases) {
    // Seeded, non-uniform micro-batches (testing::RandomCosts draws through the portable Rng).
    const ScheduleCosts costs = testing::RandomCosts(2024, g.pp, g.vpp, g.m);
    StatusOr<ScheduleResult> r = GenerateSchedule(g.kind, costs);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->outcome, PlanOutcome::kOk);
    const std::string csv = ScheduleToCsv(r->schedule);
    const std::string file = std::string(ScheduleKindName(g.kind)) + "_pp" + std::to_string(g.pp) +
                             "_vpp" + std::to_string(g.vpp) + "_m" + std::to_string(g.m) + ".csv";
    const std::string path = testing::GoldenPath(file);
    if (UpdateGolden()) {
      std::ofstream out(path, std::ios::binary);
      out << csv;
      ASSERT_TRUE(out.good()) << "cannot write " << path;
      continue;
    }
    std::ifstream in(path, std::ios::binary);
    ASSERT_TRUE(in.good()) << path << " is missing; run with SLUICE_UPDATE_GOLDEN=1 to create it";
    std::stringstream want;
    want << in.rdbuf();
    EXPECT_EQ(csv, want.str()) << file << " differs; if the change is intended, regenerate with "
                               << "SLUICE_UPDATE_GOLDEN=1";
    // The file reads back into the same schedule.
    StatusOr<Schedule> back = ScheduleFromCsv(want.str(), path, r->schedule.name);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, r->schedule) << file;
  }
}

}  // namespace
}  // namespace sluice
