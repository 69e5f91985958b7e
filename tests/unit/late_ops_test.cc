// Classification of ops whose outputs are checked on the GPU: results come
// later, through the check ring, in enqueue order; origin, propagation and
// nesting must come out as on the CPU. The device is a fake whose slots
// finish when the test says so.
#include "core/late_ops.h"

#include <map>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "core/check_ring.h"
#include "gtest/gtest.h"

namespace nanhunt {
namespace {

// Slots finish when told; each holds the counts the test planted.
class PlantedDevice : public DeviceChecks {
 public:
  int slots() const override { return 4; }
  void Plant(int slot, const CheckCounts& c) {
    absl::MutexLock lock(&mu_);
    planted_[slot] = c;
    done_[slot] = false;
  }
  void Finish(int slot) {
    absl::MutexLock lock(&mu_);
    done_[slot] = true;
  }
  bool Poll(int slot, CheckCounts* result) override {
    absl::MutexLock lock(&mu_);
    if (!done_[slot]) return false;
    *result = planted_[slot];
    return true;
  }
  void Wait(int slot, CheckCounts* result) override {
    absl::MutexLock lock(&mu_);
    *result = planted_[slot];
  }

 private:
  absl::Mutex mu_;
  std::map<int, CheckCounts> planted_;
  std::map<int, bool> done_;
};

CheckCounts Counts(uint64_t posinf) {
  CheckCounts c;
  c.elements = 16;
  c.posinf = posinf;
  c.max_abs_bits = posinf ? 0x7C00 : 0x3C00;
  return c;
}

int g_storage[8];  // addresses standing in for device storages

std::shared_ptr<LateOp> Op(uint64_t id, const char* name, int out, int in = -1,
                           uint64_t parent = 0) {
  auto op = std::make_shared<LateOp>();
  op->id = id;
  op->parent_id = parent;
  op->op = name;
  TensorFacts facts;
  facts.format = Format::kF16;
  facts.shape = "[4, 4]";
  op->outputs.push_back(facts);
  op->output_storages.push_back(OutputStorage{&g_storage[out], {}, false});
  if (in >= 0) {
    LateInput input;
    input.dtype = "float16";
    input.storage = &g_storage[in];
    op->inputs.push_back(input);
  }
  op->pending = 1;
  return op;
}

class LateOpsTest : public ::testing::Test {
 protected:
  Config config_;
  Monitor monitor_{config_, nullptr, [] { return 1.0; }};
  absl::flat_hash_map<const void*, StorageState> states_;
  absl::flat_hash_set<const void*> registry_;  // the non-finite ones
  void* remembered_weak_ = nullptr;  // the last remembered output's
  bool remembered_single_value_ = false;
  LateOps late_{&monitor_,
                [this](const void* s) {
                  auto it = states_.find(s);
                  return it == states_.end() ? StorageState::kFinite : it->second;
                },
                [this](const OutputStorage& out, StorageState state) {
                  const void* s = out.key;
                  remembered_weak_ = out.weak.impl();
                  remembered_single_value_ = out.single_value;
                  states_[s] = state;
                  if (state == StorageState::kNonFinite) registry_.insert(s);
                  else registry_.erase(s);
                }};
};

TEST_F(LateOpsTest, ResultsFinishingOutOfOrderAreStillJudgedInEnqueueOrder) {
  PlantedDevice device;
  std::vector<std::pair<std::string, Verdict>> verdicts;
  late_.set_on_verdict([&](const LateOp& op, Verdict v) {
    verdicts.emplace_back(op.op, v);
  });
  CheckRing ring(&device, [&](const PendingCheck& check, const CheckCounts& c) {
    late_.OnResult(static_cast<LateOp*>(check.context.get()), 0, c);
  });
  // bmm overflows (origin); softmax reads bmm's output (propagated).
  int bmm_slot = -1, softmax_slot = -1;
  ASSERT_TRUE(ring.Enqueue(nullptr, Op(1, "aten::bmm", 0), [&](int slot) {
    device.Plant(bmm_slot = slot, Counts(3));
    return true;
  }));
  ASSERT_TRUE(ring.Enqueue(nullptr, Op(2, "aten::_softmax", 1, 0), [&](int slot) {
    device.Plant(softmax_slot = slot, Counts(16));
    return true;
  }));
  device.Finish(softmax_slot);  // the later check finishes first
  ring.DrainReady();
  EXPECT_TRUE(verdicts.empty()) << "nothing may be judged before bmm";
  device.Finish(bmm_slot);
  ring.DrainAll();
  ASSERT_EQ(verdicts.size(), 2u);
  EXPECT_EQ(verdicts[0], std::make_pair(std::string("aten::bmm"), Verdict::kOrigin));
  EXPECT_EQ(verdicts[1], std::make_pair(std::string("aten::_softmax"), Verdict::kPropagated));
  EXPECT_EQ(monitor_.first_origin()->op, "aten::bmm");
}

TEST_F(LateOpsTest, TheKernelsAnOpLaunchedGoWithItsFinding) {
  auto op = Op(1, "aten::bmm", 0);
  op->kernels = "_Z4gemmPf<<<8,1,1>>>";
  EXPECT_EQ(late_.OnResult(op.get(), 0, Counts(2)), Verdict::kOrigin);
  EXPECT_EQ(monitor_.first_origin()->kernels, "_Z4gemmPf<<<8,1,1>>>");
}

TEST_F(LateOpsTest, TheDistributionsCodeThatCalledAnOpGoesWithItsFinding) {
  auto op = Op(1, "aten::log", 0);
  op->source = "train.py:10 in <module>";
  op->via = "Normal.log_prob (torch/distributions/normal.py:95)";
  EXPECT_EQ(late_.OnResult(op.get(), 0, Counts(2)), Verdict::kOrigin);
  EXPECT_EQ(monitor_.first_origin()->source, "train.py:10 in <module>");
  EXPECT_EQ(monitor_.first_origin()->via, "Normal.log_prob (torch/distributions/normal.py:95)");
}

TEST_F(LateOpsTest, ABackwardOpsFindingHasItsForwardOpsLineAndWantsItForLater) {
  auto op = Op(1, "aten::mm", 0);
  op->phase = Phase::kBackward;
  op->forward_op = "aten::addmm";
  EXPECT_EQ(late_.OnResult(op.get(), 0, Counts(2)), Verdict::kOrigin);
  EXPECT_EQ(monitor_.first_origin()->source, "");
  EXPECT_TRUE(monitor_.ForwardLineWanted("aten::addmm"));
  EXPECT_FALSE(late_.Wanted("aten::mm")) << "a backward op's own line is not the one to capture";
  auto next = Op(2, "aten::mm", 1);
  next->phase = Phase::kBackward;
  next->forward_op = "aten::addmm";
  next->forward_source = "model.py:12 in forward";  // captured at enqueue, interned
  EXPECT_EQ(late_.OnResult(next.get(), 0, Counts(2)), Verdict::kOrigin);
  EXPECT_EQ(monitor_.last_origin()->source, "model.py:12 in forward");
}

TEST_F(LateOpsTest, OutputShapesLeftToTheClassificationAreFormattedThere) {
  // The op's thread records sizes; the finding still says the shape.
  auto op = Op(1, "aten::bmm", 0);
  op->outputs[0].shape.clear();
  op->output_sizes.push_back({8, 1024, 64});
  EXPECT_EQ(late_.OnResult(op.get(), 0, Counts(2)), Verdict::kOrigin);
  EXPECT_NE(monitor_.first_origin()->outputs.find("[8, 1024, 64]"), std::string::npos)
      << monitor_.first_origin()->outputs;
}

TEST_F(LateOpsTest, AGpuInputIsDescribedByWhatItsWritersCheckFoundNotAsAMaxOfZero) {
  // No check reads an op's GPU inputs again: there is no max |x| to give.
  auto exp = Op(1, "aten::exp", 1, /*in=*/0);
  exp->inputs[0].sizes = {4, 4};
  EXPECT_EQ(late_.OnResult(exp.get(), 0, Counts(2)), Verdict::kOrigin);
  EXPECT_EQ(monitor_.first_origin()->inputs,
            "#0 float16[4, 4] on the GPU, taken as finite (no check of what wrote it found "
            "inf or NaN)");
}

TEST_F(LateOpsTest, AnInputCheckedAtItsFirstReadIsJudgedByWhatItsCheckFound) {
  // Memory no op wrote, read first by this mm: its check comes with the
  // mm's, and the mm's verdict waits for both. Its inf is the mm's input.
  auto mm = Op(1, "aten::mm", 1, /*in=*/0);
  mm->inputs[0].sizes = {4, 4};
  mm->inputs[0].checked_at_first_read = true;
  mm->inputs[0].format = Format::kF16;
  mm->pending = 3;  // its output, its input, and the enqueuing thread's hold
  EXPECT_FALSE(late_.OnResult(mm.get(), 0, Counts(4)).has_value());
  EXPECT_FALSE(late_.OnInputResult(mm.get(), 0, Counts(1)).has_value());
  EXPECT_EQ(late_.OnResult(mm.get(), -1, CheckCounts{}), Verdict::kInput);
  EXPECT_EQ(monitor_.first_origin()->inputs, "#0 float16[4, 4] max|x|=inf +inf=1");
}

TEST_F(LateOpsTest, AFirstReadWhoseCheckCountedNothingIsTakenAsBefore) {
  // Its memory went before its held check was enqueued: nothing counted,
  // and the input is judged by its writers, as an input never read.
  auto mm = Op(1, "aten::mm", 1, /*in=*/0);
  mm->inputs[0].sizes = {4, 4};
  mm->inputs[0].checked_at_first_read = true;
  mm->inputs[0].format = Format::kF16;
  mm->pending = 2;
  EXPECT_FALSE(late_.OnInputResult(mm.get(), 0, CheckCounts{}).has_value());
  EXPECT_EQ(late_.OnResult(mm.get(), 0, Counts(4)), Verdict::kOrigin);
  EXPECT_EQ(monitor_.first_origin()->inputs,
            "#0 float16[4, 4] on the GPU, taken as finite (no check of what wrote it found "
            "inf or NaN)");
}

TEST_F(LateOpsTest, AnEnclosingOpOfANestedOriginIsNotASecondOrigin) {
  EXPECT_EQ(late_.OnResult(Op(11, "aten::bmm", 2, -1, /*parent=*/10).get(), 0, Counts(1)),
            Verdict::kOrigin);
  EXPECT_EQ(late_.OnResult(Op(10, "aten::baddbmm", 3).get(), 0, Counts(1)),
            Verdict::kPropagated);
}

TEST_F(LateOpsTest, AFiniteResultClearsTheStorageSoItsNextUseIsJudgedAfresh) {
  late_.OnResult(Op(1, "aten::mul", 4).get(), 0, Counts(2));
  EXPECT_TRUE(registry_.contains(&g_storage[4]));
  late_.OnResult(Op(2, "aten::mul", 4).get(), 0, Counts(0));  // memory reused
  EXPECT_FALSE(registry_.contains(&g_storage[4]));
  EXPECT_EQ(late_.OnResult(Op(3, "aten::exp", 5, 4).get(), 0, Counts(1)), Verdict::kOrigin);
}

TEST_F(LateOpsTest, AnOpWithoutASourceLineIsWantedNextTimeAndWaitsForAllOutputs) {
  EXPECT_FALSE(late_.Wanted("aten::exp"));
  auto op = Op(1, "aten::exp", 6);
  TensorFacts second = op->outputs[0];
  op->outputs.push_back(second);
  op->output_storages.push_back(OutputStorage{&g_storage[7], {}, false});
  op->pending = 3;  // two results, and the enqueuing thread's hold
  EXPECT_FALSE(late_.OnResult(op.get(), 0, Counts(0)).has_value());
  EXPECT_FALSE(late_.OnResult(op.get(), 1, Counts(4)).has_value());
  EXPECT_EQ(late_.OnResult(op.get(), -1, CheckCounts{}), Verdict::kOrigin);
  EXPECT_TRUE(late_.Wanted("aten::exp"));
  EXPECT_TRUE(registry_.contains(&g_storage[7]));
  EXPECT_FALSE(registry_.contains(&g_storage[6]));
}

// A Python number an op was given, checked on the host at enqueue.
LateInput ScalarArgument(uint64_t neginf, uint64_t nan) {
  LateInput in;
  in.dtype = "scalar";
  in.checked_on_host = true;
  in.counts.elements = 1;
  in.counts.neginf = neginf;
  in.counts.nan = nan;
  return in;
}

// A -inf mask on the GPU: masked_fill with a -inf scalar, then an add of
// the mask, then a softmax that is finite: no finding; a row that is
// entirely masked makes NaN, and that is an origin.
TEST_F(LateOpsTest, MasksAreCarriedWithoutAFindingUntilTheyMakeNaN) {
  auto fill = Op(1, "aten::masked_fill", 0, 7);
  fill->inputs.push_back(ScalarArgument(/*neginf=*/1, /*nan=*/0));
  EXPECT_EQ(late_.OnResult(fill.get(), 0, Counts(4)), Verdict::kMasked);
  EXPECT_EQ(states_[&g_storage[0]], StorageState::kDeliberate);
  EXPECT_EQ(late_.OnResult(Op(2, "aten::add", 1, 0).get(), 0, Counts(4)), Verdict::kMasked);
  EXPECT_EQ(late_.OnResult(Op(3, "aten::_softmax", 2, 1).get(), 0, Counts(0)), Verdict::kClean);
  EXPECT_FALSE(monitor_.first_origin()) << "a mask is not a finding";
  CheckCounts nan = Counts(0);
  nan.nan = 8;
  EXPECT_EQ(late_.OnResult(Op(4, "aten::_softmax", 3, 1).get(), 0, nan), Verdict::kOrigin);
  EXPECT_EQ(monitor_.first_origin()->op, "aten::_softmax");
}

// On a GPU, sinc's backward: its division's 0 / 0 at x == 0, which the
// formula masks itself, then `* pi` of it, known by its input's memory
// alone (a GPU op's inputs are not read).
TEST_F(LateOpsTest, ABackwardFormulasOwnMaskedNaNIsKnownByItsMemory) {
  CheckCounts nan = Counts(0);
  nan.nan = 4;
  auto div = Op(1, "aten::div", 0);
  div->phase = Phase::kBackward;
  div->forward_op = "aten::sinc";
  EXPECT_EQ(late_.OnResult(div.get(), 0, nan), Verdict::kOwnMasked);
  EXPECT_EQ(states_[&g_storage[0]], StorageState::kOwnMasked);
  auto mul = Op(2, "aten::mul", 1, 0);
  mul->phase = Phase::kBackward;
  mul->forward_op = "aten::sinc";
  EXPECT_EQ(late_.OnResult(mul.get(), 0, nan), Verdict::kOwnMasked);
  EXPECT_EQ(states_[&g_storage[1]], StorageState::kOwnMasked);
  EXPECT_FALSE(monitor_.first_origin());
  EXPECT_EQ(monitor_.findings(), 0);
}

TEST_F(LateOpsTest, InfAnOpThatDoesNotCarryMasksMakesFromOneIsAnOrigin) {
  states_[&g_storage[0]] = StorageState::kDeliberate;
  EXPECT_EQ(late_.OnResult(Op(2, "aten::nll_loss_forward", 1, 0).get(), 0, Counts(1)),
            Verdict::kOrigin);
  EXPECT_EQ(states_[&g_storage[1]], StorageState::kNonFinite);
  EXPECT_NE(monitor_.first_origin()->inputs.find("put there by a mask"), std::string::npos);
}

// NaN markers on a GPU: torch.where(absent, float("nan"), dice) with the
// scalar known at enqueue, then carried by memory alone (not read), and a
// mean over them the origin.
TEST_F(LateOpsTest, NanMarkersAreKnownByTheirMemoryAndAMeanOverThemIsAnOrigin) {
  auto where = Op(1, "aten::where", 0);
  where->inputs.push_back(ScalarArgument(/*neginf=*/0, /*nan=*/1));
  CheckCounts nan = Counts(0);
  nan.nan = 1;
  EXPECT_EQ(late_.OnResult(where.get(), 0, nan), Verdict::kMasked);
  EXPECT_EQ(states_[&g_storage[0]], StorageState::kNanMarkers);
  EXPECT_EQ(late_.OnResult(Op(2, "aten::mul", 1, 0).get(), 0, nan), Verdict::kMasked);
  EXPECT_EQ(states_[&g_storage[1]], StorageState::kNanMarkers);
  EXPECT_FALSE(monitor_.first_origin());
  EXPECT_EQ(late_.OnResult(Op(3, "aten::mean", 2, 1).get(), 0, nan), Verdict::kOrigin);
  ASSERT_TRUE(monitor_.first_origin());
  EXPECT_EQ(monitor_.first_origin()->op, "aten::mean");
}

TEST_F(LateOpsTest, MaskConstantsAreKnownByTheirMemoryAndMakeMinusInfAMask) {
  // torch.full((4, 4), torch.finfo(torch.float32).min): the scalar is
  // known at enqueue; the result says the output came past fp16's limit.
  auto full = Op(1, "aten::full", 0);
  full->outputs[0].format = Format::kF32;
  LateInput fill_value;
  fill_value.dtype = "scalar";
  fill_value.checked_on_host = true;
  fill_value.counts.elements = 1;
  fill_value.holds_masks = true;
  full->inputs.push_back(fill_value);
  CheckCounts constants;
  constants.elements = 16;
  constants.near_max = constants.fp16_overflow = 16;
  constants.max_abs_bits = 0x7F7FFFFF;
  EXPECT_EQ(late_.OnResult(full.get(), 0, constants), Verdict::kMaskConstants);
  EXPECT_EQ(states_[&g_storage[0]], StorageState::kMaskConstants);
  // triu of it carries them: known by its input's memory alone.
  auto triu = Op(2, "aten::triu", 1, 0);
  triu->outputs[0].format = Format::kF32;
  EXPECT_EQ(late_.OnResult(triu.get(), 0, constants), Verdict::kMaskConstants);
  // Cast to fp16 (autocast, for scaled_dot_product_attention): -inf.
  CheckCounts minus_inf = Counts(0);
  minus_inf.neginf = 6;
  minus_inf.max_abs_bits = 0x7C00;
  EXPECT_EQ(late_.OnResult(Op(3, "aten::_to_copy", 2, 1).get(), 0, minus_inf), Verdict::kMasked);
  EXPECT_EQ(states_[&g_storage[2]], StorageState::kDeliberate);
  EXPECT_FALSE(monitor_.first_origin()) << "a mask is not a finding";
  EXPECT_EQ(monitor_.findings(), 0) << "nor a headroom warning";
  // Memory written finite since holds no mask constants: its cast is an origin.
  EXPECT_EQ(late_.OnResult(Op(4, "aten::mul", 1, 5).get(), 0, Counts(0)), Verdict::kClean);
  EXPECT_EQ(late_.OnResult(Op(5, "aten::_to_copy", 3, 1).get(), 0, minus_inf), Verdict::kOrigin);
}

int g_weak_released = 0;

// The weak reference to an output's storage, taken at enqueue, reaches
// the registry with the result (which tells from it whether the memory is
// still that storage's), and is let go once, with the op.
TEST_F(LateOpsTest, AnOutputsWeakStorageReachesTheRegistryAndGoesWithItsOp) {
  g_weak_released = 0;
  auto op = Op(1, "aten::mm", 2);
  const auto release = [](void*) { ++g_weak_released; };
  WeakStorage moved(&g_storage[2], release);
  op->output_storages[0].weak = std::move(moved);
  op->output_storages[0].single_value = true;
  EXPECT_EQ(moved.impl(), nullptr);
  EXPECT_EQ(late_.OnResult(op.get(), 0, Counts(4)), Verdict::kOrigin);
  EXPECT_EQ(remembered_weak_, &g_storage[2]);
  EXPECT_TRUE(remembered_single_value_);
  EXPECT_EQ(g_weak_released, 0);
  op.reset();
  EXPECT_EQ(g_weak_released, 1);
}

}  // namespace
}  // namespace nanhunt
