#include "interpose/torch/forward_ops.h"

#include "gtest/gtest.h"

namespace nanhunt {
namespace {

// Threads of their own: the rings live for the process.
constexpr uint64_t kTrainer = 7001, kLoader = 7002;

// A step: nodes 10 to 12 (the loss last), its backward pass from 12 down;
// then a metric of the step's logits (node 13, made only of nodes already
// back-propagated) and the next forward pass (node 14, of a parameter).
TEST(ForwardOpsTest, NodesABackwardPassRanOrMadeOfThoseAreBackpropagated) {
  for (int64_t seq = 10; seq <= 12; ++seq) ForwardOps::Record(kTrainer, seq, "aten::addmm");
  EXPECT_FALSE(ForwardOps::Backpropagated(kTrainer, 10)) << "no backward pass yet";
  ForwardOps::BackwardRan(kTrainer, 12);
  ForwardOps::BackwardRan(kTrainer, 11);  // later, lower: the highest stays
  ForwardOps::BackwardRan(kTrainer, -1);  // AccumulateGrad's: made by no forward op
  for (int64_t seq = 10; seq <= 12; ++seq) EXPECT_TRUE(ForwardOps::Backpropagated(kTrainer, seq));
  ForwardOps::Record(kTrainer, 13, "aten::argmax", nullptr, /*stale=*/true);
  ForwardOps::Record(kTrainer, 14, "aten::addmm");
  EXPECT_TRUE(ForwardOps::Backpropagated(kTrainer, 13));
  EXPECT_FALSE(ForwardOps::Backpropagated(kTrainer, 14));
  EXPECT_FALSE(ForwardOps::Backpropagated(kTrainer, 15)) << "not made yet";
  EXPECT_FALSE(ForwardOps::Backpropagated(kTrainer, -1));
  EXPECT_FALSE(ForwardOps::Backpropagated(kLoader, 10)) << "numbers are a thread's own";
}

}  // namespace
}  // namespace nanhunt
