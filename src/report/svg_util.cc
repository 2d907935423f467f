#include "report/svg_util.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <utility>

namespace sluice::report::internal {
namespace {

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Length of the valid UTF-8 sequence at text[i], or 0 when it is not valid.
size_t Utf8SequenceLength(std::string_view text, size_t i) {
  const auto c = static_cast<unsigned char>(text[i]);
  size_t len = 0;
  uint32_t cp = 0;
  uint32_t min = 0;
  if ((c & 0xE0) == 0xC0) {
    len = 2, cp = c & 0x1F, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3, cp = c & 0x0F, min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4, cp = c & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (i + len > text.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(text[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

size_t CodePoints(std::string_view text) {
  size_t n = 0;
  for (char ch : text) n += (static_cast<unsigned char>(ch) & 0xC0) != 0x80;
  return n;
}

// Digits after the point needed to print `x` exactly enough (at most 12).
int DecimalsFor(double x) {
  x = std::fabs(x);
  if (x == 0) return 0;
  for (int d = 0; d < 12; ++d) {
    const double scaled = x * std::pow(10.0, d);
    if (std::round(scaled) >= 1 && std::fabs(scaled - std::round(scaled)) <= 1e-6 * scaled) {
      return d;
    }
  }
  return 12;
}

std::string TrimZeros(std::string s) {
  if (s.find('.') == std::string::npos) return s;
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  if (s == "-0") s = "0";
  return s;
}

struct KnownCategory {
  std::string_view key;
  std::string_view color;
  std::array<std::string_view, 8> aliases;
};

// In legend order. Colours follow the Tableau 10 palette: compute in blue/green/purple,
// point-to-point communication in orange, collectives in red (all-reduce), dark magenta
// (reduce-scatter), teal (all-gather) and pink (all-to-all), idle time in grey. Every category
// has its own colour except send/recv, which is the send colour under a name of its own.
constexpr std::array<KnownCategory, 16> kKnownCategories = {{
    {"forward", "#4e79a7", {"fwd", "f", "fw", "fprop"}},
    {"recompute", "#a0cbe8", {"recomputation", "rc", "re-forward"}},
    {"backward", "#59a14f", {"bwd", "b", "bw", "bprop"}},
    {"backward-input", "#8cd17d", {"bwd-input", "input-grad", "i", "dgrad", "backward-i"}},
    {"backward-weight", "#b07aa1", {"bwd-weight", "weight-grad", "w", "wgrad", "backward-w"}},
    {"send", "#f28e2b", {"send-start", "send-finish", "isend"}},
    {"recv", "#ffbe7d", {"receive", "recv-start", "recv-finish", "irecv"}},
    {"send/recv", "#f28e2b", {"sendrecv", "send-recv", "p2p", "comm"}},
    {"all-reduce", "#e15759", {"allreduce", "grad-sync", "dp-comm"}},
    {"reduce-scatter", "#8f2d56", {"reducescatter"}},
    {"all-gather", "#76b7b2", {"allgather"}},
    {"all-to-all", "#ff9da7", {"alltoall", "a2a"}},
    {"optimizer", "#edc948", {"optim", "opt", "step", "optimizer-step"}},
    {"load", "#9c755f", {"data", "loader", "data-load"}},
    {"idle", "#d4d4d4", {"bubble", "wait", "stall"}},
    {"other", "#bab0ac", {"misc"}},
}};

constexpr std::array<std::string_view, 10> kFallbackColors = {
    "#499894", "#d37295", "#b6992d", "#86bcb6", "#79706e",
    "#fabfd2", "#f1ce63", "#d4a6c8", "#9d7660", "#8cd1c3"};

constexpr std::array<std::string_view, 10> kSeriesColors = {
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
    "#b07aa1", "#edc948", "#ff9da7", "#9c755f", "#79706e"};

const KnownCategory* FindCategory(std::string_view key) {
  for (const KnownCategory& k : kKnownCategories) {
    if (k.key == key) return &k;
    for (std::string_view a : k.aliases) {
      if (!a.empty() && a == key) return &k;
    }
  }
  return nullptr;
}

uint32_t Fnv1a(std::string_view s) {
  uint32_t h = 2166136261u;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 16777619u;
  }
  return h;
}

}  // namespace

void AppendEscaped(std::string* out, std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      switch (c) {
        case '&':
          *out += "&amp;";
          break;
        case '<':
          *out += "&lt;";
          break;
        case '>':
          *out += "&gt;";
          break;
        case '"':
          *out += "&quot;";
          break;
        case '\'':
          *out += "&#39;";
          break;
        default:
          if (c >= 0x20 ? c != 0x7F : (c == '\t' || c == '\n' || c == '\r')) {
            out->push_back(static_cast<char>(c));
          }
      }
      ++i;
      continue;
    }
    const size_t len = Utf8SequenceLength(text, i);
    if (len == 0) {
      *out += kReplacementChar;
      ++i;
    } else {
      out->append(text.substr(i, len));
      i += len;
    }
  }
}

std::string Escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  AppendEscaped(&out, text);
  return out;
}

std::string Coord(double v) {
  if (!std::isfinite(v)) return "0";
  return TrimZeros(fmt::format("{:.1f}", std::round(v * 10.0) / 10.0));
}

std::string FormatFixed(double v, int decimals) {
  std::string s = fmt::format("{:.{}f}", v, std::clamp(decimals, 0, 15));
  if (s[0] == '-' && s.find_first_not_of("-0.") == std::string::npos) s.erase(0, 1);
  return s;
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  const double a = std::fabs(v);
  static constexpr std::array<std::pair<double, std::string_view>, 3> kSuffixes = {
      {{1e9, "G"}, {1e6, "M"}, {1e3, "k"}}};
  for (const auto& [scale, suffix] : kSuffixes) {
    if (a >= (scale == 1e3 ? 1e4 : scale)) {
      const double s = v / scale;
      const int decimals = std::fabs(s) >= 100 ? 0 : std::fabs(s) >= 10 ? 1 : 2;
      return TrimZeros(FormatFixed(s, decimals)) + std::string(suffix);
    }
  }
  int decimals = 3;
  if (a >= 1000) {
    decimals = 1;
  } else if (a >= 100) {
    decimals = 2;
  } else if (a > 0 && a < 0.1) {
    decimals = std::min(12, 2 - static_cast<int>(std::floor(std::log10(a))));
  }
  return TrimZeros(FormatFixed(v, decimals));
}

Axis NiceAxis(double lo, double hi, int target, bool extend) {
  if (!std::isfinite(lo) || !std::isfinite(hi) || !std::isfinite(hi - lo)) lo = 0, hi = 1;
  if (lo > hi) std::swap(lo, hi);
  const double magnitude = std::max(std::fabs(lo), std::fabs(hi));
  if (hi - lo <= magnitude * 1e-12) {
    if (magnitude == 0) {
      lo = 0, hi = 1;
    } else {
      lo -= magnitude * 0.1, hi += magnitude * 0.1;
    }
  }
  target = std::clamp(target, 1, 50);
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  const double nice = norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 2.5 ? 2.5 : norm <= 5 ? 5 : 10;
  Axis axis;
  axis.step = nice * mag;
  if (extend) {
    lo = std::floor(lo / axis.step + 1e-9) * axis.step;
    hi = std::ceil(hi / axis.step - 1e-9) * axis.step;
  }
  axis.lo = lo;
  axis.hi = hi;
  const double kmin = std::ceil(lo / axis.step - 1e-9);
  const double kmax = std::floor(hi / axis.step + 1e-9);
  for (double k = kmin; k <= kmax && axis.ticks.size() < 200; k += 1) {
    double t = k * axis.step;
    if (std::fabs(t) < axis.step * 1e-9) t = 0;
    axis.ticks.push_back(t);
  }
  const double largest = std::max(std::fabs(lo), std::fabs(hi));
  if (largest >= 1e9) {
    axis.scale = 1e9, axis.suffix = "G";
  } else if (largest >= 1e6) {
    axis.scale = 1e6, axis.suffix = "M";
  } else if (largest >= 1e4) {
    axis.scale = 1e3, axis.suffix = "k";
  }
  axis.decimals = DecimalsFor(axis.step / axis.scale);
  return axis;
}

std::string TickLabel(double v, const Axis& axis) {
  if (v == 0) return "0";
  return FormatFixed(v / axis.scale, axis.decimals) + axis.suffix;
}

std::string Slug(std::string_view text) {
  std::string out;
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z')) {
      out.push_back(static_cast<char>(c));
    } else if (c >= 'A' && c <= 'Z') {
      out.push_back(static_cast<char>(c - 'A' + 'a'));
    } else if (!out.empty() && out.back() != '-') {
      out.push_back('-');
    }
    if (out.size() >= 60) break;
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out;
}

std::string IdRegistry::Make(std::string_view title, std::string_view fallback) {
  std::string base = Slug(title);
  if (base.empty()) base = Slug(fallback);
  if (base.empty()) base = "block";
  std::string id = base;
  for (int n = 2; used_.count(id) > 0; ++n) id = fmt::format("{}-{}", base, n);
  used_.insert(id);
  return id;
}

std::string CategoryKey(std::string_view category) {
  const size_t b = category.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return "other";
  const size_t e = category.find_last_not_of(" \t\r\n");
  std::string key(category.substr(b, e - b + 1));
  for (char& c : key) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c == '_' || c == ' ') c = '-';
  }
  return key;
}

std::string CategoryColor(std::string_view key) {
  if (const KnownCategory* k = FindCategory(key)) return std::string(k->color);
  return std::string(kFallbackColors[Fnv1a(key) % kFallbackColors.size()]);
}

int CategoryRank(std::string_view key) {
  for (size_t i = 0; i < kKnownCategories.size(); ++i) {
    if (&kKnownCategories[i] == FindCategory(key)) return static_cast<int>(i);
  }
  return static_cast<int>(kKnownCategories.size());
}

std::string SeriesColor(size_t i) { return std::string(kSeriesColors[i % kSeriesColors.size()]); }

bool WantsDarkText(std::string_view hex) {
  if (hex.size() != 7 || hex[0] != '#') return true;
  auto channel = [&](size_t at) {
    const int v = std::stoi(std::string(hex.substr(at, 2)), nullptr, 16);
    const double c = v / 255.0;
    return c <= 0.03928 ? c / 12.92 : std::pow((c + 0.055) / 1.055, 2.4);
  };
  const double luminance = 0.2126 * channel(1) + 0.7152 * channel(3) + 0.0722 * channel(5);
  // Contrast against white text (1.05) vs dark text (#222, ~0.016): pick the larger one.
  return (luminance + 0.05) / 0.066 > 1.05 / (luminance + 0.05);
}

double TextWidth(std::string_view text, double font_px) {
  return static_cast<double>(CodePoints(text)) * 0.58 * font_px;
}

std::string Truncate(std::string_view text, double max_px, double font_px) {
  if (TextWidth(text, font_px) <= max_px) return std::string(text);
  const double ellipsis = TextWidth("…", font_px);
  if (max_px < ellipsis) return "";
  const auto keep = static_cast<size_t>((max_px - ellipsis) / (0.58 * font_px));
  size_t bytes = 0;
  size_t kept = 0;
  while (bytes < text.size()) {
    size_t next = bytes + 1;
    while (next < text.size() && (static_cast<unsigned char>(text[next]) & 0xC0) == 0x80) ++next;
    if (kept == keep) break;
    bytes = next;
    ++kept;
  }
  return std::string(text.substr(0, bytes)) + "…";
}

}  // namespace sluice::report::internal

namespace sluice::report::internal {
namespace {

constexpr double kTickFontPx = 11;
constexpr double kLegendFontPx = 12;
constexpr double kLegendRowPx = 20;

double LegendItemWidth(const LegendItem& item) {
  return 16 + 6 + TextWidth(item.text, kLegendFontPx) + 18;
}

}  // namespace

std::string Plural(size_t count, std::string_view noun) {
  return fmt::format("{} {}{}", count, noun, count == 1 ? "" : "s");
}

void OpenFigure(std::string* out, std::string_view kind, std::string_view id,
                std::string_view title, double width, double height) {
  *out += "<figure class=\"sluice-figure\">";
  if (!title.empty()) {
    *out += "<h3>";
    AppendEscaped(out, title);
    *out += "</h3>";
  }
  *out += fmt::format(
      "<div class=\"chart\"><svg class=\"sluice-chart {}\" id=\"{}\" "
      "xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {} {}\" width=\"{}\" height=\"{}\">"
      "<title>",
      kind, id, Coord(width), Coord(height), Coord(width), Coord(height));
  AppendEscaped(out, title.empty() ? kind : title);
  *out += "</title>\n";
}

void CloseFigure(std::string* out, const std::vector<std::string>& notes) {
  *out += "</svg></div>";
  for (const std::string& note : notes) {
    *out += "<p class=\"note\">";
    AppendEscaped(out, note);
    *out += "</p>";
  }
  *out += "</figure>\n";
}

void AppendXAxis(std::string* out, const Axis& axis, const Scale& x, double y, double grid_top,
                 std::string_view label, bool labels_above) {
  *out += "<g class=\"axis x-axis\"><path class=\"grid\" d=\"";
  for (double t : axis.ticks)
    *out += fmt::format("M{} {}V{}", Coord(x(t)), Coord(grid_top), Coord(y));
  *out +=
      fmt::format("\"/><path class=\"domain\" d=\"M{} {}H{}", Coord(x.p0), Coord(y), Coord(x.p1));
  for (double t : axis.ticks) {
    *out += fmt::format("M{} {}v{}", Coord(x(t)), Coord(y), labels_above ? -4 : 4);
  }
  *out += "\"/><g class=\"tick-labels\" text-anchor=\"middle\">";
  const double label_y = labels_above ? y - 7 : y + 16;
  for (double t : axis.ticks) {
    *out += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>", Coord(x(t)), Coord(label_y),
                        Escape(TickLabel(t, axis)));
  }
  *out += "</g>";
  if (!label.empty()) {
    *out += fmt::format("<text class=\"axis-title\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">",
                        Coord((x.p0 + x.p1) / 2), Coord(labels_above ? y - 24 : y + 34));
    AppendEscaped(out, label);
    *out += "</text>";
  }
  *out += "</g>\n";
}

double YAxisWidth(const Axis& axis, bool has_label) {
  double widest = 0;
  for (double t : axis.ticks) widest = std::max(widest, TextWidth(TickLabel(t, axis), kTickFontPx));
  return 8 + widest + (has_label ? 22 : 4);
}

void AppendYAxis(std::string* out, const Axis& axis, const Scale& y, double x, double grid_right,
                 std::string_view label) {
  *out += "<g class=\"axis y-axis\"><path class=\"grid\" d=\"";
  for (double t : axis.ticks)
    *out += fmt::format("M{} {}H{}", Coord(x), Coord(y(t)), Coord(grid_right));
  *out += fmt::format("\"/><path class=\"domain\" d=\"M{} {}V{}\"/>", Coord(x), Coord(y.p0),
                      Coord(y.p1));
  *out += "<g class=\"tick-labels\" text-anchor=\"end\">";
  double widest = 0;
  for (double t : axis.ticks) {
    const std::string text = TickLabel(t, axis);
    widest = std::max(widest, TextWidth(text, kTickFontPx));
    *out += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>", Coord(x - 6), Coord(y(t) + 4),
                        Escape(text));
  }
  *out += "</g>";
  if (!label.empty()) {
    *out += fmt::format(
        "<text class=\"axis-title\" text-anchor=\"middle\" transform=\"translate({} {}) "
        "rotate(-90)\">",
        Coord(x - 8 - widest - 10), Coord((y.p0 + y.p1) / 2));
    AppendEscaped(out, label);
    *out += "</text>";
  }
  *out += "</g>\n";
}

double LegendHeight(const std::vector<LegendItem>& items, double width) {
  if (items.empty()) return 0;
  double x = 0;
  int rows = 1;
  for (const LegendItem& item : items) {
    const double w = LegendItemWidth(item);
    if (x > 0 && x + w > width) x = 0, ++rows;
    x += w;
  }
  return rows * kLegendRowPx;
}

void AppendLegend(std::string* out, const std::vector<LegendItem>& items, double x, double y,
                  double width, std::string_view hatch_id) {
  if (items.empty()) return;
  *out += "<g class=\"legend\">";
  double cx = 0;
  double cy = y;
  for (const LegendItem& item : items) {
    const double w = LegendItemWidth(item);
    if (cx > 0 && cx + w > width) cx = 0, cy += kLegendRowPx;
    const double left = x + cx;
    const double mid = cy + kLegendRowPx / 2;
    *out += "<g><title>";
    AppendEscaped(out, item.tooltip.empty() ? item.text : item.tooltip);
    *out += "</title>";
    switch (item.mark) {
      case LegendItem::Mark::kSwatch:
        *out +=
            fmt::format("<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" rx=\"2\" fill=\"{}\"/>",
                        Coord(left + 2), Coord(mid - 6), item.color);
        break;
      case LegendItem::Mark::kHatched:
        *out += fmt::format(
            "<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"url(#{})\" "
            "stroke=\"#8c959f\"/>",
            Coord(left + 2), Coord(mid - 6), hatch_id);
        break;
      case LegendItem::Mark::kLine:
      case LegendItem::Mark::kDashedLine:
        *out += fmt::format(
            "<path d=\"M{} {}h16\" stroke=\"{}\" stroke-width=\"2.5\"{}/>", Coord(left), Coord(mid),
            item.color,
            item.mark == LegendItem::Mark::kDashedLine ? " stroke-dasharray=\"5 3\"" : "");
        break;
    }
    *out += fmt::format("<text x=\"{}\" y=\"{}\">", Coord(left + 22), Coord(mid + 4));
    AppendEscaped(out, item.text);
    *out += "</text></g>";
    cx += w;
  }
  *out += "</g>\n";
}

void AppendHatchPattern(std::string* out, std::string_view id) {
  *out += fmt::format(
      "<defs><pattern id=\"{}\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
      "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#f6f8fa\"/>"
      "<path d=\"M0 0V6\" stroke=\"#b4bcc5\" stroke-width=\"2.5\"/></pattern></defs>\n",
      id);
}

}  // namespace sluice::report::internal
