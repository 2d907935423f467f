#include "report/html_report.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "base/json_util.h"
#include "report/svg_util.h"

namespace sluice::report {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

size_t Count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = haystack.find(needle); pos != std::string::npos;
       pos = haystack.find(needle, pos + needle.size())) {
    ++n;
  }
  return n;
}

// The position of the "</g>" that closes the <g> starting at `open`.
size_t GroupEnd(const std::string& html, size_t open) {
  int depth = 0;
  for (size_t pos = open; pos < html.size(); ++pos) {
    if (html.compare(pos, 3, "<g ") == 0 || html.compare(pos, 3, "<g>") == 0) ++depth;
    if (html.compare(pos, 4, "</g>") == 0 && --depth == 0) return pos;
  }
  return std::string::npos;
}

// How often `needle` occurs inside all groups whose opening tag starts with `group`.
size_t CountInGroups(const std::string& html, const std::string& group, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = html.find(group); pos != std::string::npos; pos = html.find(group, pos + 1)) {
    n += Count(html.substr(pos, GroupEnd(html, pos) - pos), needle);
  }
  return n;
}

size_t Bars(const std::string& html) {
  return CountInGroups(html, "<g class=\"tl-bars ", "<rect ");
}

// The text of every <text> element inside the first `<g class="CLASS"` group after `from`.
std::vector<std::string> TextsInGroup(const std::string& html, const std::string& cls,
                                      size_t from = 0) {
  std::vector<std::string> out;
  size_t pos = html.find("<g class=\"" + cls + "\"", from);
  if (pos == std::string::npos) return out;
  const size_t end = GroupEnd(html, pos);
  while (true) {
    pos = html.find("<text", pos);
    if (pos == std::string::npos || pos > end) break;
    const size_t open = html.find('>', pos) + 1;
    out.push_back(html.substr(open, html.find("</text>", open) - open));
    pos = open;
  }
  return out;
}

// The value of the first attribute `name` after `marker`.
std::string AttributeAfter(const std::string& html, const std::string& marker,
                           const std::string& name) {
  const size_t at = html.find(marker);
  if (at == std::string::npos) return "";
  const size_t value = html.find(name + "=\"", at) + name.size() + 2;
  return html.substr(value, html.find('"', value) - value);
}

HtmlReport OneBlock(Block block, std::string heading = "Section") {
  HtmlReport report;
  report.title = "Test";
  report.sections.push_back({std::move(heading), "", {std::move(block)}});
  return report;
}

Timeline SmallTimeline() {
  Timeline t;
  t.title = "Pipeline timeline";
  t.rows = {{"rank 0", {{0, 10, "F0", "forward", ""}, {10, 30, "B0", "backward", "B of 0"}}},
            {"rank 1", {{2, 12, "F0", "fwd", ""}, {12, 12.5, "LONG-LABEL", "send", ""}}}};
  return t;
}

TEST(HtmlReportTest, PageIsSelfContained) {
  const std::string html = RenderHtml(OneBlock(SmallTimeline()));
  EXPECT_EQ(html.rfind("<!DOCTYPE html>\n<html lang=\"en\">", 0), 0u);
  EXPECT_EQ(Count(html, "<meta charset=\"utf-8\">"), 1u);
  EXPECT_EQ(Count(html, "<style>"), 1u);
  EXPECT_EQ(Count(html, "<script"), 0u);
  EXPECT_EQ(Count(html, "<link"), 0u);
  EXPECT_EQ(Count(html, "https://"), 0u);
  EXPECT_EQ(Count(html, "url(http"), 0u);
  EXPECT_EQ(Count(html, "http://"), Count(html, "xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_EQ(html.substr(html.size() - 8), "</html>\n");
}

TEST(HtmlReportTest, EscapesEveryText) {
  HtmlReport report;
  report.title = "a <b> & \"c\"";
  report.subtitle = "'sub' <i>";
  Table table;
  table.title = "<tbl>";
  table.header = {"<h>"};
  table.rows = {{"<script>alert(1)</script>"}};
  Timeline timeline;
  timeline.title = "t<1>";
  timeline.rows = {{"<row>", {{0, 100, "<lbl>", "<cat>", "tip \"q\" & <x>"}}}};
  BarChart bars;
  bars.title = "b&b";
  bars.bars = {{"<bar>", 1, "<note>", false}, {"<m>", 0, "<oom>", true}};
  Distribution dist;
  dist.title = "d";
  dist.groups = {{"<grp>", {1, 2}}};
  LineChart line;
  line.series = {{"<s>", {{0, 1}, {1, 2}}}};
  line.limit = 3;
  line.limit_label = "<lim>";
  report.sections.push_back(
      {"<sec>", "text <p> & </section>", {table, timeline, bars, dist, line}});
  const std::string html = RenderHtml(report);
  for (const char* raw :
       {"<b>", "<i>", "<tbl>", "<h>", "<script", "<row>", "<lbl>", "<cat>", "<x>", "<bar>",
        "<note>", "<m>", "<oom>", "<grp>", "<s>", "<lim>", "<sec>", "<p> &", "\"q\""}) {
    EXPECT_EQ(Count(html, raw), 0u) << raw;
  }
  EXPECT_NE(html.find("<title>a &lt;b&gt; &amp; &quot;c&quot;</title>"), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
  EXPECT_NE(html.find("<title>tip &quot;q&quot; &amp; &lt;x&gt;</title>"), std::string::npos);
  EXPECT_NE(html.find("text &lt;p&gt; &amp; &lt;/section&gt;"), std::string::npos);
  EXPECT_EQ(Count(html, "<section "), 1u);
  EXPECT_EQ(Count(html, "</section>"), 1u);
}

TEST(HtmlReportTest, TableAlignsNumericColumns) {
  Table table;
  table.title = "Methods";
  table.header = {"method", "tokens/s", "speed-up", "note"};
  table.rows = {{"padding", "41,240", "1.00x", "ok"},
                {"sorted", "—", "n/a", "OOM at 3"},
                {"packing", "5.5e4", "1.34x"}};  // ragged: padded with an empty cell
  const std::string html = RenderHtml(OneBlock(table));
  EXPECT_NE(html.find("<table class=\"sluice-table\" id=\"methods\">"), std::string::npos);
  EXPECT_NE(html.find("<th>method</th><th class=\"num\">tokens/s</th>"
                      "<th class=\"num\">speed-up</th><th>note</th>"),
            std::string::npos);
  EXPECT_NE(html.find("<tr><td>padding</td><td class=\"num\">41,240</td>"), std::string::npos);
  EXPECT_EQ(Count(html, "<td"), 12u);
  EXPECT_EQ(Count(html, "<tr>"), 4u);

  table.numeric = {true, false};  // explicit for the first two columns, guessed after
  const std::string forced = RenderHtml(OneBlock(table));
  EXPECT_NE(forced.find("<th class=\"num\">method</th><th>tokens/s</th>"
                        "<th class=\"num\">speed-up</th>"),
            std::string::npos);
}

TEST(HtmlReportTest, EmptyTables) {
  Table no_rows;
  no_rows.header = {"a", "b"};
  const std::string html = RenderHtml(OneBlock(no_rows));
  EXPECT_NE(html.find("<td colspan=\"2\">no rows</td>"), std::string::npos);
  EXPECT_NE(html.find("id=\"table\""), std::string::npos);
  const std::string nothing = RenderHtml(OneBlock(Table{}));
  EXPECT_NE(nothing.find("<td colspan=\"1\">no rows</td>"), std::string::npos);
  EXPECT_EQ(Count(nothing, "<thead>"), 0u);
}

TEST(HtmlReportTest, TimelineStructure) {
  const std::string html = RenderHtml(OneBlock(SmallTimeline()));
  EXPECT_EQ(Count(html, "<svg class=\"sluice-chart sluice-timeline\" id=\"pipeline-timeline\""),
            1u);
  EXPECT_EQ(Count(html, "<g class=\"tl-row\""), 2u);
  EXPECT_EQ(Count(html, "<g class=\"tl-bars "), 4u);  // per row and category
  EXPECT_EQ(Bars(html), 4u);
  // Every bar has a tooltip: the given one or start–end with the unit.
  EXPECT_NE(html.find("<title>B of 0</title>"), std::string::npos);
  EXPECT_NE(html.find("<title>F0 · forward · 0–10 ms (10 ms)</title>"), std::string::npos);
  // "fwd" is drawn like "forward" but keeps its name in the legend.
  EXPECT_EQ(AttributeAfter(html, "class=\"tl-bars cat-fwd\"", "fill"), "#4e79a7");
  EXPECT_EQ(AttributeAfter(html, "class=\"tl-bars cat-forward\"", "fill"), "#4e79a7");
  EXPECT_NE(AttributeAfter(html, "class=\"tl-bars cat-backward\"", "fill"), "#4e79a7");
  EXPECT_EQ(TextsInGroup(html, "legend"),
            (std::vector<std::string>{"forward", "fwd", "backward", "send"}));
  // Labels inside bars when they fit: F0/B0 do, LONG-LABEL on a 0.5 ms bar does not.
  EXPECT_EQ(Count(html, ">F0</text>"), 2u);
  EXPECT_EQ(Count(html, ">B0</text>"), 1u);
  EXPECT_EQ(Count(html, ">LONG-LABEL</text>"), 0u);
  EXPECT_NE(html.find("<title>LONG-LABEL · send · 12–12.5 ms (0.5 ms)</title>"), std::string::npos);
  // Axis: 0..30 ms in steps of 5, titled with the unit.
  EXPECT_EQ(TextsInGroup(html, "tick-labels"),
            (std::vector<std::string>{"0", "5", "10", "15", "20", "25", "30"}));
  EXPECT_NE(html.find(">time (ms)</text>"), std::string::npos);
}

TEST(HtmlReportTest, TimelineSkipsBadBarsAndSaysSo) {
  Timeline t = SmallTimeline();
  t.rows[0].bars.push_back({kNaN, 3, "x", "forward", ""});
  t.rows[0].bars.push_back({1, kInf, "y", "forward", ""});
  t.rows[1].bars.push_back({5, 4, "z", "forward", ""});
  const std::string html = RenderHtml(OneBlock(t));
  EXPECT_EQ(Bars(html), 4u);
  EXPECT_NE(html.find("<p class=\"note\">2 bars with a non-finite start or end skipped.</p>"),
            std::string::npos);
  EXPECT_NE(html.find("<p class=\"note\">1 bar ending before its start skipped.</p>"),
            std::string::npos);
  EXPECT_EQ(Count(html, "=\"nan"), 0u);
  EXPECT_EQ(Count(html, "=\"inf"), 0u);
}

TEST(HtmlReportTest, TimelineEmptyAndDegenerate) {
  Timeline none;
  none.title = "nothing";
  EXPECT_NE(RenderHtml(OneBlock(none)).find(">no rows</text>"), std::string::npos);

  Timeline empty_rows;
  empty_rows.rows = {{"rank 0", {}}, {"rank 1", {}}};
  const std::string html = RenderHtml(OneBlock(empty_rows));
  EXPECT_EQ(Count(html, "<g class=\"tl-row\""), 2u);
  EXPECT_NE(html.find("No bars to show."), std::string::npos);
  EXPECT_NE(html.find("id=\"timeline\""), std::string::npos);

  Timeline instant;
  instant.rows = {{"r", {{5, 5, "x", "forward", ""}, {5, 5, "y", "idle", ""}}}};
  const std::string zero = RenderHtml(OneBlock(instant));
  EXPECT_EQ(Bars(zero), 2u);
  EXPECT_NE(zero.find("width=\"0.3\""), std::string::npos);  // still visible
  EXPECT_GE(TextsInGroup(zero, "tick-labels").size(), 2u);
}

TEST(HtmlReportTest, LargeTimelineStaysCompact) {
  Timeline t;
  t.title = "big";
  for (int r = 0; r < 64; ++r) {
    TimelineRow row{"rank " + std::to_string(r), {}};
    for (int k = 0; k < 2000; ++k) {
      row.bars.push_back({k * 1.5, k * 1.5 + 1.0, std::to_string(k), k % 2 ? "forward" : "backward",
                          "mb " + std::to_string(k)});
    }
    t.rows.push_back(std::move(row));
  }
  const std::string html = RenderHtml(OneBlock(t));
  EXPECT_EQ(Bars(html), 64u * 2000u);
  EXPECT_EQ(Count(html, "<g class=\"tl-bars "), 64u * 2u);
  // About 60 bytes of markup per bar besides its tooltip.
  EXPECT_LT(html.size(), 64u * 2000u * 80u);
}

TEST(HtmlReportTest, LineChartAxesSeriesAndLimit) {
  LineChart chart;
  chart.title = "Memory per rank";
  chart.x_label = "time (ms)";
  chart.y_label = "MB";
  chart.series = {{"rank 0", {{0, 10}, {40, 60}, {100, 97}}},
                  {"rank 1", {{0, 5}, {50, 20}, {kNaN, 3}, {60, kInf}}},
                  {"rank 2", {}}};
  chart.limit = 90;
  chart.limit_label = "limit (90 MB)";
  const std::string html = RenderHtml(OneBlock(chart));
  EXPECT_EQ(Count(html, "<svg class=\"sluice-chart sluice-line-chart\" id=\"memory-per-rank\""),
            1u);
  EXPECT_EQ(TextsInGroup(html, "tick-labels"),
            (std::vector<std::string>{"0", "20", "40", "60", "80", "100"}));
  const size_t x_axis = html.find("<g class=\"axis x-axis\"");
  EXPECT_EQ(
      TextsInGroup(html, "tick-labels", x_axis),
      (std::vector<std::string>{"0", "10", "20", "30", "40", "50", "60", "70", "80", "90", "100"}));
  EXPECT_EQ(Count(html, "<g class=\"series\""), 2u);
  EXPECT_NE(html.find("<path d=\"M"), std::string::npos);
  EXPECT_EQ(Count(html, "stroke-dasharray=\"6 4\""), 1u);
  EXPECT_NE(html.find(">limit (90 MB)</text>"), std::string::npos);
  EXPECT_NE(html.find("<title>limit (90 MB): 90</title>"), std::string::npos);
  EXPECT_NE(html.find("rank 2 (no points)"), std::string::npos);
  EXPECT_NE(html.find("2 points with NaN or infinite values skipped."), std::string::npos);
  EXPECT_NE(html.find(">MB</text>"), std::string::npos);
}

TEST(HtmlReportTest, LineChartStepVersusStraight) {
  LineChart chart;
  chart.series = {{"s", {{0, 0}, {1, 1}, {2, 0}}}};
  const std::string step = RenderHtml(OneBlock(chart));
  const size_t d = step.find("<path d=\"M", step.find("<g class=\"series\""));
  const std::string path = step.substr(d, step.find('"', d + 9) - d);
  EXPECT_NE(path.find('H'), std::string::npos);
  EXPECT_NE(path.find('V'), std::string::npos);
  EXPECT_EQ(path.find('L'), std::string::npos);
  EXPECT_EQ(Count(step, "<circle"), 0u);

  chart.step = false;
  const std::string straight = RenderHtml(OneBlock(chart));
  const size_t d2 = straight.find("<path d=\"M", straight.find("<g class=\"series\""));
  const std::string path2 = straight.substr(d2, straight.find('"', d2 + 9) - d2);
  EXPECT_EQ(Count(path2, "L"), 2u);
  EXPECT_EQ(Count(straight, "<circle"), 3u);  // markers on short straight series
}

TEST(HtmlReportTest, LineChartEmptyAndSinglePoint) {
  LineChart empty;
  const std::string html = RenderHtml(OneBlock(empty));
  EXPECT_NE(html.find(">no data points</text>"), std::string::npos);
  EXPECT_NE(html.find("No series to show."), std::string::npos);

  LineChart single;
  single.series = {{"one", {{3, 7}}}};
  single.limit = kNaN;
  const std::string one = RenderHtml(OneBlock(single));
  EXPECT_EQ(Count(one, "<circle"), 1u);
  EXPECT_NE(one.find("<title>one: (3, 7)</title>"), std::string::npos);
  EXPECT_NE(one.find("The limit is not finite; not drawn."), std::string::npos);
  EXPECT_EQ(Count(one, "=\"nan"), 0u);
}

TEST(HtmlReportTest, BarChartMissingAndInvalid) {
  BarChart chart;
  chart.title = "Throughput";
  chart.value_label = "tokens/s";
  chart.bars = {{"padding", 41240, "1.00x", false},
                {"sorted", 0, "OOM", true},
                {"broken", kNaN, "", false},
                {"packing", 55306, "", false}};
  const std::string html = RenderHtml(OneBlock(chart));
  EXPECT_EQ(Count(html, "<g class=\"bar\">"), 2u);
  EXPECT_EQ(Count(html, "<g class=\"bar missing\">"), 2u);
  EXPECT_EQ(Count(html, "fill=\"url(#throughput-hatch)\""), 2u);
  EXPECT_EQ(Count(html, "<pattern id=\"throughput-hatch\""), 1u);
  EXPECT_NE(html.find(">OOM</text>"), std::string::npos);
  EXPECT_NE(html.find(">invalid value (nan)</text>"), std::string::npos);
  EXPECT_NE(html.find(">1.00x</text>"), std::string::npos);
  EXPECT_NE(html.find(">55.3k</text>"), std::string::npos);  // no note: the value
  EXPECT_NE(html.find("<title>padding: 41.2k tokens/s (1.00x)</title>"), std::string::npos);
  EXPECT_NE(html.find("1 bar with a NaN or infinite value drawn as missing."), std::string::npos);
  EXPECT_EQ(TextsInGroup(html, "tick-labels"),
            (std::vector<std::string>{"0", "10k", "20k", "30k", "40k", "50k", "60k"}));

  BarChart negative;
  negative.bars = {{"a", -5, "", false}, {"b", 10, "", false}};
  EXPECT_NE(RenderHtml(OneBlock(negative)).find("<path class=\"zero\""), std::string::npos);
  EXPECT_NE(RenderHtml(OneBlock(BarChart{})).find(">no bars</text>"), std::string::npos);
}

TEST(HtmlReportTest, PartialBarIsPaleAndDashed) {
  BarChart chart;
  chart.title = "Throughput";
  Bar partial{"dp8", 9348, "1.00x, 8/20 batches ran", false};
  partial.partial = true;
  chart.bars = {partial, {"tp4", 21966, "2.35x", false}};
  const std::string html = RenderHtml(OneBlock(chart));
  EXPECT_EQ(Count(html, "<g class=\"bar partial\">"), 1u);
  EXPECT_EQ(Count(html, "<g class=\"bar\">"), 1u);
  EXPECT_EQ(Count(html, "fill-opacity=\"0.45\""), 1u);
  EXPECT_EQ(Count(html, "stroke-dasharray=\"4 2\""), 1u);
  EXPECT_NE(html.find(">1.00x, 8/20 batches ran</text>"), std::string::npos);
}

TEST(HtmlReportTest, FactsAreRowsAndTablesWrapMarkedColumns) {
  HtmlReport report = OneBlock(Table{
      "t", {"method", "configuration"}, {{"a", "dp 2 x pp 4"}}, {false, false}, {false, true}});
  report.subtitle = "line one\nline two";
  report.facts = {{"model", "gpt-6.7b"}, {"lost", "3 of 9 <samples>"}};
  const std::string html = RenderHtml(report);
  EXPECT_NE(html.find("<dl class=\"facts\"><dt>model</dt><dd>gpt-6.7b</dd><dt>lost</dt><dd>3 of "
                      "9 &lt;samples&gt;</dd></dl>"),
            std::string::npos);
  EXPECT_NE(html.find(".subtitle{color:var(--muted);margin:0;white-space:pre-line}"),
            std::string::npos);
  EXPECT_NE(html.find("<td>a</td><td class=\"wrap\">dp 2 x pp 4</td>"), std::string::npos);
  EXPECT_NE(html.find("<th>method</th><th class=\"wrap\">configuration</th>"), std::string::npos);
  EXPECT_EQ(Count(RenderHtml(OneBlock(Table{"t", {"x"}, {{"1"}}})), "<dl"), 0u);
}

TEST(HtmlReportTest, CollectivesHaveDistinctColours) {
  const std::string all_reduce = internal::CategoryColor("all-reduce");
  const std::string reduce_scatter = internal::CategoryColor("reduce-scatter");
  const std::string all_gather = internal::CategoryColor("all-gather");
  const std::string all_to_all = internal::CategoryColor("all-to-all");
  EXPECT_NE(all_reduce, reduce_scatter);
  EXPECT_NE(all_reduce, all_gather);
  EXPECT_NE(reduce_scatter, all_gather);
  EXPECT_NE(all_to_all, reduce_scatter);
  EXPECT_NE(all_to_all, all_gather);
  EXPECT_EQ(internal::CategoryColor("allgather"), all_gather);
  EXPECT_EQ(internal::CategoryColor("allreduce"), all_reduce);
  // Every named category but the send/recv alias of send has a colour of its own.
  std::set<std::string> colours;
  for (const char* c : {"forward", "recompute", "backward", "backward-input", "backward-weight",
                        "send", "recv", "all-reduce", "reduce-scatter", "all-gather", "all-to-all",
                        "optimizer", "load", "idle", "other"}) {
    EXPECT_TRUE(colours.insert(internal::CategoryColor(c)).second) << c;
  }
}

TEST(HtmlReportTest, DistributionQuartilesAndPoints) {
  Distribution dist;
  dist.title = "Iteration time";
  dist.value_label = "ms";
  std::vector<double> many;
  for (int i = 0; i < 1000; ++i) many.push_back(i % 97);
  dist.groups = {{"five", {5, 1, 4, 2, 3, kNaN}}, {"empty", {}}, {"many", many}};
  const std::string html = RenderHtml(OneBlock(dist));
  EXPECT_EQ(Count(html, "<svg class=\"sluice-chart sluice-distribution\" id=\"iteration-time\""),
            1u);
  EXPECT_EQ(Count(html, "<g class=\"dist-group\""), 3u);
  EXPECT_EQ(Count(html, "<g class=\"box\">"), 2u);
  EXPECT_NE(html.find("<title>five: n=5, min 1, q1 2, median 3, q3 4, max 5, mean 3</title>"),
            std::string::npos);
  // The box is as wide as its median line and as tall as q1..q3: 2..4 on a 0..100 axis of 260 px.
  const size_t box = html.find("<g class=\"box\">");
  const std::string box_width = AttributeAfter(html.substr(box), "<rect", "width");
  const std::string box_height = AttributeAfter(html.substr(box), "<rect", "height");
  const size_t median = html.find("class=\"median\" d=\"M", box);
  const size_t h = html.find('h', median + 20);
  EXPECT_EQ(box_width, html.substr(h + 1, html.find('"', h) - h - 1));
  EXPECT_EQ(box_width, "56");
  EXPECT_EQ(box_height, "5.2");
  EXPECT_NE(html.find(">n=0</text>"), std::string::npos);
  EXPECT_NE(html.find(">no data"), std::string::npos);
  EXPECT_EQ(Count(html, "<circle"), 5u + 334u);  // every third of 1,000 sorted values
  EXPECT_NE(html.find("1 value with NaN or infinite values skipped."), std::string::npos);
  EXPECT_NE(html.find("(666 points not drawn)"), std::string::npos);

  const std::string none = RenderHtml(OneBlock(Distribution{}));
  EXPECT_NE(none.find(">no groups</text>"), std::string::npos);
}

HtmlReport FullReport() {
  HtmlReport report;
  report.title = "Full";
  report.subtitle = "every block";
  LineChart line;
  line.title = "Same title";
  line.series = {{"s", {{0, 1}, {2, 3}}}};
  BarChart bars;
  bars.title = "Same title";
  bars.bars = {{"x", 1, "", false}};
  Distribution dist;
  dist.groups = {{"g", {1, 2, 3}}};
  Table table;
  table.header = {"k", "v"};
  table.rows = {{"a", "1"}};
  report.sections.push_back({"One", "first\n\nsecond", {SmallTimeline(), line, bars}});
  BarChart clash;
  clash.title = "Same title 2 hatch";  // its id would be the first bar chart's pattern id
  report.sections.push_back({"Two", "", {dist, table, clash}});
  return report;
}

TEST(HtmlReportTest, DeterministicWithUniqueIds) {
  const HtmlReport report = FullReport();
  const std::string a = RenderHtml(report);
  const HtmlReport copy = report;
  EXPECT_EQ(a, RenderHtml(copy));
  EXPECT_EQ(Count(a, "<svg "), 5u);
  EXPECT_EQ(Count(a, "id=\"same-title-2-hatch\""), 1u);
  EXPECT_EQ(Count(a, "id=\"same-title-2-hatch-2\""), 1u);
  EXPECT_EQ(Count(a, "id=\"same-title\""), 1u);
  EXPECT_EQ(Count(a, "id=\"same-title-2\""), 1u);
  EXPECT_EQ(Count(a, "<pattern id=\"same-title-2-hatch\""), 1u);
  EXPECT_EQ(Count(a, "<section class=\"report-section\" id=\"section-one\">"), 1u);
  EXPECT_NE(a.find("<a href=\"#section-two\">Two</a>"), std::string::npos);
  EXPECT_EQ(Count(a, "<p class=\"section-text\">"), 2u);
}

TEST(HtmlReportTest, EmptyReport) {
  const std::string html = RenderHtml(HtmlReport{});
  EXPECT_NE(html.find("<title>sluice report</title>"), std::string::npos);
  EXPECT_NE(html.find("This report has no sections."), std::string::npos);
  EXPECT_EQ(Count(html, "<nav"), 0u);
}

TEST(HtmlReportTest, WriteHtmlReport) {
  const std::string dir = testing::TempDir();
  const std::string path = dir + "/report_test.html";
  ASSERT_TRUE(WriteHtmlReport(FullReport(), path).ok());
  StatusOr<std::string> read = ReadFileToString(path);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(*read, RenderHtml(FullReport()));
  std::filesystem::remove(path);

  EXPECT_EQ(WriteHtmlReport(FullReport(), "").code(), StatusCode::kInvalidArgument);
  const Status s = WriteHtmlReport(FullReport(), dir + "/no/such/dir/r.html");
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("no/such/dir/r.html"), std::string::npos);
}

}  // namespace
}  // namespace sluice::report
