// How a backward finding's forward op is found again in a later step: the
// node numbered as many after the step's start, made by an op of the same
// name, on the same thread.
#include "core/forward_line_fills.h"

#include <map>
#include <string>

#include "gtest/gtest.h"

namespace nanhunt {
namespace {

FindingKey Key(int64_t step, int64_t call_index, const char* forward_op = "aten::div") {
  return FindingKey{step, call_index, "aten::div", forward_op};
}

// The plugin's ring of forward ops, as a map from node number to maker.
ForwardLineFills::NamedNodes NamedBy(const std::map<int64_t, std::string>& maker) {
  return [&maker](uint64_t, int64_t from, int64_t to, absl::string_view name) {
    int64_t count = 0;
    for (int64_t seq = from; seq < to; ++seq) {
      auto it = maker.find(seq);
      count += it != maker.end() && it->second == name;
    }
    return count;
  };
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

TEST(ForwardLineFills, CountedByNameOpsOfOtherNamesBetweenStepsShiftNothing) {
  // cdist(z, z) under a loop that checks its weights after each update
  // (torch.isfinite(p): an abs and a ne on a parameter, with grad on): those
  // nodes begin the next step, so step 1's _euclidean_dist is its 9th node
  // where step 0's was its 7th. It is still the first of its name.
  const std::map<int64_t, std::string> maker = {
      {0, "aten::t"},     {1, "aten::addmm"},  {2, "aten::expand"},
      {3, "aten::view"},  {4, "aten::expand"}, {5, "aten::view"},
      {6, "aten::_euclidean_dist"},            {11, "aten::abs"},
      {12, "aten::ne"},   {13, "aten::t"},     {14, "aten::addmm"},
      {15, "aten::expand"}, {16, "aten::view"}, {17, "aten::expand"},
      {18, "aten::view"}, {19, "aten::_euclidean_dist"}};
  ForwardLineFills fills;
  fills.set_named_nodes(NamedBy(maker));
  fills.OnTrainingOp(0, 0, 7);
  ASSERT_TRUE(fills.Want(Key(0, 3, "aten::_euclidean_dist"), 6, 7));
  EXPECT_TRUE(fills.OnStepBegan(1, 11, 7).empty());
  // Known to have made node 19 once node 20 is numbered.
  EXPECT_TRUE(fills.OnLine(1, "aten::_euclidean_dist", 19, 7, "train.py:7 in <module>").empty());
  const std::vector<ForwardLineFills::Fill> got = fills.OnLine(1, "aten::mul", 20, 7, "x.py:1");
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].source, "train.py:7 in <module>");
  EXPECT_EQ(got[0].from_step, 1);
}

TEST(ForwardLineFills, ACallThatMadeNoNodeIsNotTheOneWanted) {
  // Autocast casts the weight (node 0), the bias (1) and the input, which
  // needs no node: its cast is numbered 2, as the transpose after it that
  // makes node 2. The third node made by a cast is out.float()'s, 4.
  const std::map<int64_t, std::string> maker = {{0, "aten::_to_copy"}, {1, "aten::_to_copy"},
                                          {2, "aten::t"},        {3, "aten::addmm"},
                                          {4, "aten::_to_copy"}, {7, "aten::_to_copy"},
                                          {8, "aten::_to_copy"}, {9, "aten::t"},
                                          {10, "aten::addmm"},   {11, "aten::_to_copy"}};
  ForwardLineFills fills;
  fills.set_named_nodes(NamedBy(maker));
  fills.OnTrainingOp(0, 0, 7);
  ASSERT_TRUE(fills.Want(Key(0, 24, "aten::_to_copy"), 4, 7));
  fills.OnStepBegan(1, 7, 7);
  std::vector<ForwardLineFills::Fill> got;
  for (const auto& [seq, line] : std::vector<std::pair<int64_t, const char*>>{
           {7, "train.py:20 in <module>"}, {8, "train.py:20 in <module>"},
           {9, "train.py:20 in <module>"}, {11, "train.py:21 in <module>"}}) {
    for (auto& fill : fills.OnLine(1, "aten::_to_copy", seq, 7, line)) got.push_back(fill);
  }
  for (auto& fill : fills.OnStepBegan(2, 14, 7)) got.push_back(fill);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].source, "train.py:21 in <module>") << "the cast of out.float(), not x's";
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
