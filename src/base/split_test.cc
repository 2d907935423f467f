#include "base/split.h"

#include <gtest/gtest.h>

namespace sluice {
namespace {

using Parts = std::vector<std::string_view>;

TEST(SplitOnTest, KeepsEmptyParts) {
  EXPECT_EQ(SplitOn("dp=2,pp=4", ','), (Parts{"dp=2", "pp=4"}));
  EXPECT_EQ(SplitOn("9+8+8+7", '+'), (Parts{"9", "8", "8", "7"}));
  EXPECT_EQ(SplitOn("a,,b", ','), (Parts{"a", "", "b"}));
  EXPECT_EQ(SplitOn("", ','), (Parts{""}));
  EXPECT_EQ(SplitOn("a,", ','), (Parts{"a", ""}));
  EXPECT_EQ(SplitOn(",", ','), (Parts{"", ""}));
  EXPECT_EQ(SplitOn("one", ';'), (Parts{"one"}));
}

}  // namespace
}  // namespace sluice
