#include "data/stats.h"

#include <fmt/core.h>

#include <algorithm>
#include <bit>

#include "base/numbers.h"
#include "base/status.h"

namespace sluice {
namespace {

// The bucket index of a length: 0 for 0, 1 + floor(log2(v)) otherwise.
int BucketOf(int64_t v) {
  if (v <= 0) return 0;
  return std::bit_width(static_cast<uint64_t>(v));
}

int64_t BucketLo(int b) { return b == 0 ? 0 : int64_t{1} << (b - 1); }
int64_t BucketHi(int b) { return b == 0 ? 0 : (int64_t{1} << b) - 1; }

std::string Bar(int64_t count, int64_t max_count, int width, bool unicode) {
  if (count == 0 || max_count == 0 || width <= 0) return "";
  // Length in eighths of a character, at least one eighth (or one '#') for a non-empty bucket.
  const int64_t eighths = std::max<int64_t>(1, (count * width * 8 + max_count / 2) / max_count);
  if (!unicode)
    return std::string(static_cast<size_t>(std::max<int64_t>(1, (eighths + 4) / 8)), '#');
  static constexpr std::string_view kPartial[8] = {"", "▏", "▎", "▍", "▌", "▋", "▊", "▉"};
  std::string out;
  for (int64_t i = 0; i < eighths / 8; ++i) out += "█";
  out += kPartial[eighths % 8];
  return out;
}

void AppendLengthRow(std::string& out, std::string_view label, const LengthStats& s) {
  out += fmt::format("{:<8}{:>12}{:>10.1f}{:>8}{:>8}{:>8}{:>8}{:>10}\n", label, FormatCount(s.sum),
                     s.mean, s.min, s.p50, s.p90, s.p99, s.max);
}

std::string TaskColumns(const LengthStats& s) {
  return fmt::format("{:>9.1f}{:>7}{:>7}{:>8}{:>9}", s.mean, s.p50, s.p90, s.p99, s.max);
}

}  // namespace

int64_t NearestRankPercentile(std::span<const int64_t> sorted, int percent) {
  SLUICE_CHECK(!sorted.empty() && percent > 0 && percent <= 100);
  const int64_t n = static_cast<int64_t>(sorted.size());
  const int64_t rank = (static_cast<int64_t>(percent) * n + 99) / 100;  // ceil(P * n / 100)
  return sorted[static_cast<size_t>(std::max<int64_t>(rank, 1) - 1)];
}

LengthStats ComputeLengthStats(std::vector<int64_t>& values) {
  LengthStats s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  s.count = static_cast<int64_t>(values.size());
  for (int64_t v : values) s.sum += v;
  s.mean = static_cast<double>(s.sum) / static_cast<double>(s.count);
  s.min = values.front();
  s.p50 = NearestRankPercentile(values, 50);
  s.p90 = NearestRankPercentile(values, 90);
  s.p99 = NearestRankPercentile(values, 99);
  s.max = values.back();
  return s;
}

std::vector<HistogramBucket> LogHistogram(std::span<const int64_t> values) {
  if (values.empty()) return {};
  std::vector<int64_t> counts(65, 0);
  int lo = 64, hi = 0;
  for (int64_t v : values) {
    const int b = BucketOf(v);
    ++counts[static_cast<size_t>(b)];
    lo = std::min(lo, b);
    hi = std::max(hi, b);
  }
  std::vector<HistogramBucket> out;
  for (int b = lo; b <= hi; ++b) out.push_back({BucketLo(b), BucketHi(b), counts[b]});
  return out;
}

DataStats ComputeStats(const Dataset& dataset) {
  DataStats st;
  st.source = dataset.source();
  st.samples = static_cast<int64_t>(dataset.size());
  st.has_targets = dataset.has_targets();
  std::vector<int64_t> input, target, total;
  input.reserve(dataset.size());
  target.reserve(dataset.size());
  total.reserve(dataset.size());
  std::vector<std::vector<int64_t>> task_input(static_cast<size_t>(dataset.num_tasks()));
  std::vector<std::vector<int64_t>> task_target(task_input.size());
  for (const Sample& s : dataset.samples()) {
    input.push_back(s.input_len);
    target.push_back(s.target_len);
    total.push_back(s.tokens());
    task_input[static_cast<size_t>(s.task)].push_back(s.input_len);
    task_target[static_cast<size_t>(s.task)].push_back(s.target_len);
  }
  st.input_histogram = LogHistogram(input);
  if (st.has_targets) st.target_histogram = LogHistogram(target);
  st.input = ComputeLengthStats(input);
  st.target = ComputeLengthStats(target);
  st.total = ComputeLengthStats(total);
  st.tokens = st.total.sum;
  for (size_t t = 0; t < task_input.size(); ++t) {
    if (task_input[t].empty()) continue;
    TaskStats ts;
    ts.task = dataset.task_name(static_cast<TaskId>(t));
    ts.samples = static_cast<int64_t>(task_input[t].size());
    ts.input = ComputeLengthStats(task_input[t]);
    ts.target = ComputeLengthStats(task_target[t]);
    ts.tokens = ts.input.sum + ts.target.sum;
    st.tasks.push_back(std::move(ts));
  }
  std::sort(st.tasks.begin(), st.tasks.end(),
            [](const TaskStats& a, const TaskStats& b) { return a.task < b.task; });
  return st;
}

std::string FormatHistogram(std::span<const HistogramBucket> buckets, std::string_view title,
                            const StatsFormatOptions& options) {
  std::string out = fmt::format("{}\n", title);
  int64_t total = 0, max_count = 0;
  for (const HistogramBucket& b : buckets) {
    total += b.count;
    max_count = std::max(max_count, b.count);
  }
  std::vector<std::string> ranges;
  size_t range_width = 0, count_width = 0;
  for (const HistogramBucket& b : buckets) {
    ranges.push_back(b.lo == b.hi ? FormatCount(b.lo)
                                  : fmt::format("{} - {}", FormatCount(b.lo), FormatCount(b.hi)));
    range_width = std::max(range_width, ranges.back().size());
    count_width = std::max(count_width, FormatCount(b.count).size());
  }
  for (size_t i = 0; i < buckets.size(); ++i) {
    const HistogramBucket& b = buckets[i];
    const double pct =
        total == 0 ? 0.0 : 100.0 * static_cast<double>(b.count) / static_cast<double>(total);
    out +=
        fmt::format("  {:>{}}  {:>{}}  {:>5.1f}%  {}\n", ranges[i], range_width, FormatCount(b.count),
                    count_width, pct, Bar(b.count, max_count, options.bar_width, options.unicode));
  }
  return out;
}

std::string FormatStats(const DataStats& s, const StatsFormatOptions& options) {
  std::string out =
      fmt::format("{}: {} samples, {} task{}, {} tokens (input {}, target {})\n\n", s.source,
                  FormatCount(s.samples), s.tasks.size(), s.tasks.size() == 1 ? "" : "s",
                  FormatCount(s.tokens), FormatCount(s.input.sum), FormatCount(s.target.sum));
  out += fmt::format("{:<8}{:>12}{:>10}{:>8}{:>8}{:>8}{:>8}{:>10}\n", "length", "tokens", "mean",
                     "min", "p50", "p90", "p99", "max");
  AppendLengthRow(out, "input", s.input);
  if (s.has_targets) {
    AppendLengthRow(out, "target", s.target);
    AppendLengthRow(out, "total", s.total);
  }
  if (options.per_task && s.tasks.size() > 1) {
    size_t w = 4;
    for (const TaskStats& t : s.tasks) w = std::max(w, t.task.size());
    out += fmt::format("\n{:<{}}{:>9}{:>7}{:>14}  {:-^40}", "", w, "", "", "", " input length ");
    out += s.has_targets ? fmt::format("  {:-^40}\n", " target length ") : "\n";
    out += fmt::format("{:<{}}{:>9}{:>7}{:>14}  {:>9}{:>7}{:>7}{:>8}{:>9}", "task", w, "samples",
                       "share", "tokens", "mean", "p50", "p90", "p99", "max");
    out += s.has_targets
               ? fmt::format("  {:>9}{:>7}{:>7}{:>8}{:>9}\n", "mean", "p50", "p90", "p99", "max")
               : "\n";
    for (const TaskStats& t : s.tasks) {
      const double share = 100.0 * static_cast<double>(t.samples) / std::max<int64_t>(s.samples, 1);
      out += fmt::format("{:<{}}{:>9}{:>6.1f}%{:>14}  {}", t.task, w, FormatCount(t.samples), share,
                         FormatCount(t.tokens), TaskColumns(t.input));
      out += s.has_targets ? "  " + TaskColumns(t.target) + "\n" : "\n";
    }
  }
  if (options.histograms) {
    out += "\n";
    out +=
        FormatHistogram(s.input_histogram, "input length (tokens), power-of-two buckets:", options);
    if (s.has_targets) {
      out += "\n";
      out += FormatHistogram(s.target_histogram,
                             "target length (tokens), power-of-two buckets:", options);
    }
  }
  return out;
}

}  // namespace sluice
