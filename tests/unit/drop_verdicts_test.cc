// When a step's verdict on its inf/NaN stops waiting for GPU results.
#include "core/drop_verdicts.h"

#include "gtest/gtest.h"

namespace nanhunt {
namespace {

TEST(DropVerdicts, NoGpuOpsOutstandingNoVerdictWaits) {
  DropVerdicts d;
  EXPECT_FALSE(d.UpdateEnded(0, 3));
  const int64_t g = d.OpNoted();
  d.OpJudged(g);
  EXPECT_FALSE(d.UpdateEnded(1, 1));
  EXPECT_FALSE(d.AnyReady(2));
}

TEST(DropVerdicts, AVerdictWaitsForTheOpsNotedBeforeItsUpdateOnly) {
  DropVerdicts d;
  const int64_t before = d.OpNoted();
  ASSERT_TRUE(d.UpdateEnded(0, 0));
  const int64_t after = d.OpNoted();  // the next step's
  EXPECT_NE(before, after);
  d.CountNonFinite(0);  // step 0's result, arriving late
  EXPECT_FALSE(d.AnyReady(1));
  d.OpJudged(before);
  ASSERT_TRUE(d.AnyReady(1));
  const auto ready = d.TakeReady(1);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].step, 0);
  EXPECT_EQ(ready[0].nonfinite_ops, 1);
  EXPECT_FALSE(d.AnyReady(1));
  EXPECT_TRUE(d.UpdateEnded(1, 0));  // the next step's op is still to come
}

// A program that stopped after a step (its training function returned,
// its model freed) would make every tensor look dropped: the verdict is
// given only once a later step has begun.
TEST(DropVerdicts, AVerdictIsGivenOnlyOnceALaterStepHasBegun) {
  DropVerdicts d;
  const int64_t g = d.OpNoted();
  ASSERT_TRUE(d.UpdateEnded(7, 1));
  d.OpJudged(g);
  EXPECT_FALSE(d.AnyReady(7));
  EXPECT_TRUE(d.TakeReady(7).empty());
  ASSERT_TRUE(d.AnyReady(8));
  EXPECT_EQ(d.TakeReady(8).size(), 1u);
}

TEST(DropVerdicts, AStepOfSeveralUpdatesWaitsForItsLast) {
  DropVerdicts d;
  const int64_t first = d.OpNoted();
  ASSERT_TRUE(d.UpdateEnded(4, 1));  // the dense parameters' optimizer
  const int64_t second = d.OpNoted();
  ASSERT_TRUE(d.UpdateEnded(4, 1));  // the sparse ones'
  d.OpJudged(first);
  EXPECT_FALSE(d.AnyReady(5));
  d.OpJudged(second);
  const auto ready = d.TakeReady(5);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].step, 4);
}

TEST(DropVerdicts, ResultsOutOfOrderAcrossDevicesHoldOlderVerdictsBack) {
  DropVerdicts d;
  const int64_t step0 = d.OpNoted();
  ASSERT_TRUE(d.UpdateEnded(0, 1));
  const int64_t step1 = d.OpNoted();
  ASSERT_TRUE(d.UpdateEnded(1, 1));
  d.OpJudged(step1);  // another device's result first
  EXPECT_FALSE(d.AnyReady(2));
  d.OpJudged(step0);
  const auto ready = d.TakeReady(2);
  ASSERT_EQ(ready.size(), 2u);
  EXPECT_EQ(ready[0].step, 0);
  EXPECT_EQ(ready[1].step, 1);
}

}  // namespace
}  // namespace nanhunt
