// How a backward finding's forward op is found again in a later step: the
// node numbered as many after the step's start, made by an op of the same
// name, on the same thread.
#include "core/forward_line_fills.h"

#include "gtest/gtest.h"

namespace nanhunt {
namespace {

FindingKey Key(int64_t step, int64_t call_index, const char* forward_op = "aten::div") {
  return FindingKey{step, call_index, "aten::div", forward_op, /*origin=*/true};
}

TEST(ForwardLineFills, TheSameNodeNumberAfterALaterStepsStartIsTheLine) {
  ForwardLineFills fills;
  fills.OnTrainingOp(0, 100, 7);  // the first step begins with the process
  fills.OnTrainingOp(0, 140, 7);  // a later op of the same step: not its start
  EXPECT_FALSE(fills.any());
  ASSERT_TRUE(fills.Want(Key(0, 24), 103, 7));
  ASSERT_TRUE(fills.Want(Key(0, 25), 103, 7));  // a second backward op of that node
  EXPECT_TRUE(fills.any());
  // Step 0's own later calls are no evidence: its node's line is gone.
  EXPECT_TRUE(fills.OnLine(0, "aten::div", 103, 7, "train.py:12 in <module>").empty());
  fills.OnStepBegan(1, 200, 7);
  EXPECT_TRUE(fills.OnLine(1, "aten::div", 202, 7, "train.py:11 in <module>").empty());
  EXPECT_TRUE(fills.OnLine(1, "aten::div", 203, 8, "worker.py:3 in run").empty());
  const std::vector<ForwardLineFills::Fill> got =
      fills.OnLine(1, "aten::div", 203, 7, "train.py:12 in <module>");
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].key.call_index, 24);
  EXPECT_EQ(got[1].key.call_index, 25);
  EXPECT_EQ(got[0].source, "train.py:12 in <module>");
  EXPECT_FALSE(fills.any()) << "filled once";
  EXPECT_TRUE(fills.OnLine(2, "aten::div", 203, 7, "train.py:12 in <module>").empty());
}

TEST(ForwardLineFills, AnotherOpAtThatNumberFillsNothing) {
  // A forward pass that changed after the finding (a data-dependent branch)
  // put another op's node at its number: no line rather than a wrong one.
  ForwardLineFills fills;
  fills.OnStepBegan(3, 300, 7);
  ASSERT_TRUE(fills.Want(Key(3, 9), 305, 7));
  fills.OnStepBegan(4, 400, 7);
  EXPECT_TRUE(fills.OnLine(4, "aten::mul", 405, 7, "train.py:20 in <module>").empty());
  EXPECT_TRUE(fills.any());
}

TEST(ForwardLineFills, NoWantWithoutAKnownStartOnTheNodesThread) {
  ForwardLineFills fills;
  EXPECT_FALSE(fills.Want(Key(0, 1), 5, 7)) << "no step start known";
  fills.OnStepBegan(2, -1, 7);  // began at a GPU result: no number
  EXPECT_FALSE(fills.Want(Key(2, 1), 5, 7));
  fills.OnStepBegan(3, 100, 7);
  EXPECT_FALSE(fills.Want(Key(3, 1), 105, 8)) << "another thread's node";
  EXPECT_FALSE(fills.Want(Key(3, 1), 99, 7)) << "a node of an earlier step";
  EXPECT_FALSE(fills.any());
}

TEST(ForwardLineFills, StepsRenumberedAwayAreForgottenAndWantsExpire) {
  ForwardLineFills fills;
  fills.OnStepBegan(1, 100, 7);
  fills.OnStepBegan(2, 150, 7);  // a micro-batch, counted a step for now
  fills.OnStepBegan(1, 200, 7);  // ... undone: step 1 begins again
  ASSERT_TRUE(fills.Want(Key(1, 4), 203, 7));
  fills.OnStepBegan(2, 300, 7);
  EXPECT_EQ(fills.OnLine(2, "aten::div", 303, 7, "train.py:12 in <module>").size(), 1u);

  ASSERT_TRUE(fills.Want(Key(2, 4), 303, 7));
  const int64_t late = 2 + ForwardLineFills::kWantSteps + 1;
  fills.OnStepBegan(late, 900, 7);
  EXPECT_TRUE(fills.OnLine(late, "aten::div", 903, 7, "train.py:12 in <module>").empty());
  EXPECT_FALSE(fills.any()) << "expired";
}

}  // namespace
}  // namespace nanhunt
