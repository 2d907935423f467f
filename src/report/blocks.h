// The renderers of the report's blocks (html_report.h), one per Block alternative. Each appends
// one self-contained <figure> (a table or an inline <svg>) to `out`, taking its element id from
// `ids` so that ids stay unique on the page. Values that cannot be drawn (NaN, infinities, bars
// that end before they start) are skipped and counted in a note under the figure.
//
// Internal to the report library; RenderHtml is the public entry point.
//
// Thread safety: pure functions; `ids` and `out` belong to the caller's render.
#pragma once

#include <string>

#include "report/html_report.h"
#include "report/svg_util.h"

namespace sluice::report::internal {

// The width in pixels of every chart's viewBox; the page scales it down on narrow screens.
inline constexpr double kChartWidth = 1100;

void RenderTable(const Table& table, IdRegistry* ids, std::string* out);
void RenderTimeline(const Timeline& timeline, IdRegistry* ids, std::string* out);
void RenderLineChart(const LineChart& chart, IdRegistry* ids, std::string* out);
void RenderBarChart(const BarChart& chart, IdRegistry* ids, std::string* out);
void RenderDistribution(const Distribution& dist, IdRegistry* ids, std::string* out);

}  // namespace sluice::report::internal
