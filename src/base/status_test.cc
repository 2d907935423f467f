#include "base/status.h"

#include <gtest/gtest.h>

namespace sluice {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgumentError("odd");
  return x / 2;
}

Status UseHalf(int x, int* out) {
  SLUICE_ASSIGN_OR_RETURN(*out, Half(x));
  return Status::Ok();
}

TEST(StatusTest, OkAndError) {
  EXPECT_TRUE(Status::Ok().ok());
  Status s = InvalidArgumentError("bad");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.ToString(), "invalid argument: bad");
  EXPECT_EQ(s.WithPrefix("f.json").message(), "f.json: bad");
  EXPECT_TRUE(Status::Ok().WithPrefix("x").ok());
}

TEST(StatusTest, StatusOrPropagates) {
  int v = 0;
  EXPECT_TRUE(UseHalf(8, &v).ok());
  EXPECT_EQ(v, 4);
  Status s = UseHalf(3, &v);
  EXPECT_EQ(s.message(), "odd");
  EXPECT_EQ(v, 4);
}

TEST(StatusDeathTest, ValueOfErrorAborts) {
  StatusOr<int> r = NotFoundError("nope");
  EXPECT_DEATH((void)r.value(), "nope");
}

}  // namespace
}  // namespace sluice
