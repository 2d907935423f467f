#include "base/rng.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

namespace sluice {
namespace {

TEST(RngTest, SameSeedSameStream) {
  Rng a(7), b(7), c(8);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    const uint64_t x = a.NextU64();
    EXPECT_EQ(x, b.NextU64());
    differs |= x != c.NextU64();
  }
  EXPECT_TRUE(differs);
}

TEST(RngTest, KnownFirstValuesArePortable) {
  // Pinned so that a change to the generator (which would change every plan) is noticed.
  Rng r(0);
  EXPECT_EQ(r.NextU64(), 0x99ec5f36cb75f2b4ULL);
}

TEST(RngTest, UniformIntInRangeAndCoversIt) {
  Rng r(1);
  std::vector<int> hits(6, 0);
  for (int i = 0; i < 6000; ++i) {
    const int64_t v = r.UniformInt(-2, 3);
    ASSERT_GE(v, -2);
    ASSERT_LE(v, 3);
    ++hits[v + 2];
  }
  for (int h : hits) EXPECT_GT(h, 800);
}

TEST(RngTest, NormalMoments) {
  Rng r(3);
  double sum = 0, sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double x = r.Normal();
    sum += x;
    sq += x * x;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sq / n, 1.0, 0.01);
}

TEST(RngTest, ShuffleIsPermutationAndDeterministic) {
  std::vector<int> a(100), b;
  std::iota(a.begin(), a.end(), 0);
  b = a;
  Rng r1(5), r2(5);
  r1.Shuffle(a);
  r2.Shuffle(b);
  EXPECT_EQ(a, b);
  std::vector<int> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < 100; ++i) EXPECT_EQ(sorted[i], i);
  EXPECT_NE(a[0] * 1000 + a[1], 1);  // not the identity
}

TEST(RngTest, ForkIsIndependentOfParentState) {
  Rng a(9);
  Rng f1 = a.Fork(1);
  a.NextU64();
  Rng f2 = a.Fork(1);
  EXPECT_EQ(f1.NextU64(), f2.NextU64());
  EXPECT_NE(Rng(9).Fork(1).NextU64(), Rng(9).Fork(2).NextU64());
}

}  // namespace
}  // namespace sluice
