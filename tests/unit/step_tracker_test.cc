// Step numbering with and without torch.optim's step records.
#include "core/step_tracker.h"

#include "gtest/gtest.h"

namespace nanhunt {
namespace {

TEST(StepTracker, OptimizerRecordsEndSteps) {
  StepTracker t;
  t.OnOp(Phase::kForward, true);
  t.OnOp(Phase::kBackward, true);
  t.OnOptimizerStepBegin();
  EXPECT_EQ(t.step(), 0);
  t.OnOptimizerStepEnd();
  EXPECT_EQ(t.step(), 1);
  EXPECT_FALSE(t.OnOp(Phase::kForward, true));
  EXPECT_EQ(t.step(), 1);
}

TEST(StepTracker, WithoutOptimizerForwardAfterBackwardStartsAStep) {
  StepTracker t;
  t.OnOp(Phase::kForward, true);
  t.OnOp(Phase::kBackward, true);
  EXPECT_TRUE(t.OnOp(Phase::kForward, true));
  EXPECT_EQ(t.step(), 1);
  EXPECT_FALSE(t.OnOp(Phase::kForward, true));
  t.OnOp(Phase::kBackward, true);
  t.OnOp(Phase::kForward, true);
  EXPECT_EQ(t.step(), 2);
}

TEST(StepTracker, GradientClippingBeforeTheFirstOptimizerStepStaysInStepZero) {
  StepTracker t;
  t.OnOp(Phase::kForward, true);
  t.OnOp(Phase::kBackward, true);
  t.OnOp(Phase::kForward, true);  // a grad-enabled op: the fallback advances
  EXPECT_TRUE(t.OnOptimizerStepBegin());  // ...and the optimizer undoes it
  EXPECT_EQ(t.step(), 0);
  t.OnOptimizerStepEnd();
  EXPECT_EQ(t.step(), 1);
  t.OnOp(Phase::kForward, true);
  t.OnOp(Phase::kBackward, true);
  EXPECT_FALSE(t.OnOp(Phase::kForward, true));  // optimizer mode: no fallback
  EXPECT_EQ(t.step(), 1);
}

TEST(StepTracker, NoGradOpsAfterBackwardAreTheUpdateNotANewStep) {
  StepTracker t;
  t.OnOp(Phase::kForward, true);
  t.OnOp(Phase::kBackward, true);
  // A C++ optimizer (or clip_grad_norm_): grad mode off, after backward.
  EXPECT_FALSE(t.OnOp(Phase::kForward, false));
  EXPECT_EQ(t.Refine(Phase::kForward, false), Phase::kOptimizer);
  EXPECT_EQ(t.step(), 0);
  EXPECT_TRUE(t.OnOp(Phase::kForward, true));  // the next forward pass
  EXPECT_EQ(t.step(), 1);
  // Evaluation under no_grad before any backward is still forward.
  EXPECT_EQ(t.Refine(Phase::kForward, false), Phase::kForward);
}

}  // namespace
}  // namespace nanhunt
