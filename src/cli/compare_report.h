// What `sluice compare` shows of a CompareResult (compare/compare.h): the terminal tables, the
// HTML report (report/html_report.h: throughput bars per method, the per-batch throughput
// distribution, where each method's device time goes, one example timeline per method) and the
// Markdown summary of several scenarios (`--scenario-dir`, pasted into docs/benchmarks.md).
//
// Thread safety: pure functions.
#pragma once

#include <span>
#include <string>

#include "compare/compare.h"
#include "report/html_report.h"

namespace sluice::cli {

// The method tables (own best configuration, controlled) and the time breakdown, for a terminal.
std::string FormatCompareTables(const CompareResult& result);

// The HTML report of one comparison.
report::HtmlReport BuildCompareReport(const CompareResult& result);

// One Markdown table row per scenario: every method's ratio to the reference (own best
// configurations), sluice's ratio under the controlled configuration, sluice's fraction of the
// ideal, its configuration and its three largest losses (the time breakdown). A scenario without
// a method named "sluice" shows its fastest method instead, named in the cell.
std::string FormatScenarioSummary(std::span<const CompareResult> results);

}  // namespace sluice::cli
