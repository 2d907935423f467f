#include "data/stats.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "data/data_source.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(StatsTest, NearestRankPercentiles) {
  const std::vector<int64_t> v = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_EQ(NearestRankPercentile(v, 50), 5);  // the lower middle value for even n
  EXPECT_EQ(NearestRankPercentile(v, 90), 9);
  EXPECT_EQ(NearestRankPercentile(v, 91), 10);
  EXPECT_EQ(NearestRankPercentile(v, 99), 10);
  EXPECT_EQ(NearestRankPercentile(v, 100), 10);
  EXPECT_EQ(NearestRankPercentile(std::vector<int64_t>{7}, 1), 7);
  std::vector<int64_t> w = {9, 1, 5};
  const LengthStats s = ComputeLengthStats(w);
  EXPECT_EQ(s, (LengthStats{3, 15, 5.0, 1, 5, 9, 9, 9}));
  std::vector<int64_t> none;
  EXPECT_EQ(ComputeLengthStats(none), LengthStats{});
}

TEST(StatsTest, LogHistogramBuckets) {
  const std::vector<int64_t> v = {0, 0, 1, 2, 3, 4, 9, 1024};
  const std::vector<HistogramBucket> h = LogHistogram(v);
  ASSERT_EQ(h.size(), 12u);  // 0, 1, 2-3, ..., 1024-2047
  EXPECT_EQ(h[0], (HistogramBucket{0, 0, 2}));
  EXPECT_EQ(h[1], (HistogramBucket{1, 1, 1}));
  EXPECT_EQ(h[2], (HistogramBucket{2, 3, 2}));
  EXPECT_EQ(h[3], (HistogramBucket{4, 7, 1}));
  EXPECT_EQ(h[4], (HistogramBucket{8, 15, 1}));
  EXPECT_EQ(h[5], (HistogramBucket{16, 31, 0}));
  EXPECT_EQ(h[11], (HistogramBucket{1024, 2047, 1}));
  EXPECT_THAT(LogHistogram(std::vector<int64_t>{100, 120}),
              ElementsAre(HistogramBucket{64, 127, 2}));
  EXPECT_TRUE(LogHistogram({}).empty());
}

// data/lengths/README.md, "Statistics": n, input mean/median/p90/p99/max, target
// mean/median/p99/max.
struct ReadmeRow {
  std::string_view name;
  int64_t n;
  double in_mean;
  int64_t in_p50, in_p90, in_p99, in_max;
  double tg_mean;
  int64_t tg_p50, tg_p99, tg_max;
};

TEST(StatsTest, ReproducesTheSharedReadmeTable) {
  const ReadmeRow rows[] = {
      {"man-summarize", 3075, 678.8, 169, 1280, 8860, 89358, 7.5, 7, 19, 66},
      {"py-docstring", 20000, 310.4, 138, 727, 2654, 13311, 165.8, 58, 1582, 9783},
      {"py-file", 8175, 7909.5, 2678, 18685, 74579, 989348, 0.0, 0, 0, 0},
      {"gcide-define", 20000, 33.6, 21, 61, 232, 1238, 91.9, 38, 821, 7321},
      {"mixture-4task", 30000, 1406.7, 70, 2051, 25868, 989348, 100.9, 29, 1131, 7321},
  };
  for (const ReadmeRow& row : rows) {
    SCOPED_TRACE(row.name);
    StatusOr<Dataset> ds = LoadData(row.name);
    ASSERT_TRUE(ds.ok()) << ds.status().ToString();
    const DataStats s = ComputeStats(*ds);
    EXPECT_EQ(s.samples, row.n);
    EXPECT_NEAR(s.input.mean, row.in_mean, 0.05);
    EXPECT_EQ(s.input.p50, row.in_p50);
    EXPECT_EQ(s.input.p90, row.in_p90);
    EXPECT_EQ(s.input.p99, row.in_p99);
    EXPECT_EQ(s.input.max, row.in_max);
    EXPECT_NEAR(s.target.mean, row.tg_mean, 0.05);
    EXPECT_EQ(s.target.p50, row.tg_p50);
    EXPECT_EQ(s.target.p99, row.tg_p99);
    EXPECT_EQ(s.target.max, row.tg_max);
  }
}

TEST(StatsTest, PerTaskStatsOfTheMixture) {
  const DataStats s = ComputeStats(*LoadData("mixture-4task"));
  std::vector<std::pair<std::string, int64_t>> counts;
  int64_t tokens = 0;
  for (const TaskStats& t : s.tasks) {
    counts.emplace_back(t.task, t.samples);
    tokens += t.tokens;
  }
  // README: 1,800 man-summarize, 11,707 py-docstring, 4,786 py-file, 11,707 gcide-define.
  EXPECT_THAT(counts, ElementsAre(std::pair<std::string, int64_t>{"gcide-define", 11707},
                                  std::pair<std::string, int64_t>{"man-summarize", 1800},
                                  std::pair<std::string, int64_t>{"py-docstring", 11707},
                                  std::pair<std::string, int64_t>{"py-file", 4786}));
  EXPECT_EQ(tokens, s.tokens);
  EXPECT_EQ(s.tokens, s.input.sum + s.target.sum);
  EXPECT_EQ(s.tasks[3].target.max, 0);
}

TEST(StatsTest, FormatShowsTablesAndAlignedHistograms) {
  const std::string out = FormatStats(ComputeStats(*LoadData("mixture-4task")));
  EXPECT_THAT(out, HasSubstr("mixture-4task: 30,000 samples, 4 tasks, 45,229,510 tokens"));
  EXPECT_THAT(out, HasSubstr("input     42,201,403    1406.7       2      70    2051   25868"
                             "    989348\n"));
  EXPECT_THAT(out, HasSubstr("target     3,028,107     100.9       0      29     249    1131"));
  EXPECT_THAT(out, HasSubstr("py-file"));
  EXPECT_THAT(out, HasSubstr("input length (tokens), power-of-two buckets:"));
  EXPECT_THAT(out, HasSubstr("\n  524,288 - 1,048,575      1    0.0%  #\n"));
  // Every histogram line of a block has the bar column at the same place.
  const size_t start = out.find("input length (tokens)");
  const size_t end = out.find("\n\n", start);
  std::vector<size_t> bar_columns;
  size_t pos = out.find('\n', start) + 1;
  while (pos < end) {
    const size_t eol = out.find('\n', pos);
    bar_columns.push_back(out.find('%', pos) - pos);
    pos = eol + 1;
  }
  ASSERT_GT(bar_columns.size(), 10u);
  for (size_t c : bar_columns) EXPECT_EQ(c, bar_columns.front());
}

TEST(StatsTest, HistogramBarsScaleToTheLargestBucket) {
  const std::vector<HistogramBucket> h = {{1, 1, 10}, {2, 3, 5}, {4, 7, 0}, {8, 15, 1}};
  StatsFormatOptions o;
  o.bar_width = 10;
  EXPECT_EQ(FormatHistogram(h, "t", o),
            "t\n"
            "       1  10   62.5%  ##########\n"
            "   2 - 3   5   31.2%  #####\n"
            "   4 - 7   0    0.0%  \n"
            "  8 - 15   1    6.2%  #\n");
  o.unicode = true;
  EXPECT_EQ(FormatHistogram(h, "t", o),
            "t\n"
            "       1  10   62.5%  ██████████\n"
            "   2 - 3   5   31.2%  █████\n"
            "   4 - 7   0    0.0%  \n"
            "  8 - 15   1    6.2%  █\n");
  o.bar_width = 3;
  EXPECT_THAT(FormatHistogram(h, "t", o), HasSubstr("  5   31.2%  █▌\n"));
}

TEST(StatsTest, DecoderOnlyDataHasNoTargetSections) {
  DataOptions o;
  o.num_samples = 500;
  const std::string out = FormatStats(ComputeStats(*LoadData("web", o)));
  EXPECT_THAT(out, HasSubstr("web: 500 samples, 1 task,"));
  EXPECT_EQ(out.find("target length"), std::string::npos);
  EXPECT_EQ(out.find("\ntarget "), std::string::npos);
}

}  // namespace
}  // namespace sluice
