// Building blocks of the HTML report that are not part of its public API (html_report.h):
// escaping, fixed number formatting, nice axis ticks, element ids and category colours. They are
// declared here so that the chart renderers share them and the unit tests can check them.
//
// Everything is deterministic: numbers are formatted with fmt (locale-independent) at a fixed
// precision, colours of unknown categories come from a portable hash of the name, and ids depend
// only on the titles and the order in which they are requested.
//
// Thread safety: free functions are pure; an IdRegistry is used by one thread (one page render).
#pragma once

#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::report::internal {

// Appends `text` escaped for HTML and SVG/XML, valid both as element text and inside a
// double-quoted attribute: & < > " ' become entities, control characters other than tab, newline
// and carriage return are dropped (XML forbids them) and invalid UTF-8 becomes U+FFFD.
void AppendEscaped(std::string* out, std::string_view text);
std::string Escape(std::string_view text);

// An SVG coordinate rounded to 0.1 in its shortest form: "12", "12.5", "-3.1"; never "-0".
// Non-finite values give "0" (callers skip them before; this only keeps the markup valid).
std::string Coord(double v);

// `v` with exactly `decimals` digits after the point ("-0.0" is printed as "0.0").
std::string FormatFixed(double v, int decimals);

// A value for a label or tooltip, about 3-4 significant digits without trailing zeros, with a
// k/M/G suffix from 10,000 on: "12.5", "0.00312", "1234.6", "45.2k", "1.23M". "nan", "inf" and
// "-inf" for non-finite values.
std::string FormatValue(double v);

// A linear axis: the domain [lo, hi] and the tick positions inside it, `step` apart.
struct Axis {
  double lo = 0;
  double hi = 1;
  double step = 0.2;
  std::vector<double> ticks;
  int decimals = 1;  // digits after the point that tell two neighbouring ticks apart
  double scale = 1;  // tick labels show value / scale with `suffix` (1 and "", 1e3 and "k", ...)
  std::string suffix;
};

// A "nice" axis (steps of 1, 2, 2.5 or 5 times a power of ten) covering [lo, hi] with about
// `target` intervals (clamped to [1, 50]). With `extend` the domain grows to the enclosing ticks.
// A zero-width range is widened (around the value, or [0, 1] at zero); non-finite ends give
// [0, 1]; lo > hi are swapped.
Axis NiceAxis(double lo, double hi, int target, bool extend);

// A tick label: "0", "2.5", "40k", "1.5M", with the axis' decimals and suffix.
std::string TickLabel(double v, const Axis& axis);

// Unique ids for the elements of one page: a lower-case slug of the title ("Memory per rank" →
// "memory-per-rank"), `fallback` when the title has no letters or digits, and "-2", "-3", ...
// appended when the id is already taken.
class IdRegistry {
 public:
  std::string Make(std::string_view title, std::string_view fallback);

 private:
  std::set<std::string> used_;
};

// Lower-case ASCII letters, digits and single dashes; "" when nothing is left.
std::string Slug(std::string_view text);

// A timeline category as shown in the legend: trimmed, lower-case, '_' and ' ' turned into '-'
// ("Backward_Weight" → "backward-weight"); "other" when empty.
std::string CategoryKey(std::string_view category);
// The fill colour of a category key ("#4e79a7"). The known kinds (forward, backward,
// backward-input, backward-weight, recompute, send, recv, send/recv, all-reduce, reduce-scatter,
// all-gather, all-to-all, optimizer, load, idle, other and their common abbreviations such as
// "fwd", "bwd", "F", "B", "W") have fixed colours, distinct but for send/recv (send's); any other
// key gets one of a fixed palette by a hash of its name.
std::string CategoryColor(std::string_view key);
// Legend position: known kinds first in pipeline order, then the others (by name, by caller).
int CategoryRank(std::string_view key);

// The colour of the i-th series of a chart (a 10-colour palette, repeated).
std::string SeriesColor(size_t i);

// Whether text on the colour `hex` ("#rrggbb") should be dark (light background).
bool WantsDarkText(std::string_view hex);

// "1 bar" / "3 bars": `count` and the noun, with "s" appended unless count is 1.
std::string Plural(size_t count, std::string_view noun);

// Maps the data interval [d0, d1] linearly onto pixels [p0, p1] (p1 < p0 for a y axis).
struct Scale {
  double d0 = 0, d1 = 1, p0 = 0, p1 = 1;
  double operator()(double v) const {
    return d1 == d0 ? p0 : p0 + (v - d0) * (p1 - p0) / (d1 - d0);
  }
};

// A chart figure: `<figure class="sluice-figure">`, an <h3> with the title when there is one,
// and the opening <svg class="sluice-chart KIND" id="ID" viewBox="0 0 W H"> with a <title>.
void OpenFigure(std::string* out, std::string_view kind, std::string_view id,
                std::string_view title, double width, double height);
// Closes the <svg>, adds one <p class="note"> per note (what was skipped and why), closes the
// figure.
void CloseFigure(std::string* out, const std::vector<std::string>& notes);

// A horizontal value axis at pixel row `y`: the baseline, a tick and a label per tick (below the
// line, or above it with `labels_above`), vertical grid lines up to `grid_top` and, when `label`
// is not empty, the axis title centred under the ticks.
void AppendXAxis(std::string* out, const Axis& axis, const Scale& x, double y, double grid_top,
                 std::string_view label, bool labels_above = false);
// Pixels needed left of a vertical axis for its tick labels and, with `has_label`, its title.
double YAxisWidth(const Axis& axis, bool has_label);
// A vertical value axis at pixel column `x`: tick labels to its left, horizontal grid lines up
// to `grid_right` and, when `label` is not empty, the title rotated along the axis.
void AppendYAxis(std::string* out, const Axis& axis, const Scale& y, double x, double grid_right,
                 std::string_view label);

// One legend entry: a colour swatch (a filled square, a line, a dashed line or a hatched square)
// and its text; `tooltip` defaults to the text.
struct LegendItem {
  enum class Mark { kSwatch, kLine, kDashedLine, kHatched };
  std::string text;
  std::string color;
  Mark mark = Mark::kSwatch;
  std::string tooltip;
};
// Height in pixels of the legend laid out in rows no wider than `width` (0 for no items).
double LegendHeight(const std::vector<LegendItem>& items, double width);
// A <g class="legend"> with the items laid out left to right from (x, y), wrapping at `width`.
// `hatch_id` names the pattern used by kHatched marks.
void AppendLegend(std::string* out, const std::vector<LegendItem>& items, double x, double y,
                  double width, std::string_view hatch_id = "");
// A <pattern id="ID"> of diagonal grey lines for missing values, inside <defs>.
void AppendHatchPattern(std::string* out, std::string_view id);

// Approximate width in pixels of `text` in the page's sans-serif font at `font_px` (0.58 em per
// character, counting UTF-8 code points); good enough to decide whether a label fits.
double TextWidth(std::string_view text, double font_px);
// `text` cut to at most `max_px` wide, ending with "…" when cut.
std::string Truncate(std::string_view text, double max_px, double font_px);

}  // namespace sluice::report::internal
