// Step numbering with and without torch.optim's step records.
#include "core/step_tracker.h"

#include <cstdint>
#include <optional>
#include <vector>

#include "gtest/gtest.h"

namespace nanhunt {
namespace {

// What the tracker asks the caller to renumber since the last read, in
// order: each {first, last, to} says steps `first` through `last` become
// step `to`.
void ExpectRenumberings(StepTracker& t,
                        const std::vector<StepTracker::Renumbering>& expected) {
  const std::vector<StepTracker::Renumbering> r = t.TakeRenumberings();
  ASSERT_EQ(r.size(), expected.size());
  for (size_t i = 0; i < r.size(); ++i) {
    EXPECT_EQ(r[i].first, expected[i].first) << "renumbering " << i;
    EXPECT_EQ(r[i].last, expected[i].last) << "renumbering " << i;
    EXPECT_EQ(r[i].to, expected[i].to) << "renumbering " << i;
  }
}

// One renumbering: steps `first` through `last` become step `to`.
void ExpectRenumbering(StepTracker& t, int64_t first, int64_t last, int64_t to) {
  ExpectRenumberings(t, {{first, last, to}});
}

TEST(StepTracker, OptimizerRecordsEndSteps) {
  StepTracker t;
  t.OnOp(Phase::kForward, true, true);
  t.OnOp(Phase::kBackward, true, true);
  t.OnOptimizerStepBegin();
  EXPECT_EQ(t.step(), 0);
  t.OnOptimizerStepEnd();
  EXPECT_EQ(t.step(), 0) << "what runs before the next forward op is the step's tail";
  EXPECT_EQ(t.next_step(), 1);
  EXPECT_FALSE(t.OnOp(Phase::kForward, false, false)) << "GradScaler's update";
  EXPECT_EQ(t.step(), 0);
  EXPECT_TRUE(t.OnOp(Phase::kForward, true, true)) << "the next forward op begins step 1";
  EXPECT_EQ(t.step(), 1);
  EXPECT_FALSE(t.OnOp(Phase::kForward, true, true));
  EXPECT_EQ(t.step(), 1);
}

TEST(StepTracker, WithoutOptimizerForwardAfterBackwardStartsAStep) {
  StepTracker t;
  t.OnOp(Phase::kForward, true, true);
  t.OnOp(Phase::kBackward, true, true);
  EXPECT_TRUE(t.OnOp(Phase::kForward, true, true));
  EXPECT_EQ(t.step(), 1);
  EXPECT_FALSE(t.OnOp(Phase::kForward, true, true));
  t.OnOp(Phase::kBackward, true, true);
  t.OnOp(Phase::kForward, true, true);
  EXPECT_EQ(t.step(), 2);
}

TEST(StepTracker, GradientClippingBeforeTheFirstOptimizerStepStaysInStepZero) {
  StepTracker t;
  t.OnOp(Phase::kForward, true, true);
  t.OnOp(Phase::kBackward, true, true);
  t.OnOp(Phase::kForward, true, true);  // a grad-enabled op: the fallback advances
  EXPECT_TRUE(t.OnOptimizerStepBegin());  // ...and the optimizer undoes it
  EXPECT_EQ(t.step(), 0);
  t.OnOptimizerStepEnd();
  EXPECT_EQ(t.next_step(), 1);
  t.OnOp(Phase::kForward, true, true);
  t.OnOp(Phase::kBackward, true, true);
  EXPECT_FALSE(t.OnOp(Phase::kForward, true, true));  // optimizer mode: no fallback
  EXPECT_EQ(t.step(), 1);
}

TEST(StepTracker, FactoryOpsAfterBackwardDoNotStartAStep) {
  StepTracker t;
  t.OnOp(Phase::kForward, true, true);
  t.OnOp(Phase::kBackward, true, true);
  // torch.full for GradScaler's found_inf: grad mode on, no grad input.
  EXPECT_FALSE(t.OnOp(Phase::kForward, true, false));
  EXPECT_EQ(t.step(), 0);
}

TEST(StepTracker, GradScalerUpdateEndsSkippedStepsToo) {
  StepTracker t;
  // Step 0: inf gradients, the optimizer is skipped, the scale backs off.
  t.OnOp(Phase::kForward, true, true);
  t.OnOp(Phase::kBackward, true, true);
  StepTracker::ScalerStep s = t.OnScalerUpdate();
  EXPECT_EQ(s.step, 0);
  EXPECT_TRUE(s.advanced);
  EXPECT_EQ(t.step(), 1);
  EXPECT_FALSE(t.OnOp(Phase::kForward, true, true)) << "no second advance";
  // Step 1: the optimizer runs, then the update.
  t.OnOp(Phase::kBackward, true, true);
  t.OnOptimizerStepBegin();
  t.OnOptimizerStepEnd();
  s = t.OnScalerUpdate();
  EXPECT_EQ(s.step, 1);
  EXPECT_FALSE(s.advanced);
  EXPECT_EQ(t.next_step(), 2);
}

TEST(StepTracker, AnUpdateTheProgramSkippedEndsItsStep) {
  StepTracker t;
  // Step 0 trains; step 1's gradients overflow and its program (a loss
  // scaler of its own) goes on to the next batch without an update.
  t.OnOp(Phase::kForward, true, true);
  t.OnOp(Phase::kBackward, true, true);
  t.OnOptimizerStepBegin();
  t.OnOptimizerStepEnd();
  EXPECT_FALSE(t.AtIterationWithoutUpdate(Phase::kForward, true, true));
  t.OnOp(Phase::kForward, true, true);
  t.OnOp(Phase::kBackward, true, true);
  EXPECT_FALSE(t.AtIterationWithoutUpdate(Phase::kForward, true, false)) << "a factory op";
  EXPECT_FALSE(t.AtIterationWithoutUpdate(Phase::kForward, false, true)) << "no grad";
  ASSERT_TRUE(t.AtIterationWithoutUpdate(Phase::kForward, true, true));
  t.OnUpdateSkipped();
  EXPECT_EQ(t.step(), 2);
  EXPECT_FALSE(t.OnOp(Phase::kForward, true, true)) << "no second advance";
  EXPECT_FALSE(t.AtIterationWithoutUpdate(Phase::kForward, true, true));
  t.OnOp(Phase::kBackward, true, true);
  t.OnOptimizerStepBegin();
  t.OnOptimizerStepEnd();
  EXPECT_EQ(t.next_step(), 3);
}

TEST(StepTracker, AClosuresPassesInsideTheOptimizerStepAreNoNewIteration) {
  StepTracker t;
  t.OnOptimizerStepBegin();  // LBFGS: forward and backward in its closure
  t.OnOp(Phase::kForward, true, true);
  t.OnOp(Phase::kBackward, true, true);
  EXPECT_FALSE(t.AtIterationWithoutUpdate(Phase::kForward, true, true));
  t.OnOp(Phase::kForward, true, true);
  t.OnOp(Phase::kBackward, true, true);
  t.OnOptimizerStepEnd();
  EXPECT_EQ(t.next_step(), 1);
}

TEST(StepTracker, SkippedUpdatesBeforeAnyOptimizerStepAreNotUndone) {
  StepTracker t;
  // A scaler that starts too high skips the first update.
  t.OnOp(Phase::kForward, true, true);
  t.OnOp(Phase::kBackward, true, true);
  ASSERT_TRUE(t.AtIterationWithoutUpdate(Phase::kForward, true, true));
  t.OnUpdateSkipped();
  EXPECT_EQ(t.step(), 1);
  EXPECT_FALSE(t.OnOp(Phase::kForward, true, true)) << "no fallback advance on top";
  t.OnOp(Phase::kBackward, true, true);
  EXPECT_FALSE(t.OnOptimizerStepBegin()) << "the skip's advance stands";
  t.OnOptimizerStepEnd();
  EXPECT_EQ(t.next_step(), 2);
}

TEST(StepTracker, KeptGradientsOfAMicroBatchBeginNoStep) {
  StepTracker t;
  // Two micro-batches, the first one's non-finite gradients kept in .grad
  // for the second: one step, though no optimizer record was seen yet.
  t.OnOp(Phase::kForward, true, true);
  t.OnOp(Phase::kBackward, true, true);
  ASSERT_TRUE(t.AtIterationWithoutUpdate(Phase::kForward, true, true));
  t.OnGradientsKept();
  EXPECT_FALSE(t.OnOp(Phase::kForward, true, true));
  EXPECT_EQ(t.step(), 0);
  // A hand-written update (grad mode off) wrote them into the weights:
  // the next forward pass is the next step.
  t.OnOp(Phase::kBackward, true, true);
  t.OnOp(Phase::kForward, false, true);
  t.OnGradientsKept();
  EXPECT_TRUE(t.OnOp(Phase::kForward, true, true));
  EXPECT_EQ(t.step(), 1);
}

TEST(StepTracker, ReturnedGradientsAreNoMicroBatch) {
  StepTracker t;
  // torch.func.grad, then params - lr * g with grad mode on: the non-finite
  // gradients the update wrote into the new parameters are still held, but
  // no .grad keeps them for a next micro-batch.
  t.OnOp(Phase::kForward, true, true);
  t.OnGradientsReturned();
  t.OnOp(Phase::kBackward, true, true);
  t.OnOp(Phase::kForward, true, false);
  ASSERT_TRUE(t.AtIterationWithoutUpdate(Phase::kForward, true, true));
  t.OnGradientsKept();
  EXPECT_TRUE(t.OnOp(Phase::kForward, true, true));
  EXPECT_EQ(t.step(), 1);
}

TEST(StepTracker, MicroBatchesBeforeTheFirstOptimizerStepAreOneStep) {
  StepTracker t;
  // Three micro-batches, then torch.optim's first step record.
  for (int i = 0; i < 3; ++i) {
    t.OnOp(Phase::kForward, true, true);
    t.OnOp(Phase::kBackward, true, true);
  }
  EXPECT_EQ(t.step(), 2) << "tentative advances";
  EXPECT_TRUE(t.OnOptimizerStepBegin());
  EXPECT_EQ(t.step(), 0);
  t.OnOptimizerStepEnd();
  EXPECT_EQ(t.next_step(), 1);
}

TEST(StepTracker, MicroBatchesOfAProgramWithoutOptimizerRecordsAreOneStep) {
  StepTracker t;
  // A C++ program: two micro-batches, then its update with grad mode off.
  for (int step = 0; step < 2; ++step) {
    for (int i = 0; i < 2; ++i) {
      t.OnOp(Phase::kForward, true, true);
      t.OnOp(Phase::kBackward, true, true);
    }
    t.OnOp(Phase::kForward, false, true);  // the update
  }
  EXPECT_TRUE(t.OnOp(Phase::kForward, true, true));
  EXPECT_EQ(t.step(), 2);
}

TEST(StepTracker, MicroBatchesAfterTheFirstUpdateKeepTheirIterationsStep) {
  StepTracker t;
  // A C++ program: three micro-batches, then its update with grad mode off.
  // The first iteration's later micro-batches can only be told from steps
  // at its update; after that, every micro-batch has its iteration's step.
  std::vector<int64_t> steps_seen;
  for (int iteration = 0; iteration < 4; ++iteration) {
    for (int i = 0; i < 3; ++i) {
      t.OnOp(Phase::kForward, true, true);
      steps_seen.push_back(t.step());
      t.OnOp(Phase::kBackward, true, true);
    }
    t.OnOp(Phase::kForward, false, true);  // the update
  }
  EXPECT_EQ(steps_seen, (std::vector<int64_t>{0, 1, 2, 1, 1, 1, 2, 2, 2, 3, 3, 3}));
}

TEST(StepTracker, MicroBatchesAfterALossScalerSkipAreNoSteps) {
  StepTracker t;
  // GradScaler skips the first iterations' optimizer steps: no optimizer
  // record yet, but its update ends each iteration.
  std::vector<int64_t> steps_seen;
  for (int iteration = 0; iteration < 3; ++iteration) {
    for (int i = 0; i < 2; ++i) {
      t.OnOp(Phase::kForward, true, true);
      steps_seen.push_back(t.step());
      t.OnOp(Phase::kBackward, true, true);
    }
    t.OnOp(Phase::kForward, false, true);  // unscale_
    t.OnScalerUpdate();
  }
  EXPECT_EQ(steps_seen, (std::vector<int64_t>{0, 1, 1, 1, 2, 2}));
  EXPECT_EQ(t.step(), 3);
}

TEST(StepTracker, UndoneAdvancesSayWhichNumbersToRenumber) {
  StepTracker t;
  EXPECT_TRUE(t.TakeRenumberings().empty());
  for (int i = 0; i < 3; ++i) {
    t.OnOp(Phase::kForward, true, true);
    t.OnOp(Phase::kBackward, true, true);
  }
  EXPECT_TRUE(t.TakeRenumberings().empty()) << "nothing undone yet";
  t.OnOptimizerStepBegin();
  ExpectRenumbering(t, 1, 2, 0);
  EXPECT_TRUE(t.TakeRenumberings().empty()) << "reading clears it";
  t.OnOptimizerStepEnd();
  EXPECT_TRUE(t.TakeRenumberings().empty());
}

TEST(StepTracker, NoGradOpsAfterBackwardAreTheUpdateNotANewStep) {
  StepTracker t;
  t.OnOp(Phase::kForward, true, true);
  t.OnOp(Phase::kBackward, true, true);
  // A C++ optimizer (or clip_grad_norm_): grad mode off, after backward.
  EXPECT_FALSE(t.OnOp(Phase::kForward, false, true));
  EXPECT_EQ(t.Refine(Phase::kForward, false, true), Phase::kOptimizer);
  EXPECT_EQ(t.step(), 0);
  EXPECT_TRUE(t.OnOp(Phase::kForward, true, true));  // the next forward pass
  EXPECT_EQ(t.step(), 1);
  // Evaluation under no_grad before any backward is still forward.
  EXPECT_EQ(t.Refine(Phase::kForward, false, false), Phase::kForward);
}

TEST(StepTracker, NoGradForwardPassesAfterTheOptimizerStepAreForward) {
  StepTracker t;
  t.OnOp(Phase::kForward, true, true);
  t.OnOp(Phase::kBackward, true, true);
  t.OnOptimizerStepBegin();
  t.OnOptimizerStepEnd();
  // GradScaler's update, a scheduler: no parameter, still the update.
  EXPECT_FALSE(t.OnOp(Phase::kForward, false, false));
  EXPECT_EQ(t.Refine(Phase::kForward, false, false), Phase::kOptimizer);
  // The first ops of an evaluation's first layer (linear's addmm) end
  // before the top-level op that reads the parameters: told by it.
  EXPECT_EQ(t.Refine(Phase::kForward, false, true), Phase::kForward);
  // torch.compile's graph (or an evaluation) reads the parameters with
  // grad mode off: a forward pass, which begins the step the optimizer's
  // record ended.
  EXPECT_TRUE(t.OnOp(Phase::kForward, false, true));
  EXPECT_EQ(t.Refine(Phase::kForward, false, false), Phase::kForward);
  EXPECT_EQ(t.step(), 1);
  // Its backward, then clipping before the next optimizer step: the update.
  t.OnOp(Phase::kBackward, true, true);
  EXPECT_FALSE(t.OnOp(Phase::kForward, false, true));
  EXPECT_EQ(t.Refine(Phase::kForward, false, true), Phase::kOptimizer);
}

TEST(StepTracker, OptimizersSteppedTogetherAreOneStep) {
  // Dense and sparse parameters with an optimizer each, stepped one after
  // the other, zero_grad between: one step an iteration.
  StepTracker t;
  for (int iteration = 0; iteration < 3; ++iteration) {
    t.OnOp(Phase::kForward, true, true);
    EXPECT_EQ(t.step(), iteration);
    t.OnOp(Phase::kBackward, true, true);
    for (int optimizer = 0; optimizer < 2; ++optimizer) {
      EXPECT_FALSE(t.OnOptimizerStepBegin());
      EXPECT_EQ(t.step(), iteration);
      t.OnOp(Phase::kForward, false, false);  // its update's ops
      t.OnOptimizerStepEnd();
      EXPECT_EQ(t.step(), iteration);
      EXPECT_FALSE(t.OnOp(Phase::kForward, true, false)) << "zero_grad(set_to_none=False)";
    }
  }
  EXPECT_EQ(t.next_step(), 3);
}

TEST(StepTracker, AnOptimizerPerParameterSteppedInBackwardIsOneStep) {
  // Post-accumulate-grad hooks step each parameter's optimizer as its
  // gradient is ready: optimizer records between backward ops.
  StepTracker t;
  for (int iteration = 0; iteration < 3; ++iteration) {
    EXPECT_EQ(t.OnOp(Phase::kForward, true, true), iteration > 0);
    EXPECT_EQ(t.step(), iteration);
    for (int parameter = 0; parameter < 4; ++parameter) {
      EXPECT_FALSE(t.OnOp(Phase::kBackward, true, true));
      EXPECT_EQ(t.Refine(Phase::kBackward, true, true), Phase::kBackward);
      t.OnOptimizerStepBegin();
      t.OnOptimizerStepEnd();
      EXPECT_EQ(t.step(), iteration);
    }
  }
  EXPECT_EQ(t.next_step(), 3);
}

// One update of a GAN with every op checked: a forward pass, its backward
// pass, and optimizer `optimizer`'s record, identified inside it (0: not
// identified, the step guard off). Returns whether identifying it undid
// the advance its forward pass made.
bool GanUpdate(StepTracker& t, uint64_t optimizer, bool replaces_another = false) {
  t.OnOp(Phase::kForward, true, false);  // the noise: no parameter yet
  t.OnOp(Phase::kForward, true, true);
  t.OnOp(Phase::kBackward, true, true);
  t.OnOptimizerStepBegin();
  const bool undone = optimizer != 0 && t.OnOptimizerIdentified(optimizer, replaces_another);
  t.OnOptimizerStepEnd();
  return undone;
}

TEST(StepTracker, AGansTwoUpdatesAreOneStepEachAfterItsForwardPass) {
  StepTracker t;
  EXPECT_FALSE(GanUpdate(t, /*discriminator=*/10));
  EXPECT_EQ(t.step(), 0);
  EXPECT_TRUE(GanUpdate(t, /*generator=*/20)) << "the generator's forward pass began step 1";
  ExpectRenumbering(t, 1, 1, 0);
  EXPECT_EQ(t.step(), 0);
  for (int64_t iteration = 1; iteration < 4; ++iteration) {
    EXPECT_FALSE(GanUpdate(t, 10)) << "the discriminator stepped in the step before";
    EXPECT_EQ(t.step(), iteration);
    EXPECT_TRUE(GanUpdate(t, 20));
    ExpectRenumbering(t, iteration + 1, iteration + 1, iteration);
    EXPECT_EQ(t.step(), iteration);
  }
  EXPECT_EQ(t.next_step(), 4);
}

TEST(StepTracker, AGansUnidentifiedUpdatesAreTwoStepsAnIteration) {
  // A program whose optimizers nothing names (the step guard could not load).
  StepTracker t;
  for (int64_t update = 0; update < 4; ++update) {
    EXPECT_FALSE(GanUpdate(t, 0));
    EXPECT_EQ(t.step(), update);
  }
  EXPECT_TRUE(t.TakeRenumberings().empty());
}

TEST(StepTracker, TheCriticsExtraUpdatesAreStepsOfTheirOwn) {
  // A WGAN trains its critic on every batch and the generator on every
  // fifth, after the critic's update: the generator joins that batch's step.
  StepTracker t;
  int64_t batch = 0;
  for (; batch < 10; ++batch) {
    EXPECT_FALSE(GanUpdate(t, 10));
    EXPECT_EQ(t.step(), batch);
    if (batch % 5 == 0) {
      EXPECT_TRUE(GanUpdate(t, 20));
      ExpectRenumbering(t, batch + 1, batch + 1, batch);
    }
  }
  EXPECT_EQ(t.next_step(), batch);
}

TEST(StepTracker, AnOptimizerThatTakesOverAnothersParametersBeginsItsStep) {
  // A fine-tuning trains its head, then everything with a new optimizer:
  // the new one's first update is the next iteration, as the old one's was.
  StepTracker t;
  for (int64_t iteration = 0; iteration < 3; ++iteration) EXPECT_FALSE(GanUpdate(t, 10));
  EXPECT_FALSE(GanUpdate(t, 20, /*replaces_another=*/true));
  EXPECT_EQ(t.step(), 3);
  EXPECT_FALSE(GanUpdate(t, 20));
  EXPECT_EQ(t.step(), 4);
  EXPECT_TRUE(t.TakeRenumberings().empty());
}

TEST(StepTracker, AJoinedStepLearnsTheNextIterationsFirstPairAfresh) {
  // The generator's forward pass was the anchor of the step it began, and
  // its backward pass that step's; once that step joined the
  // discriminator's, the next iteration, which begins with the generator's
  // layer too, must still be able to give up its iteration.
  int generator = 0;  // the generator's first layer's weight
  StepTracker t;
  const auto update = [&](uint64_t optimizer, const void* first, bool nonfinite) {
    t.OnOp(Phase::kForward, true, true);
    t.OnTrainingPass("aten::linear", first, false, 0, 1);
    if (nonfinite) {
      // Inf in the loss: the program gives the iteration up, and the next
      // batch's pass reads the step's first pair again.
      EXPECT_TRUE(t.OnTrainingPass("aten::linear", first, true, 5, 1));
      return;
    }
    t.OnOp(Phase::kBackward, true, true);
    t.OnOptimizerStepBegin();
    t.OnOptimizerIdentified(optimizer);
    t.OnOptimizerStepEnd();
  };
  update(10, &generator, false);  // the discriminator's update on a fake batch
  update(20, &generator, false);  // the generator's
  EXPECT_EQ(t.step(), 0);
  t.TakeRenumberings();
  update(10, &generator, true);
  EXPECT_EQ(t.step(), 2) << "iteration 1 given up";
}

TEST(StepTracker, TheNextForwardPassBeginsTheStepAnOptimizerRecordEnded) {
  // Only an op that begins a forward pass: OnOp at that op's end (told
  // its start too) begins nothing more.
  StepTracker t;
  t.OnOp(Phase::kForward, true, true);
  t.OnOp(Phase::kBackward, true, true);
  t.OnOptimizerStepBegin();
  t.OnOptimizerStepEnd();
  EXPECT_FALSE(t.BeginStepAfterUpdate(Phase::kBackward, true, true));
  EXPECT_FALSE(t.BeginStepAfterUpdate(Phase::kForward, false, false)) << "the update's tail";
  EXPECT_EQ(t.next_step(), 1) << "still waiting";
  EXPECT_FALSE(t.BeginStepAfterUpdate(Phase::kForward, true, false)) << "data for the next batch";
  EXPECT_TRUE(t.BeginStepAfterUpdate(Phase::kForward, true, true)) << "the first layer";
  EXPECT_EQ(t.next_step(), t.step());
  EXPECT_EQ(t.step(), 1);
  EXPECT_FALSE(t.OnOp(Phase::kForward, true, true));
  EXPECT_EQ(t.step(), 1);
}


// Sample mode: one optimizer record of `optimizer`, identified inside it;
// returns whether identifying it undid the advance of the record before.
bool SampledOptimizerStep(StepTracker& t, uint64_t optimizer, bool replaces_another = false) {
  t.OnOptimizerStepBegin();
  const bool undone = t.OnOptimizerIdentified(optimizer, replaces_another);
  t.OnOptimizerStepEnd(/*begin_next_now=*/true);
  return undone;
}

// Sample mode sees no forward pass: each record ends a step, and an
// optimizer that has not stepped in that step yet undoes the advance (a
// second optimizer of the iteration, or one per parameter in backward).
TEST(StepTracker, SeveralOptimizersAnIterationAreOneStepInSampleMode) {
  StepTracker t;
  EXPECT_FALSE(SampledOptimizerStep(t, 10));
  EXPECT_EQ(t.step(), 1);
  EXPECT_TRUE(SampledOptimizerStep(t, 20)) << "the sparse parameters' optimizer";
  ExpectRenumbering(t, 1, 1, 0);
  EXPECT_EQ(t.step(), 1);
  for (int64_t iteration = 1; iteration < 4; ++iteration) {
    EXPECT_FALSE(SampledOptimizerStep(t, 10)) << "the next iteration";
    EXPECT_EQ(t.step(), iteration + 1);
    EXPECT_TRUE(SampledOptimizerStep(t, 20));
    ExpectRenumbering(t, iteration + 1, iteration + 1, iteration);
    EXPECT_EQ(t.step(), iteration + 1);
  }
}

TEST(StepTracker, InSampleModeAnOptimizerThatTakesOverAnothersBeginsItsStep) {
  StepTracker t;
  EXPECT_FALSE(SampledOptimizerStep(t, 10));
  EXPECT_FALSE(SampledOptimizerStep(t, 20, /*replaces_another=*/true)) << "the next phase's";
  EXPECT_FALSE(SampledOptimizerStep(t, 20));
  EXPECT_EQ(t.step(), 3);
  EXPECT_TRUE(t.TakeRenumberings().empty());
}

TEST(StepTracker, OneOptimizerInSampleModeIsAStepARecord) {
  StepTracker t;
  for (int64_t step = 1; step <= 3; ++step) {
    EXPECT_FALSE(SampledOptimizerStep(t, 10));
    EXPECT_EQ(t.step(), step);
  }
  // GradScaler skipped it: identified, no record; the caller ends the step.
  EXPECT_FALSE(t.OnOptimizerIdentified(10));
  t.OnOptimizerStepEnd(/*begin_next_now=*/true);
  EXPECT_EQ(t.step(), 4);
  EXPECT_TRUE(t.TakeRenumberings().empty());
}

// Records of an optimizer never identified (the step guard off) each end a
// step, as before; the first identified after them says nothing of them.
TEST(StepTracker, RecordsOfUnidentifiedOptimizersEachEndAStep) {
  StepTracker t;
  t.OnOptimizerStepBegin();
  t.OnOptimizerStepEnd(/*begin_next_now=*/true);
  EXPECT_FALSE(SampledOptimizerStep(t, 20)) << "nothing identified in step 0";
  EXPECT_EQ(t.step(), 2);
  EXPECT_TRUE(t.TakeRenumberings().empty());
}

// A model of two parameters read with `op` in a pass: whether reading the
// first began a step.
bool ReadBoth(StepTracker& t, const char* op, int* first, int* second) {
  const bool began = t.OnPassStart(op, first);
  EXPECT_FALSE(t.OnPassStart(op, second));
  return began;
}

// An evaluation or inference script: no backward pass, no optimizer. A
// pair of op and parameter read again in a pass began the next pass (the
// model's first layer, the next batch); each pass is a step.
TEST(StepTracker, WithoutTrainingEachForwardPassIsAStep) {
  StepTracker t;
  int fp32_embedding = 0, embedding = 0, lm_head = 0;  // parameters' memory
  // model.half(): a cast, then a check of the parameter against its cast.
  EXPECT_FALSE(t.OnPassStart("aten::to", &fp32_embedding));
  EXPECT_FALSE(t.OnPassStart("aten::_has_compatible_shallow_copy_type", &embedding));
  auto pass = [&] {
    const bool began = t.OnPassStart("aten::embedding", &embedding);
    EXPECT_FALSE(t.OnPassStart("aten::linear", &lm_head));
    EXPECT_FALSE(t.OnPassStart("aten::linear", &embedding)) << "tied weights, another op";
    EXPECT_FALSE(t.OnPassStart("aten::embedding", nullptr)) << "no parameter";
    return began;
  };
  EXPECT_FALSE(pass()) << "the first pass: step 0";
  EXPECT_EQ(t.step(), 0);
  EXPECT_FALSE(t.counts_passes());
  EXPECT_TRUE(pass()) << "the next batch";
  EXPECT_EQ(t.step(), 1);
  EXPECT_TRUE(pass());
  EXPECT_EQ(t.step(), 2);
  EXPECT_TRUE(t.counts_passes());
  EXPECT_TRUE(t.TakeRenumberings().empty());
}

// Set-up that reads each parameter twice (a model moved to where it
// already is, then cast; an initialiser, then a scaling) is no pass; nor is
// one op applied twice in a row to a parameter (x @ w, then y @ w).
TEST(StepTracker, SetUpThatReadsAParameterTwiceIsNoPass) {
  StepTracker t;
  int w1 = 0, w2 = 0;
  EXPECT_FALSE(ReadBoth(t, "aten::to", &w1, &w2));
  EXPECT_FALSE(ReadBoth(t, "aten::to", &w1, &w2));
  EXPECT_FALSE(ReadBoth(t, "aten::normal_", &w1, &w2));
  EXPECT_FALSE(ReadBoth(t, "aten::mul_", &w1, &w2));
  EXPECT_FALSE(ReadBoth(t, "aten::linear", &w1, &w2)) << "the first forward pass";
  EXPECT_FALSE(t.OnPassStart("aten::matmul", &w1));
  EXPECT_FALSE(t.OnPassStart("aten::matmul", &w1));
  EXPECT_EQ(t.step(), 0);
  EXPECT_TRUE(ReadBoth(t, "aten::linear", &w1, &w2));
  EXPECT_EQ(t.step(), 1);
}

// Passes counted before the process trained (a validation before the first
// training step, or T5's encoder and decoder both reading the shared
// embedding) are undone at the first backward op, and after it no forward
// pass is counted: iterations are.
TEST(StepTracker, ForwardPassesBeforeTrainingAreUndoneWhenItTrains) {
  StepTracker t;
  int shared = 0, encoder = 0;
  t.OnPassStart("aten::embedding", &shared);  // the encoder
  t.OnPassStart("aten::linear", &encoder);
  t.OnOp(Phase::kForward, true, true);
  EXPECT_TRUE(t.OnPassStart("aten::embedding", &shared)) << "the decoder, tentatively";
  EXPECT_EQ(t.step(), 1);
  t.OnOp(Phase::kBackward, true, true);
  EXPECT_EQ(t.step(), 0);
  ExpectRenumbering(t, 1, 1, 0);
  EXPECT_FALSE(t.counts_passes());
  EXPECT_TRUE(t.trained());
  t.OnOptimizerStepBegin();
  t.OnOptimizerStepEnd();
  EXPECT_TRUE(t.OnOp(Phase::kForward, true, true));
  EXPECT_FALSE(ReadBoth(t, "aten::embedding", &shared, &encoder));
  EXPECT_FALSE(ReadBoth(t, "aten::embedding", &shared, &encoder)) << "training: iterations count";
  EXPECT_EQ(t.step(), 1);
}

// Gradients set by hand, then an optimizer step: that trains too.
TEST(StepTracker, AnOptimizerStepWithoutBackwardUndoesTheForwardPasses) {
  StepTracker t;
  int w = 0, b = 0;
  for (int i = 0; i < 3; ++i) ReadBoth(t, "aten::linear", &w, &b);
  EXPECT_EQ(t.step(), 2);
  EXPECT_TRUE(t.OnOptimizerStepBegin());
  EXPECT_EQ(t.step(), 0);
  EXPECT_FALSE(t.counts_passes());
}

// A forward pass before the process trains, reading `w` then `b` with grad
// mode `grad`, its autograd nodes numbered from `first_node`: what
// Monitor::OnTopLevelOpStart tells the tracker. `nonfinite_before`: the
// pass before it made inf/NaN. Returns whether it began a step.
bool PassBeforeTraining(StepTracker& t, int* w, int* b, bool grad, bool nonfinite_before,
                        int64_t first_node) {
  const bool began = t.OnPassStart("aten::linear", w, grad, nonfinite_before, first_node, 1);
  EXPECT_FALSE(t.OnPassStart("aten::linear", b, grad, false, first_node + 1, 1));
  return began;
}

// The first iterations' losses are NaN (`if not torch.isfinite(loss):
// continue`) before any backward pass: counted as forward passes, they stay
// steps of their own when the process trains, as they would after it.
TEST(StepTracker, IterationsGivenUpBeforeTrainingAreStepsOfTheirOwn) {
  StepTracker t;
  int w = 0, b = 0;
  PassBeforeTraining(t, &w, &b, true, false, 0);
  EXPECT_TRUE(t.ReadsAnchorAgain("aten::linear", &w)) << "a GPU program's results come first";
  EXPECT_FALSE(t.ReadsAnchorAgain("aten::linear", &b));
  EXPECT_TRUE(PassBeforeTraining(t, &w, &b, true, true, 10));
  EXPECT_TRUE(PassBeforeTraining(t, &w, &b, true, true, 20));
  EXPECT_EQ(t.step(), 2);
  t.OnOp(Phase::kBackward, true, true);
  t.OnBackwardNode(25, 1);
  t.OnBackwardNode(20, 1);  // the backward pass reaches the last pass only
  EXPECT_EQ(t.step(), 2);
  EXPECT_TRUE(t.TakeRenumberings().empty());
  EXPECT_TRUE(t.TakeGivenUpIterations().empty()) << "not confirmed before the next iteration";
  t.OnOptimizerStepBegin();
  t.OnOptimizerStepEnd();
  EXPECT_TRUE(t.OnOp(Phase::kForward, true, true));
  EXPECT_EQ(t.step(), 3);
  EXPECT_EQ(t.TakeGivenUpIterations(), (std::vector<int64_t>{0, 1}));
}

// Evaluations (grad mode off) join the step of the pass after them, as
// before; a pass given up ends its step, and a finite pass does not.
TEST(StepTracker, PassesBeforeTrainingJoinTheStepOfAPassGivenUpAfterThem) {
  StepTracker t;
  int w = 0, b = 0;
  PassBeforeTraining(t, &w, &b, false, false, 0);                   // 0: an evaluation
  EXPECT_TRUE(PassBeforeTraining(t, &w, &b, false, true, 0));       // 1: one that made NaN
  EXPECT_TRUE(PassBeforeTraining(t, &w, &b, true, true, 0));        // 2: given up
  EXPECT_TRUE(PassBeforeTraining(t, &w, &b, false, true, 10));      // 3: an evaluation
  EXPECT_TRUE(PassBeforeTraining(t, &w, &b, true, false, 10));      // 4: trained
  EXPECT_EQ(t.step(), 4);
  t.OnOp(Phase::kBackward, true, true);
  EXPECT_EQ(t.step(), 1);
  // Passes 1-2 join 0; then 3-4 are step 1 (applied in order).
  ExpectRenumberings(t, {{1, 2, 0}, {3, 4, 1}});
  EXPECT_EQ(t.TakeGivenUpIterations(/*all=*/true), std::vector<int64_t>{0});
}

// The encoder of T5 or the first of two views made inf: its pass looked
// given up until the backward pass reached a node it made.
TEST(StepTracker, APassBeforeTrainingThatTheBackwardPassReachesWasNotGivenUp) {
  StepTracker t;
  int w = 0, b = 0;
  PassBeforeTraining(t, &w, &b, true, false, 0);
  EXPECT_TRUE(PassBeforeTraining(t, &w, &b, true, true, 10));
  t.OnOp(Phase::kBackward, true, true);
  EXPECT_EQ(t.step(), 1);
  EXPECT_TRUE(t.has_given_up_iterations());
  t.OnBackwardNode(12, 1);
  t.OnBackwardNode(3, 1);  // made by the first pass
  EXPECT_EQ(t.step(), 0);
  ExpectRenumbering(t, 1, 1, 0);
  EXPECT_FALSE(t.has_given_up_iterations());
  EXPECT_TRUE(t.TakeGivenUpIterations(/*all=*/true).empty());
}

// A training step's forward op with grad mode on, reading `w` first: what
// Monitor::OnTopLevelOpStart tells the tracker. `next_node`: the sequence
// number the op's autograd node gets.
bool TrainingOp(StepTracker& t, const int* w, bool nonfinite_so_far, int64_t next_node,
                uint64_t thread = 1) {
  const bool began = t.OnOp(Phase::kForward, true, true);
  return t.OnTrainingPass("aten::linear", w, nonfinite_so_far && !began, next_node, thread) ||
         began;
}

// A trained iteration: forward (nodes from `first_node`), backward, update.
void TrainedIteration(StepTracker& t, const int* w, int64_t first_node) {
  TrainingOp(t, w, false, first_node);
  t.OnOp(Phase::kBackward, true, true);
  t.OnBackwardNode(first_node + 5, 1);
  t.OnBackwardNode(first_node, 1);
  t.OnOptimizerStepBegin();
  t.OnOptimizerStepEnd();
}

TEST(StepTracker, AnIterationGivenUpOnANonFiniteLossIsAStepOfItsOwn) {
  StepTracker t;
  int w = 0;
  TrainedIteration(t, &w, 0);
  // Step 1's loss is NaN: the program goes on to the next batch
  // (`if not torch.isfinite(loss): continue`), which reads w first again.
  EXPECT_TRUE(TrainingOp(t, &w, false, 100));
  EXPECT_EQ(t.step(), 1);
  EXPECT_TRUE(t.may_give_up_iteration());
  EXPECT_TRUE(TrainingOp(t, &w, true, 110));
  EXPECT_EQ(t.step(), 2);
  EXPECT_TRUE(t.has_given_up_iterations());
  t.OnOp(Phase::kBackward, true, true);
  // The backward pass reaches the nodes of step 2's pass only.
  t.OnBackwardNode(115, 1);
  t.OnBackwardNode(-1, 1);  // AccumulateGrad
  t.OnBackwardNode(110, 1);
  EXPECT_EQ(t.step(), 2);
  EXPECT_TRUE(t.TakeRenumberings().empty());
  EXPECT_TRUE(t.TakeGivenUpIterations().empty()) << "not confirmed before the next iteration";
  t.OnOptimizerStepBegin();
  t.OnOptimizerStepEnd();
  EXPECT_TRUE(TrainingOp(t, &w, false, 200));
  EXPECT_EQ(t.step(), 3);
  EXPECT_EQ(t.TakeGivenUpIterations(), std::vector<int64_t>{1});
  EXPECT_TRUE(t.TakeGivenUpIterations().empty()) << "taken once";
}

TEST(StepTracker, IterationsGivenUpInARowAreAStepEach) {
  StepTracker t;
  int w = 0;
  TrainedIteration(t, &w, 0);
  TrainingOp(t, &w, false, 100);
  // NaN weights: every loss from here on is NaN, and no backward pass runs.
  EXPECT_TRUE(TrainingOp(t, &w, true, 100));
  EXPECT_TRUE(TrainingOp(t, &w, true, 100));
  EXPECT_TRUE(TrainingOp(t, &w, true, 100));
  EXPECT_EQ(t.step(), 4);
  EXPECT_EQ(t.TakeGivenUpIterations(/*all=*/true), (std::vector<int64_t>{1, 2, 3}));
}

TEST(StepTracker, AFiniteStepThatReadsItsFirstPairAgainIsOneStep) {
  StepTracker t;
  int w = 0, other = 0;
  TrainedIteration(t, &w, 0);
  TrainingOp(t, &w, false, 100);
  EXPECT_FALSE(TrainingOp(t, &w, false, 110)) << "a finite loss: no iteration was given up";
  EXPECT_FALSE(TrainingOp(t, &other, true, 120)) << "another pair";
  EXPECT_FALSE(t.OnTrainingPass("aten::matmul", &w, true, 120, 1)) << "another op on w";
  EXPECT_EQ(t.step(), 1);
}

TEST(StepTracker, TwoForwardPassesIntoOneLossAreOneStep) {
  StepTracker t;
  int w = 0;
  TrainedIteration(t, &w, 0);
  // Two views of a batch, the first one's pass made inf: its second pass
  // looks like a new iteration until the backward pass reaches the first.
  TrainingOp(t, &w, false, 100);
  EXPECT_TRUE(TrainingOp(t, &w, true, 110));
  EXPECT_EQ(t.step(), 2);
  t.OnOp(Phase::kBackward, true, true);
  t.OnBackwardNode(112, 1);
  EXPECT_EQ(t.step(), 2);
  t.OnBackwardNode(7, 2);  // a node of another thread's numbering says nothing
  EXPECT_EQ(t.step(), 2);
  t.OnBackwardNode(105, 1);  // made by the first pass
  EXPECT_EQ(t.step(), 1);
  ExpectRenumbering(t, 2, 2, 1);
  EXPECT_FALSE(t.has_given_up_iterations());
  t.OnOptimizerStepBegin();
  t.OnOptimizerStepEnd();
  EXPECT_TRUE(TrainingOp(t, &w, false, 200));
  EXPECT_EQ(t.step(), 2);
  EXPECT_TRUE(t.TakeGivenUpIterations(true).empty());
}

TEST(StepTracker, ALayerAppliedThriceInAPassIsOneStep) {
  StepTracker t;
  int w = 0;
  TrainedIteration(t, &w, 0);
  // An RNN cell over three time steps whose input is data: each reads w
  // first, after the first made inf.
  TrainingOp(t, &w, false, 100);
  TrainingOp(t, &w, true, 110);
  TrainingOp(t, &w, true, 120);
  EXPECT_EQ(t.step(), 3);
  t.OnOp(Phase::kBackward, true, true);
  for (int64_t node = 125; node >= 100; node -= 5) t.OnBackwardNode(node, 1);
  EXPECT_EQ(t.step(), 1);
  ExpectRenumberings(t, {{3, 3, 2}, {2, 2, 1}});  // one undo a node of each earlier pass
  EXPECT_FALSE(TrainingOp(t, &w, true, 130)) << "after the step's backward op: a micro-batch";
}

TEST(StepTracker, NoIterationIsGivenUpBeforeTheFirstUpdate) {
  StepTracker t;
  int w = 0;
  // The first iterations' forward passes are counted as passes, undone at
  // the first backward op; until an update shows how iterations end, a
  // forward pass after another may be a micro-batch.
  t.OnOp(Phase::kForward, true, true);
  t.OnOp(Phase::kBackward, true, true);
  EXPECT_TRUE(TrainingOp(t, &w, false, 100)) << "the fallback's tentative advance";
  EXPECT_FALSE(t.may_give_up_iteration());
  EXPECT_FALSE(TrainingOp(t, &w, true, 110));
  EXPECT_EQ(t.step(), 1);
}

TEST(StepTracker, AProgramWithoutOptimizerRecordsGivesIterationsUpToo) {
  StepTracker t;
  int w = 0;
  // A C++ program: forward, backward, an update with grad mode off.
  TrainingOp(t, &w, false, 0);
  t.OnOp(Phase::kBackward, true, true);
  t.OnOp(Phase::kForward, false, true);
  EXPECT_TRUE(TrainingOp(t, &w, false, 100)) << "the fallback begins step 1";
  EXPECT_TRUE(TrainingOp(t, &w, true, 110)) << "step 1 given up";
  EXPECT_EQ(t.step(), 2);
  t.OnOp(Phase::kBackward, true, true);
  t.OnBackwardNode(110, 1);
  t.OnOp(Phase::kForward, false, true);
  EXPECT_TRUE(TrainingOp(t, &w, false, 200));
  EXPECT_EQ(t.step(), 3);
  EXPECT_TRUE(t.TakeRenumberings().empty());
  EXPECT_EQ(t.TakeGivenUpIterations(), std::vector<int64_t>{1});
}

}  // namespace
}  // namespace nanhunt
