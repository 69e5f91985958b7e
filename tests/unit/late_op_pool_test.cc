// Reused late-op records (core/late_op_pool.h): an op taken again must be
// a new op in every field, whatever the last one held, and the memory kept
// must stay that of small ops; ops go back from another thread, and
// LateOps gives an op back exactly once, when the last hold on it goes.
#include "core/late_op_pool.h"

#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "core/late_ops.h"
#include "gtest/gtest.h"

namespace nanhunt {
namespace {

int g_memory[4];  // addresses standing in for device storages

// An op with every field away from a new op's.
void FillEveryField(LateOp& op) {
  op.id = 7;
  op.parent_id = 3;
  op.op = "aten::_softmax_backward_data";  // past the short-string buffer
  op.overload = "out";
  op.top_op = "aten::scaled_dot_product_attention";
  op.forward_op = "aten::native_layer_norm_backward";
  op.phase = Phase::kBackward;
  op.step = 12;
  op.renumberings = 2;
  op.generation = 5;
  op.grad_enabled = false;
  op.takes_grad_input = true;
  op.thread = 99;
  TensorFacts facts;
  facts.format = Format::kF16;
  facts.shape = "[8, 1024, 50257]";
  facts.counts.posinf = 3;
  op.outputs.push_back(facts);
  op.output_sizes.emplace_back().assign({8, 1024, 50257});
  op.output_storages.push_back(OutputStorage{&g_memory[0], {}, true});
  for (int i = 0; i < 3; ++i) {
    LateInput& in = op.inputs.emplace_back();
    in.arg_index = i;
    in.dtype = "Half";
    in.sizes.assign({4, 4});
    in.storage = &g_memory[1];
    in.checked_on_host = true;
  }
  op.source = "train.py:30";
  op.stack = "train.py:30 in forward";
  op.via = "Normal.log_prob (torch/distributions/normal.py:95)";
  op.kernels = "ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn";
  op.loss_scaling = op.scaled_gradients = op.others_unchecked = true;
  op.result_contexts.resize(1);
  op.result_contexts[0].op = &op;
  op.result_contexts[0].index = 0;
  op.pending = 4;
}

void ExpectNewOp(const LateOp& op) {
  EXPECT_EQ(op.id, 0u);
  EXPECT_EQ(op.parent_id, 0u);
  EXPECT_TRUE(op.op.empty() && op.overload.empty() && op.top_op.empty() &&
              op.forward_op.empty());
  EXPECT_EQ(op.phase, Phase::kForward);
  EXPECT_EQ(op.step, 0);
  EXPECT_EQ(op.renumberings, 0);
  EXPECT_EQ(op.generation, 0);
  EXPECT_TRUE(op.grad_enabled);
  EXPECT_FALSE(op.takes_grad_input);
  EXPECT_EQ(op.thread, 0u);
  EXPECT_TRUE(op.outputs.empty() && op.output_sizes.empty() && op.output_storages.empty() &&
              op.inputs.empty() && op.result_contexts.empty());
  EXPECT_TRUE(op.source.empty() && op.stack.empty() && op.via.empty() && op.kernels.empty());
  EXPECT_FALSE(op.loss_scaling || op.scaled_gradients || op.others_unchecked);
  EXPECT_EQ(op.pending.load(), 0);
}

TEST(LateOpPoolTest, AnOpTakenAgainIsANewOpThatKeptItsMemory) {
  LateOpPool pool(4);
  LateOp* op = pool.Take();
  FillEveryField(*op);
  const char* name_memory = op->op.data();
  const size_t inputs_capacity = op->inputs.capacity();
  pool.Give(op);
  EXPECT_EQ(pool.kept(), 1u);
  LateOp* again = pool.Take();
  ASSERT_EQ(again, op);
  ExpectNewOp(*again);
  // The point of reuse: the next op's long name and three inputs fit.
  EXPECT_EQ(again->inputs.capacity(), inputs_capacity);
  again->op = "aten::_softmax_backward_data";
  EXPECT_EQ(again->op.data(), name_memory);
  pool.Give(again);
}

TEST(LateOpPoolTest, KeepsNoMoreOpsThanAskedNorTheListsOfAnOpOverEveryParameter) {
  LateOpPool pool(2);
  std::vector<LateOp*> taken;
  for (int i = 0; i < 3; ++i) taken.push_back(pool.Take());
  std::set<LateOp*> distinct(taken.begin(), taken.end());
  EXPECT_EQ(distinct.size(), 3u);
  for (LateOp* op : taken) pool.Give(op);  // the third is deleted
  EXPECT_EQ(pool.kept(), 2u);

  LateOpPool wide(4);
  LateOp* foreach_op = wide.Take();
  foreach_op->outputs.resize(LateOpPool::kMaxKeptOutputs + 1);
  wide.Give(foreach_op);
  LateOp* many_inputs = wide.Take();
  many_inputs->inputs.resize(LateOpPool::kMaxKeptInputs + 1);
  wide.Give(many_inputs);
  EXPECT_EQ(wide.kept(), 0u);
  LateOp* small = wide.Take();
  small->outputs.resize(LateOpPool::kMaxKeptOutputs);
  wide.Give(small);
  EXPECT_EQ(wide.kept(), 1u);
}

// As in a training process: filled on the op's thread, given back on the
// drain thread, taken again on the op's thread, a new op every time.
TEST(LateOpPoolTest, OpsFilledOnOneThreadAndGivenBackOnAnotherComeBackNew) {
  LateOpPool pool(64);
  absl::Mutex mu;
  std::vector<LateOp*> handed;  // guarded by mu
  bool wake = false, done = false;  // guarded by mu
  std::thread drain([&] {
    for (;;) {
      std::vector<LateOp*> now;
      bool last = false;
      {
        absl::MutexLock lock(&mu);
        mu.Await(absl::Condition(&wake));
        wake = false;
        now.swap(handed);
        last = done;
      }
      for (LateOp* op : now) pool.Give(op);
      if (last) return;
    }
  });
  int not_new = 0;
  for (int i = 0; i < 20000; ++i) {
    LateOp* op = pool.Take();
    const bool fresh = op->id == 0 && op->op.empty() && op->inputs.empty() &&
                       op->outputs.empty() && op->pending.load() == 0 && op->kernels.empty();
    not_new += fresh ? 0 : 1;
    FillEveryField(*op);
    absl::MutexLock lock(&mu);
    handed.push_back(op);
    wake = true;
  }
  {
    absl::MutexLock lock(&mu);
    done = wake = true;
  }
  drain.join();
  EXPECT_EQ(not_new, 0);
  EXPECT_GT(pool.kept(), 0u);
  EXPECT_LE(pool.kept(), 64u);
}

TEST(LateOpPoolTest, LateOpsGivesAnOpBackOnceWhenTheLastHoldGoes) {
  Config config;
  Monitor monitor{config, nullptr, [] { return 1.0; }};
  LateOps late(&monitor, [](const void*) { return StorageState::kFinite; },
               [](const OutputStorage&, StorageState) {});
  std::vector<LateOp*> released;
  late.set_release([&](LateOp* op) { released.push_back(op); });
  LateOp judged;
  TensorFacts facts;
  facts.format = Format::kF16;
  judged.op = "aten::add";
  judged.outputs.push_back(facts);
  judged.output_storages.emplace_back();
  judged.pending = 2;  // one result and the enqueuing thread's hold
  EXPECT_FALSE(late.OnResult(&judged, -1, CheckCounts{}).has_value());
  EXPECT_TRUE(released.empty());
  EXPECT_TRUE(late.OnResult(&judged, 0, CheckCounts{}).has_value());
  ASSERT_EQ(released.size(), 1u);
  EXPECT_EQ(released[0], &judged);

  // After monitoring stopped: let go unjudged, given back all the same.
  LateOp unjudged;
  unjudged.pending = 2;
  late.LetGo(&unjudged);
  EXPECT_EQ(released.size(), 1u);
  late.LetGo(&unjudged);
  ASSERT_EQ(released.size(), 2u);
  EXPECT_EQ(released[1], &unjudged);
}

}  // namespace
}  // namespace nanhunt
