#include "report/svg_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace sluice::report::internal {
namespace {

TEST(EscapeTest, HtmlAndAttributeSpecials) {
  EXPECT_EQ(Escape("<a href=\"x\">&'</a>"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;");
  EXPECT_EQ(Escape("plain text"), "plain text");
  EXPECT_EQ(Escape("&amp;"), "&amp;amp;");
}

TEST(EscapeTest, ControlCharactersAndUtf8) {
  EXPECT_EQ(Escape(std::string("a\x01"
                               "b\x7f"
                               "c\td\ne",
                               9)),
            "abc\td\ne");
  EXPECT_EQ(Escape(std::string("nul\0x", 5)), "nulx");
  EXPECT_EQ(Escape("µs → ✓ 🚀"), "µs → ✓ 🚀");
  EXPECT_EQ(Escape("bad \xff byte"), "bad \xEF\xBF\xBD byte");
  EXPECT_EQ(Escape("cut \xE2\x86"), "cut \xEF\xBF\xBD\xEF\xBF\xBD");          // truncated sequence
  EXPECT_EQ(Escape("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // overlong '/'
  EXPECT_EQ(Escape("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
}

TEST(FormatTest, Coordinates) {
  EXPECT_EQ(Coord(12.34), "12.3");
  EXPECT_EQ(Coord(12.0), "12");
  EXPECT_EQ(Coord(12.96), "13");
  EXPECT_EQ(Coord(-3.14), "-3.1");
  EXPECT_EQ(Coord(-0.04), "0");
  EXPECT_EQ(Coord(1e6), "1000000");
  EXPECT_EQ(Coord(std::nan("")), "0");
  EXPECT_EQ(Coord(std::numeric_limits<double>::infinity()), "0");
}

TEST(FormatTest, FixedAndValues) {
  EXPECT_EQ(FormatFixed(-0.0001, 2), "0.00");
  EXPECT_EQ(FormatFixed(2.5, 0), "2");  // round half to even, like printf
  EXPECT_EQ(FormatFixed(1.25, 1), "1.2");
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(12.5), "12.5");
  EXPECT_EQ(FormatValue(1.0 / 3), "0.333");
  EXPECT_EQ(FormatValue(0.0042), "0.0042");
  EXPECT_EQ(FormatValue(1234.56), "1234.6");
  EXPECT_EQ(FormatValue(45200), "45.2k");
  EXPECT_EQ(FormatValue(-1234567), "-1.23M");
  EXPECT_EQ(FormatValue(3.5e9), "3.5G");
  EXPECT_EQ(FormatValue(std::nan("")), "nan");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-inf");
  EXPECT_EQ(Plural(1, "bar"), "1 bar");
  EXPECT_EQ(Plural(0, "bar"), "0 bars");
}

std::vector<std::string> Labels(const Axis& axis) {
  std::vector<std::string> out;
  for (double t : axis.ticks) out.push_back(TickLabel(t, axis));
  return out;
}

TEST(NiceAxisTest, ExtendsToNiceSteps) {
  const Axis a = NiceAxis(0, 97, 5, true);
  EXPECT_EQ(a.step, 20);
  EXPECT_EQ(a.lo, 0);
  EXPECT_EQ(a.hi, 100);
  EXPECT_EQ(Labels(a), (std::vector<std::string>{"0", "20", "40", "60", "80", "100"}));

  const Axis b = NiceAxis(0, 345.2, 10, true);
  EXPECT_EQ(b.step, 50);
  EXPECT_EQ(b.hi, 350);
  EXPECT_EQ(b.ticks.size(), 8u);

  const Axis c = NiceAxis(0, 1, 4, true);
  EXPECT_EQ(c.step, 0.25);
  EXPECT_EQ(Labels(c), (std::vector<std::string>{"0", "0.25", "0.50", "0.75", "1.00"}));

  const Axis d = NiceAxis(-3.7, 12.2, 8, true);
  EXPECT_EQ(d.step, 2);
  EXPECT_EQ(d.lo, -4);
  EXPECT_EQ(d.hi, 14);
  EXPECT_EQ(Labels(d).front(), "-4");
}

TEST(NiceAxisTest, WithoutExtendTicksStayInside) {
  const Axis a = NiceAxis(3, 97, 5, false);
  EXPECT_EQ(a.lo, 3);
  EXPECT_EQ(a.hi, 97);
  EXPECT_EQ(Labels(a), (std::vector<std::string>{"20", "40", "60", "80"}));
}

TEST(NiceAxisTest, LargeValuesUseSuffixes) {
  const Axis a = NiceAxis(0, 65000, 6, true);
  EXPECT_EQ(Labels(a), (std::vector<std::string>{"0", "20k", "40k", "60k", "80k"}));
  const Axis b = NiceAxis(0, 2.5e6, 5, true);
  EXPECT_EQ(Labels(b)[1], "0.5M");
}

TEST(NiceAxisTest, DegenerateRanges) {
  const Axis zero = NiceAxis(0, 0, 5, true);
  EXPECT_EQ(zero.lo, 0);
  EXPECT_EQ(zero.hi, 1);
  const Axis point = NiceAxis(5, 5, 5, true);
  EXPECT_LT(point.lo, 5);
  EXPECT_GT(point.hi, 5);
  EXPECT_GE(point.ticks.size(), 2u);
  const Axis nan = NiceAxis(std::nan(""), 3, 5, true);
  EXPECT_EQ(nan.lo, 0);
  EXPECT_EQ(nan.hi, 1);
  const Axis huge =
      NiceAxis(-std::numeric_limits<double>::max(), std::numeric_limits<double>::max(), 5, true);
  EXPECT_EQ(huge.lo, 0);
  EXPECT_EQ(huge.hi, 1);
  const Axis swapped = NiceAxis(10, 0, 5, true);
  EXPECT_EQ(swapped.lo, 0);
  EXPECT_EQ(swapped.hi, 10);
  const Axis tiny = NiceAxis(1e-9, 3e-9, 4, true);
  EXPECT_GE(tiny.ticks.size(), 3u);
  EXPECT_NE(TickLabel(tiny.ticks[1], tiny), TickLabel(tiny.ticks[2], tiny));
}

TEST(IdRegistryTest, SlugsAndUniqueness) {
  IdRegistry ids;
  EXPECT_EQ(ids.Make("Memory per rank", "x"), "memory-per-rank");
  EXPECT_EQ(ids.Make("Memory  per rank!", "x"), "memory-per-rank-2");
  EXPECT_EQ(ids.Make("memory-per-rank-2", "x"), "memory-per-rank-2-2");
  EXPECT_EQ(ids.Make("!!!", "timeline"), "timeline");
  EXPECT_EQ(ids.Make("", "timeline"), "timeline-2");
  EXPECT_EQ(ids.Make("", ""), "block");
  EXPECT_EQ(Slug("  <Rank 3> µs "), "rank-3-s");
}

TEST(CategoryTest, KeysColoursAndOrder) {
  EXPECT_EQ(CategoryKey(" Backward_Weight "), "backward-weight");
  EXPECT_EQ(CategoryKey(""), "other");
  EXPECT_EQ(CategoryColor("fwd"), CategoryColor("forward"));
  EXPECT_EQ(CategoryColor("f"), CategoryColor("forward"));
  EXPECT_NE(CategoryColor("forward"), CategoryColor("backward"));
  EXPECT_NE(CategoryColor("backward-input"), CategoryColor("backward-weight"));
  EXPECT_EQ(CategoryColor("allreduce"), CategoryColor("all-reduce"));
  EXPECT_EQ(CategoryColor("my-kernel"), CategoryColor("my-kernel"));
  EXPECT_EQ(CategoryColor("my-kernel").size(), 7u);
  EXPECT_LT(CategoryRank("forward"), CategoryRank("backward"));
  EXPECT_LT(CategoryRank("backward"), CategoryRank("backward-weight"));
  EXPECT_LT(CategoryRank("send"), CategoryRank("all-reduce"));
  EXPECT_LT(CategoryRank("optimizer"), CategoryRank("idle"));
  EXPECT_LT(CategoryRank("idle"), CategoryRank("other"));
  EXPECT_LT(CategoryRank("other"), CategoryRank("my-kernel"));
  EXPECT_EQ(CategoryColor(CategoryKey("")), CategoryColor("other"));
}

TEST(TextTest, ContrastWidthAndTruncation) {
  EXPECT_TRUE(WantsDarkText("#ffffff"));
  EXPECT_TRUE(WantsDarkText("#edc948"));
  EXPECT_FALSE(WantsDarkText("#1f2328"));
  EXPECT_FALSE(WantsDarkText("#4e79a7"));
  EXPECT_DOUBLE_EQ(TextWidth("abcd", 10), TextWidth("µ→✓d", 10));
  EXPECT_EQ(Truncate("short", 100, 12), "short");
  const std::string cut = Truncate("a rather long row label", 60, 12);
  EXPECT_LE(TextWidth(cut, 12), 60);
  EXPECT_EQ(cut.substr(cut.size() - 3), "…");
  EXPECT_EQ(Truncate("→→→→→→→→→→", 30, 12).substr(0, 3), "→");  // never splits a code point
  EXPECT_EQ(Truncate("abc", 1, 12), "");
}

}  // namespace
}  // namespace sluice::report::internal
