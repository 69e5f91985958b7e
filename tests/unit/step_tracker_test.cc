// Step numbering with and without torch.optim's step records.
#include "core/step_tracker.h"

#include "gtest/gtest.h"

namespace nanhunt {
namespace {

TEST(StepTracker, OptimizerRecordsEndSteps) {
  StepTracker t;
  t.OnOp(Phase::kForward);
  t.OnOp(Phase::kBackward);
  t.OnOptimizerStepBegin();
  EXPECT_EQ(t.step(), 0);
  t.OnOptimizerStepEnd();
  EXPECT_EQ(t.step(), 1);
  EXPECT_FALSE(t.OnOp(Phase::kForward));
  EXPECT_EQ(t.step(), 1);
}

TEST(StepTracker, WithoutOptimizerForwardAfterBackwardStartsAStep) {
  StepTracker t;
  t.OnOp(Phase::kForward);
  t.OnOp(Phase::kBackward);
  EXPECT_TRUE(t.OnOp(Phase::kForward));
  EXPECT_EQ(t.step(), 1);
  EXPECT_FALSE(t.OnOp(Phase::kForward));
  t.OnOp(Phase::kBackward);
  t.OnOp(Phase::kForward);
  EXPECT_EQ(t.step(), 2);
}

TEST(StepTracker, GradientClippingBeforeTheFirstOptimizerStepStaysInStepZero) {
  StepTracker t;
  t.OnOp(Phase::kForward);
  t.OnOp(Phase::kBackward);
  t.OnOp(Phase::kForward);  // clip_grad_norm_ ops: the fallback advances
  EXPECT_TRUE(t.OnOptimizerStepBegin());  // ...and the optimizer undoes it
  EXPECT_EQ(t.step(), 0);
  t.OnOptimizerStepEnd();
  EXPECT_EQ(t.step(), 1);
  t.OnOp(Phase::kForward);
  t.OnOp(Phase::kBackward);
  EXPECT_FALSE(t.OnOp(Phase::kForward));  // optimizer mode: no fallback
  EXPECT_EQ(t.step(), 1);
}

}  // namespace
}  // namespace nanhunt
