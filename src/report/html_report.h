// HtmlReport: a self-contained HTML page (inline CSS and SVG, no scripts or fonts fetched from
// the network) built from plain data: tables, pipeline timelines, step/line charts, bar charts
// and distributions. `sluice simulate --report` and `sluice compare` describe what they show with
// these types; RenderHtml draws them. Nothing here knows about plans or simulations.
//
// Every chart is an <svg> with a class naming its kind ("sluice-timeline", "sluice-line-chart",
// "sluice-bar-chart", "sluice-distribution") and an id derived from its title, and every element a
// <title> child, so browsers show tooltips without JavaScript and tests can find the elements.
//
// Thread safety: pure functions over value types.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "base/status.h"

namespace sluice::report {

struct Table {
  std::string title;
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  std::vector<bool> numeric;  // per column: right-align (empty: guess from the cells)
  // Per column: long text wraps (cells otherwise stay on one line); empty: none wraps.
  std::vector<bool> wrap;
};

// One horizontal bar on a timeline row: [start, end) in the timeline's unit (e.g. ms).
struct TimelineBar {
  double start = 0;
  double end = 0;
  std::string label;     // short text drawn inside the bar when it fits, e.g. "F3"
  std::string category;  // colour key, e.g. "forward", "backward", "send", "all-reduce"
  std::string tooltip;   // shown on hover (<title>)
};

struct TimelineRow {
  std::string label;  // e.g. "rank 3 compute"
  std::vector<TimelineBar> bars;
};

struct Timeline {
  std::string title;
  std::string unit = "ms";
  std::vector<TimelineRow> rows;
};

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y), x ascending
};

struct LineChart {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<Series> series;
  bool step = true;                  // draw as a step function (memory over time)
  std::optional<double> limit;       // a horizontal dashed line, e.g. the memory limit
  std::string limit_label;            // text at the line's end (empty: "limit <value>")
};

struct Bar {
  std::string label;
  double value = 0;
  std::string note;        // text after the bar, e.g. "1.00x" or "OOM"
  bool missing = false;    // drawn as an empty, hatched slot (e.g. out of memory)
  // The value covers only part of what it measures (e.g. some batches failed): drawn paler with
  // a dashed outline; say what is missing in `note`.
  bool partial = false;
};

struct BarChart {
  std::string title;
  std::string value_label;  // e.g. "tokens/s"
  std::vector<Bar> bars;
};

// Per label a set of values, drawn as min / quartiles / median / max with the points.
struct Distribution {
  std::string title;
  std::string value_label;
  std::vector<std::pair<std::string, std::vector<double>>> groups;
};

using Block = std::variant<Table, Timeline, LineChart, BarChart, Distribution>;

struct Section {
  std::string heading;
  std::string text;  // a paragraph above the blocks (plain text, escaped)
  std::vector<Block> blocks;
};

struct HtmlReport {
  std::string title;
  std::string subtitle;  // free text under the title; its line breaks are kept
  // Labelled facts shown under the title, one row each (label, value): e.g. ("model",
  // "gpt-6.7b ..."). Values may be long: they wrap within their row.
  std::vector<std::pair<std::string, std::string>> facts;
  std::vector<Section> sections;
};

// The whole page. Deterministic: the same report gives byte-identical HTML.
std::string RenderHtml(const HtmlReport& report);
// RenderHtml into `path`: InvalidArgument for an empty path, IoError naming the path when the
// file cannot be written.
Status WriteHtmlReport(const HtmlReport& report, std::string_view path);

}  // namespace sluice::report
