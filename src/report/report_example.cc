// report_example: writes an example HtmlReport that uses every block type, for looking at the
// page and for tests/html_report_browser_test.sh, which loads it in a headless browser.
//
//   report_example OUT.html [--large]
//
// The data is synthetic but shaped like sluice's: a 1F1B pipeline over variable-length
// micro-batches (timeline and per-rank memory), throughput per batching method with one method
// out of memory, iteration times per method and a summary table. --large adds a 64-row timeline
// with 2,000 bars per row. On success it prints one line of counts that the browser test compares
// with the DOM: "tables=T timelines=L line_charts=C bar_charts=B distributions=D bars=N rows=R".

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "base/rng.h"
#include "report/html_report.h"

namespace sluice::report {
namespace {

struct Counts {
  int tables = 0, timelines = 0, line_charts = 0, bar_charts = 0, distributions = 0;
  size_t bars = 0, rows = 0;
};

void Count(const Block& block, Counts* c) {
  if (std::holds_alternative<Table>(block)) ++c->tables;
  if (std::holds_alternative<LineChart>(block)) ++c->line_charts;
  if (std::holds_alternative<BarChart>(block)) ++c->bar_charts;
  if (std::holds_alternative<Distribution>(block)) ++c->distributions;
  if (const auto* t = std::get_if<Timeline>(&block)) {
    ++c->timelines;
    c->rows += t->rows.size();
    for (const TimelineRow& row : t->rows) c->bars += row.bars.size();
  }
}

// A 1F1B schedule of `lengths.size()` micro-batches on `stages` pipeline ranks, with a compute
// and a communication row per rank, and each rank's activation memory over time.
void PipelineExample(int stages, const std::vector<int>& lengths, Timeline* timeline,
                     LineChart* memory) {
  const int m = static_cast<int>(lengths.size());
  auto fwd_ms = [&](int i, int s) { return 0.4 + lengths[i] / 1024.0 * (1.0 + 0.05 * s); };
  auto comm_ms = [&](int i) { return 0.12 + lengths[i] / 8192.0; };
  // Per rank the 1F1B order: warm-up forwards, then one forward and one backward, then backwards.
  std::vector<std::vector<std::pair<char, int>>> order(stages);
  for (int s = 0; s < stages; ++s) {
    const int warmup = std::min(m, stages - s - 1);
    int f = 0, b = 0;
    for (; f < warmup; ++f) order[s].push_back({'F', f});
    while (b < m) {
      if (f < m) order[s].push_back({'F', f++});
      order[s].push_back({'B', b++});
    }
  }
  std::vector<std::vector<double>> f_end(stages, std::vector<double>(m, -1));
  std::vector<std::vector<double>> b_end(stages, std::vector<double>(m, -1));
  std::vector<size_t> next(stages, 0);
  std::vector<double> free_at(stages, 0);
  timeline->rows.clear();
  for (int s = 0; s < stages; ++s) {
    timeline->rows.push_back({fmt::format("rank {} compute", s), {}});
    timeline->rows.push_back({fmt::format("rank {} comm", s), {}});
  }
  std::vector<Series> mem(stages);
  std::vector<double> live_mb(stages, 5200);
  for (int s = 0; s < stages; ++s) {
    mem[s].name = fmt::format("rank {}", s);
    mem[s].points.push_back({0, live_mb[s]});
  }
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < stages; ++s) {
      if (next[s] == order[s].size()) continue;
      const auto [kind, i] = order[s][next[s]];
      double ready = 0;
      if (kind == 'F' && s > 0) ready = f_end[s - 1][i] < 0 ? -1 : f_end[s - 1][i] + comm_ms(i);
      if (kind == 'B' && s + 1 < stages) {
        ready = b_end[s + 1][i] < 0 ? -1 : b_end[s + 1][i] + comm_ms(i);
      }
      if (ready < 0) continue;
      const double start = std::max(ready, free_at[s]);
      const double dur = kind == 'F' ? fwd_ms(i, s) : 2 * fwd_ms(i, s);
      const double end = start + dur;
      free_at[s] = end;
      ++next[s];
      progress = true;
      const std::string label = fmt::format("{}{}", kind, i);
      timeline->rows[2 * s].bars.push_back(
          {start, end, label, kind == 'F' ? "forward" : "backward",
           fmt::format("{} on rank {}: micro-batch {} ({} tokens), {:.2f} ms",
                       kind == 'F' ? "forward" : "backward", s, i, lengths[i], dur)});
      const double act_mb = lengths[i] * 0.85;
      live_mb[s] += kind == 'F' ? act_mb : -act_mb;
      mem[s].points.push_back({end, live_mb[s]});
      (kind == 'F' ? f_end : b_end)[s][i] = end;
      const int peer = kind == 'F' ? s + 1 : s - 1;
      if (peer >= 0 && peer < stages) {
        timeline->rows[2 * s + 1].bars.push_back(
            {end, end + comm_ms(i), fmt::format("{}{}", kind == 'F' ? "a" : "g", i), "send",
             fmt::format("send {} of micro-batch {} to rank {}",
                         kind == 'F' ? "activations" : "gradients", i, peer)});
      }
    }
  }
  double last = 0;
  for (int s = 0; s < stages; ++s) last = std::max(last, free_at[s]);
  for (int s = 0; s < stages; ++s) {
    timeline->rows[2 * s + 1].bars.push_back({free_at[s], last + 2.5, "all-reduce", "all-reduce",
                                              "gradient all-reduce across data-parallel replicas"});
    timeline->rows[2 * s].bars.push_back(
        {last + 2.5, last + 3.4, "opt", "optimizer", "optimizer step"});
    mem[s].points.push_back({last + 3.4, live_mb[s]});
  }
  memory->series = std::move(mem);
}

HtmlReport ExampleReport(bool large) {
  HtmlReport report;
  report.title = "sluice simulate: gpt-1.3b on a100-40g:8";
  report.subtitle =
      "dp=2, pp=4, method dynapipe, schedule 1f1b, 65,536 tokens per batch, seed 0 (example data)";
  report.facts = {{"model", "gpt-1.3b (decoder-only, 24 layers)"},
                  {"cluster", "a100-40g:8 (8 devices), memory limit 38655 MB per device"}};

  Section overview;
  overview.heading = "Summary";
  overview.text =
      "Throughput and memory of each batching method on the same global batches. Text is "
      "escaped: <script>alert(\"x\")</script> & 'quotes' stay text.";
  Table summary;
  summary.title = "Methods";
  summary.header = {"method",           "iteration (ms)", "tokens/s",
                    "peak memory (MB)", "speed-up",       "status"};
  summary.rows = {{"padding", "1589.2", "41,240", "31,220", "1.00x", "ok"},
                  {"sorted", "—", "—", "41,980", "—", "OOM"},
                  {"packing", "1185.0", "55,306", "28,410", "1.34x", "ok"},
                  {"dynapipe", "1074.4", "61,002", "27,905", "1.48x", "ok"},
                  {"hydraulis", "1032.1", "63,498", "29,377", "1.54x", "ok"}};
  overview.blocks.push_back(summary);
  BarChart throughput;
  throughput.title = "Throughput by method";
  throughput.value_label = "tokens/s";
  throughput.bars = {{"padding", 41240, "1.00x", false},
                     {"sorted", 0, "OOM: 41,980 MB > 40,000 MB", true},
                     {"packing", 55306, "1.34x", false},
                     {"dynapipe", 61002, "1.48x", false},
                     {"hydraulis", 63498, "1.54x", false}};
  Bar partial{"wide dp", 30125, "0.73x, 13/20 batches ran", false};
  partial.partial = true;  // some batches failed
  throughput.bars.push_back(partial);
  overview.blocks.push_back(throughput);
  Distribution iterations;
  iterations.title = "Iteration time per method";
  iterations.value_label = "iteration time (ms)";
  Rng rng(7);
  const std::vector<std::pair<std::string, double>> methods = {
      {"padding", 1589}, {"packing", 1185}, {"dynapipe", 1074}, {"hydraulis", 1032}};
  for (const auto& [name, mean] : methods) {
    std::vector<double> v;
    for (int k = 0; k < 40; ++k) v.push_back(mean * rng.LogNormal(0, 0.06));
    iterations.groups.push_back({name, std::move(v)});
  }
  overview.blocks.push_back(iterations);
  report.sections.push_back(std::move(overview));

  Section pipeline;
  pipeline.heading = "Pipeline schedule (iteration 0, replica 0)";
  pipeline.text =
      "Forward (F) and backward (B) passes of 8 variable-length micro-batches on "
      "4 pipeline ranks under 1F1B, with point-to-point sends and the gradient "
      "all-reduce. Hover over a bar for its details.";
  Timeline timeline;
  timeline.title = "Timeline";
  LineChart memory;
  memory.title = "Memory per rank";
  memory.x_label = "time (ms)";
  memory.y_label = "allocated (MB)";
  memory.limit = 14000;
  memory.limit_label = "memory limit (14,000 MB)";
  PipelineExample(4, {1024, 3072, 512, 2048, 4096, 768, 1536, 2560}, &timeline, &memory);
  pipeline.blocks.push_back(timeline);
  pipeline.blocks.push_back(memory);
  LineChart loss;
  loss.title = "Training loss";
  loss.x_label = "iteration";
  loss.y_label = "loss";
  loss.step = false;
  loss.series.push_back({"loss", {}});
  for (int k = 0; k <= 30; ++k) loss.series[0].points.push_back({k, 2.2 + 8.5 / (1.0 + 0.35 * k)});
  pipeline.blocks.push_back(loss);
  report.sections.push_back(std::move(pipeline));

  if (large) {
    Section big;
    big.heading = "Large timeline";
    big.text = "64 rows of 2,000 bars each.";
    Timeline t;
    t.title = "64 ranks";
    static constexpr const char* kKinds[] = {"forward", "backward", "send", "all-reduce"};
    for (int r = 0; r < 64; ++r) {
      TimelineRow row{fmt::format("rank {}", r), {}};
      double at = r * 0.7;
      for (int k = 0; k < 2000; ++k) {
        const double dur = 0.5 + rng.Uniform01() * 1.5;
        row.bars.push_back({at, at + dur, fmt::format("{}", k), kKinds[k % 4], ""});
        at += dur + rng.Uniform01() * 0.4;
      }
      t.rows.push_back(std::move(row));
    }
    big.blocks.push_back(std::move(t));
    report.sections.push_back(std::move(big));
  }
  return report;
}

int Main(int argc, char** argv) {
  std::vector<std::string_view> args(argv + 1, argv + argc);
  const bool large = std::find(args.begin(), args.end(), "--large") != args.end();
  std::erase(args, "--large");
  if (args.size() != 1) {
    std::fprintf(stderr, "usage: report_example OUT.html [--large]\n");
    return 2;
  }
  const HtmlReport report = ExampleReport(large);
  if (Status s = WriteHtmlReport(report, args[0]); !s.ok()) {
    std::fprintf(stderr, "report_example: %s\n", s.ToString().c_str());
    return 1;
  }
  Counts c;
  for (const Section& section : report.sections) {
    for (const Block& block : section.blocks) Count(block, &c);
  }
  std::printf(
      "tables=%d timelines=%d line_charts=%d bar_charts=%d distributions=%d bars=%zu rows=%zu\n",
      c.tables, c.timelines, c.line_charts, c.bar_charts, c.distributions, c.bars, c.rows);
  return 0;
}

}  // namespace
}  // namespace sluice::report

int main(int argc, char** argv) { return sluice::report::Main(argc, argv); }
