// Fiber: the body and the resumer alternate, steps in order; errors and aborts.
#include "runtime/fiber.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace sluice::runtime {
namespace {

TEST(FiberTest, AlternatesStepByStep) {
  std::vector<std::string> log;
  Fiber* self = nullptr;
  Fiber f([&] {
    log.push_back("b0");
    self->Suspend();
    log.push_back("b1");
    self->Suspend();
    log.push_back("b2");
  });
  self = &f;
  log.push_back("m0");
  f.Resume();
  EXPECT_FALSE(f.finished());
  log.push_back("m1");
  f.Resume();
  EXPECT_FALSE(f.finished());
  log.push_back("m2");
  f.Resume();
  EXPECT_TRUE(f.finished());
  EXPECT_EQ(f.error(), nullptr);
  EXPECT_EQ(log, (std::vector<std::string>{"m0", "b0", "m1", "b1", "m2", "b2"}));
}

TEST(FiberTest, KeepsTheBodysException) {
  Fiber f([] { throw std::runtime_error("boom"); });
  f.Resume();
  ASSERT_TRUE(f.finished());
  ASSERT_NE(f.error(), nullptr);
  try {
    std::rethrow_exception(f.error());
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "boom");
  }
}

TEST(FiberTest, DestroyedWhileSuspendedUnwindsTheBody) {
  bool unwound = false, after = false;
  {
    Fiber* self = nullptr;
    Fiber f([&] {
      struct Guard {
        bool* flag;
        ~Guard() { *flag = true; }
      } guard{&unwound};
      self->Suspend();
      after = true;
    });
    self = &f;
    f.Resume();
    EXPECT_FALSE(f.finished());
  }
  EXPECT_TRUE(unwound);
  EXPECT_FALSE(after);
}

TEST(FiberTest, NeverResumedStartsNoThread) {
  bool ran = false;
  {
    Fiber f([&] { ran = true; });
  }
  EXPECT_FALSE(ran);
}

}  // namespace
}  // namespace sluice::runtime
