// LineChart, BarChart and Distribution: value charts on nice linear axes.

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "report/blocks.h"

namespace sluice::report::internal {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kLabelFontPx = 12;
constexpr char kBarColor[] = "#4e79a7";
constexpr char kLimitColor[] = "#cf222e";

std::string SkippedNote(size_t count, std::string_view what) {
  return fmt::format("{} with NaN or infinite values skipped.", Plural(count, what));
}

// Builds an SVG path through pixel points, dropping moves that change nothing at 0.1 px. A step
// path holds each y until the next x (step-after); runs of vertical moves at one x collapse to
// the lowest, the highest and the last y, which draws the same pixels.
class PathBuilder {
 public:
  explicit PathBuilder(bool step) : step_(step) {}

  void Add(double px, double py) {
    px = std::round(px * 10) / 10;
    py = std::round(py * 10) / 10;
    if (n_++ == 0) {
      d_ = fmt::format("M{} {}", Coord(px), Coord(py));
      x_ = px, y_ = py;
      return;
    }
    if (!step_) {
      if (px == x_ && py == y_) return;
      d_ += fmt::format("L{} {}", Coord(px), Coord(py));
      x_ = px, y_ = py;
      return;
    }
    if (px != x_) {
      FlushVertical();
      d_ += fmt::format("H{}", Coord(px));
      x_ = px;
    }
    if (py != y_) {
      run_lo_ = std::min(run_lo_, py);
      run_hi_ = std::max(run_hi_, py);
      run_last_ = py;
      in_run_ = true;
      y_ = py;
    }
  }

  std::string Finish() {
    FlushVertical();
    return d_;
  }

 private:
  void FlushVertical() {
    if (!in_run_) return;
    // Moves run_lo_/run_hi_ already include the last y; emit extremes then the last one.
    if (run_lo_ != run_last_) d_ += fmt::format("V{}", Coord(run_lo_));
    if (run_hi_ != run_last_) d_ += fmt::format("V{}", Coord(run_hi_));
    d_ += fmt::format("V{}", Coord(run_last_));
    in_run_ = false;
    run_lo_ = kInf, run_hi_ = -kInf;
  }

  bool step_;
  size_t n_ = 0;
  std::string d_;
  double x_ = 0, y_ = 0;
  bool in_run_ = false;
  double run_lo_ = kInf, run_hi_ = -kInf, run_last_ = 0;
};

// Linear-interpolation quantile (R's type 7) of sorted, non-empty `v`.
double Quantile(const std::vector<double>& v, double p) {
  const double h = (static_cast<double>(v.size()) - 1) * p;
  const auto i = static_cast<size_t>(std::floor(h));
  if (i + 1 >= v.size()) return v.back();
  return v[i] + (h - static_cast<double>(i)) * (v[i + 1] - v[i]);
}

}  // namespace

void RenderLineChart(const LineChart& chart, IdRegistry* ids, std::string* out) {
  const std::string id = ids->Make(chart.title, "line-chart");
  size_t skipped = 0;
  double xmin = kInf, xmax = -kInf, ymin = kInf, ymax = -kInf;
  std::vector<std::vector<std::pair<double, double>>> series(chart.series.size());
  for (size_t s = 0; s < chart.series.size(); ++s) {
    for (const auto& [px, py] : chart.series[s].points) {
      if (!std::isfinite(px) || !std::isfinite(py)) {
        ++skipped;
        continue;
      }
      series[s].emplace_back(px, py);
      xmin = std::min(xmin, px), xmax = std::max(xmax, px);
      ymin = std::min(ymin, py), ymax = std::max(ymax, py);
    }
    std::stable_sort(series[s].begin(), series[s].end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
  }
  const bool has_points = xmin <= xmax;
  const bool has_limit = chart.limit.has_value() && std::isfinite(*chart.limit);
  if (!has_points) xmin = 0, xmax = 1, ymin = has_limit ? *chart.limit : 0, ymax = ymin;
  if (has_limit) ymin = std::min(ymin, *chart.limit), ymax = std::max(ymax, *chart.limit);
  if (ymin > 0 && ymin <= 0.5 * ymax) ymin = 0;  // small offsets from zero read as a cut axis

  std::vector<LegendItem> legend;
  for (size_t s = 0; s < chart.series.size(); ++s) {
    const std::string& name = chart.series[s].name;
    legend.push_back({series[s].empty() ? name + " (no points)" : name,
                      SeriesColor(s),
                      LegendItem::Mark::kLine,
                      {}});
  }
  const std::string limit_text = !has_limit                  ? ""
                                 : chart.limit_label.empty() ? "limit " + FormatValue(*chart.limit)
                                                             : chart.limit_label;
  if (has_limit) legend.push_back({limit_text, kLimitColor, LegendItem::Mark::kDashedLine, {}});

  const Axis xaxis = NiceAxis(xmin, xmax, 10, /*extend=*/true);
  const Axis yaxis = NiceAxis(ymin, ymax, 6, /*extend=*/true);
  const double legend_h = LegendHeight(legend, kChartWidth - 8);
  const double plot_top = legend_h + 14;
  const double plot_bottom = plot_top + 260;
  const double plot_left = YAxisWidth(yaxis, !chart.y_label.empty()) + 4;
  const double plot_right = kChartWidth - 24;
  const double height = plot_bottom + (chart.x_label.empty() ? 28 : 44);
  const Scale xs{xaxis.lo, xaxis.hi, plot_left, plot_right};
  const Scale ys{yaxis.lo, yaxis.hi, plot_bottom, plot_top};

  OpenFigure(out, "sluice-line-chart", id, chart.title, kChartWidth, height);
  AppendLegend(out, legend, plot_left, 0, kChartWidth - plot_left - 8);
  AppendYAxis(out, yaxis, ys, plot_left, plot_right, chart.y_label);
  AppendXAxis(out, xaxis, xs, plot_bottom, plot_top, chart.x_label);
  if (!has_points) {
    *out += fmt::format(
        "<text class=\"empty\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">no data points</text>",
        Coord((plot_left + plot_right) / 2), Coord((plot_top + plot_bottom) / 2));
  }
  if (has_limit) {
    const double ly = ys(*chart.limit);
    *out += fmt::format(
        "<g class=\"limit\"><title>{}</title><path d=\"M{} {}H{}\" stroke=\"{}\" "
        "stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/><text x=\"{}\" y=\"{}\" "
        "text-anchor=\"end\" fill=\"{}\">{}</text></g>\n",
        Escape(fmt::format("{}: {}", limit_text, FormatValue(*chart.limit))), Coord(plot_left),
        Coord(ly), Coord(plot_right), kLimitColor, Coord(plot_right - 4), Coord(ly - 5),
        kLimitColor, Escape(limit_text));
  }
  for (size_t s = 0; s < series.size(); ++s) {
    if (series[s].empty()) continue;
    const std::string color = SeriesColor(s);
    const Series& src = chart.series[s];
    double top = -kInf;
    for (const auto& p : series[s]) top = std::max(top, p.second);
    *out += fmt::format("<g class=\"series\" data-series=\"{}\">", s);
    if (series[s].size() > 1) {
      PathBuilder path(chart.step);
      for (const auto& [px, py] : series[s]) path.Add(xs(px), ys(py));
      *out += fmt::format(
          "<path d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\" "
          "stroke-linejoin=\"round\"><title>{}</title></path>",
          path.Finish(), color,
          Escape(fmt::format("{}: {}, max {}", src.name, Plural(series[s].size(), "point"),
                             FormatValue(top))));
    }
    if (series[s].size() == 1 || (!chart.step && series[s].size() <= 40)) {
      *out += fmt::format("<g class=\"markers\" fill=\"{}\">", color);
      for (const auto& [px, py] : series[s]) {
        *out += fmt::format(
            "<circle cx=\"{}\" cy=\"{}\" r=\"{}\"><title>{}</title></circle>", Coord(xs(px)),
            Coord(ys(py)), series[s].size() == 1 ? 4 : 3,
            Escape(fmt::format("{}: ({}, {})", src.name, FormatValue(px), FormatValue(py))));
      }
      *out += "</g>";
    }
    *out += "</g>\n";
  }
  std::vector<std::string> notes;
  if (chart.series.empty()) notes.push_back("No series to show.");
  if (skipped > 0) notes.push_back(SkippedNote(skipped, "point"));
  if (chart.limit.has_value() && !has_limit) notes.push_back("The limit is not finite; not drawn.");
  CloseFigure(out, notes);
}

void RenderBarChart(const BarChart& chart, IdRegistry* ids, std::string* out) {
  const std::string id = ids->Make(chart.title, "bar-chart");
  size_t invalid = 0;
  double vmin = 0, vmax = 0;
  double label_w = 0, note_w = 0;
  std::vector<std::string> notes_text;
  for (const Bar& bar : chart.bars) {
    const bool valid = !bar.missing && std::isfinite(bar.value);
    if (!bar.missing && !valid) ++invalid;
    if (valid) vmin = std::min(vmin, bar.value), vmax = std::max(vmax, bar.value);
    notes_text.push_back(!bar.note.empty() ? bar.note : valid ? FormatValue(bar.value) : "");
    label_w = std::max(label_w, TextWidth(bar.label, kLabelFontPx));
    if (valid) note_w = std::max(note_w, TextWidth(notes_text.back(), kLabelFontPx));
  }
  const double plot_left = std::clamp(label_w + 18, 60.0, 260.0);
  const double plot_right = kChartWidth - std::clamp(note_w + 16, 40.0, 360.0);
  const double row_h = 28;
  const double bar_h = 18;
  const double plot_top = 6;
  const double n = static_cast<double>(std::max<size_t>(chart.bars.size(), 1));
  const double plot_bottom = plot_top + n * row_h;
  const double height = plot_bottom + (chart.value_label.empty() ? 28 : 44);
  const Axis axis = NiceAxis(vmin, vmax, 8, /*extend=*/true);
  const Scale xs{axis.lo, axis.hi, plot_left, plot_right};
  const std::string hatch = ids->Make(id + "-hatch", "hatch");

  OpenFigure(out, "sluice-bar-chart", id, chart.title, kChartWidth, height);
  AppendHatchPattern(out, hatch);
  AppendXAxis(out, axis, xs, plot_bottom, plot_top, chart.value_label);
  if (chart.bars.empty()) {
    *out +=
        fmt::format("<text class=\"empty\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">no bars</text>",
                    Coord((plot_left + plot_right) / 2), Coord(plot_top + row_h / 2 + 4));
  }
  const double zero = xs(0);
  for (size_t i = 0; i < chart.bars.size(); ++i) {
    const Bar& bar = chart.bars[i];
    const bool valid = !bar.missing && std::isfinite(bar.value);
    const double top = plot_top + static_cast<double>(i) * row_h + (row_h - bar_h) / 2;
    const double text_y = top + bar_h / 2 + 4;
    std::string tooltip = bar.label + ": ";
    if (valid) {
      tooltip += FormatValue(bar.value);
      if (!chart.value_label.empty()) tooltip += " " + chart.value_label;
      if (!bar.note.empty()) tooltip += " (" + bar.note + ")";
    } else {
      tooltip += bar.missing ? "missing" : "invalid value " + FormatValue(bar.value);
      if (!bar.note.empty()) tooltip += " (" + bar.note + ")";
    }
    *out += fmt::format("<g class=\"bar{}\"><title>{}</title>",
                        !valid ? " missing" : bar.partial ? " partial" : "", Escape(tooltip));
    *out += fmt::format("<text class=\"bar-label\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
                        Coord(plot_left - 8), Coord(text_y),
                        Escape(Truncate(bar.label, plot_left - 14, kLabelFontPx)));
    if (valid) {
      const double x0 = std::min(zero, xs(bar.value));
      const double x1 = std::max(zero, xs(bar.value));
      *out += fmt::format(
          "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" rx=\"2\" fill=\"{}\"{}/>"
          "<text class=\"bar-note\" x=\"{}\" y=\"{}\">{}</text>",
          Coord(x0), Coord(top), Coord(std::max(x1 - x0, 0.5)), Coord(bar_h), kBarColor,
          bar.partial ? fmt::format(" fill-opacity=\"0.45\" stroke=\"{}\" "
                                    "stroke-dasharray=\"4 2\"",
                                    kBarColor)
                      : "",
          Coord(x1 + 6), Coord(text_y), Escape(notes_text[i]));
    } else {
      std::string text = bar.missing ? (bar.note.empty() ? "missing" : bar.note)
                                     : "invalid value (" + FormatValue(bar.value) + ")";
      *out += fmt::format(
          "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"url(#{})\" "
          "stroke=\"#8c959f\" stroke-dasharray=\"3 2\"/>"
          "<text class=\"bar-missing\" x=\"{}\" y=\"{}\">{}</text>",
          Coord(plot_left), Coord(top), Coord(plot_right - plot_left), Coord(bar_h), hatch,
          Coord(plot_left + 8), Coord(text_y), Escape(text));
    }
    *out += "</g>\n";
  }
  if (axis.lo < 0) {
    *out += fmt::format("<path class=\"zero\" d=\"M{} {}V{}\"/>", Coord(zero), Coord(plot_top),
                        Coord(plot_bottom));
  }
  std::vector<std::string> notes;
  if (invalid > 0) {
    notes.push_back(
        fmt::format("{} with a NaN or infinite value drawn as missing.", Plural(invalid, "bar")));
  }
  CloseFigure(out, notes);
}

void RenderDistribution(const Distribution& dist, IdRegistry* ids, std::string* out) {
  constexpr size_t kMaxPoints = 400;
  const std::string id = ids->Make(dist.title, "distribution");
  size_t skipped = 0;
  size_t thinned = 0;
  double vmin = kInf, vmax = -kInf;
  std::vector<std::vector<double>> values(dist.groups.size());
  for (size_t g = 0; g < dist.groups.size(); ++g) {
    for (double v : dist.groups[g].second) {
      if (!std::isfinite(v)) {
        ++skipped;
        continue;
      }
      values[g].push_back(v);
      vmin = std::min(vmin, v), vmax = std::max(vmax, v);
    }
    std::sort(values[g].begin(), values[g].end());
  }
  if (vmin > vmax) vmin = 0, vmax = 1;
  if (vmin > 0 && vmin <= 0.5 * vmax) vmin = 0;

  const Axis axis = NiceAxis(vmin, vmax, 6, /*extend=*/true);
  const double plot_top = 10;
  const double plot_bottom = plot_top + 260;
  const double plot_left = YAxisWidth(axis, !dist.value_label.empty()) + 4;
  const double plot_right = kChartWidth - 16;
  const double height = plot_bottom + 46;
  const Scale ys{axis.lo, axis.hi, plot_bottom, plot_top};
  const double slot =
      (plot_right - plot_left) / static_cast<double>(std::max<size_t>(dist.groups.size(), 1));
  const double box_w = std::min(56.0, slot * 0.45);
  const double spread = std::min(slot * 0.7, box_w * 1.8);

  OpenFigure(out, "sluice-distribution", id, dist.title, kChartWidth, height);
  AppendYAxis(out, axis, ys, plot_left, plot_right, dist.value_label);
  *out += fmt::format("<path class=\"domain\" d=\"M{} {}H{}\"/>\n", Coord(plot_left),
                      Coord(plot_bottom), Coord(plot_right));
  if (dist.groups.empty()) {
    *out += fmt::format(
        "<text class=\"empty\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">no groups</text>",
        Coord((plot_left + plot_right) / 2), Coord((plot_top + plot_bottom) / 2));
  }
  for (size_t g = 0; g < dist.groups.size(); ++g) {
    const std::string& label = dist.groups[g].first;
    const std::vector<double>& v = values[g];
    const std::string color = SeriesColor(g);
    const double cx = plot_left + slot * (static_cast<double>(g) + 0.5);
    *out += fmt::format("<g class=\"dist-group\" data-group=\"{}\">", g);
    *out += fmt::format(
        "<text class=\"group-label\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>", Coord(cx),
        Coord(plot_bottom + 17), Escape(Truncate(label, slot - 6, kLabelFontPx)));
    *out += fmt::format(
        "<text class=\"group-count\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">n={}</text>",
        Coord(cx), Coord(plot_bottom + 32), v.size());
    if (v.empty()) {
      *out += fmt::format(
          "<text class=\"empty\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">"
          "<title>{}: no values</title>no data</text></g>\n",
          Coord(cx), Coord((plot_top + plot_bottom) / 2), Escape(label));
      continue;
    }
    const double q1 = Quantile(v, 0.25), med = Quantile(v, 0.5), q3 = Quantile(v, 0.75);
    double sum = 0;
    for (double x : v) sum += x;
    *out +=
        fmt::format("<g class=\"box\"><title>{}</title>",
                    Escape(fmt::format("{}: n={}, min {}, q1 {}, median {}, q3 {}, max {}, mean {}",
                                       label, v.size(), FormatValue(v.front()), FormatValue(q1),
                                       FormatValue(med), FormatValue(q3), FormatValue(v.back()),
                                       FormatValue(sum / static_cast<double>(v.size())))));
    const double cap = box_w / 4;
    *out += fmt::format(
        "<path class=\"whisker\" d=\"M{0} {1}V{2}M{0} {3}V{4}M{5} {1}h{7}M{5} {4}h{7}\" "
        "stroke=\"{6}\" stroke-width=\"1.5\"/>",
        Coord(cx), Coord(ys(v.front())), Coord(ys(q1)), Coord(ys(q3)), Coord(ys(v.back())),
        Coord(cx - cap), color, Coord(2 * cap));
    *out += fmt::format(
        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" fill-opacity=\"0.18\" "
        "stroke=\"{}\" stroke-width=\"1.5\"/><path class=\"median\" d=\"M{} {}h{}\" stroke=\"{}\" "
        "stroke-width=\"3\"/></g>",
        Coord(cx - box_w / 2), Coord(ys(q3)), Coord(box_w), Coord(std::max(ys(q1) - ys(q3), 0.5)),
        color, color, Coord(cx - box_w / 2), Coord(ys(med)), Coord(box_w), color);
    const size_t stride = (v.size() + kMaxPoints - 1) / kMaxPoints;
    if (stride > 1) thinned += v.size() - (v.size() + stride - 1) / stride;
    *out += fmt::format("<g class=\"points\" fill=\"{}\" fill-opacity=\"0.55\">", color);
    for (size_t i = 0; i < v.size(); i += stride) {
      // Deterministic jitter from the golden-ratio sequence.
      const double jitter = std::fmod(static_cast<double>(i) * 0.6180339887498949, 1.0) - 0.5;
      *out += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"2.2\"><title>{}</title></circle>",
                          Coord(cx + jitter * spread), Coord(ys(v[i])), FormatValue(v[i]));
    }
    *out += "</g></g>\n";
  }
  std::vector<std::string> notes;
  if (skipped > 0) notes.push_back(SkippedNote(skipped, "value"));
  if (thinned > 0) {
    notes.push_back(
        fmt::format("Groups with more than {} values show every k-th sorted value as "
                    "a point ({} not drawn); the boxes use all values.",
                    kMaxPoints, Plural(thinned, "point")));
  }
  CloseFigure(out, notes);
}

}  // namespace sluice::report::internal
