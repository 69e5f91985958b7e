#include "core/wanted_ops.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace nanhunt {
namespace {

TEST(WantedOpsTest, NothingIsWantedUntilAsked) {
  WantedOps wanted;
  int steps_read = 0;
  EXPECT_FALSE(wanted.Wanted("aten::addmm", [&] { return ++steps_read, int64_t{0}; }));
  EXPECT_EQ(steps_read, 0) << "no window open: the step is not even read";
}

TEST(WantedOpsTest, AnOpIsWantedUpToItsStepThenEveryWindowCloses) {
  WantedOps wanted;
  EXPECT_FALSE(wanted.AnyOpen());
  wanted.Want("aten::addmm", 5);
  EXPECT_TRUE(wanted.AnyOpen());
  EXPECT_TRUE(wanted.Wanted("aten::addmm", [] { return int64_t{3}; }));
  EXPECT_TRUE(wanted.Wanted("aten::addmm", [] { return int64_t{5}; }));
  EXPECT_FALSE(wanted.Wanted("aten::bmm", [] { return int64_t{3}; })) << "another op";
  EXPECT_FALSE(wanted.Wanted("aten::addmm", [] { return int64_t{6}; }));
  // Closed: asked again, the step is not read.
  int steps_read = 0;
  EXPECT_FALSE(wanted.Wanted("aten::addmm", [&] { return ++steps_read, int64_t{4}; }));
  EXPECT_EQ(steps_read, 0);
  EXPECT_FALSE(wanted.AnyOpen());
}

TEST(WantedOpsTest, ALaterWantExtendsTheWindowAndAnEarlierOneDoesNotShortenIt) {
  WantedOps wanted;
  wanted.Want("aten::addmm", 5);
  wanted.Want("aten::addmm", 9);
  wanted.Want("aten::addmm", 7);
  EXPECT_TRUE(wanted.Wanted("aten::addmm", [] { return int64_t{9}; }));
  wanted.Want("aten::bmm", 2);
  EXPECT_TRUE(wanted.Wanted("aten::addmm", [] { return int64_t{8}; }))
      << "an op whose window closes earlier does not close the others'";
  EXPECT_FALSE(wanted.Wanted("aten::bmm", [] { return int64_t{8}; }));
}

TEST(WantedOpsTest, WantedForeverWithoutSteps) {
  WantedOps wanted;
  EXPECT_FALSE(wanted.Wanted("aten::bmm"));
  wanted.Want("aten::bmm");
  EXPECT_TRUE(wanted.Wanted("aten::bmm"));
  EXPECT_TRUE(wanted.Wanted("aten::bmm", [] { return int64_t{1} << 40; }));
}

}  // namespace
}  // namespace nanhunt
