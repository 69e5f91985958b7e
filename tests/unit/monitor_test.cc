// What the monitor calls an origin, an input, a propagation or a warning,
// decided on facts alone (no torch).
#include "core/monitor.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "core/trace_writer.h"
#include "gtest/gtest.h"
#include "viewer/summary.h"
#include "viewer/trace_reader.h"

namespace nanhunt {
namespace {

class FakeContext : public OpContext {
 public:
  std::vector<InputFacts> inputs;
  int source_calls = 0;
  std::vector<InputFacts> Inputs() override { return inputs; }
  std::string Source() override {
    ++source_calls;
    return "model.py:33 in forward";
  }
  std::string Stack() override { return "model.py:33 in forward"; }
  std::optional<double> RecomputeFp32MaxAbs() override { return 71000.0; }
  bool holds_masks = false;  // what InputsHoldMasks says
  int mask_constant_calls = 0;
  bool InputsHoldMasks(absl::string_view) override {
    ++mask_constant_calls;
    return holds_masks;
  }
  bool outputs_hold_masks = false;  // what OutputsHoldMasks says
  bool OutputsHoldMasks() override { return outputs_hold_masks; }
  bool gradients_held = true;  // what NonFiniteGradientsHeld says
  bool NonFiniteGradientsHeld() override { return gradients_held; }
  CallSite backward_call_site;  // what BackwardCallSite says
  CallSite BackwardCallSite() override { return backward_call_site; }
};

// What the plugin answers for a GPU op that begins an iteration: whether
// the last one's non-finite gradients are still held (here: yes, when asked).
bool GradientsHeld() { return true; }

TensorFacts Fp16(uint64_t posinf, uint16_t max_bits = 0x5000) {
  TensorFacts t;
  t.format = Format::kF16;
  t.shape = "[2, 4]";
  t.counts.elements = 8;
  t.counts.posinf = posinf;
  t.counts.max_abs_bits = posinf ? 0x7C00 : max_bits;
  return t;
}

// An fp32 output with these counts of NaN and -inf.
TensorFacts Fp32NonFinite(uint64_t nan, uint64_t neginf) {
  TensorFacts t = Fp16(0);
  t.format = Format::kF32;
  t.counts.nan = nan;
  t.counts.neginf = neginf;
  return t;
}

// A top-level op of a training iteration: the forward addmm on a
// parameter, or its backward mm.
void IterationOp(Monitor& m, OpContext& ctx, Phase phase, const TensorFacts& out) {
  OpEvent e;
  e.op = phase == Phase::kBackward ? "aten::mm" : "aten::addmm";
  e.phase = phase;
  e.forward_op = phase == Phase::kBackward ? "aten::addmm" : "";
  e.takes_grad_input = true;
  e.outputs = absl::MakeConstSpan(&out, 1);
  m.OnOp(e, ctx);
}

// A step whose forward and backward ops are finite, ended by an optimizer
// record.
void TrainedStep(Monitor& m, OpContext& ctx) {
  const TensorFacts fine = Fp16(0, 0x4000);
  IterationOp(m, ctx, Phase::kForward, fine);
  IterationOp(m, ctx, Phase::kBackward, fine);
  m.OnOptimizerStepBegin();
  m.OnOptimizerStepEnd();
}


InputFacts Input(bool nonfinite, bool produced_by_op) {
  InputFacts in;
  in.checked = true;
  in.dtype = "float16";
  in.counts.elements = 8;
  in.counts.nan = nonfinite ? 1 : 0;
  in.produced_by_op = produced_by_op;
  return in;
}

// A tensor holding a mask's deliberate -inf.
InputFacts MaskInput(uint64_t neginf) {
  InputFacts in = Input(false, false);
  in.counts.neginf = neginf;
  in.deliberate = true;
  return in;
}

class MonitorTest : public ::testing::Test {
 protected:
  Verdict Op(const char* op, const TensorFacts& out, FakeContext& ctx,
             const char* top = "", bool contains = false,
             Phase phase = Phase::kForward, bool takes_grad_input = false) {
    OpEvent e;
    e.op = op;
    e.top_op = top;
    e.phase = phase;
    e.takes_grad_input = takes_grad_input;
    e.outputs = absl::MakeConstSpan(&out, 1);
    e.contains_finding = contains;
    return monitor_.OnOp(e, ctx);
  }
  Config config_;
  Monitor monitor_{config_, nullptr, [] { return 1.0; }};
};

TEST_F(MonitorTest, FiniteInputsGivingInfIsAnOriginWithSourceAndFp32Value) {
  FakeContext ctx;
  ctx.inputs = {Input(false, false), Input(false, false)};
  EXPECT_EQ(Op("aten::bmm", Fp16(3), ctx, "aten::matmul"), Verdict::kOrigin);
  auto first = monitor_.first_origin();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->kind, "origin");
  EXPECT_EQ(first->op, "aten::bmm");
  EXPECT_EQ(first->top_op, "aten::matmul");
  EXPECT_EQ(first->posinf, 3);
  EXPECT_EQ(first->source, "model.py:33 in forward");
  ASSERT_TRUE(first->fp32_max_abs.has_value());
  EXPECT_EQ(*first->fp32_max_abs, 71000.0);
}

TEST_F(MonitorTest, NonFiniteInputFromAnEarlierOpIsPropagation) {
  FakeContext ctx;
  ctx.inputs = {Input(true, true)};
  EXPECT_EQ(Op("aten::softmax", Fp16(1), ctx), Verdict::kPropagated);
  EXPECT_FALSE(monitor_.first_origin().has_value());
  EXPECT_EQ(ctx.source_calls, 0) << "propagation must not pay for a stack";
}

TEST_F(MonitorTest, NonFiniteDataFromOutsideIsAnInputNotAnOrigin) {
  FakeContext ctx;
  ctx.inputs = {Input(true, false)};
  EXPECT_EQ(Op("aten::linear", Fp16(1), ctx), Verdict::kInput);
  ASSERT_TRUE(monitor_.first_origin().has_value());
  EXPECT_EQ(monitor_.first_origin()->kind, "input");
}

TEST_F(MonitorTest, UnknownNonFiniteValueInsideAnotherOpDefersToThatOp) {
  FakeContext ctx;
  ctx.inputs = {Input(true, false)};  // e.g. a scalar the kernel computed
  EXPECT_EQ(Op("aten::fill_", Fp16(1), ctx, "aten::dot"), Verdict::kPropagated);
  FakeContext outer;
  outer.inputs = {Input(false, false)};
  EXPECT_EQ(Op("aten::dot", Fp16(1), outer), Verdict::kOrigin);
}

InputFacts MinusInfScalar() {
  InputFacts in;
  in.checked = true;
  in.dtype = "scalar";
  in.counts.elements = 1;
  in.counts.neginf = 1;
  return in;
}

TEST_F(MonitorTest, AMaskFilledWithMinusInfIsNoFinding) {
  // scores.masked_fill(mask, float("-inf")), called by the program.
  FakeContext ctx;
  ctx.inputs = {Input(false, false), MinusInfScalar()};
  EXPECT_EQ(Op("aten::masked_fill", Fp16(4), ctx), Verdict::kMasked);
  // Carried on: the mask added to scores.
  FakeContext add;
  const InputFacts mask = MaskInput(4);
  add.inputs = {Input(false, false), mask};
  EXPECT_EQ(Op("aten::add", Fp16(4), add), Verdict::kMasked);
  // Every op that places a scalar also carries masks: torch.fill(t, -inf).
  FakeContext fill;
  fill.inputs = {Input(false, false), MinusInfScalar()};
  EXPECT_EQ(Op("aten::fill", Fp16(4), fill), Verdict::kMasked);
  EXPECT_FALSE(monitor_.first_origin().has_value());
  EXPECT_EQ(monitor_.findings(), 0);
}

TEST_F(MonitorTest, AMaskThatMakesNaNOrInfOutsideOpsThatCarryMasksIsAnOrigin) {
  const InputFacts mask = MaskInput(8);
  FakeContext softmax;
  softmax.inputs = {mask};
  TensorFacts nan = Fp16(0);
  nan.counts.nan = 8;  // a row with every position masked
  EXPECT_EQ(Op("aten::_softmax", nan, softmax), Verdict::kOrigin);
  // An op that does not carry masks and makes inf of one is an origin
  // too: a loss over a masked position is real inf, the loss the user
  // sees. Its finding says its input was a mask (the viewer reads it).
  FakeContext loss;
  loss.inputs = {mask};
  EXPECT_EQ(Op("aten::nll_loss_forward", Fp16(1), loss), Verdict::kOrigin);
  ASSERT_TRUE(monitor_.last_origin().has_value());
  EXPECT_EQ(monitor_.last_origin()->op, "aten::nll_loss_forward");
  EXPECT_NE(monitor_.last_origin()->inputs.find("put there by a mask"), std::string::npos)
      << monitor_.last_origin()->inputs;
}

TEST_F(MonitorTest, ACompositeOpReturningMasksItsNestedOpsCarriedIsNoFinding) {
  // torch.hstack([masked, masked]): atleast_1d, then cat carried the mask
  // into memory the registry now says holds deliberate -inf.
  const InputFacts mask = MaskInput(4);
  FakeContext ctx;
  ctx.inputs = {mask};
  ctx.outputs_hold_masks = true;
  OpEvent e;
  e.op = "aten::hstack";
  TensorFacts neginf = Fp16(0);
  neginf.counts.neginf = 4;
  neginf.counts.max_abs_bits = 0x7C00;
  e.outputs = absl::MakeConstSpan(&neginf, 1);
  e.composite = true;
  EXPECT_EQ(monitor_.OnOp(e, ctx), Verdict::kMasked);
  EXPECT_EQ(monitor_.findings(), 0);
  // Not composite: a kernel of its own computed those values.
  e.composite = false;
  EXPECT_EQ(monitor_.OnOp(e, ctx), Verdict::kOrigin);
  // Composite, but its memory is not known as a mask's: judged as ever.
  e.composite = true;
  ctx.outputs_hold_masks = false;
  EXPECT_EQ(monitor_.OnOp(e, ctx), Verdict::kOrigin);
  // A nested op's finding is still where it began.
  ctx.outputs_hold_masks = true;
  e.contains_finding = true;
  EXPECT_EQ(monitor_.OnOp(e, ctx), Verdict::kPropagated);
}

TEST_F(MonitorTest, PlusInfFromAProductBesideAMinusInfMaskIsAnOverflow) {
  // nn.MultiheadAttention's baddbmm(key_padding_mask, q, k^T): -inf out
  // of it is the mask carried; +inf is q @ k^T overflowing fp16.
  const InputFacts mask = MaskInput(8);
  FakeContext ctx;
  ctx.inputs = {mask, Input(false, false), Input(false, false)};
  TensorFacts carried = Fp16(0);
  carried.counts.neginf = 8;
  carried.counts.max_abs_bits = 0x7C00;
  EXPECT_EQ(Op("aten::baddbmm", carried, ctx), Verdict::kMasked);
  TensorFacts overflowed = carried;
  overflowed.counts.posinf = 2;
  EXPECT_EQ(Op("aten::baddbmm", overflowed, ctx), Verdict::kOrigin);
  // Ops that do not compute beside the mask carry it as before.
  FakeContext add;
  add.inputs = {mask, Input(false, false)};
  EXPECT_EQ(Op("aten::add", carried, add), Verdict::kMasked);
}

TEST_F(MonitorTest, AOneValueMinusInfTensorGivenToWhereIsAMask) {
  // torch.where(mask, att, torch.tensor(float("-inf"))): made by no op.
  InputFacts minus_inf = MinusInfScalar();
  minus_inf.dtype = "float32";
  minus_inf.shape = "[]";
  FakeContext where;
  where.inputs = {Input(false, false), minus_inf};
  EXPECT_EQ(Op("aten::where", Fp16(4), where), Verdict::kMasked);
  // A larger tensor of -inf from outside is still data.
  minus_inf.shape = "[4]";
  FakeContext data;
  data.inputs = {Input(false, false), minus_inf};
  EXPECT_EQ(Op("aten::where", Fp16(4), data), Verdict::kInput);
}

// A NaN literal the program places itself marks a missing value (a
// per-class Dice loss's absent classes, averaged with torch.nanmean): a
// mask, carried as masks are; a mean over it is where real NaN begins.
// Inside an op that computes (torch.logdet's own NaN), it is no marker.
TEST_F(MonitorTest, ANanLiteralTheProgramPlacesIsAMarkerAndAMeanOverItAnOrigin) {
  TensorFacts marked = Fp16(0);
  marked.counts.nan = 1;
  InputFacts nan = MinusInfScalar();
  nan.counts.neginf = 0;
  nan.counts.nan = 1;
  FakeContext where;
  where.inputs = {Input(false, false), nan, Input(false, false)};
  EXPECT_EQ(Op("aten::where", marked, where), Verdict::kMasked);
  // where's Scalar overload: the scalar_tensor it makes of the number.
  FakeContext scalar_tensor;
  scalar_tensor.inputs = {nan};
  EXPECT_EQ(Op("aten::scalar_tensor", marked, scalar_tensor, "aten::where"), Verdict::kMasked);
  // Carried: an op that carries masks.
  InputFacts carried = Input(/*nonfinite=*/true, /*produced_by_op=*/false);
  carried.deliberate = true;
  FakeContext add;
  add.inputs = {carried, Input(false, false)};
  EXPECT_EQ(Op("aten::add", marked, add), Verdict::kMasked);
  EXPECT_FALSE(monitor_.first_origin().has_value());
  // Reduced by an op that does not skip NaN: the origin, its input a marker.
  TensorFacts mean = marked;
  mean.shape = "[]";
  mean.counts.elements = 1;
  FakeContext sum;
  sum.inputs = {carried};
  EXPECT_EQ(Op("aten::sum", mean, sum, "aten::mean"), Verdict::kOrigin);
  ASSERT_TRUE(monitor_.first_origin().has_value());
  EXPECT_NE(monitor_.first_origin()->inputs.find("NaN put there on purpose (a marker)"),
            std::string::npos)
      << monitor_.first_origin()->inputs;
  // Inside torch.logdet, a NaN placed by its kernel is the kernel's.
  FakeContext logdet;
  logdet.inputs = {nan};
  EXPECT_NE(Op("aten::scalar_tensor", marked, logdet, "aten::logdet"), Verdict::kMasked);
  // A NaN input no op made, to an op that places no scalar: data.
  FakeContext data;
  data.inputs = {Input(true, false)};
  EXPECT_EQ(Op("aten::mul", marked, data), Verdict::kInput);
}

// Any forward op carries NaN markers where they were (NaN stays NaN); one
// that spreads them (a linear over a batch with x[0, 0] = nan placed in it)
// was given them, as data; a gradient formula that computes with them (0 x
// NaN, where the loss left them out) made NaN gradients.
TEST_F(MonitorTest, NanMarkersAreCarriedWhereTheyWereGivenAsDataWhenSpreadAndAGradientsOrigin) {
  InputFacts marker = Input(/*nonfinite=*/true, /*produced_by_op=*/false);
  marker.deliberate = true;
  TensorFacts same_share = Fp16(0);
  same_share.counts.nan = 1;
  FakeContext sub;
  sub.inputs = {Input(false, false), marker};
  EXPECT_EQ(Op("aten::pow", same_share, sub), Verdict::kMasked);
  EXPECT_FALSE(monitor_.first_origin().has_value());
  TensorFacts spread = Fp16(0);
  spread.counts.nan = 4;
  FakeContext linear;
  linear.inputs = {marker, Input(false, false)};
  EXPECT_EQ(Op("aten::addmm", spread, linear), Verdict::kInput);
  ASSERT_TRUE(monitor_.first_origin().has_value());
  EXPECT_EQ(monitor_.first_origin()->kind, "input");
  EXPECT_NE(monitor_.first_origin()->inputs.find("NaN put there on purpose (a marker)"),
            std::string::npos)
      << monitor_.first_origin()->inputs;
  // The same share, in pow's backward formula: a NaN gradient it made.
  OpEvent e;
  e.op = "aten::mul";
  e.phase = Phase::kBackward;
  e.forward_op = "aten::pow";
  e.outputs = absl::MakeConstSpan(&same_share, 1);
  FakeContext backward;
  backward.inputs = {Input(false, false), marker};
  EXPECT_EQ(monitor_.OnOp(e, backward), Verdict::kOrigin);
}

TEST_F(MonitorTest, WhileOthersGoUncheckedInfOfUnknownMakingIsPresumedAMask) {
  // Sample mode: the mask's maker (full, triu) was not sampled; the sampled
  // _to_copy is given its -inf, in host memory (read) ...
  InputFacts unknown = Input(false, false);
  unknown.counts.neginf = 4;
  OpEvent e;
  e.op = "aten::_to_copy";
  TensorFacts out = Fp16(0);
  out.counts.neginf = 4;
  e.outputs = absl::MakeConstSpan(&out, 1);
  FakeContext host;
  host.inputs = {unknown};
  EXPECT_EQ(monitor_.OnOp(e, host), Verdict::kInput) << "every op checked: data";
  e.others_unchecked = true;
  EXPECT_EQ(monitor_.OnOp(e, host), Verdict::kMasked);
  // ... or on a GPU (not read: taken as finite).
  InputFacts gpu;
  gpu.checked = true;
  gpu.assumed_finite = true;
  FakeContext device;
  device.inputs = {gpu};
  EXPECT_EQ(monitor_.OnOp(e, device), Verdict::kMasked);
  e.others_unchecked = false;
  EXPECT_EQ(monitor_.OnOp(e, device), Verdict::kOrigin) << "escalated: an origin";
  // An op that does not carry masks making inf is an origin all the same
  // (a sampled bmm overflowing), and NaN is never a mask.
  e.others_unchecked = true;
  e.op = "aten::bmm";
  EXPECT_EQ(monitor_.OnOp(e, device), Verdict::kOrigin);
  e.op = "aten::_to_copy";
  out.counts.nan = 1;
  EXPECT_EQ(monitor_.OnOp(e, device), Verdict::kOrigin);
}

TEST_F(MonitorTest, AGpuCopyThatKeepsTheDtypeMakesNoNaNItsSourceHeldThem) {
  // load_state_dict's copy_ of a checkpoint loaded straight onto the GPU:
  // neither its destination's old values nor its source were read.
  InputFacts destination;
  destination.dtype = "Half";
  destination.shape = "[2, 4]";
  destination.checked = destination.on_device = destination.assumed_finite = true;
  InputFacts source = destination;
  source.arg_index = 1;
  source.copy_source = true;
  source.model_tensor = "copied into parameter";
  FakeContext device;
  device.inputs = {destination, source};
  TensorFacts out = Fp16(0);
  out.counts.nan = 1;
  OpEvent e;
  e.op = "aten::copy_";
  e.outputs = absl::MakeConstSpan(&out, 1);
  e.copies_unchanged = true;
  EXPECT_EQ(monitor_.OnOp(e, device), Verdict::kInput);
  ASSERT_TRUE(monitor_.first_origin().has_value());
  EXPECT_NE(monitor_.first_origin()->inputs.find(
                "#1 Half[2, 4] (copied into parameter) max|x|=32 nan=1 on the GPU, not read, "
                "but held them: a copy makes no inf/NaN"),
            std::string::npos)
      << monitor_.first_origin()->inputs;
  e.copies_unchanged = false;
  EXPECT_EQ(monitor_.OnOp(e, device), Verdict::kOrigin) << "a cast could make them";
  e.copies_unchanged = true;
  // Two sources (a cat): one of them held them, which is not known.
  device.inputs = {source, source};
  EXPECT_EQ(monitor_.OnOp(e, device), Verdict::kInput);
  // A source an earlier check found non-finite: passed on.
  device.inputs[1].assumed_finite = false;
  device.inputs[1].produced_by_op = true;
  device.inputs[1].counts.nan = 1;
  EXPECT_EQ(monitor_.OnOp(e, device), Verdict::kPropagated);
}

TEST_F(MonitorTest, WhileOthersGoUncheckedNaNOfUnknownMakingIsNotCalledData) {
  InputFacts nan = Input(true, false);
  FakeContext ctx;
  ctx.inputs = {nan};
  TensorFacts out = Fp16(0);
  out.counts.nan = 8;
  OpEvent e;
  e.op = "aten::add";
  e.outputs = absl::MakeConstSpan(&out, 1);
  e.others_unchecked = true;
  EXPECT_EQ(monitor_.OnOp(e, ctx), Verdict::kPropagated);
  EXPECT_FALSE(monitor_.first_origin().has_value());
}

TEST_F(MonitorTest, InfFromAComputationIsJudgedAtTheOpThatComputedIt) {
  // A kernel inside another op fills a tensor with a scalar: a constant
  // (amax's -inf to start a maximum from) or a value it computed (the CPU
  // dot's overflowed fp32 sum, filled into its fp16 result). The fill_
  // cannot tell which and is no finding; the op around it, checked at its
  // end with finite inputs and inf out, is the origin.
  FakeContext nested;
  nested.inputs = {MinusInfScalar()};
  EXPECT_EQ(Op("aten::fill_", Fp16(1), nested, "aten::dot"), Verdict::kMasked);
  FakeContext dot;
  dot.inputs = {Input(false, false), Input(false, false)};
  EXPECT_EQ(Op("aten::dot", Fp16(1), dot), Verdict::kOrigin);
  ASSERT_TRUE(monitor_.first_origin().has_value());
  EXPECT_EQ(monitor_.first_origin()->op, "aten::dot");
  // A Python float that overflowed, given to an op that computes: data
  // from outside, never a mask.
  FakeContext mul;
  mul.inputs = {Input(false, false), MinusInfScalar()};
  EXPECT_EQ(Op("aten::mul", Fp16(8), mul), Verdict::kInput);
}

TEST_F(MonitorTest, EnclosingOpOfAnOriginIsNotASecondOrigin) {
  FakeContext ctx;
  ctx.inputs = {Input(false, false)};
  EXPECT_EQ(Op("aten::matmul", Fp16(1), ctx, "", /*contains=*/true),
            Verdict::kPropagated);
}

TEST_F(MonitorTest, NearMaxWarnsOnceThenOnlyWhenItGrowsByAQuarter) {
  config_.near_max = 16376;
  FakeContext ctx;
  // 0x7000 = 8192 (below), 0x7400 = 16384, 0x7600 = 24576.
  Op("aten::bmm", Fp16(0, 0x7000), ctx);
  EXPECT_EQ(monitor_.findings(), 0);
  TensorFacts near = Fp16(0, 0x7400);
  near.counts.near_max = 1;
  Op("aten::bmm", near, ctx);
  EXPECT_EQ(monitor_.findings(), 1);
  TensorFacts bit_more = Fp16(0, 0x74F0);  // 20224
  bit_more.counts.near_max = 1;
  Op("aten::bmm", bit_more, ctx);
  EXPECT_EQ(monitor_.findings(), 1) << "20224 < 1.25 * 16384";
  TensorFacts more = Fp16(0, 0x7600);
  more.counts.near_max = 1;
  Op("aten::bmm", more, ctx);
  EXPECT_EQ(monitor_.findings(), 2);
}

TEST_F(MonitorTest, GradientsAGradScalerScalesNearTheLimitWarnOnlyInTheTrace) {
  config_.near_max = 16376;
  std::vector<std::string> told;
  monitor_.set_notify([&](const std::string& line) { told.push_back(line); });
  FakeContext ctx;
  TensorFacts near = Fp16(0, 0x7400);  // 16384
  near.counts.near_max = 1;
  OpEvent e;
  e.op = "aten::mm";
  e.phase = Phase::kBackward;
  e.outputs = absl::MakeConstSpan(&near, 1);
  e.scaled_gradients = true;
  EXPECT_EQ(monitor_.OnOp(e, ctx), Verdict::kWarned);
  EXPECT_EQ(monitor_.findings(), 1) << "recorded";
  EXPECT_TRUE(told.empty()) << "but not told live";
  e.op = "aten::bmm";
  e.scaled_gradients = false;
  monitor_.OnOp(e, ctx);
  ASSERT_EQ(told.size(), 1u);
}

// A backward op of the forward op addmm, with the one output `out`.
OpEvent BackwardOfAddmm(const TensorFacts& out, absl::string_view forward_source = "") {
  OpEvent e;
  e.op = "aten::mm";
  e.phase = Phase::kBackward;
  e.forward_op = "aten::addmm";
  e.forward_source = forward_source;
  e.outputs = absl::MakeConstSpan(&out, 1);
  return e;
}

TEST_F(MonitorTest, ABackwardFindingsLineIsTheOneItsForwardOpWasCalledFrom) {
  FakeContext ctx;  // its own line would be the loss.backward() call's
  ctx.inputs = {Input(false, false)};
  const TensorFacts inf = Fp16(2);
  EXPECT_EQ(monitor_.OnOp(BackwardOfAddmm(inf, "model.py:12 in forward"), ctx),
            Verdict::kOrigin);
  ASSERT_TRUE(monitor_.first_origin().has_value());
  EXPECT_EQ(monitor_.first_origin()->source, "model.py:12 in forward");
  EXPECT_EQ(monitor_.first_origin()->forward_op, "aten::addmm");
  EXPECT_EQ(ctx.source_calls, 0);
}

TEST_F(MonitorTest, ABackwardOpCalledByAHookOrACustomBackwardHasThatLineAndStack) {
  FakeContext ctx;
  ctx.inputs = {Input(false, false)};
  ctx.backward_call_site = {"train.py:5 in <lambda>", "train.py:5 in <lambda>"};
  const TensorFacts inf = Fp16(2);
  EXPECT_EQ(monitor_.OnOp(BackwardOfAddmm(inf, "model.py:12 in forward"), ctx),
            Verdict::kOrigin);
  const FindingRow origin = *monitor_.first_origin();
  EXPECT_EQ(origin.source, "train.py:5 in <lambda>");
  EXPECT_EQ(origin.stack, "train.py:5 in <lambda>");
  EXPECT_FALSE(SourceIsForwardLine(origin));
  EXPECT_FALSE(monitor_.ForwardLineWanted("aten::addmm")) << "its line is known";

  // Autograd's own node: the forward op's line, which has no stack.
  ctx.backward_call_site = {};
  Monitor other{config_, nullptr, [] { return 1.0; }};
  EXPECT_EQ(other.OnOp(BackwardOfAddmm(inf, "model.py:12 in forward"), ctx), Verdict::kOrigin);
  EXPECT_EQ(other.first_origin()->source, "model.py:12 in forward");
  EXPECT_EQ(other.first_origin()->stack, "");
  EXPECT_TRUE(SourceIsForwardLine(*other.first_origin()));
}

TEST_F(MonitorTest, ABackwardOriginWantsItsForwardOpsLineForTwentySteps) {
  FakeContext ctx;
  ctx.inputs = {Input(false, false)};
  EXPECT_FALSE(monitor_.ForwardLineWanted("aten::addmm"));
  const TensorFacts inf = Fp16(2);
  EXPECT_EQ(monitor_.OnOp(BackwardOfAddmm(inf), ctx), Verdict::kOrigin);  // step 0
  EXPECT_EQ(monitor_.first_origin()->source, "") << "not captured before it was wanted";
  EXPECT_TRUE(monitor_.ForwardLineWanted("aten::addmm"));
  EXPECT_FALSE(monitor_.ForwardLineWanted("aten::mm")) << "the backward op is not called from a line";
  monitor_.OnOptimizerStepBegin();
  monitor_.OnOptimizerStepEnd();
  for (int step = 1; step <= Monitor::kForwardLineSteps; ++step) {
    TrainedStep(monitor_, ctx);
    EXPECT_EQ(monitor_.step(), step);
    EXPECT_TRUE(monitor_.ForwardLineWanted("aten::addmm")) << "at step " << step;
  }
  // The next forward pass begins step 21.
  IterationOp(monitor_, ctx, Phase::kForward, Fp16(0, 0x4000));
  EXPECT_EQ(monitor_.step(), Monitor::kForwardLineSteps + 1);
  EXPECT_FALSE(monitor_.ForwardLineWanted("aten::addmm"));
}

TEST_F(MonitorTest, OnlyUnscaledBackwardWarningsWantTheForwardOpsLine) {
  config_.near_max = 16376;
  FakeContext ctx;
  TensorFacts near = Fp16(0, 0x7400);  // 16384
  near.counts.near_max = 1;
  OpEvent scaled = BackwardOfAddmm(near);
  scaled.scaled_gradients = true;  // a GradScaler's, near the limit on purpose
  EXPECT_EQ(monitor_.OnOp(scaled, ctx), Verdict::kWarned);
  EXPECT_FALSE(monitor_.ForwardLineWanted("aten::addmm"));
  TensorFacts nearer = Fp16(0, 0x7600);  // 24576: a quarter more, warned again
  nearer.counts.near_max = 1;
  EXPECT_EQ(monitor_.OnOp(BackwardOfAddmm(nearer), ctx), Verdict::kWarned);
  EXPECT_TRUE(monitor_.ForwardLineWanted("aten::addmm"));
}

TEST_F(MonitorTest, GradScalersScaledValuesAreNoHeadroomFindingButTheirInfStillIs) {
  // loss * 65536 in fp32: 416072, past fp16's limit on purpose.
  TensorFacts scaled;
  scaled.format = Format::kF32;
  scaled.counts.elements = 1;
  scaled.counts.near_max = scaled.counts.fp16_overflow = 1;
  scaled.counts.max_abs_bits = 0x48CB2900;  // 416072.0f
  FakeContext ctx;
  OpEvent e;
  e.op = "aten::mul";
  e.outputs = absl::MakeConstSpan(&scaled, 1);
  e.loss_scaling = true;
  EXPECT_EQ(monitor_.OnOp(e, ctx), Verdict::kClean);
  EXPECT_EQ(monitor_.findings(), 0);
  e.loss_scaling = false;  // the same values from any other op warn
  EXPECT_EQ(monitor_.OnOp(e, ctx), Verdict::kWarned);
  EXPECT_EQ(monitor_.findings(), 1);
  // A scale that overflows fp32 itself is still found.
  TensorFacts inf = scaled;
  inf.counts.near_max = 0;
  inf.counts.posinf = 1;
  inf.counts.max_abs_bits = 0x7F800000;
  e.outputs = absl::MakeConstSpan(&inf, 1);
  e.loss_scaling = true;
  EXPECT_EQ(monitor_.OnOp(e, ctx), Verdict::kOrigin);
}

// What the monitor says of `op` in the backward of `forward_op`, whose one
// output is `out`.
Verdict OnBackwardOp(Monitor& monitor, OpContext& ctx, const char* op, const char* forward_op,
                     const TensorFacts& out) {
  OpEvent e;
  e.op = op;
  e.phase = Phase::kBackward;
  e.forward_op = forward_op;
  e.outputs = absl::MakeConstSpan(&out, 1);
  return monitor.OnOp(e, ctx);
}

// F.normalize of a zero vector (a padding embedding): the norm's backward
// divides by the norm, 0 / 0, and masks those NaN itself right after; a
// std's at a constant feature likewise, sinc's, copysign's and a complex angle's at 0,
// a distance's at equal points, a cumulative product's at a zero factor,
// and atan2's reciprocal at (0, 0). Their own, of finite inputs: no
// finding. Not so for a division of the program's, a square root's
// derivative, a NaN it was given, or ±inf in fp16 (a tiny divisor
// overflows there) or where the formula divides 0 by 0 alone.
TEST_F(MonitorTest, ABackwardFormulasZeroDivisionIsItsOwnMaskedNaN) {
  FakeContext ctx;
  TensorFacts nan = Fp16(0);
  nan.format = Format::kF32;
  nan.counts.nan = 8;
  TensorFacts inf = nan;
  inf.counts.nan = 0;
  inf.counts.posinf = 1;
  TensorFacts fp16_inf = inf;
  fp16_inf.format = Format::kF16;
  TensorFacts fp16_nan = nan;
  fp16_nan.format = Format::kF16;
  const auto backward = [&](const char* op, const char* forward_op, const TensorFacts& out) {
    ctx.inputs = {Input(false, true), Input(false, true)};
    return OnBackwardOp(monitor_, ctx, op, forward_op, out);
  };
  for (const char* forward_op :
       {"aten::linalg_vector_norm", "aten::norm", "aten::dist", "aten::renorm", "aten::std",
        "aten::_euclidean_dist", "aten::sgn", "aten::cumprod"}) {
    EXPECT_EQ(backward("aten::div", forward_op, nan), Verdict::kOwnMasked) << forward_op;
    EXPECT_EQ(backward("aten::div", forward_op, inf), Verdict::kOwnMasked) << forward_op;
    EXPECT_EQ(backward("aten::div", forward_op, fp16_nan), Verdict::kOwnMasked) << forward_op;
    EXPECT_EQ(backward("aten::div", forward_op, fp16_inf), Verdict::kOrigin) << forward_op;
  }
  for (const char* forward_op : {"aten::sinc", "aten::angle", "aten::copysign"}) {
    EXPECT_EQ(backward("aten::div", forward_op, nan), Verdict::kOwnMasked) << forward_op;
    EXPECT_EQ(backward("aten::div", forward_op, inf), Verdict::kOrigin) << forward_op;
  }
  // A norm of p < 1: |x| ** (p - 1) at 0; atan2: 1 / (x^2 + y^2) there.
  EXPECT_EQ(backward("aten::pow_", "aten::linalg_vector_norm", inf), Verdict::kOwnMasked);
  EXPECT_EQ(backward("aten::reciprocal", "aten::atan2", inf), Verdict::kOwnMasked);
  EXPECT_EQ(backward("aten::reciprocal", "aten::atan2", fp16_inf), Verdict::kOrigin);
  EXPECT_EQ(monitor_.findings(), 12) << "the origins above, no more";
  EXPECT_TRUE(monitor_.mask_ops().empty()) << "torch's, not a mask of the program's";
  EXPECT_EQ(backward("aten::div", "aten::sqrt", nan), Verdict::kOrigin);
  EXPECT_EQ(backward("aten::pow", "aten::pow", inf), Verdict::kOrigin) << "x ** 0.5 at 0";
  EXPECT_EQ(backward("aten::reciprocal", "aten::reciprocal", inf), Verdict::kOrigin);
  ctx.inputs = {Input(true, true), Input(false, true)};
  EXPECT_EQ(OnBackwardOp(monitor_, ctx, "aten::div", "aten::linalg_vector_norm", nan),
            Verdict::kPropagated);
}

// torch.linalg.pinv: where(S > tol, S.reciprocal(), 0), whose reciprocal of
// a zero singular value is inf before its own where drops it. Not so out
// of pinv.
TEST_F(MonitorTest, PinvsReciprocalOfAZeroSingularValueIsItsOwn) {
  FakeContext ctx;
  TensorFacts inf = Fp16(0);
  inf.format = Format::kF32;
  inf.counts.posinf = 1;
  OpEvent e;
  e.op = "aten::reciprocal";
  e.top_op = "aten::linalg_pinv";
  e.outputs = absl::MakeConstSpan(&inf, 1);
  ctx.inputs = {Input(false, false)};
  EXPECT_EQ(monitor_.OnOp(e, ctx), Verdict::kOwnMasked);
  EXPECT_EQ(monitor_.findings(), 0);
  e.top_op = "";
  ctx.inputs = {Input(false, false)};
  EXPECT_EQ(monitor_.OnOp(e, ctx), Verdict::kOrigin);
}

// F.poisson_nll_loss(full=True)'s Stirling term takes log(0) at each zero
// count, carries it (0 * -inf, - target) to its masked_fill: the loss's
// own. Its NaN log (a negative rate's log(input + eps)) is an origin, and
// the same ops out of the loss carry nothing.
TEST_F(MonitorTest, APoissonLossesStirlingTermAtAZeroCountIsItsOwn) {
  FakeContext ctx;
  const TensorFacts neginf = Fp32NonFinite(0, 28);
  const TensorFacts nan = Fp32NonFinite(28, 0);
  const auto nested = [&](const char* op, const char* top_op, const TensorFacts& out,
                          std::vector<InputFacts> inputs) {
    ctx.inputs = std::move(inputs);
    OpEvent e;
    e.op = op;
    e.top_op = top_op;
    e.outputs = absl::MakeConstSpan(&out, 1);
    return monitor_.OnOp(e, ctx);
  };
  InputFacts own = Input(true, true);
  own.own_masked = true;
  EXPECT_EQ(nested("aten::log", "aten::poisson_nll_loss", neginf, {Input(false, false)}),
            Verdict::kOwnMasked);
  EXPECT_EQ(nested("aten::mul", "aten::poisson_nll_loss", nan, {Input(false, false), own}),
            Verdict::kOwnMasked);
  EXPECT_EQ(nested("aten::sub", "aten::poisson_nll_loss", neginf, {own, Input(false, false)}),
            Verdict::kOwnMasked);
  EXPECT_EQ(monitor_.findings(), 0);
  EXPECT_EQ(nested("aten::log", "aten::poisson_nll_loss", nan, {Input(false, true)}),
            Verdict::kOrigin)
      << "a negative rate";
  EXPECT_EQ(nested("aten::log", "", neginf, {Input(false, false)}), Verdict::kOrigin);
  EXPECT_EQ(nested("aten::mul", "aten::nll_loss_nd", nan, {Input(false, false), own}),
            Verdict::kPropagated)
      << "out of the loss";
}

// sinc's backward multiplies its own 0 / 0 by pi before its torch.where
// masks it: the product is the formula's too. Out of the formula (an op of
// another backward), or beside another NaN, it is not.
TEST_F(MonitorTest, AnOpOfTheFormulaCarryingItsOwnMaskedNaNIsTheFormulas) {
  FakeContext ctx;
  TensorFacts nan = Fp16(0);
  nan.format = Format::kF32;
  nan.counts.nan = 8;
  InputFacts own = Input(true, false);
  own.own_masked = true;
  const auto backward_mul = [&](const char* forward_op) {
    return OnBackwardOp(monitor_, ctx, "aten::mul", forward_op, nan);
  };
  ctx.inputs = {own, Input(false, false)};
  EXPECT_EQ(backward_mul("aten::sinc"), Verdict::kOwnMasked);
  EXPECT_EQ(monitor_.findings(), 0);
  ctx.inputs = {own, Input(true, true)};
  EXPECT_EQ(backward_mul("aten::sinc"), Verdict::kPropagated) << "another op's NaN beside it";
  ctx.inputs = {own, Input(false, false)};
  EXPECT_EQ(backward_mul("aten::addmm"), Verdict::kPropagated)
      << "out of its formula: made by its division, not the data";
  EXPECT_FALSE(monitor_.first_origin());
}

// A tensor exponent's gradient, where(x == 0 & y >= 0, 0, x ** y * log(x)):
// log(0) is -inf and 0 * -inf NaN before the where (GeM pooling's learned
// p over a ReLU's zeros), the formula's own. A log's NaN (a negative base)
// is unmasked, an origin; as are the log of another backward and a
// division in pow's.
TEST_F(MonitorTest, ATensorExponentsLogOfAZeroBaseIsItsFormulasOwn) {
  FakeContext ctx;
  const TensorFacts neginf = Fp32NonFinite(0, 3);
  const TensorFacts nan = Fp32NonFinite(3, 0);
  const TensorFacts both = Fp32NonFinite(2, 3);
  const auto backward = [&](const char* op, const char* forward_op, const TensorFacts& out) {
    ctx.inputs = {Input(false, true)};
    return OnBackwardOp(monitor_, ctx, op, forward_op, out);
  };
  for (const char* forward_op : {"aten::pow", "aten::pow_", "aten::float_power"}) {
    EXPECT_EQ(backward("aten::log", forward_op, neginf), Verdict::kOwnMasked) << forward_op;
  }
  // logcumsumexp's log |grad| at a zero gradient, before its where.
  EXPECT_EQ(backward("aten::log", "aten::logcumsumexp", neginf), Verdict::kOwnMasked);
  TensorFacts fp16_neginf = neginf;
  fp16_neginf.format = Format::kF16;
  EXPECT_EQ(backward("aten::log", "aten::pow", fp16_neginf), Verdict::kOwnMasked)
      << "log(0) is -inf in every format";
  EXPECT_EQ(monitor_.findings(), 0);
  // The product with x ** y carries it to the where.
  InputFacts own = Input(true, false);
  own.own_masked = true;
  ctx.inputs = {Input(false, true), own};
  EXPECT_EQ(OnBackwardOp(monitor_, ctx, "aten::mul", "aten::pow", nan), Verdict::kOwnMasked);
  // x ** y was +inf already (0 ** y for y < 0: the forward's origin).
  ctx.inputs = {Input(true, true), own};
  EXPECT_EQ(OnBackwardOp(monitor_, ctx, "aten::mul", "aten::pow", nan), Verdict::kPropagated);
  EXPECT_EQ(monitor_.findings(), 1);
  EXPECT_EQ(backward("aten::log", "aten::pow", nan), Verdict::kOrigin) << "a negative base";
  EXPECT_EQ(backward("aten::log", "aten::pow", both), Verdict::kOrigin);
  EXPECT_EQ(backward("aten::log", "aten::log_softmax", neginf), Verdict::kOrigin);
  EXPECT_EQ(backward("aten::div", "aten::pow", nan), Verdict::kOrigin);
  EXPECT_EQ(backward("aten::pow", "aten::pow", neginf), Verdict::kOrigin)
      << "the base's x ** (y - 1), masked only where y == 0";
}

// torch.finfo(torch.float32).min in fp32: 0x7F7FFFFF, past fp16's range.
TensorFacts Fp32MaskConstants() {
  TensorFacts t;
  t.format = Format::kF32;
  t.shape = "[8, 8]";
  t.counts.elements = 64;
  t.counts.near_max = t.counts.fp16_overflow = 28;
  t.counts.max_abs_bits = 0x7F7FFFFF;
  return t;
}

TEST_F(MonitorTest, MaskConstantsAnOpPlacesOrCarriesAreNoHeadroomFinding) {
  // torch.full((8, 8), torch.finfo(torch.float32).min).triu(1): the
  // context says a scalar or an input holds mask constants.
  std::vector<std::string> notes;
  monitor_.set_notify([&](const std::string& s) { notes.push_back(s); });
  FakeContext ctx;
  ctx.holds_masks = true;
  EXPECT_EQ(Op("aten::triu", Fp32MaskConstants(), ctx), Verdict::kMaskConstants);
  TensorFacts fp16 = Fp16(0, 0x7BFF);  // where(causal, w, finfo(fp16).min)
  fp16.counts.near_max = 4;
  EXPECT_EQ(Op("aten::where", fp16, ctx), Verdict::kMaskConstants);
  EXPECT_EQ(monitor_.findings(), 0);
  EXPECT_TRUE(notes.empty()) << notes[0];
  // Only an op that carries masks passes them on: softmax computes.
  EXPECT_EQ(Op("aten::_softmax", fp16, ctx), Verdict::kWarned);
  // The same values with no mask constant in: an fp32 op that would
  // overflow fp16, and an fp16 warning.
  FakeContext plain;
  EXPECT_EQ(Op("aten::mul", Fp32MaskConstants(), plain), Verdict::kWarned);
  EXPECT_EQ(Op("aten::add", fp16, plain), Verdict::kWarned);
  EXPECT_EQ(notes.size(), 2u);
}

TEST_F(MonitorTest, OnlyOpsNearTheLimitAreAskedForMaskConstants) {
  FakeContext ctx;
  ctx.holds_masks = true;
  EXPECT_EQ(Op("aten::add", Fp16(0, 0x3C00), ctx), Verdict::kClean);
  EXPECT_EQ(ctx.mask_constant_calls, 0) << "asked of every op, it costs every op";
}

TEST_F(MonitorTest, MinusInfFromMaskConstantsIsAMaskButPlusInfIsNot) {
  // autocast casts a finfo(fp32).min attn_mask to fp16 for
  // scaled_dot_product_attention: -inf from finite inputs.
  FakeContext ctx;
  ctx.holds_masks = true;
  ctx.inputs = {Input(false, false)};
  TensorFacts minus = Fp16(0);
  minus.counts.neginf = 28;
  minus.counts.max_abs_bits = 0x7C00;
  EXPECT_EQ(Op("aten::_to_copy", minus, ctx, "aten::scaled_dot_product_attention"),
            Verdict::kMasked);
  EXPECT_FALSE(monitor_.first_origin().has_value());
  EXPECT_EQ(Op("aten::_to_copy", Fp16(3), ctx), Verdict::kOrigin) << "+inf is computed";
  FakeContext plain;
  plain.inputs = {Input(false, false)};
  EXPECT_EQ(Op("aten::_to_copy", minus, plain), Verdict::kOrigin);
  // NaN made of masks (a row masked entirely) is never a mask.
  TensorFacts nan = minus;
  nan.counts.nan = 1;
  EXPECT_EQ(Op("aten::add", nan, ctx), Verdict::kOrigin);
}

TEST(StorageStateAfter, WhatTheRegistryRemembersOfAnOutput) {
  CheckCounts finite, minus_inf, nan;
  minus_inf.neginf = 1;
  nan.nan = 1;
  EXPECT_EQ(StorageStateAfter(Verdict::kMasked, minus_inf), StorageState::kDeliberate);
  EXPECT_EQ(StorageStateAfter(Verdict::kMasked, nan), StorageState::kNanMarkers);
  EXPECT_EQ(StorageStateAfter(Verdict::kOwnMasked, nan), StorageState::kOwnMasked);
  EXPECT_EQ(StorageStateAfter(Verdict::kOwnMasked, finite), StorageState::kFinite);
  EXPECT_EQ(StorageStateAfter(Verdict::kOrigin, nan), StorageState::kNonFinite);
  EXPECT_EQ(StorageStateAfter(Verdict::kMaskConstants, finite), StorageState::kMaskConstants);
  EXPECT_EQ(StorageStateAfter(Verdict::kWarned, finite), StorageState::kFinite);
  EXPECT_EQ(StorageStateAfter(Verdict::kMasked, finite), StorageState::kFinite);
}

TEST_F(MonitorTest, UnderflowIsReportedOncePerOpAndPhase) {
  FakeContext ctx;
  TensorFacts t = Fp16(0, 0x3C00);
  t.counts.underflow = 4;  // half of 8 elements
  Op("aten::mul", t, ctx, "", false, Phase::kBackward);
  Op("aten::mul", t, ctx, "", false, Phase::kBackward);
  EXPECT_EQ(monitor_.findings(), 1);
}

TEST_F(MonitorTest, StepsAdvanceWithOptimizerRecords) {
  FakeContext ctx;
  Op("aten::mm", Fp16(0), ctx);
  monitor_.OnOptimizerStepBegin();
  monitor_.OnOptimizerStepEnd();
  EXPECT_EQ(monitor_.step(), 0) << "until the next forward pass";
  EXPECT_EQ(monitor_.next_step(), 1);
  ctx.inputs = {Input(false, false)};
  Op("aten::mm", Fp16(1), ctx, "", false, Phase::kForward, /*takes_grad_input=*/true);
  EXPECT_EQ(monitor_.first_origin()->step, 1);
}

// Sample mode does not judge an iteration that made non-finite gradients
// and began the next batch without an optimizer step (an op nobody checked
// may hold them): it counts it, once, for the view's caution.
TEST_F(MonitorTest, SampleModeCountsIterationsWithoutUpdateItDoesNotJudge) {
  config_.mode = Mode::kSample;
  Monitor m(config_, nullptr, [] { return 1.0; });
  FakeContext ctx;
  ctx.inputs = {Input(false, false)};
  ctx.gradients_held = false;  // what the CPU path would call a skip
  const TensorFacts overflowed = Fp16(/*posinf=*/3);
  const TensorFacts fine = Fp16(0, 0x4000);
  const auto op = [&](Phase phase, const TensorFacts& out) { IterationOp(m, ctx, phase, out); };
  TrainedStep(m, ctx);
  for (int iteration = 0; iteration < 2; ++iteration) {
    op(Phase::kForward, fine);
    op(Phase::kBackward, overflowed);
  }
  op(Phase::kForward, fine);
  op(Phase::kForward, fine);  // the same iteration: counted once
  EXPECT_EQ(m.iterations_unjudged_in_sample_mode(), 2);
  EXPECT_EQ(m.program_skips(), 0);
}

TEST_F(MonitorTest, PropagatedFindingsAreCappedPerStepButOriginsAreNot) {
  config_.max_findings_per_step = 2;
  Monitor m(config_, nullptr, [] { return 1.0; });
  FakeContext propagated;
  propagated.inputs = {Input(true, true)};
  TensorFacts out = Fp16(1);
  OpEvent e;
  e.op = "aten::add";
  e.outputs = absl::MakeConstSpan(&out, 1);
  for (int i = 0; i < 5; ++i) m.OnOp(e, propagated);
  EXPECT_EQ(m.findings(), 2);
  FakeContext origin;
  origin.inputs = {Input(false, false)};
  m.OnOp(e, origin);
  EXPECT_EQ(m.findings(), 3);
}

TEST_F(MonitorTest, NonFiniteValuesInMemoryACollectiveWroteWereReceived) {
  static int bucket, batch;
  monitor_.NoteCollective({&bucket});
  FakeContext ctx;
  ctx.inputs = {Input(true, false)};
  ctx.inputs[0].storage = &bucket;
  Op("aten::copy_", Fp16(1), ctx);
  EXPECT_FALSE(monitor_.first_origin().has_value()) << "received is not where it began";
  // Written by an op of this process since: an input again (a reused
  // address must not pass for a bucket).
  monitor_.ForgetCollective({&bucket});
  ctx.inputs[0].storage = &batch;
  Op("aten::add", Fp16(1), ctx);
  ASSERT_TRUE(monitor_.first_origin().has_value());
  EXPECT_EQ(monitor_.first_origin()->kind, "input");
}

TEST_F(MonitorTest, SkippedStepNamesTheFirstBackwardOpOfThatStep) {
  FakeContext ctx;
  ctx.inputs = {Input(false, false)};
  Op("aten::mm", Fp16(1), ctx, "", false, Phase::kBackward);  // step 0
  monitor_.OnOptimizerStepBegin();
  monitor_.OnOptimizerStepEnd();
  // Step 1: a forward warning, then two backward ops go non-finite.
  Op("aten::bmm", Fp16(0, 0x7000), ctx, "", false, Phase::kForward, /*takes_grad_input=*/true);
  OpEvent e;
  TensorFacts out = Fp16(2);
  e.op = "aten::copy_";  // a helper inside the op the node called
  e.top_op = "aten::mul";
  e.phase = Phase::kBackward;
  e.forward_op = "aten::gelu";
  e.outputs = absl::MakeConstSpan(&out, 1);
  monitor_.OnOp(e, ctx);
  Op("aten::mm", Fp16(1), ctx, "", false, Phase::kBackward);
  monitor_.OnOptimizerStepBegin();
  EXPECT_EQ(monitor_.OnStepSkipped(),
            "skipped the optimizer step at step 1: non-finite gradients, "
            "first made by aten::mul (backward of aten::gelu)");
  monitor_.OnOptimizerStepEnd();
  EXPECT_EQ(monitor_.skipped_steps(), 1);
  // Step 2 starts clean: a skip without a checked culprit says so.
  Op("aten::addmm", Fp16(0), ctx, "", false, Phase::kForward, /*takes_grad_input=*/true);
  monitor_.OnOptimizerStepBegin();
  EXPECT_EQ(monitor_.OnStepSkipped(),
            "skipped the optimizer step at step 2: non-finite gradients "
            "(no checked backward op made them)");
}

// A monitor writing a real trace file, read back once the test closes it.
// A top-level forward op named `op` with the one output `out`.
OpEvent OpNamed(const char* op, const TensorFacts& out) {
  OpEvent e;
  e.op = op;
  e.phase = Phase::kForward;
  e.outputs = absl::MakeConstSpan(&out, 1);
  return e;
}

class TracedMonitorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "/" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name() +
            std::to_string(getpid()) + ".sqlite";
    std::remove(path_.c_str());
    auto w = TraceWriter::Open(path_, std::chrono::milliseconds(50));
    ASSERT_TRUE(w.ok()) << w.status();
    writer_ = std::move(*w);
    monitor_ = std::make_unique<Monitor>(config_, writer_.get(), [] { return 1.0; });
  }
  // The monitor and writer close before their files go: a trace deleted
  // under an open connection leaves its -wal and -shm behind.
  void TearDown() override {
    monitor_.reset();
    writer_.reset();
    for (const char* suffix : {"", "-wal", "-shm"}) std::remove((path_ + suffix).c_str());
  }
  absl::StatusOr<Trace> CloseAndRead() {
    writer_->Close();
    return ReadTrace(path_, /*with_series=*/true);
  }
  // The lines the monitor says live from here on.
  std::vector<std::string>& Told() {
    monitor_->set_notify([this](const std::string& line) { told_.push_back(line); });
    return told_;
  }
  // Ops whose one input was checked and finite.
  static FakeContext FiniteInputs() {
    FakeContext ctx;
    ctx.inputs = {Input(false, false)};
    return ctx;
  }

  std::string path_;
  Config config_;
  std::vector<std::string> told_;
  std::unique_ptr<TraceWriter> writer_;
  std::unique_ptr<Monitor> monitor_;
};

// CPU flash attention's outputs: the fp16 attention and an fp32 log-sum-exp
// of the scores. A headroom finding is about the outputs near the limit, of
// the format that overflows near 65504 where there is one; the fp32
// statistic far past 65504 beside a small fp16 output is a forecast (no live
// warning) and does not hide the fp16 output's own warnings.
TEST_F(TracedMonitorTest, AHeadroomFindingIsAboutTheFormatAtRiskNotAWiderOutputBesideIt) {
  Monitor& m = *monitor_;
  const std::vector<std::string>& told = Told();
  FakeContext ctx;
  TensorFacts attention = Fp16(0, 0x6030);  // 536
  TensorFacts logsumexp;
  logsumexp.format = Format::kF32;
  logsumexp.shape = "[2]";
  logsumexp.counts.elements = 2;
  logsumexp.counts.near_max = logsumexp.counts.fp16_overflow = 2;
  logsumexp.counts.max_abs_bits = 0x47de7e00;  // 113916
  const TensorFacts outputs[2] = {attention, logsumexp};
  OpEvent e;
  e.op = "aten::_scaled_dot_product_flash_attention_for_cpu";
  e.phase = Phase::kForward;
  e.outputs = absl::MakeConstSpan(outputs, 2);
  EXPECT_EQ(m.OnOp(e, ctx), Verdict::kWarned);
  EXPECT_TRUE(told.empty()) << told[0];
  // The fp16 output comes near the limit (20000), the fp32 one far past
  // (2e6): an fp16 finding of 20000, told live.
  TensorFacts both[2] = {Fp16(0, 0x74E2), logsumexp};
  both[0].counts.near_max = 1;
  both[1].counts.max_abs_bits = 0x49f42400;
  e.outputs = absl::MakeConstSpan(both, 2);
  EXPECT_EQ(m.OnOp(e, ctx), Verdict::kWarned);
  ASSERT_EQ(told.size(), 1u);
  EXPECT_NE(told[0].find("|x|=20000,"), std::string::npos) << told[0];
  // Neither grew: nothing new.
  EXPECT_EQ(m.OnOp(e, ctx), Verdict::kClean);
  // The fp16 output grows to 30000 (the fp32 one's 2e6 was no bar).
  both[0].counts.max_abs_bits = 0x7753;
  EXPECT_EQ(m.OnOp(e, ctx), Verdict::kWarned);
  EXPECT_EQ(told.size(), 2u);
  auto t = CloseAndRead();
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->findings.size(), 3u);
  EXPECT_EQ(t->findings[0].dtype, "float32");
  EXPECT_EQ(t->findings[0].max_abs, 113916.0);
  EXPECT_EQ(t->findings[1].dtype, "float16");
  EXPECT_EQ(t->findings[1].max_abs, 20000.0);
  EXPECT_EQ(t->findings[2].dtype, "float16");
  EXPECT_EQ(t->findings[2].max_abs, 30000.0);
}

// A GPU scaler's update in two parts: the step when the update runs, the
// loss-scale row once its values are back, for the step the first part gave.
TEST_F(TracedMonitorTest, ScalerUpdateInTwoPartsRecordsTheStepItRanIn) {
  Monitor& m = *monitor_;
  // Step 0: the optimizer ran, then the update.
  m.OnOptimizerStepBegin();
  m.OnOptimizerStepEnd();
  const StepTracker::ScalerStep ran = m.OnScalerUpdateStep();
  EXPECT_FALSE(ran.advanced);
  EXPECT_EQ(m.next_step(), 1);
  // Step 1: GradScaler skipped the optimizer; the update ends the iteration.
  const StepTracker::ScalerStep skipped = m.OnScalerUpdateStep();
  EXPECT_TRUE(skipped.advanced);
  EXPECT_EQ(m.step(), 2);
  // The values arrive later, in step 2, and still belong to steps 0 and 1.
  m.RecordLossScale(ran.step, 65536.0, false);
  m.RecordLossScale(skipped.step, 32768.0, true);
  auto t = CloseAndRead();
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->loss_scale.size(), 2u);
  EXPECT_EQ(t->loss_scale[0].step, 0);
  EXPECT_EQ(t->loss_scale[0].scale, 65536.0);
  EXPECT_FALSE(t->loss_scale[0].skipped);
  EXPECT_EQ(t->loss_scale[1].step, 1);
  EXPECT_EQ(t->loss_scale[1].scale, 32768.0);
  EXPECT_TRUE(t->loss_scale[1].skipped);
}

// A step whose inf/NaN were all freed by its optimizer step's end says so
// in the trace; one whose inf/NaN may still be held, or a finite one, not.
TEST_F(TracedMonitorTest, AStepWhoseInfNanWereFreedByItsEndIsRecordedAsDropped) {
  Monitor& m = *monitor_;
  FakeContext ctx;
  ctx.inputs = {Input(false, false)};
  const TensorFacts overflowed = Fp16(/*posinf=*/3);
  const TensorFacts fine = Fp16(0, 0x4000);
  OpEvent e;
  e.op = "aten::_softmax";
  e.phase = Phase::kForward;
  e.takes_grad_input = true;  // each begins its step
  int64_t step = 0;
  for (const bool held : {false, true, false}) {  // steps 0, 1, 2 (finite)
    e.outputs = absl::MakeConstSpan(step++ == 2 ? &fine : &overflowed, 1);
    m.OnOp(e, ctx);
    m.OnOptimizerStepBegin();
    m.OnOptimizerStepEnd(/*nonfinite_held=*/held);
  }
  auto t = CloseAndRead();
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->dropped_steps, std::vector<int64_t>{0});
}

// An fp32 output whose largest |x| is `max_abs`.
TensorFacts Fp32(float max_abs) {
  TensorFacts t;
  t.format = Format::kF32;
  t.shape = "[64, 16]";
  t.counts.elements = 1024;
  uint32_t bits = 0;
  std::memcpy(&bits, &max_abs, sizeof bits);
  t.counts.max_abs_bits = bits;
  return t;
}

// SGD at a learning rate too high: the weights its update writes grow
// from 0.82 to 4782.83 in three steps. Said live, before any inf/NaN, and
// written for the viewer.
TEST_F(TracedMonitorTest, AnUpdateGrowingTenfoldAStepIsWarnedLiveAndWrittenAsDiverging) {
  Monitor& m = *monitor_;
  const std::vector<std::string>& told = Told();
  FakeContext ctx = FiniteInputs();
  const TensorFacts fine = Fp16(0, 0x4000);
  for (const float weights : {0.82f, 1.41f, 19.47f, 4782.83f}) {
    IterationOp(m, ctx, Phase::kForward, fine);
    IterationOp(m, ctx, Phase::kBackward, fine);
    m.OnOptimizerStepBegin();
    const TensorFacts written = Fp32(weights);
    OpEvent update;
    update.op = "aten::add_";
    update.phase = Phase::kOptimizer;
    update.outputs = absl::MakeConstSpan(&written, 1);
    m.OnOp(update, ctx);
    m.OnOptimizerStepEnd();
  }
  IterationOp(m, ctx, Phase::kForward, fine);  // step 4 begins: step 3's row
  ASSERT_EQ(told.size(), 1u) << ::testing::PrintToString(told);
  EXPECT_EQ(told[0],
            "warning: the training is diverging: the updates grew from max|x| 0.82 at step 0 to "
            "4782.83 at step 3, tenfold and more within three steps (lower the learning rate, "
            "or clip gradients, before a value passes the format's range)");
  m.FlushStep();
  auto t = CloseAndRead();
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->diverging.size(), 1u);
  EXPECT_EQ(t->diverging[0].step, 3);
  EXPECT_EQ(t->diverging[0].detail,
            "the updates grew from max|x| 0.82 at step 0 to 4782.83 at step 3");
}

// A backward op's first overflow comes after its forward op's line is gone:
// the row is written without one, and filled from the same call of the next
// step (core/forward_line_fills.h), with a live line saying so.
TEST_F(TracedMonitorTest, AFirstBackwardOverflowGetsItsForwardLineFromTheNextStepsSameCall) {
  Monitor& m = *monitor_;
  const std::vector<std::string>& told = Told();
  FakeContext ctx = FiniteInputs();
  const TensorFacts fine = Fp16(0, 0x4000);
  int parameter = 0;
  const auto begin_forward = [&](int64_t next_node) {
    m.OnTopLevelOpStart(Phase::kForward, true, true, GradientsHeld, "aten::linear", &parameter,
                        next_node, /*thread=*/7);
    IterationOp(m, ctx, Phase::kForward, fine);
  };
  begin_forward(100);
  const TensorFacts overflowed = Fp16(4);
  OpEvent div_backward;
  div_backward.op = "aten::div";
  div_backward.phase = Phase::kBackward;
  div_backward.forward_op = "aten::div";
  div_backward.forward_seq = 103;
  div_backward.forward_thread = 7;
  div_backward.outputs = absl::MakeConstSpan(&overflowed, 1);
  EXPECT_EQ(m.OnOp(div_backward, ctx), Verdict::kOrigin);
  m.OnOptimizerStepBegin();
  m.OnOptimizerStepEnd();
  begin_forward(200);
  ASSERT_EQ(m.step(), 1);
  m.OnForwardLine("aten::mul", 203, 7, "train.py:11 in <module>");  // not a division
  m.OnForwardLine("aten::div", 203, 7, "train.py:12 in <module>");
  ASSERT_EQ(told.size(), 2u) << ::testing::PrintToString(told);
  EXPECT_EQ(told[1],
            "the forward op of step 0's first non-finite values (aten::div, backward of "
            "aten::div) was called at train.py:12 in <module>: the line of the same call in step 1");
  ASSERT_TRUE(m.first_origin());
  EXPECT_EQ(m.first_origin()->source, "train.py:12 in <module>");
  m.FlushStep();
  auto t = CloseAndRead();
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->findings.size(), 1u);
  EXPECT_EQ(t->findings[0].source, "train.py:12 in <module>");
  EXPECT_TRUE(SourceIsForwardLine(t->findings[0]));
}

// Two optimizers stepped one after the other (dense and sparse
// parameters), GradScaler unscaling the second's gradients between them:
// one step an iteration, its row written when the next forward pass
// begins, ended at the last optimizer record. Sample mode, which cannot
// see where a forward pass begins, ends a step at each record.
TEST_F(TracedMonitorTest, OptimizersSteppedTogetherAreOneStep) {
  Monitor& m = *monitor_;
  FakeContext ctx;
  ctx.inputs = {Input(false, false)};
  const TensorFacts fine = Fp16(0, 0x4000);
  for (int iteration = 0; iteration < 3; ++iteration) {
    IterationOp(m, ctx, Phase::kForward, fine);
    EXPECT_EQ(m.step(), iteration);
    IterationOp(m, ctx, Phase::kBackward, fine);
    for (int optimizer = 0; optimizer < 2; ++optimizer) {
      OpEvent unscale;
      unscale.op = "aten::_amp_foreach_non_finite_check_and_unscale_";
      unscale.outputs = absl::MakeConstSpan(&fine, 1);
      m.OnOp(unscale, ctx);
      m.OnOptimizerStepBegin();
      m.OnOptimizerStepEnd();
    }
  }
  m.FlushStep();
  auto t = CloseAndRead();
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->steps.size(), 3u);
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(t->steps[i].step, i);
    EXPECT_EQ(t->steps[i].ops, 4) << "forward, backward and both unscales";
  }

  config_.mode = Mode::kSample;
  Monitor sampled(config_, nullptr, [] { return 1.0; });
  for (int optimizer = 0; optimizer < 2; ++optimizer) {
    sampled.OnOptimizerStepBegin();
    sampled.OnOptimizerStepEnd();
  }
  EXPECT_EQ(sampled.step(), 2);
}

// A program without optimizer records (a hand-written update, a C++ one):
// the first layer's linear begins the next step at its start, so the
// addmm inside it, which ends first, is that step's too.
TEST_F(TracedMonitorTest, TheOpsInsideTheOpThatBeginsAStepAreInIt) {
  Monitor& m = *monitor_;
  FakeContext ctx;
  ctx.inputs = {Input(false, false)};
  const TensorFacts fine = Fp16(0, 0x4000);
  IterationOp(m, ctx, Phase::kForward, fine);
  IterationOp(m, ctx, Phase::kBackward, fine);
  EXPECT_TRUE(m.step_may_begin());
  OpEvent update;  // p -= lr * p.grad under no_grad
  update.op = "aten::sub_";
  update.grad_enabled = false;
  update.takes_grad_input = true;
  update.outputs = absl::MakeConstSpan(&fine, 1);
  m.OnOp(update, ctx);
  m.OnTopLevelOpStart(Phase::kForward, true, true, [] { return false; });
  EXPECT_EQ(m.step(), 1);
  EXPECT_FALSE(m.step_may_begin()) << "no lock at the next ops' starts";
  const TensorFacts overflowed = Fp16(/*posinf=*/3);
  OpEvent nested;
  nested.op = "aten::addmm";
  nested.top_op = "aten::linear";
  nested.outputs = absl::MakeConstSpan(&overflowed, 1);
  EXPECT_EQ(m.OnOp(nested, ctx), Verdict::kOrigin);
  OpEvent linear;  // its end: no second step
  linear.op = "aten::linear";
  linear.takes_grad_input = true;
  linear.outputs = absl::MakeConstSpan(&overflowed, 1);
  m.OnOp(linear, ctx);
  EXPECT_EQ(m.step(), 1);
  m.FlushStep();
  ASSERT_TRUE(m.first_origin().has_value());
  EXPECT_EQ(m.first_origin()->step, 1);
}

// An iteration whose program threw its non-finite gradients away and went
// on to the next batch without an optimizer step is a step of its own, a
// skip in the trace; one whose gradients are still held (the next
// micro-batch) is not.
TEST_F(TracedMonitorTest, AnUpdateTheProgramSkippedIsAStepOfItsOwn) {
  Monitor& m = *monitor_;
  FakeContext ctx;
  ctx.inputs = {Input(false, false)};
  const TensorFacts overflowed = Fp16(/*posinf=*/3);
  const TensorFacts fine = Fp16(0, 0x4000);
  const auto op = [&](Phase phase, const TensorFacts& out) { IterationOp(m, ctx, phase, out); };
  TrainedStep(m, ctx);  // step 0
  // Step 1's gradients overflow; two micro-batches are kept.
  op(Phase::kForward, fine);
  op(Phase::kBackward, overflowed);
  ctx.gradients_held = true;
  op(Phase::kForward, fine);  // the second micro-batch
  op(Phase::kBackward, fine);
  EXPECT_EQ(m.step(), 1);
  ctx.gradients_held = false;  // zero_grad(): the program skipped the update
  op(Phase::kForward, fine);
  EXPECT_EQ(m.step(), 2);
  EXPECT_EQ(m.program_skips(), 1);
  op(Phase::kBackward, fine);
  m.OnOptimizerStepBegin();
  m.OnOptimizerStepEnd();
  m.FlushStep();
  auto t = CloseAndRead();
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->program_skipped_steps, std::vector<int64_t>{1});
  ASSERT_EQ(t->steps.size(), 3u);
  EXPECT_EQ(t->steps[1].nonfinite_ops, 1);
  EXPECT_EQ(t->steps[2].nonfinite_ops, 0);
}

// A GAN through one GradScaler: the generator's gradients overflow in
// iteration 1, and GradScaler skips its step alone (no record; the step
// guard reports it). Its update ends there, in the step its discriminator's
// update began: the next batch begins step 2, and the freed gradients were
// not an update the program skipped.
TEST_F(TracedMonitorTest, AGansGeneratorGradScalerSkippedEndsItsUpdateInItsIteration) {
  FakeContext ctx;
  ctx.inputs = {Input(false, false)};
  // One update: its forward pass (which begins a step), its backward pass,
  // and optimizer `optimizer`'s record, or GradScaler's skip of it.
  const auto update = [&](uint64_t optimizer, bool overflow) {
    IterationOp(*monitor_, ctx, Phase::kForward, Fp16(0, 0x4000));
    IterationOp(*monitor_, ctx, Phase::kBackward,
                overflow ? Fp16(/*posinf=*/3) : Fp16(0, 0x4000));
    if (overflow) {
      monitor_->OnOptimizerIdentified(optimizer, false);
      monitor_->OnOptimizerSkipped();
      return;
    }
    monitor_->OnOptimizerStepBegin();
    monitor_->OnOptimizerIdentified(optimizer, false);
    monitor_->OnOptimizerStepEnd();
  };
  constexpr uint64_t kDiscriminator = 1, kGenerator = 2;
  for (int iteration = 0; iteration < 3; ++iteration) {
    update(kDiscriminator, false);
    EXPECT_EQ(monitor_->step(), iteration);
    update(kGenerator, iteration == 1);
    EXPECT_EQ(monitor_->step(), iteration) << "the generator's step joins the discriminator's";
  }
  monitor_->FlushStep();
  EXPECT_EQ(monitor_->program_skips(), 0);
  auto t = CloseAndRead();
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->program_skipped_steps.empty());
  EXPECT_TRUE(t->dropped_steps.empty());
  int64_t nonfinite_in_step_1 = 0, last = -1;
  for (const auto& row : t->steps) {
    if (row.step == 1) nonfinite_in_step_1 += row.nonfinite_ops;
    last = std::max(last, row.step);
  }
  EXPECT_EQ(last, 2);
  EXPECT_EQ(nonfinite_in_step_1, 1);
}

// F.normalize's clamp_min(1e-12) in a model.half() run, every step: one
// events row for the op and format, with its line, read only then.
TEST_F(TracedMonitorTest, AnEpsThatIsZeroInItsFormatIsToldOncePerOpAndFormat) {
  int lines_read = 0;
  const auto line = [&] {
    ++lines_read;
    return std::string("model.py:12 in forward");
  };
  monitor_->OnEpsRoundedToZero("aten::clamp_min", Format::kF16, 1e-12, line);
  monitor_->OnEpsRoundedToZero("aten::clamp_min", Format::kF16, 1e-12, line);
  monitor_->OnEpsRoundedToZero("aten::add", Format::kF16, 1e-9, line);
  EXPECT_EQ(lines_read, 2);
  auto trace = CloseAndRead();
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->eps_rounded.size(), 2u);
  EXPECT_EQ(trace->eps_rounded[0].step, 0);
  EXPECT_EQ(trace->eps_rounded[0].detail,
            "aten::clamp_min's 1e-12 is 0 in float16 (its smallest value is 5.96046e-08), at "
            "model.py:12 in forward");
}

// An iteration the program gave up on a non-finite loss: the next batch's
// first op on the step's first parameter begins a step at its start, the
// trace has an events row for the step given up once the next iteration is
// over, and its inf counts in its own step. Two passes into one loss: the
// backward pass reaches the first, and the advance is undone.
TEST_F(TracedMonitorTest, AnIterationGivenUpIsAStepOfItsOwn) {
  Monitor& m = *monitor_;
  FakeContext ctx;
  ctx.inputs = {Input(false, false)};
  const TensorFacts overflowed = Fp16(/*posinf=*/3);
  const TensorFacts fine = Fp16(0, 0x4000);
  int w = 0;
  const auto pass_starts = [&](int64_t next_node) {
    m.OnTopLevelOpStart(Phase::kForward, true, true, [] { return false; }, "aten::linear", &w,
                        next_node, /*thread=*/1);
  };
  TrainedStep(m, ctx);  // step 0
  pass_starts(100);
  EXPECT_EQ(m.step(), 1);
  EXPECT_FALSE(m.step_may_begin()) << "finite so far: no lock at the next ops' starts";
  IterationOp(m, ctx, Phase::kForward, overflowed);
  EXPECT_TRUE(m.step_may_begin());
  EXPECT_TRUE(m.may_give_up_iteration());
  EXPECT_TRUE(m.WouldGiveUpIteration("aten::linear", &w));
  pass_starts(110);  // the next batch: step 1 was given up
  EXPECT_EQ(m.step(), 2);
  EXPECT_TRUE(m.watches_backward_nodes());
  IterationOp(m, ctx, Phase::kForward, fine);
  IterationOp(m, ctx, Phase::kBackward, fine);
  m.OnBackwardNode(110, 1);
  EXPECT_EQ(m.step(), 2);
  m.OnOptimizerStepBegin();
  m.OnOptimizerStepEnd();
  pass_starts(200);
  EXPECT_EQ(m.step(), 3);
  EXPECT_EQ(m.iterations_given_up(), 1);
  // Step 3: two views, the first overflows; the backward pass reaches it.
  IterationOp(m, ctx, Phase::kForward, overflowed);
  pass_starts(210);
  EXPECT_EQ(m.step(), 4);
  IterationOp(m, ctx, Phase::kForward, fine);
  IterationOp(m, ctx, Phase::kBackward, fine);
  m.OnBackwardNode(215, 1);
  m.OnBackwardNode(205, 1);
  EXPECT_EQ(m.step(), 3);
  EXPECT_FALSE(m.watches_backward_nodes());
  m.OnOptimizerStepBegin();
  m.OnOptimizerStepEnd();
  m.FlushStep();
  EXPECT_EQ(m.iterations_given_up(), 1);
  auto t = CloseAndRead();
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->given_up_steps, std::vector<int64_t>{1});
  std::map<int64_t, int64_t> nonfinite;  // step: its rows' non-finite ops
  for (const StepRow& row : t->steps) nonfinite[row.step] += row.nonfinite_ops;
  EXPECT_EQ(nonfinite, (std::map<int64_t, int64_t>{{0, 0}, {1, 1}, {2, 0}, {3, 1}}));
}

// The same on a GPU: the backward pass's results arrive late (the plugin
// delivers them before the next iteration's first op when the program has
// read a GPU value). The op that begins the next iteration is judged by
// them, as on the CPU: a skip when nothing holds the gradients, the next
// micro-batch when they are still held. A result of a step already over
// names no bad gradients of the step it arrives in.
TEST_F(TracedMonitorTest, GpuResultsOfABackwardPassJudgeTheIterationAfterIt) {
  Monitor& m = *monitor_;
  FakeContext ctx;
  const TensorFacts overflowed = Fp16(/*posinf=*/3);
  const TensorFacts fine = Fp16(0, 0x4000);
  bool held = false;
  const auto held_now = [&] { return held; };
  // Enqueued now; its result, delivered by `deliver` (later).
  const auto enqueue = [&](Phase phase) {
    return m.NoteLateOp(phase, true, phase == Phase::kForward, true, held_now);
  };
  const auto deliver = [&](const Monitor::Position& at, const TensorFacts& out) {
    OpEvent e;
    e.op = at.phase == Phase::kBackward ? "aten::mm" : "aten::addmm";
    e.forward_op = at.phase == Phase::kBackward ? "aten::addmm" : "";
    e.phase = at.phase;
    e.late_step = at.step;
    e.late_renumberings = at.renumberings;
    e.outputs = absl::MakeConstSpan(&out, 1);
    m.OnOp(e, ctx);
  };
  // Step 0 trains.
  deliver(enqueue(Phase::kForward), fine);
  deliver(enqueue(Phase::kBackward), fine);
  m.OnOptimizerStepBegin();
  m.OnOptimizerStepEnd();
  // Step 1's gradients overflow; they are still held at the next forward
  // pass: a micro-batch.
  deliver(enqueue(Phase::kForward), fine);
  deliver(enqueue(Phase::kBackward), overflowed);
  held = true;
  EXPECT_TRUE(m.JudgesIterationWithoutUpdate(Phase::kForward, true, true));
  deliver(enqueue(Phase::kForward), fine);
  EXPECT_EQ(m.step(), 1);
  EXPECT_EQ(m.program_skips(), 0);
  // Freed by the next one: the program skipped the update.
  deliver(enqueue(Phase::kBackward), fine);
  held = false;
  deliver(enqueue(Phase::kForward), fine);
  EXPECT_EQ(m.step(), 2);
  EXPECT_EQ(m.program_skips(), 1);
  // Step 2 updates; its backward result comes in only after that, in step
  // 3, whose iteration is then judged by nothing: no skip.
  const Monitor::Position late = enqueue(Phase::kBackward);
  m.OnOptimizerStepBegin();
  m.OnOptimizerStepEnd();
  EXPECT_FALSE(m.JudgesIterationWithoutUpdate(Phase::kForward, true, true));
  deliver(enqueue(Phase::kForward), fine);
  deliver(late, overflowed);
  deliver(enqueue(Phase::kBackward), fine);
  deliver(enqueue(Phase::kForward), fine);  // step 3's second micro-batch
  EXPECT_EQ(m.step(), 3);
  EXPECT_EQ(m.program_skips(), 1);
  m.OnOptimizerStepBegin();
  m.OnOptimizerStepEnd();
  auto t = CloseAndRead();
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->program_skipped_steps, std::vector<int64_t>{1});
}

// On a GPU, a step's results arrive after its optimizer step has ended:
// whether the inf/NaN it made were dropped (every tensor that held them
// freed) is asked once they are all in, after the registry has been told
// what the last one found (LateOps calls JudgeWaitingDrops then).
TEST_F(TracedMonitorTest, AStepsVerdictOnItsInfNanWaitsForItsGpuResults) {
  Monitor& m = *monitor_;
  FakeContext ctx;
  const TensorFacts nan = [] {
    TensorFacts t = Fp16(0, 0x3C00);
    t.counts.nan = 2;  // a softmax over a fully masked row
    return t;
  }();
  const TensorFacts fine = Fp16(0, 0x4000);
  bool held = false;
  int asked = 0;
  m.set_nonfinite_held([&] {
    ++asked;
    return held;
  });
  const auto enqueue = [&](Phase phase) {
    return m.NoteLateOp(phase, true, phase == Phase::kForward, true, GradientsHeld);
  };
  const auto deliver = [&](const Monitor::Position& at, const TensorFacts& out) {
    OpEvent e;
    e.op = at.phase == Phase::kBackward ? "aten::mm" : "aten::_softmax";
    e.phase = at.phase;
    e.late_step = at.step;
    e.late_renumberings = at.renumberings;
    e.late_generation = at.generation;
    e.outputs = absl::MakeConstSpan(&out, 1);
    m.OnOp(e, ctx);
    if (m.drops_ready()) m.JudgeWaitingDrops();
  };
  // A step whose softmax made NaN, with results `lag` ops behind.
  std::vector<std::pair<Monitor::Position, const TensorFacts*>> in_flight;
  const auto step = [&](bool makes_nan, size_t lag) {
    in_flight.push_back({enqueue(Phase::kForward), makes_nan ? &nan : &fine});
    in_flight.push_back({enqueue(Phase::kBackward), &fine});
    while (in_flight.size() > lag) {
      deliver(in_flight.front().first, *in_flight.front().second);
      in_flight.erase(in_flight.begin());
    }
    m.OnOptimizerStepBegin();
    // What the plugin passes: no inf/NaN seen yet in this step, or held.
    m.OnOptimizerStepEnd(/*nonfinite_held=*/true);
  };
  step(/*makes_nan=*/true, /*lag=*/2);  // step 0: its NaN comes in later
  EXPECT_FALSE(m.drops_ready());
  EXPECT_EQ(asked, 0);
  step(true, 2);  // step 0's results in, nothing held: dropped
  EXPECT_EQ(asked, 1);
  held = true;
  step(false, 2);  // step 1's in, its NaN still held: not dropped
  EXPECT_EQ(asked, 2);
  held = false;
  step(true, 1);  // step 2 made none: not asked; step 3's NaN came in before its end
  EXPECT_EQ(asked, 2);
  step(false, 0);  // step 3 judged at step 4's first result; step 4 at its end
  EXPECT_EQ(asked, 3);
  m.FlushStep();
  auto t = CloseAndRead();
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->dropped_steps, (std::vector<int64_t>{0, 3}));
}

// In sample mode no verdict waits: unsampled ops may have carried the
// inf/NaN anywhere.
TEST(SampleModeMonitor, LeavesNoVerdictWaitingForGpuResults) {
  Config config;
  config.mode = Mode::kSample;
  Monitor m(config, nullptr);
  int asked = 0;
  m.set_nonfinite_held([&] {
    ++asked;
    return false;
  });
  const Monitor::Position at = m.NoteLateOp(Phase::kForward, true, true, true, GradientsHeld);
  m.OnOptimizerStepBegin();
  m.OnOptimizerStepEnd();
  FakeContext ctx;
  TensorFacts nan = Fp16(0);
  nan.counts.nan = 1;
  OpEvent e;
  e.op = "aten::_softmax";
  e.late_step = at.step;
  e.late_generation = at.generation;
  e.outputs = absl::MakeConstSpan(&nan, 1);
  m.OnOp(e, ctx);
  EXPECT_FALSE(m.drops_ready());
  EXPECT_EQ(asked, 0);
}

// At exit, a step whose backward pass had no update after it is
// unfinished: no verdict on its gradients. A C++ program (no optimizer
// records) whose last update ran (ops with grad mode off) finished its
// step, though no op began the next one.
class CppProgramExitTest : public TracedMonitorTest {
 protected:
  // The unfinished steps of two iterations, the last one `updated` or not.
  std::vector<int64_t> UnfinishedSteps(bool updated) {
    Monitor& m = *monitor_;
    FakeContext ctx;
    const TensorFacts fine = Fp16(0, 0x4000);
    for (int iteration = 0; iteration < 2; ++iteration) {
      IterationOp(m, ctx, Phase::kForward, fine);
      IterationOp(m, ctx, Phase::kBackward, fine);
      if (iteration == 0 || updated) {
        OpEvent update;  // SGD's in-place update, under NoGradGuard
        update.op = "aten::add_";
        update.grad_enabled = false;
        update.outputs = absl::MakeConstSpan(&fine, 1);
        m.OnOp(update, ctx);
      }
    }
    m.FlushStep();
    auto t = CloseAndRead();
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? t->unfinished_steps : std::vector<int64_t>{-1};
  }
};

TEST_F(CppProgramExitTest, ItsLastUpdateFinishesItsStep) {
  EXPECT_EQ(UnfinishedSteps(/*updated=*/true), std::vector<int64_t>{});
}

TEST_F(CppProgramExitTest, StoppedAfterItsBackwardPassItsStepIsUnfinished) {
  EXPECT_EQ(UnfinishedSteps(/*updated=*/false), std::vector<int64_t>{1});
}


// The host runs ahead of the GPU: a step ends at its last op's launch, and
// results of its ops may come in while the next step runs. They count in
// their own step, in op_stats and in the steps table, not in the step that
// was running when they arrived.
TEST_F(TracedMonitorTest, GpuResultsArrivingAfterTheirStepEndedCountInThatStep) {
  Monitor& m = *monitor_;
  FakeContext ctx;
  // Step 0: a GPU matmul is enqueued; the optimizer ends the step before
  // its result is back.
  const Monitor::Position enqueued = m.NoteLateOp(Phase::kForward, true, false, true, GradientsHeld);
  ASSERT_EQ(enqueued.step, 0);
  m.OnOptimizerStepBegin();
  m.OnOptimizerStepEnd();
  ASSERT_EQ(m.next_step(), 1);
  // Step 1 runs a GPU op of its own, then step 0's result arrives: inf
  // from finite inputs, an origin of step 0.
  ASSERT_EQ(m.NoteLateOp(Phase::kForward, true, true, true, GradientsHeld).step, 1);
  const TensorFacts overflowed = Fp16(/*posinf=*/3);
  OpEvent late;
  late.op = "aten::mm";
  late.phase = Phase::kForward;
  late.late_step = 0;
  late.outputs = absl::MakeConstSpan(&overflowed, 1);
  EXPECT_EQ(m.OnOp(late, ctx), Verdict::kOrigin);
  // Step 1's own result arrives in its step.
  const TensorFacts fine = Fp16(0, 0x4000);
  OpEvent current = late;
  current.op = "aten::add";
  current.late_step = 1;
  current.outputs = absl::MakeConstSpan(&fine, 1);
  EXPECT_EQ(m.OnOp(current, ctx), Verdict::kClean);
  m.OnOptimizerStepBegin();
  m.OnOptimizerStepEnd();
  m.FlushStep();
  auto t = CloseAndRead();
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->op_steps.size(), 2u);
  EXPECT_EQ(t->op_steps[0].step, 0);
  EXPECT_EQ(t->op_steps[0].op, "aten::mm");
  EXPECT_EQ(t->op_steps[0].nonfinite, 3);
  EXPECT_EQ(t->op_steps[1].step, 1);
  EXPECT_EQ(t->op_steps[1].op, "aten::add");
  EXPECT_EQ(t->op_steps[1].nonfinite, 0);
  ASSERT_EQ(t->steps.size(), 2u);
  EXPECT_EQ(t->steps[0].step, 0);
  EXPECT_EQ(t->steps[0].nonfinite_ops, 1);
  EXPECT_EQ(t->steps[0].origins, 1);
  EXPECT_EQ(t->steps[0].ops, 1);
  // The step keeps the times of its own row (the clock's 1.0): the late
  // row has none, rather than a 0 or a NaN that MIN would pick.
  EXPECT_EQ(t->steps[0].started, 1.0);
  EXPECT_EQ(t->steps[0].ended, 1.0);
  EXPECT_EQ(t->steps[1].nonfinite_ops, 0);
  EXPECT_EQ(t->steps[1].origins, 0);
  EXPECT_EQ(t->steps[1].ops, 1);
  ASSERT_EQ(t->findings.size(), 1u);
  EXPECT_EQ(t->findings[0].step, 0);
}

// Gradient accumulation on a GPU, first iteration: micro-batches 2 and 3
// looked like steps 1 and 2 when their ops were enqueued. Micro-batch 2's
// result arrives while 3 runs; 3's after the first optimizer record showed
// both were step 0. Both count there. A result enqueued after that, in
// step 1, is not renumbered.
TEST_F(TracedMonitorTest, GpuResultsOfUndoneStepsCountInTheStepTheyJoined) {
  Monitor& m = *monitor_;
  FakeContext ctx;
  const TensorFacts fine = Fp16(0, 0x4000);
  const TensorFacts overflowed = Fp16(/*posinf=*/3);
  // The result of `op`, enqueued at `at`.
  auto result = [](const char* op, const Monitor::Position& at, const TensorFacts& out) {
    OpEvent e;
    e.op = op;
    e.phase = Phase::kForward;
    e.late_step = at.step;
    e.late_renumberings = at.renumberings;
    e.outputs = absl::MakeConstSpan(&out, 1);
    return e;
  };
  Monitor::Position second{}, third{};
  for (int micro_batch = 0; micro_batch < 3; ++micro_batch) {
    third = m.NoteLateOp(Phase::kForward, true, true, true, GradientsHeld);
    if (micro_batch == 1) second = third;
    if (micro_batch == 2) {
      EXPECT_EQ(m.OnOp(result("aten::add", second, fine), ctx), Verdict::kClean);
    }
    m.NoteLateOp(Phase::kBackward, true, false, true, GradientsHeld);
  }
  ASSERT_EQ(second.step, 1) << "a tentative number";
  ASSERT_EQ(third.step, 2) << "a tentative number";
  m.OnOptimizerStepBegin();
  m.OnOptimizerStepEnd();
  ASSERT_EQ(m.next_step(), 1);
  const Monitor::Position next = m.NoteLateOp(Phase::kForward, true, true, true, GradientsHeld);
  ASSERT_EQ(next.step, 1);
  EXPECT_EQ(m.OnOp(result("aten::mm", third, overflowed), ctx), Verdict::kOrigin);
  EXPECT_EQ(m.OnOp(result("aten::bmm", next, overflowed), ctx), Verdict::kOrigin);
  m.OnOptimizerStepBegin();
  m.OnOptimizerStepEnd();
  m.FlushStep();
  auto t = CloseAndRead();
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->findings.size(), 2u);
  EXPECT_EQ(t->findings[0].op, "aten::mm");
  EXPECT_EQ(t->findings[0].step, 0);
  EXPECT_EQ(t->findings[1].op, "aten::bmm");
  EXPECT_EQ(t->findings[1].step, 1);
  ASSERT_EQ(t->op_steps.size(), 3u);
  for (const auto& row : t->op_steps) {
    EXPECT_EQ(row.step, row.op == "aten::bmm" ? 1 : 0) << row.op;
  }
  ASSERT_EQ(t->steps.size(), 2u);
  EXPECT_EQ(t->steps[0].step, 0);
  EXPECT_EQ(t->steps[1].step, 1);
}

// A nested op whose non-finite outputs only its enclosing op can explain
// (an input it overwrote unchecked) is recorded by how they turned out
// when that op ends: a mask it carried, garbage it overwrote, values it
// left out of its finite outputs, or propagation that stands. Without a place to defer to (the GPU path), it
// is propagation at once.
TEST_F(TracedMonitorTest, DeferredOpsAreRecordedByWhatTheEnclosingOpMadeOfThem) {
  Monitor& m = *monitor_;
  FakeContext ctx;
  InputFacts overwritten;
  overwritten.unknown_before = true;
  ctx.inputs = {overwritten, Input(false, false)};
  const TensorFacts minus_inf = [] {
    TensorFacts t = Fp16(0);
    t.counts.neginf = 2;
    t.counts.max_abs_bits = 0x7C00;
    return t;
  }();
  auto nested = [&](const char* op, const TensorFacts& out, std::optional<Deferral>* d) {
    OpEvent e;
    e.op = op;
    e.top_op = "aten::baddbmm";
    e.outputs = absl::MakeConstSpan(&out, 1);
    return m.OnOp(e, ctx, d);
  };
  // Step 0: an addmm_ into a copy of baddbmm's -inf mask; baddbmm masked.
  std::optional<Deferral> mask;
  EXPECT_EQ(nested("aten::addmm_", minus_inf, &mask), Verdict::kDeferred);
  ASSERT_TRUE(mask.has_value());
  EXPECT_EQ(mask->op, "aten::addmm_");
  EXPECT_EQ(mask->row.kind, "propagated");
  m.SettleDeferral(*mask, Settled::kMask);
  // A cast of a buffer's garbage, overwritten before its op ended.
  std::optional<Deferral> garbage;
  EXPECT_EQ(nested("aten::_to_copy", Fp16(/*posinf=*/1), &garbage), Verdict::kDeferred);
  m.SettleDeferral(*garbage, Settled::kOverwritten);
  // torch.logdet's NaN for a negative determinant, which its torch.where
  // left out: logdet returned finite values.
  TensorFacts nan = Fp16(0);
  nan.counts.nan = 1;
  std::optional<Deferral> left_out;
  EXPECT_EQ(nested("aten::scalar_tensor", nan, &left_out), Verdict::kDeferred);
  m.SettleDeferral(*left_out, Settled::kLeftOut);
  EXPECT_EQ(m.findings(), 0);
  m.OnOptimizerStepBegin();
  m.OnOptimizerStepEnd();
  // Step 1 begins at its first top-level forward op's start (the baddbmm
  // the nested ops below run in).
  m.OnTopLevelOpStart(Phase::kForward, true, true, [] { return false; });
  // Step 1: the non-finite values outlive the enclosing op, no mask.
  std::optional<Deferral> stands;
  EXPECT_EQ(nested("aten::addmm_", Fp16(/*posinf=*/3), &stands), Verdict::kDeferred);
  m.SettleDeferral(*stands, Settled::kStands);
  // On the GPU path, with nowhere to defer to.
  EXPECT_EQ(nested("aten::addmm_", Fp16(/*posinf=*/3), nullptr), Verdict::kPropagated);
  m.OnOptimizerStepBegin();
  m.OnOptimizerStepEnd();
  m.FlushStep();
  EXPECT_EQ(m.mask_ops(), std::vector<std::string>{"aten::addmm_"});
  EXPECT_FALSE(m.first_origin().has_value());
  auto t = CloseAndRead();
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->steps.size(), 2u);
  EXPECT_EQ(t->steps[0].nonfinite_ops, 0)
      << "a mask, garbage and what the enclosing op left out: no non-finite step";
  EXPECT_EQ(t->steps[0].ops, 2) << "garbage is no op's values";
  EXPECT_EQ(t->steps[1].nonfinite_ops, 2);
  ASSERT_EQ(t->findings.size(), 2u);
  EXPECT_EQ(t->findings[0].kind, "propagated");
  EXPECT_EQ(t->findings[0].step, 1);
  EXPECT_EQ(t->findings[0].posinf, 3);
  EXPECT_EQ(t->findings[1].step, 1);
  ASSERT_EQ(t->op_steps.size(), 3u);
  EXPECT_EQ(t->op_steps[0].op, "aten::addmm_");
  EXPECT_EQ(t->op_steps[0].nonfinite, 2) << "a mask's -inf counted as masks are";
  EXPECT_TRUE(t->op_steps[0].mask);
  EXPECT_EQ(t->op_steps[1].op, "aten::scalar_tensor");
  EXPECT_TRUE(t->op_steps[1].mask) << "counted apart, as torch's own masked NaN are";
  EXPECT_EQ(t->op_steps[2].op, "aten::addmm_");
  EXPECT_FALSE(t->op_steps[2].mask);
}

// Values no op made, given to an op inside another, are the enclosing
// op's to explain only if it is judged at its end: inside aten::to (a view
// of its _to_copy's result) or a record named by a string (an
// autograd.Function, a torch.compile region) they are the nested op's own
// input finding. Left to them, data cast with .float() was "propagated"
// from nobody and the run was called healthy.
TEST_F(TracedMonitorTest, ValuesNoOpMadeInsideAnOpNeverJudgedAreAnInputFinding) {
  Monitor& m = *monitor_;
  FakeContext ctx;
  ctx.inputs = {Input(/*nonfinite=*/true, /*produced_by_op=*/false)};
  const TensorFacts out = Fp16(/*posinf=*/1);
  OpEvent e;
  e.op = "aten::_to_copy";
  e.top_op = "aten::to";
  e.outputs = absl::MakeConstSpan(&out, 1);
  std::optional<Deferral> deferral;
  EXPECT_EQ(m.OnOp(e, ctx, &deferral), Verdict::kDeferred) << "aten::to judged: its call";
  e.enclosing_op_judges = false;
  deferral.reset();
  EXPECT_EQ(m.OnOp(e, ctx, &deferral), Verdict::kInput);
  EXPECT_FALSE(deferral.has_value());
  ASSERT_TRUE(m.first_origin().has_value());
  EXPECT_EQ(m.first_origin()->kind, "input");
  EXPECT_EQ(m.first_origin()->op, "aten::_to_copy");
  EXPECT_EQ(m.first_origin()->top_op, "aten::to");
  // On the GPU path (no deferral) as well.
  EXPECT_EQ(m.OnOp(e, ctx, nullptr), Verdict::kInput);
}

// After a torch.compile region ran in the iteration, values no checked op
// made came out of it (its fused kernels write unseen): a "compiled"
// finding that names the region, and the first one; data otherwise.
TEST_F(TracedMonitorTest, ValuesNoOpMadeAfterACompiledRegionAreItsFinding) {
  Monitor& m = *monitor_;
  FakeContext ctx;
  ctx.inputs = {Input(/*nonfinite=*/true, /*produced_by_op=*/false)};
  const TensorFacts out = Fp16(/*posinf=*/1);
  OpEvent e;
  e.op = "aten::mean";
  e.outputs = absl::MakeConstSpan(&out, 1);
  e.compiled_region = "Torch-Compiled Region: 0/0, called at train.py:11 in <module>";
  EXPECT_EQ(m.OnOp(e, ctx), Verdict::kInput);
  ASSERT_TRUE(m.first_origin().has_value());
  EXPECT_EQ(m.first_origin()->kind, "compiled");
  EXPECT_EQ(m.first_origin()->compiled_region,
            "Torch-Compiled Region: 0/0, called at train.py:11 in <module>");
  // Made by a checked op, they are propagation, region or not.
  FakeContext made;
  made.inputs = {Input(/*nonfinite=*/true, /*produced_by_op=*/true)};
  EXPECT_EQ(m.OnOp(e, made), Verdict::kPropagated);
  // No region: the data's.
  e.compiled_region = {};
  EXPECT_EQ(m.OnOp(e, ctx), Verdict::kInput);
  m.FlushStep();
  auto t = CloseAndRead();
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->findings.size(), 3u);
  EXPECT_EQ(t->findings[0].kind, "compiled");
  EXPECT_EQ(t->findings[0].compiled_region,
            "Torch-Compiled Region: 0/0, called at train.py:11 in <module>");
  EXPECT_EQ(t->findings[2].kind, "input");
  EXPECT_EQ(t->findings[2].compiled_region, "");
}

// An origin read its inputs on the CPU: a region before it changes nothing.
// A GPU origin's inputs were not read: its row keeps the region, for the
// view to say that the region may have made them.
TEST_F(TracedMonitorTest, AGpuOriginAfterACompiledRegionKeepsTheRegion) {
  Monitor& m = *monitor_;
  FakeContext ctx;
  ctx.inputs = {Input(/*nonfinite=*/false, /*produced_by_op=*/false)};
  const TensorFacts out = Fp16(/*posinf=*/1);
  OpEvent e;
  e.op = "aten::mean";
  e.outputs = absl::MakeConstSpan(&out, 1);
  e.compiled_region = "Torch-Compiled Region: 0/0";
  EXPECT_EQ(m.OnOp(e, ctx), Verdict::kOrigin);
  e.late_step = 0;
  EXPECT_EQ(m.OnOp(e, ctx), Verdict::kOrigin);
  m.FlushStep();
  auto t = CloseAndRead();
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->findings.size(), 2u);
  EXPECT_EQ(t->findings[0].compiled_region, "") << "on the CPU its inputs were read";
  EXPECT_EQ(t->findings[1].compiled_region, "Torch-Compiled Region: 0/0");
}

// An argument of lengths is written by its values (CTC's input_lengths and
// target_lengths: what its +inf is about), beside the tensors' facts.
TEST_F(TracedMonitorTest, AnOriginsLengthsArgumentsAreWrittenByTheirValues) {
  Monitor& m = *monitor_;
  FakeContext ctx;
  InputFacts log_probs = Input(/*nonfinite=*/false, /*produced_by_op=*/false);
  log_probs.shape = "[20, 4, 6]";
  InputFacts lengths;
  lengths.arg_index = 2;
  lengths.dtype = "values";
  lengths.values = "input_lengths=[20, 17, 15, 12]";
  ctx.inputs = {log_probs, lengths};
  TensorFacts loss = Fp16(/*posinf=*/1);
  loss.format = Format::kF32;
  OpEvent e;
  e.op = "aten::_ctc_loss";
  e.outputs = absl::MakeConstSpan(&loss, 1);
  EXPECT_EQ(m.OnOp(e, ctx), Verdict::kOrigin);
  m.FlushStep();
  auto t = CloseAndRead();
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->findings.size(), 1u);
  EXPECT_EQ(t->findings[0].inputs,
            "#0 float16[20, 4, 6] max|x|=0; #2 input_lengths=[20, 17, 15, 12]");
}

// One op both masks and computes: autocast's casts (_to_copy) next to the
// cast of an additive mask, and of the inf that `x != inf` compares with
// (isfinite, isinf, logsumexp). Its mask calls are a row of their own, so
// a real overflow in its other calls still shows as the op's; the cast of
// a number the program wrote is neither counted nor a mask.
TEST_F(TracedMonitorTest, AnOpsMaskCallsAreKeptApartFromTheCallsThatCompute) {
  Monitor& m = *monitor_;
  FakeContext mask;
  mask.inputs = {MaskInput(4)};
  TensorFacts masked = Fp16(0);
  masked.counts.neginf = 4;
  masked.counts.max_abs_bits = 0x7C00;
  EXPECT_EQ(m.OnOp(OpNamed("aten::_to_copy", masked), mask), Verdict::kMasked);
  FakeContext literal;
  InputFacts inf = Input(false, false);
  inf.dtype = "float64";
  inf.shape = "[]";
  inf.counts.elements = 1;
  inf.counts.posinf = 1;
  inf.deliberate = inf.python_number = true;
  literal.inputs = {inf};
  TensorFacts one = Fp16(1);
  one.shape = "[]";
  one.counts.elements = 1;
  EXPECT_EQ(m.OnOp(OpNamed("aten::_to_copy", one), literal), Verdict::kMasked);
  // The same literal filling more than one value is a mask again.
  EXPECT_EQ(m.OnOp(OpNamed("aten::_to_copy", Fp16(8)), literal), Verdict::kMasked);
  // An fp32 activation past 65504 cast to fp16: the origin.
  FakeContext cast;
  cast.inputs = {Input(false, false)};
  EXPECT_EQ(m.OnOp(OpNamed("aten::_to_copy", Fp16(3)), cast), Verdict::kOrigin);
  m.OnOptimizerStepBegin();
  m.OnOptimizerStepEnd();
  m.FlushStep();
  EXPECT_EQ(m.mask_ops(), std::vector<std::string>{"aten::_to_copy"});
  auto t = CloseAndRead();
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->ops.size(), 2u);
  const OpTotals& computed = t->ops[0].mask ? t->ops[1] : t->ops[0];
  const OpTotals& masks = t->ops[0].mask ? t->ops[0] : t->ops[1];
  EXPECT_FALSE(computed.mask);
  EXPECT_EQ(computed.calls, 1) << "the origin alone";
  EXPECT_EQ(computed.posinf, 3);
  EXPECT_TRUE(std::isinf(computed.max_abs));
  EXPECT_TRUE(masks.mask);
  EXPECT_EQ(masks.calls, 2) << "the mask cast, the literal filling 8 values; not the literal";
  EXPECT_EQ(masks.neginf, 4);
  EXPECT_EQ(masks.posinf, 8);
  const RunSummary s = Summarise({*t});
  ASSERT_EQ(s.ops.size(), 2u);
  EXPECT_FALSE(s.ops[0].mask) << "the op that overflowed comes first, its figures its own";
  EXPECT_TRUE(std::isinf(s.ops[0].max_abs));
  EXPECT_TRUE(s.ops[1].mask);
  ASSERT_EQ(s.phases.size(), 1u);
  EXPECT_EQ(s.phases[0].nonfinite_values, 3) << "the overflow's, not the masks'";
}

// `h * 30000.0`, `loss * 2**24`: torch wraps the Python number into a
// one-value tensor and casts it to the other operand's dtype. The literal is
// the program's own, large on purpose: no warning, no finding, not the
// op's max |x| (what it makes is judged at the mul). The same one-value cast
// of a value the program computed still warns.
TEST_F(TracedMonitorTest, ALiteralCastNearTheLimitIsNoWarningAndNotTheOpsMagnitude) {
  Monitor& m = *monitor_;
  std::vector<std::string> told;
  m.set_notify([&](const std::string& line) { told.push_back(line); });
  FakeContext literal;
  InputFacts number = Input(false, false);
  number.dtype = "float64";
  number.shape = "[]";
  number.counts.elements = 1;
  number.python_number = true;
  literal.inputs = {number};
  TensorFacts thirty_thousand = Fp16(0, 0x7753);  // 30000
  thirty_thousand.shape = "[]";
  thirty_thousand.counts.elements = 1;
  thirty_thousand.counts.near_max = 1;
  EXPECT_EQ(m.OnOp(OpNamed("aten::_to_copy", thirty_thousand), literal), Verdict::kClean);
  TensorFacts scale;  // 2**24 in fp32
  scale.format = Format::kF32;
  scale.shape = "[]";
  scale.counts.elements = 1;
  scale.counts.near_max = scale.counts.fp16_overflow = 1;
  scale.counts.max_abs_bits = 0x4B800000;
  EXPECT_EQ(m.OnOp(OpNamed("aten::_to_copy", scale), literal), Verdict::kClean);
  EXPECT_EQ(m.findings(), 0);
  EXPECT_TRUE(told.empty()) << told.front();
  // Not a copy: a one-value op given the literal makes a value of its own.
  EXPECT_EQ(m.OnOp(OpNamed("aten::mul", thirty_thousand), literal), Verdict::kWarned);
  // A computed value cast the same way (a loss, item() of a sum).
  FakeContext computed;
  InputFacts loss = number;
  loss.python_number = false;
  computed.inputs = {loss};
  EXPECT_EQ(m.OnOp(OpNamed("aten::_to_copy", thirty_thousand), computed), Verdict::kWarned);
  EXPECT_EQ(m.findings(), 2);
  EXPECT_EQ(told.size(), 2u);
  m.FlushStep();
  auto t = CloseAndRead();
  ASSERT_TRUE(t.ok()) << t.status();
  for (const OpTotals& op : t->ops) {
    if (op.op != "aten::_to_copy") continue;
    EXPECT_EQ(op.calls, 3) << "the literals' casts are calls";
    EXPECT_EQ(op.max_abs, 30000.0) << "the computed value's, not 2**24";
    EXPECT_EQ(op.near_max, 1);
  }
}

// `(1.0 - keep) * -1e9` over fp16 scores: the number is past fp16's range,
// and torch's cast of it (and the mul) make -inf. A mask meant as minus
// infinity, told once with its line; +inf made of such a number, or -inf
// of one fp16 holds, is what the op computed.
TEST_F(TracedMonitorTest, ANumberPastFp16sRangeMadeMinusInfIsAMaskToldOnce) {
  Monitor& m = *monitor_;
  InputFacts number = Input(false, false);
  number.dtype = "float64";
  number.shape = "[]";
  number.counts.elements = 1;
  number.max_abs = 1e9;
  number.python_number = true;
  FakeContext literal;
  literal.inputs = {number};
  TensorFacts cast = Fp16(0);
  cast.shape = "[]";
  cast.counts.elements = 1;
  cast.counts.neginf = 1;
  cast.counts.max_abs_bits = 0x7C00;
  EXPECT_EQ(m.OnOp(OpNamed("aten::_to_copy", cast), literal), Verdict::kMasked);
  FakeContext scores;
  scores.inputs = {Input(false, false), number};
  TensorFacts masked = Fp16(0);
  masked.counts.neginf = 4;
  masked.counts.max_abs_bits = 0x7C00;
  EXPECT_EQ(m.OnOp(OpNamed("aten::mul", masked), scores), Verdict::kMasked);
  EXPECT_EQ(m.OnOp(OpNamed("aten::mul", masked), scores), Verdict::kMasked);
  EXPECT_EQ(scores.source_calls + literal.source_calls, 1) << "told once";
  // x * 1e9: +inf is the product's.
  EXPECT_EQ(m.OnOp(OpNamed("aten::mul", Fp16(4)), scores), Verdict::kOrigin);
  // -inf of a number fp16 holds (-1e4) is the product's too.
  FakeContext within;
  within.inputs = {Input(false, false), number};
  within.inputs[1].max_abs = 1e4;
  EXPECT_EQ(m.OnOp(OpNamed("aten::mul", masked), within), Verdict::kOrigin);
  EXPECT_EQ(m.mask_ops(), std::vector<std::string>{"aten::mul"}) << "not the literal's cast";
  m.FlushStep();
  auto t = CloseAndRead();
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->mask_literals.size(), 1u);
  EXPECT_EQ(t->mask_literals[0].detail,
            "aten::_to_copy made -inf of the program's 1e+09, past float16's largest value "
            "(65504), at model.py:33 in forward");
}

// An acos's input of 1.0000001, past the domain, must not read as 1.
TEST(DescribeTensorTest, AValueNextToOneKeepsTheDigitsThatTellItFromOne) {
  CheckCounts c;
  EXPECT_EQ(DescribeTensor("float32", "[4]", c, 1.0), "float32[4] max|x|=1");
  EXPECT_EQ(DescribeTensor("float32", "[4]", c, 1.00000012), "float32[4] max|x|=1.00000012");
  EXPECT_EQ(DescribeTensor("float32", "[4]", c, 0.99999994), "float32[4] max|x|=0.99999994");
  EXPECT_EQ(DescribeTensor("float32", "[4]", c, 3.1415926), "float32[4] max|x|=3.14159");
  EXPECT_EQ(DescribeTensor("float32", "[4]", c, 100000.01), "float32[4] max|x|=100000");
}

}  // namespace
}  // namespace nanhunt
