#include "base/units.h"

#include <gtest/gtest.h>

namespace sluice {
namespace {

TEST(UnitsTest, DurationConversions) {
  EXPECT_EQ(Duration::Millis(1.5).nanos(), 1500000);
  EXPECT_EQ(Duration::Micros(2).nanos(), 2000);
  EXPECT_EQ(Duration::Seconds(1).nanos(), 1000000000);
  EXPECT_DOUBLE_EQ(Duration::Millis(2.25).millis(), 2.25);
  EXPECT_EQ(Duration::Millis(1) + Duration::Micros(500), Duration::Micros(1500));
  EXPECT_LT(Duration::Millis(1), Duration::Millis(2));
  EXPECT_TRUE(Duration::Infinite().is_infinite());
  EXPECT_EQ(Duration::Millis(-1.5).nanos(), -1500000);
}

TEST(UnitsTest, BytesConversions) {
  EXPECT_EQ(Bytes::MiB(1).count(), 1048576);
  EXPECT_EQ(Bytes::GiB(1).count(), 1073741824);
  EXPECT_DOUBLE_EQ(Bytes::MiB(417.656).mib(), 417.656 + (Bytes::MiB(417.656).count() -
                                                         417.656 * 1048576.0) / 1048576.0);
  EXPECT_EQ(Bytes::Of(10) * 3, Bytes::Of(30));
}

TEST(UnitsTest, Formatting) {
  EXPECT_EQ(FormatDuration(Duration::Millis(12.5)), "12.50 ms");
  EXPECT_EQ(FormatDuration(Duration::Seconds(3.2)), "3.20 s");
  EXPECT_EQ(FormatDuration(Duration::Nanos(42)), "42 ns");
  EXPECT_EQ(FormatBytes(Bytes::GiB(1.5)), "1.50 GiB");
  EXPECT_EQ(FormatBytes(Bytes::MiB(512)), "512.0 MiB");
  EXPECT_EQ(FormatBytes(Bytes::Of(64)), "64 B");
}

}  // namespace
}  // namespace sluice
