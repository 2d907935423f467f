#include "data/sample.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(SampleTest, TokensAndEquality) {
  const Sample a{3, 100, 20, 1};
  EXPECT_EQ(a.tokens(), 120);
  EXPECT_EQ(a, (Sample{3, 100, 20, 1}));
  EXPECT_NE(a, (Sample{3, 100, 21, 1}));
}

TEST(DatasetTest, InternTaskGivesIdsInOrderOfFirstUse) {
  Dataset ds("t");
  EXPECT_EQ(ds.InternTask("b"), 0);
  EXPECT_EQ(ds.InternTask("a"), 1);
  EXPECT_EQ(ds.InternTask("b"), 0);
  EXPECT_EQ(ds.FindTask("a"), 1);
  EXPECT_EQ(ds.FindTask("zzz"), -1);
  EXPECT_THAT(ds.task_names(), ElementsAre("b", "a"));
  EXPECT_EQ(ds.task_name(1), "a");
}

TEST(DatasetTest, AddNumbersSamplesAndSums) {
  Dataset ds("t");
  const TaskId t = ds.InternTask("x");
  ds.Add(10, 0, t);
  ds.Add(5, 7, t);
  ASSERT_EQ(ds.size(), 2u);
  EXPECT_EQ(ds[1], (Sample{1, 5, 7, t}));
  EXPECT_EQ(ds.input_tokens(), 15);
  EXPECT_EQ(ds.target_tokens(), 7);
  EXPECT_EQ(ds.tokens(), 22);
  EXPECT_TRUE(ds.has_targets());
  EXPECT_TRUE(ds.Validate().ok());
}

TEST(DatasetTest, PrefixKeepsTaskTable) {
  Dataset ds("t");
  const TaskId a = ds.InternTask("a");
  const TaskId b = ds.InternTask("b");
  ds.Add(1, 0, a);
  ds.Add(2, 0, b);
  ds.Add(3, 0, a);
  const Dataset p = ds.Prefix(2);
  EXPECT_EQ(p.size(), 2u);
  EXPECT_EQ(p.task_names(), ds.task_names());
  EXPECT_EQ(ds.Prefix(99), ds);
  EXPECT_FALSE(p == ds);
}

TEST(DatasetTest, ValidateNamesTheProblem) {
  Dataset dup("d");
  const TaskId t = dup.InternTask("x");
  dup.Add(Sample{7, 1, 0, t});
  dup.Add(Sample{7, 2, 0, t});
  EXPECT_THAT(dup.Validate().message(), HasSubstr("duplicate sample id"));

  Dataset neg("n");
  neg.InternTask("x");
  neg.Add(Sample{0, -1, 0, 0});
  EXPECT_THAT(neg.Validate().message(), HasSubstr("lengths must be in [0,"));

  Dataset empty("e");
  empty.InternTask("x");
  empty.Add(Sample{0, 0, 0, 0});
  EXPECT_THAT(empty.Validate().message(), HasSubstr("empty sample"));
}

}  // namespace
}  // namespace sluice
