// Timeline: one row per TimelineRow, its bars on a shared time axis, coloured by category.
//
// The markup is kept small because simulated timelines are large (64 ranks × 2,000 bars): each
// row is a translated <g>, its bars are grouped by category so that the fill is given once per
// group, and a bar is `<rect x=".." width=".." height=".."><title>..</title></rect>` with 0.1 px
// coordinates.

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "report/blocks.h"

namespace sluice::report::internal {
namespace {

constexpr double kRowLabelFontPx = 12;
constexpr double kRightMargin = 16;

struct PlacedBar {
  const TimelineBar* bar;
  int category;  // index into the legend order
};

std::string DefaultTooltip(const TimelineBar& bar, const std::string& key,
                           const std::string& unit) {
  std::string text;
  if (!bar.label.empty()) text = bar.label + " · ";
  text += fmt::format("{} · {}–{} {} ({} {})", key, FormatValue(bar.start), FormatValue(bar.end),
                      unit, FormatValue(bar.end - bar.start), unit);
  return text;
}

}  // namespace

void RenderTimeline(const Timeline& timeline, IdRegistry* ids, std::string* out) {
  const std::string id = ids->Make(timeline.title, "timeline");

  // Pass 1: valid bars, the time domain and the categories in use.
  size_t non_finite = 0;
  size_t reversed = 0;
  size_t drawn = 0;
  double lo = std::numeric_limits<double>::infinity();
  double hi = -lo;
  std::map<std::string, size_t> category_count;
  std::vector<std::vector<std::pair<const TimelineBar*, std::string>>> rows(timeline.rows.size());
  for (size_t r = 0; r < timeline.rows.size(); ++r) {
    for (const TimelineBar& bar : timeline.rows[r].bars) {
      if (!std::isfinite(bar.start) || !std::isfinite(bar.end)) {
        ++non_finite;
        continue;
      }
      if (bar.end < bar.start) {
        ++reversed;
        continue;
      }
      lo = std::min(lo, bar.start);
      hi = std::max(hi, bar.end);
      std::string key = CategoryKey(bar.category);
      ++category_count[key];
      rows[r].emplace_back(&bar, std::move(key));
      ++drawn;
    }
  }
  if (drawn == 0) lo = 0, hi = 1;

  std::vector<std::string> categories;
  for (const auto& [key, count] : category_count) categories.push_back(key);
  std::stable_sort(categories.begin(), categories.end(),
                   [](const auto& a, const auto& b) { return CategoryRank(a) < CategoryRank(b); });
  std::map<std::string, int> category_index;
  std::vector<std::string> colors;
  std::vector<LegendItem> legend;
  for (const std::string& key : categories) {
    category_index[key] = static_cast<int>(colors.size());
    colors.push_back(CategoryColor(key));
    legend.push_back({key, colors.back(), LegendItem::Mark::kSwatch,
                      fmt::format("{}: {}", key, Plural(category_count[key], "bar"))});
  }

  // Layout.
  const size_t n = timeline.rows.size();
  double label_width = 0;
  for (const TimelineRow& row : timeline.rows) {
    label_width = std::max(label_width, TextWidth(row.label, kRowLabelFontPx));
  }
  const double plot_left = std::clamp(label_width + 16, 64.0, 220.0);
  const double plot_right = kChartWidth - kRightMargin;
  const double row_h = n <= 16 ? 24 : n <= 40 ? 18 : 14;
  const double bar_h = row_h - 4;
  const double label_font = std::min(11.0, bar_h - 5);
  const double legend_h = LegendHeight(legend, kChartWidth - 8);
  const bool top_axis = n > 24;
  const double rows_top = legend_h + (legend_h > 0 ? 8 : 4) + (top_axis ? 20 : 0);
  const double rows_bottom = rows_top + std::max<double>(static_cast<double>(n), 1) * row_h;
  const double height = rows_bottom + 44;

  const Axis axis = NiceAxis(lo, hi, 10, /*extend=*/true);
  const Scale x{axis.lo, axis.hi, plot_left, plot_right};
  const std::string axis_label = timeline.unit.empty() ? "time" : "time (" + timeline.unit + ")";

  OpenFigure(out, "sluice-timeline", id, timeline.title, kChartWidth, height);
  AppendLegend(out, legend, 4, 0, kChartWidth - 8);
  *out += "<g class=\"tl-stripes\">";
  for (size_t r = 1; r < n; r += 2) {
    *out += fmt::format("<rect x=\"0\" y=\"{}\" width=\"{}\" height=\"{}\"/>",
                        Coord(rows_top + static_cast<double>(r) * row_h), Coord(plot_right),
                        Coord(row_h));
  }
  *out += "</g>\n";
  AppendXAxis(out, axis, x, rows_bottom, rows_top, axis_label);
  if (top_axis) AppendXAxis(out, axis, x, rows_top, rows_top, "", /*labels_above=*/true);
  if (n == 0) {
    *out +=
        fmt::format("<text class=\"empty\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">no rows</text>",
                    Coord((plot_left + plot_right) / 2), Coord(rows_top + row_h / 2 + 4));
  }

  std::vector<std::vector<const PlacedBar*>> by_category(colors.size());
  std::vector<PlacedBar> placed;
  for (size_t r = 0; r < n; ++r) {
    const TimelineRow& row = timeline.rows[r];
    double busy = 0;
    placed.clear();
    for (const auto& [bar, key] : rows[r]) {
      placed.push_back({bar, category_index[key]});
      const int rank = CategoryRank(key);
      if (rank != CategoryRank("idle")) busy += bar->end - bar->start;
    }
    *out += fmt::format("<g class=\"tl-row\" transform=\"translate(0 {})\">",
                        Coord(rows_top + static_cast<double>(r) * row_h));
    *out += fmt::format("<text class=\"tl-label\" x=\"{}\" y=\"{}\" text-anchor=\"end\"><title>",
                        Coord(plot_left - 8), Coord(row_h / 2 + 4));
    AppendEscaped(out, fmt::format("{}: {}, busy {} of {} {}", row.label,
                                   Plural(placed.size(), "bar"), FormatValue(busy),
                                   FormatValue(hi > lo && drawn > 0 ? hi - lo : 0), timeline.unit));
    *out += "</title>";
    AppendEscaped(out, Truncate(row.label, plot_left - 14, kRowLabelFontPx));
    *out += "</text>";

    for (auto& list : by_category) list.clear();
    for (const PlacedBar& p : placed) by_category[p.category].push_back(&p);
    std::string dark_labels;
    std::string light_labels;
    for (size_t c = 0; c < by_category.size(); ++c) {
      if (by_category[c].empty()) continue;
      *out += fmt::format("<g class=\"tl-bars cat-{}\" fill=\"{}\" transform=\"translate(0 2)\">",
                          Slug(categories[c]), colors[c]);
      const bool dark = WantsDarkText(colors[c]);
      for (const PlacedBar* p : by_category[c]) {
        const TimelineBar& bar = *p->bar;
        const double x0 = std::round(x(bar.start) * 10) / 10;
        const double x1 = std::round(x(bar.end) * 10) / 10;
        // Bars wide enough to show a seam end 0.6 px early, so that neighbours stay apart.
        const double w = x1 - x0 >= 4 ? x1 - x0 - 0.6 : std::max(x1 - x0, 0.3);
        *out += fmt::format("<rect x=\"{}\" width=\"{}\" height=\"{}\"><title>", Coord(x0),
                            Coord(w), Coord(bar_h));
        AppendEscaped(out, bar.tooltip.empty() ? DefaultTooltip(bar, categories[c], timeline.unit)
                                               : bar.tooltip);
        *out += "</title></rect>";
        if (!bar.label.empty() && label_font >= 8 && TextWidth(bar.label, label_font) + 4 <= w) {
          std::string& labels = dark ? dark_labels : light_labels;
          labels += fmt::format("<text x=\"{}\" y=\"{}\">", Coord(x0 + w / 2),
                                Coord(2 + bar_h / 2 + label_font * 0.35));
          AppendEscaped(&labels, bar.label);
          labels += "</text>";
        }
      }
      *out += "</g>";
    }
    const std::string label_attrs = fmt::format(
        "text-anchor=\"middle\" font-size=\"{}\" pointer-events=\"none\"", Coord(label_font));
    if (!dark_labels.empty()) {
      *out +=
          "<g class=\"tl-bar-labels\" fill=\"#1f2328\" " + label_attrs + ">" + dark_labels + "</g>";
    }
    if (!light_labels.empty()) {
      *out += "<g class=\"tl-bar-labels\" fill=\"#ffffff\" " + label_attrs + ">" + light_labels +
              "</g>";
    }
    *out += "</g>\n";
  }

  std::vector<std::string> notes;
  if (n > 0 && drawn == 0 && non_finite == 0 && reversed == 0) notes.push_back("No bars to show.");
  if (non_finite > 0) {
    notes.push_back(
        fmt::format("{} with a non-finite start or end skipped.", Plural(non_finite, "bar")));
  }
  if (reversed > 0) {
    notes.push_back(fmt::format("{} ending before {} start skipped.", Plural(reversed, "bar"),
                                reversed == 1 ? "its" : "their"));
  }
  CloseFigure(out, notes);
}

}  // namespace sluice::report::internal
