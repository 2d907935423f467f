#include "batching/ordering.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "base/rng.h"
#include "batching/test_util.h"

namespace sluice {
namespace {

using testing::MakeTestSetup;
using testing::RandomBatch;
using testing::TestParallel;

std::vector<LengthPoint> RandomPoints(uint64_t seed, int64_t n, int64_t grid) {
  Rng rng(seed);
  std::vector<LengthPoint> pts;
  for (int64_t i = 0; i < n; ++i) {
    pts.push_back({rng.UniformInt(1, grid) * 8, rng.UniformInt(1, grid / 4 + 1) * 8});
  }
  return pts;
}

bool IsPermutation(std::vector<int64_t> order, size_t n) {
  std::sort(order.begin(), order.end());
  std::vector<int64_t> want(n);
  std::iota(want.begin(), want.end(), 0);
  return order == want;
}

TEST(OrderingTest, Names) {
  for (SampleOrder o : {SampleOrder::kAuto, SampleOrder::kSortDescending, SampleOrder::kTspPath,
                        SampleOrder::kLexicographic}) {
    auto parsed = ParseSampleOrder(SampleOrderName(o));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, o);
  }
  auto bad = ParseSampleOrder("random");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("lexicographic"), std::string::npos);
}

TEST(OrderingTest, SortDescendingAndLexicographic) {
  const std::vector<LengthPoint> pts = {{5, 0}, {9, 0}, {5, 0}, {7, 2}, {1, 8}, {9, 1}};
  EXPECT_EQ(SortDescendingOrder(pts), (std::vector<int64_t>{5, 1, 3, 4, 0, 2}));
  EXPECT_EQ(LexicographicOrder(pts), (std::vector<int64_t>{5, 1, 3, 0, 2, 4}));
  EXPECT_TRUE(SortDescendingOrder({}).empty());
  EXPECT_TRUE(TspPathOrder({}).empty());
  const LengthPoint one[] = {{3, 3}};
  EXPECT_EQ(TspPathOrder(one), (std::vector<int64_t>{0}));
}

TEST(OrderingTest, TspPathIsAPermutationAndDeterministic) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const std::vector<LengthPoint> pts = RandomPoints(seed, 5 + seed * 17, 64);
    const std::vector<int64_t> a = TspPathOrder(pts);
    EXPECT_TRUE(IsPermutation(a, pts.size()));
    EXPECT_EQ(a, TspPathOrder(pts));
    // Larger end first.
    const LengthPoint& f = pts[a.front()];
    const LengthPoint& b = pts[a.back()];
    EXPECT_GE(f.enc + f.dec, b.enc + b.dec);
  }
}

TEST(OrderingTest, TspPathIsShorterThanSortsAndImprovesOnNearestNeighbour) {
  for (uint64_t seed = 0; seed < 10; ++seed) {
    const std::vector<LengthPoint> pts = RandomPoints(100 + seed, 300, 128);
    const int64_t tsp = PathLength(pts, TspPathOrder(pts));
    const int64_t nn = PathLength(pts, TspPathOrder(pts, TspOptions{.max_work = 0}));
    EXPECT_LE(tsp, nn);
    EXPECT_LT(tsp, PathLength(pts, LexicographicOrder(pts)));
    EXPECT_LT(tsp, PathLength(pts, SortDescendingOrder(pts)));
  }
}

TEST(OrderingTest, IdenticalPointsStayTogether) {
  std::vector<LengthPoint> pts = RandomPoints(7, 40, 6);
  const std::vector<int64_t> order = TspPathOrder(pts);
  for (size_t i = 0; i < order.size(); ++i) {
    for (size_t j = i + 2; j < order.size(); ++j) {
      if (pts[order[i]] == pts[order[j]]) {
        EXPECT_EQ(pts[order[i + 1]], pts[order[i]]) << "point split at " << i << ".." << j;
      }
    }
  }
}

// With every other point as a neighbour, no single reversal shortens the result (2-opt optimal).
TEST(OrderingTest, SmallPathsAreTwoOptOptimal) {
  for (uint64_t seed = 0; seed < 30; ++seed) {
    std::vector<LengthPoint> pts = RandomPoints(1000 + seed, 9, 40);
    const std::vector<int64_t> order = TspPathOrder(pts, TspOptions{.neighbours = 16});
    const int64_t len = PathLength(pts, order);
    for (size_t l = 0; l < order.size(); ++l) {
      for (size_t r = l + 1; r < order.size(); ++r) {
        std::vector<int64_t> other = order;
        std::reverse(other.begin() + l, other.begin() + r + 1);
        EXPECT_GE(PathLength(pts, other), len) << "seed " << seed << " reverse " << l << ".." << r;
      }
    }
  }
}

TEST(OrderingTest, OrderSamplesDecoderOnlySortsByLength) {
  auto setup = MakeTestSetup("gpt-6.7b", TestParallel(1, 8));
  const std::vector<Sample> batch = RandomBatch(3, 200, 2048, false);
  const std::vector<int64_t> order = OrderSamples(batch, setup->evaluator(), SampleOrder::kAuto);
  ASSERT_TRUE(IsPermutation(order, batch.size()));
  for (size_t i = 1; i < order.size(); ++i) {
    EXPECT_GE(batch[order[i - 1]].tokens(), batch[order[i]].tokens());
  }
  EXPECT_EQ(order, OrderSamples(batch, setup->evaluator(), SampleOrder::kTspPath));
}

TEST(OrderingTest, OrderSamplesEncoderDecoderUsesPaddedPoints) {
  auto setup = MakeTestSetup("t5-11b", TestParallel(1, 2, 8));
  const StageCostEvaluator& e = setup->evaluator();
  const std::vector<Sample> batch = RandomBatch(4, 300, 2048, true);
  const std::vector<LengthPoint> pts = SamplePoints(batch, e);
  EXPECT_EQ(pts[0], (LengthPoint{e.Pad(batch[0].input_len), e.Pad(batch[0].target_len)}));
  const std::vector<int64_t> tsp = OrderSamples(batch, e, SampleOrder::kAuto);
  const std::vector<int64_t> lex = OrderSamples(batch, e, SampleOrder::kLexicographic);
  ASSERT_TRUE(IsPermutation(tsp, batch.size()));
  ASSERT_TRUE(IsPermutation(lex, batch.size()));
  EXPECT_LT(PathLength(pts, tsp), PathLength(pts, lex));
  for (size_t i = 1; i < lex.size(); ++i) {
    EXPECT_GE(pts[lex[i - 1]].enc, pts[lex[i]].enc);
  }
  // Identical padded points are refined by raw lengths, longest first.
  for (size_t i = 1; i < tsp.size(); ++i) {
    if (pts[tsp[i - 1]] == pts[tsp[i]]) {
      EXPECT_GE(batch[tsp[i - 1]].input_len, batch[tsp[i]].input_len);
    }
  }
}

}  // namespace
}  // namespace sluice
