#include "report/html_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <string>
#include <type_traits>

#include "base/json_util.h"
#include "report/blocks.h"
#include "report/svg_util.h"

namespace sluice::report {
namespace internal {
namespace {

// The page's only stylesheet. System fonts only: nothing is fetched to show the page.
constexpr std::string_view kStyle = R"css(
:root{--fg:#1f2328;--muted:#59636e;--border:#d1d9e0;--soft:#eef1f4;--panel:#f6f8fa;--accent:#0969da}
*{box-sizing:border-box}
html{-webkit-text-size-adjust:100%}
body{margin:0;background:var(--panel);color:var(--fg);
font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue","Noto Sans",
"Liberation Sans",Arial,sans-serif}
.page-header{background:#fff;border-bottom:1px solid var(--border);padding:20px 0 16px}
.page-header>div,main,footer{max-width:1320px;margin:0 auto;padding-left:24px;padding-right:24px}
h1{font-size:24px;line-height:1.25;margin:0 0 4px;font-weight:600}
.subtitle{color:var(--muted);margin:0;white-space:pre-line}
.facts{display:grid;grid-template-columns:max-content minmax(0,1fr);gap:3px 14px;margin:10px 0 0;
font-size:13px;line-height:1.45}
.facts dt{color:var(--muted);font-weight:600;white-space:nowrap}
.facts dd{margin:0;overflow-wrap:anywhere}
.toc{margin-top:10px;font-size:13px}
.toc a{color:var(--accent);text-decoration:none;margin-right:16px;white-space:nowrap}
.toc a:hover{text-decoration:underline}
main{padding-top:8px;padding-bottom:24px}
.report-section{background:#fff;border:1px solid var(--border);border-radius:8px;
padding:16px 24px 8px;margin:16px 0}
h2{font-size:18px;line-height:1.3;margin:0 0 10px;padding-bottom:8px;
border-bottom:1px solid var(--soft);font-weight:600}
h3{font-size:14px;margin:14px 0 8px;font-weight:600}
.section-text{margin:0 0 10px;max-width:80ch}
.sluice-figure{margin:0 0 18px}
.chart,.table-wrap{overflow-x:auto}
.sluice-chart{display:block;max-width:100%;height:auto;font-size:11px}
.sluice-chart text{fill:var(--muted)}
.sluice-chart .legend text,.sluice-chart .tl-label,.sluice-chart .bar-label,
.sluice-chart .group-label{fill:var(--fg);font-size:12px}
.sluice-chart .tl-bar-labels text{fill:inherit}
.sluice-chart .axis-title{font-size:12px;fill:var(--fg)}
.sluice-chart .grid{stroke:var(--soft);fill:none}
.sluice-chart .domain{stroke:#8c959f;fill:none}
.sluice-chart .zero{stroke:#59636e;fill:none}
.sluice-chart .tl-stripes rect{fill:#f6f8fa}
.sluice-chart .tl-bars rect:hover,.sluice-chart .bar rect:hover{stroke:#1f2328;stroke-width:1}
.sluice-chart .bar-note{fill:var(--fg);font-size:12px}
.sluice-chart .bar-missing{fill:var(--fg);font-size:12px;font-weight:600}
.sluice-chart .empty{font-size:13px;font-style:italic}
.sluice-chart .limit text{fill:#cf222e;font-size:12px}
.sluice-table{border-collapse:collapse;font-size:13px;font-variant-numeric:tabular-nums;
min-width:50%}
.sluice-table th,.sluice-table td{padding:5px 10px;border-bottom:1px solid var(--soft);
text-align:left;white-space:nowrap}
.sluice-table .wrap{white-space:normal;min-width:14em}
.sluice-table th{background:var(--panel);font-weight:600;border-bottom:1px solid var(--border);
white-space:normal;vertical-align:bottom}
.sluice-table .num{text-align:right}
.sluice-table tbody tr:hover{background:#f3f8ff}
.sluice-table .empty td{color:var(--muted);font-style:italic}
.note{color:var(--muted);font-size:12.5px;margin:4px 0}
footer{color:var(--muted);font-size:12px;padding-bottom:24px}
@media print{body{background:#fff}.report-section{border:none;padding:0}}
)css";

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

std::string_view Trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// A number, optionally signed, with ',' grouping and an exponent, followed by an optional unit
// without digits of at most 6 characters: "12", "-3.5e-2", "1,024", "1.00x", "45 %", "12.3 ms".
bool LooksNumeric(std::string_view cell) {
  size_t i = 0;
  if (i < cell.size() && (cell[i] == '+' || cell[i] == '-')) ++i;
  size_t digits = 0;
  bool dot = false;
  for (; i < cell.size(); ++i) {
    const char c = cell[i];
    if (c >= '0' && c <= '9') {
      ++digits;
    } else if (c == '.' && !dot) {
      dot = true;
    } else if (c == ',' && digits > 0 && !dot) {
    } else {
      break;
    }
  }
  if (digits == 0) return false;
  if (i + 1 < cell.size() && (cell[i] == 'e' || cell[i] == 'E')) {
    size_t j = i + 1;
    if (cell[j] == '+' || cell[j] == '-') ++j;
    if (j < cell.size() && cell[j] >= '0' && cell[j] <= '9') {
      while (j < cell.size() && cell[j] >= '0' && cell[j] <= '9') ++j;
      i = j;
    }
  }
  const std::string_view unit = Trim(cell.substr(i));
  return unit.size() <= 6 && unit.find_first_of("0123456789") == std::string_view::npos;
}

// Cells that say "no value" and do not decide a column's alignment.
bool IsPlaceholder(std::string_view cell) {
  static constexpr std::array<std::string_view, 14> kPlaceholders = {
      "", "-", "—", "–", "n/a", "na", "nan", "inf", "-inf", "+inf", "oom", "none", "null", "?"};
  const std::string lower = Lower(cell);
  return std::find(kPlaceholders.begin(), kPlaceholders.end(), lower) != kPlaceholders.end();
}

bool GuessNumeric(const Table& table, size_t column) {
  bool any = false;
  for (const auto& row : table.rows) {
    if (column >= row.size()) continue;
    const std::string_view cell = Trim(row[column]);
    if (LooksNumeric(cell)) {
      any = true;
    } else if (!IsPlaceholder(cell)) {
      return false;
    }
  }
  return any;
}

// Paragraphs separated by blank lines, each in a <p>.
void AppendParagraphs(std::string* out, std::string_view text, std::string_view cls) {
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find("\n\n", pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view para = Trim(text.substr(pos, end - pos));
    if (!para.empty()) {
      *out += fmt::format("<p class=\"{}\">", cls);
      AppendEscaped(out, para);
      *out += "</p>\n";
    }
    pos = end + 2;
  }
}

}  // namespace

void RenderTable(const Table& table, IdRegistry* ids, std::string* out) {
  const std::string id = ids->Make(table.title, "table");
  size_t columns = table.header.size();
  for (const auto& row : table.rows) columns = std::max(columns, row.size());
  std::vector<bool> numeric(columns);
  for (size_t c = 0; c < columns; ++c) {
    numeric[c] = c < table.numeric.size() ? table.numeric[c] : GuessNumeric(table, c);
  }
  auto cell_open = [&](std::string_view tag, size_t c) {
    const bool wrap = c < table.wrap.size() && table.wrap[c];
    if (numeric[c]) return fmt::format("<{} class=\"num{}\">", tag, wrap ? " wrap" : "");
    return wrap ? fmt::format("<{} class=\"wrap\">", tag) : fmt::format("<{}>", tag);
  };

  *out += "<figure class=\"sluice-figure\">";
  if (!table.title.empty()) {
    *out += "<h3>";
    AppendEscaped(out, table.title);
    *out += "</h3>";
  }
  *out += fmt::format("<div class=\"table-wrap\"><table class=\"sluice-table\" id=\"{}\">", id);
  if (columns > 0 && !table.header.empty()) {
    *out += "<thead><tr>";
    for (size_t c = 0; c < columns; ++c) {
      *out += cell_open("th", c);
      if (c < table.header.size()) AppendEscaped(out, table.header[c]);
      *out += "</th>";
    }
    *out += "</tr></thead>";
  }
  *out += "\n<tbody>\n";
  for (const auto& row : table.rows) {
    *out += "<tr>";
    for (size_t c = 0; c < columns; ++c) {
      *out += cell_open("td", c);
      if (c < row.size()) AppendEscaped(out, row[c]);
      *out += "</td>";
    }
    *out += "</tr>\n";
  }
  if (table.rows.empty()) {
    *out += fmt::format("<tr class=\"empty\"><td colspan=\"{}\">no rows</td></tr>\n",
                        std::max<size_t>(columns, 1));
  }
  *out += "</tbody></table></div></figure>\n";
}

}  // namespace internal

std::string RenderHtml(const HtmlReport& report) {
  using internal::AppendEscaped;
  internal::IdRegistry ids;
  const std::string title = report.title.empty() ? "sluice report" : report.title;
  std::string out;
  out +=
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<meta name=\"generator\" content=\"sluice\">\n<title>";
  AppendEscaped(&out, title);
  out += "</title>\n<style>";
  out += internal::kStyle;
  out += "</style>\n</head>\n<body>\n<header class=\"page-header\"><div><h1>";
  AppendEscaped(&out, title);
  out += "</h1>";
  if (!report.subtitle.empty()) {
    out += "<p class=\"subtitle\">";
    AppendEscaped(&out, report.subtitle);
    out += "</p>";
  }
  if (!report.facts.empty()) {
    out += "\n<dl class=\"facts\">";
    for (const auto& [label, value] : report.facts) {
      out += "<dt>";
      AppendEscaped(&out, label);
      out += "</dt><dd>";
      AppendEscaped(&out, value);
      out += "</dd>";
    }
    out += "</dl>";
  }
  std::vector<std::string> section_ids;
  for (const Section& section : report.sections) {
    section_ids.push_back(ids.Make("section " + section.heading, "section"));
  }
  if (report.sections.size() > 1) {
    out += "\n<nav class=\"toc\">";
    for (size_t s = 0; s < report.sections.size(); ++s) {
      if (report.sections[s].heading.empty()) continue;
      out += fmt::format("<a href=\"#{}\">", section_ids[s]);
      AppendEscaped(&out, report.sections[s].heading);
      out += "</a>";
    }
    out += "</nav>";
  }
  out += "</div></header>\n<main>\n";
  if (report.sections.empty()) out += "<p class=\"note\">This report has no sections.</p>\n";
  for (size_t s = 0; s < report.sections.size(); ++s) {
    const Section& section = report.sections[s];
    out += fmt::format("<section class=\"report-section\" id=\"{}\">\n", section_ids[s]);
    if (!section.heading.empty()) {
      out += "<h2>";
      AppendEscaped(&out, section.heading);
      out += "</h2>\n";
    }
    internal::AppendParagraphs(&out, section.text, "section-text");
    for (const Block& block : section.blocks) {
      std::visit(
          [&](const auto& b) {
            using T = std::decay_t<decltype(b)>;
            if constexpr (std::is_same_v<T, Table>) {
              internal::RenderTable(b, &ids, &out);
            } else if constexpr (std::is_same_v<T, Timeline>) {
              internal::RenderTimeline(b, &ids, &out);
            } else if constexpr (std::is_same_v<T, LineChart>) {
              internal::RenderLineChart(b, &ids, &out);
            } else if constexpr (std::is_same_v<T, BarChart>) {
              internal::RenderBarChart(b, &ids, &out);
            } else {
              static_assert(std::is_same_v<T, Distribution>);
              internal::RenderDistribution(b, &ids, &out);
            }
          },
          block);
    }
    out += "</section>\n";
  }
  out +=
      "</main>\n<footer>Generated by sluice. This page is self-contained: it loads nothing "
      "from the network. Hover over bars and points for details.</footer>\n</body>\n</html>\n";
  return out;
}

Status WriteHtmlReport(const HtmlReport& report, std::string_view path) {
  if (path.empty()) return InvalidArgumentError("HTML report: the output path is empty");
  return WriteStringToFile(std::string(path), RenderHtml(report));
}

}  // namespace sluice::report
