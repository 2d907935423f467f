// Length statistics of a Dataset and their terminal rendering (`sluice data stats`).
//
// Percentiles are nearest-rank: pP is the smallest value v with at least P% of the values <= v,
// i.e. sorted[ceil(P * n / 100) - 1] (computed in integers). p50 is therefore the lower of the two
// middle values when n is even; data/lengths/README.md reports its statistics the same way.
// Histograms use power-of-two buckets [2^k, 2^(k+1)) plus a bucket for 0, from the smallest to the
// largest value present (empty buckets in between are shown).
//
// Thread safety: free functions over values.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/sample.h"

namespace sluice {

struct LengthStats {
  int64_t count = 0;
  int64_t sum = 0;
  double mean = 0;  // 0 when count == 0
  int64_t min = 0;
  int64_t p50 = 0;
  int64_t p90 = 0;
  int64_t p99 = 0;
  int64_t max = 0;
  friend bool operator==(const LengthStats&, const LengthStats&) = default;
};

struct HistogramBucket {
  int64_t lo = 0;  // inclusive
  int64_t hi = 0;  // inclusive: buckets are [0, 0], [1, 1], [2, 3], [4, 7], ...
  int64_t count = 0;
  friend bool operator==(const HistogramBucket&, const HistogramBucket&) = default;
};

struct TaskStats {
  std::string task;
  int64_t samples = 0;
  int64_t tokens = 0;
  LengthStats input;
  LengthStats target;
};

struct DataStats {
  std::string source;
  int64_t samples = 0;
  int64_t tokens = 0;  // input + target
  LengthStats input;
  LengthStats target;
  LengthStats total;  // of input_len + target_len per sample
  bool has_targets = false;
  std::vector<TaskStats> tasks;  // by task name
  std::vector<HistogramBucket> input_histogram;
  std::vector<HistogramBucket> target_histogram;  // empty when !has_targets
};

// The nearest-rank `percent` percentile of `sorted` (ascending). REQUIRES: !sorted.empty(),
// 0 < percent <= 100.
int64_t NearestRankPercentile(std::span<const int64_t> sorted, int percent);
// Count, sum, mean, min, p50, p90, p99, max of `values` (any order; sorted in place).
LengthStats ComputeLengthStats(std::vector<int64_t>& values);
// Power-of-two buckets of `values` (see the file comment); empty for no values.
std::vector<HistogramBucket> LogHistogram(std::span<const int64_t> values);

DataStats ComputeStats(const Dataset& dataset);

struct StatsFormatOptions {
  bool per_task = true;    // the per-task table (only when there are 2+ tasks)
  bool histograms = true;  // input (and target) length histograms
  int bar_width = 40;      // characters of the longest histogram bar
  bool unicode = false;    // bars of Unicode blocks with eighth steps instead of '#'
};

// A multi-line report: totals, a length table, per-task table, histograms. Ends with '\n'.
std::string FormatStats(const DataStats& stats, const StatsFormatOptions& options = {});
// One histogram, one line per bucket: range, count, percent, bar. `title` is the first line.
std::string FormatHistogram(std::span<const HistogramBucket> buckets, std::string_view title,
                            const StatsFormatOptions& options = {});

}  // namespace sluice
