// The record of op outputs no check read: per op, phase and reason, with
// the steps they span, bounded, and described the way notes name them.
#include "core/unchecked_outputs.h"

#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace nanhunt {
namespace {

TEST(UncheckedOutputsTest, OutputsOfAnOpAddUpPerPhaseAndReasonWithTheStepsTheySpan) {
  UncheckedOutputs u;
  u.Add("aten::mm", Phase::kForward, UncheckedReason::kGraphCapture, 3);
  u.Add("aten::mm", Phase::kForward, UncheckedReason::kGraphCapture, 7, 2);
  u.Add("aten::mm", Phase::kBackward, UncheckedReason::kGraphCapture, 5);
  u.Add("aten::mm", Phase::kForward, UncheckedReason::kNotEnqueued, 4);
  u.Add("aten::add_", Phase::kOptimizer, UncheckedReason::kGraphCapture, 2, 0);  // none
  const std::vector<UncheckedRow> rows = u.Rows();
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].op, "aten::mm");  // most outputs first
  EXPECT_EQ(rows[0].phase, "forward");
  EXPECT_EQ(rows[0].reason, "graph_capture");
  EXPECT_EQ(rows[0].outputs, 3);
  EXPECT_EQ(rows[0].first_step, 3);
  EXPECT_EQ(rows[0].last_step, 7);
  EXPECT_EQ(rows[1].phase, "backward");
  EXPECT_EQ(rows[1].reason, "graph_capture");
  EXPECT_EQ(rows[2].reason, "not_enqueued");
  EXPECT_EQ(rows[2].first_step, 4);
}

TEST(UncheckedOutputsTest, ManyDistinctOpsAreCountedUnderOtherOpsPastTheBound) {
  UncheckedOutputs u;
  const size_t ops = UncheckedOutputs::kMaxKeys + 10;
  for (size_t i = 0; i < ops; ++i) {
    u.Add(absl::StrCat("custom::op", i), Phase::kForward, UncheckedReason::kUnreadable, 1);
  }
  const std::vector<UncheckedRow> rows = u.Rows();
  ASSERT_EQ(rows.size(), UncheckedOutputs::kMaxKeys + 1);
  EXPECT_EQ(rows[0].op, "(other ops)");
  EXPECT_EQ(rows[0].outputs, 10);  // no output is lost
}

TEST(UncheckedOutputsTest, ThreadsCountingAtOnceLoseNothing) {
  UncheckedOutputs u;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&u] {
      for (int i = 0; i < 1000; ++i) {
        u.Add("aten::addmm", Phase::kForward, UncheckedReason::kGraphCapture, i);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const std::vector<UncheckedRow> rows = u.Rows();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].outputs, 4000);
  EXPECT_EQ(rows[0].last_step, 999);
}

TEST(UncheckedOutputsTest, TheDescriptionNamesTheLargestOpsOfTheReasonsAsked) {
  UncheckedOutputs u;
  u.Add("aten::mm", Phase::kForward, UncheckedReason::kGraphCapture, 1, 96);
  u.Add("aten::add_", Phase::kOptimizer, UncheckedReason::kGraphCapture, 1, 48);
  u.Add("aten::relu", Phase::kForward, UncheckedReason::kGraphCapture, 1, 5);
  u.Add("aten::gelu", Phase::kForward, UncheckedReason::kGraphCapture, 1, 4);
  u.Add("aten::mul", Phase::kForward, UncheckedReason::kGraphCapture, 1, 3);
  u.Add("aten::to_mkldnn", Phase::kForward, UncheckedReason::kUnreadable, 1, 500);
  const std::vector<UncheckedRow> rows = u.Rows();
  const UncheckedReason captured[] = {UncheckedReason::kGraphCapture};
  EXPECT_EQ(DescribeUncheckedOps(rows, captured),
            "aten::mm (forward) 96, aten::add_ (optimizer) 48, aten::relu (forward) 5 "
            "and 2 other ops");
  EXPECT_EQ(DescribeUncheckedOps(rows, kCountedUnchecked), "aten::to_mkldnn (forward) 500");
  const UncheckedReason released[] = {UncheckedReason::kReleased};
  EXPECT_EQ(DescribeUncheckedOps(rows, released), "");
}

TEST(UncheckedOutputsTest, AnOpUncheckedForTwoCountedReasonsIsNamedOnce) {
  UncheckedOutputs u;
  u.Add("aten::mm", Phase::kForward, UncheckedReason::kNotEnqueued, 1, 2);
  u.Add("aten::mm", Phase::kForward, UncheckedReason::kReleased, 1, 3);
  u.Add("aten::bmm", Phase::kForward, UncheckedReason::kUnreadable, 1, 4);
  EXPECT_EQ(DescribeUncheckedOps(u.Rows(), kCountedUnchecked),
            "aten::mm (forward) 5, aten::bmm (forward) 4");
}

TEST(UncheckedOutputsTest, TheHostsReasonSaysWhichKindsOfOutputWentUnchecked) {
  UncheckedOutputs u;
  EXPECT_EQ(HostUncheckedReasons(u.Rows()),
            "tensors the check does not read: mkldnn, other devices', sparse ones on a GPU");
  u.Add("aten::copy_", Phase::kOptimizer, UncheckedReason::kArrivesLater, 1, 2);
  EXPECT_EQ(HostUncheckedReasons(u.Rows()),
            "copies from a GPU with non_blocking=True, whose values land after the op");
  EXPECT_EQ(UncheckedReasonName(UncheckedReason::kArrivesLater), "copied_from_gpu_async");
  u.Add("aten::to_mkldnn", Phase::kForward, UncheckedReason::kUnreadable, 1, 1);
  EXPECT_EQ(HostUncheckedReasons(u.Rows()),
            "tensors the check does not read: mkldnn, other devices', sparse ones on a GPU; "
            "copies from a GPU with non_blocking=True, whose values land after the op");
}

}  // namespace
}  // namespace nanhunt
