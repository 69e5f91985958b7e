// Diagnoses of hand-built run summaries: what the loss scalers' skips and
// the warnings before an overflow come to.
#include "viewer/diagnosis.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "viewer/scaler_skips.h"

namespace nanhunt {
namespace {

FindingRow BackwardOrigin(int64_t step) {
  FindingRow f;
  f.kind = "origin";
  f.op = "aten::mm";
  f.phase = "backward";
  f.forward_op = "aten::addmm";
  f.dtype = "float16";
  f.step = step;
  f.posinf = 3;
  f.max_abs = 1e9;
  return f;
}

// A finding of `kind` in the update: `op` at `step`.
FindingRow UpdateFinding(const char* kind, const char* op, int64_t step) {
  FindingRow f = BackwardOrigin(step);
  f.kind = kind;
  f.op = op;
  f.phase = "optimizer";
  f.forward_op.clear();
  return f;
}

// `steps` steps; the program's own scaler skipped `skipped`, which are all
// the steps with inf/NaN.
RunSummary ProgramScaler(int64_t steps, std::vector<int64_t> skipped) {
  RunSummary s;
  s.steps = steps;
  s.first_origin = BackwardOrigin(skipped.front());
  s.nonfinite_steps = skipped;
  s.program_skipped_steps = std::move(skipped);
  return s;
}

TEST(Diagnosis, AHalfModelsGradientOverflowIsNoGradScalerAdvice) {
  // GradScaler refuses a model.half() model's fp16 gradients, and
  // NANHUNT_AUTOCAST_DTYPE changes no autocast such a model runs.
  RunSummary s;
  s.steps = 5;
  s.first_origin = BackwardOrigin(2);
  s.nonfinite_steps = s.nonfinite_steps_kept = {2, 3, 4};
  s.fp16_updates = true;
  Diagnosis d = Diagnose(s);
  ASSERT_EQ(d.kind, "backward_overflow");
  EXPECT_TRUE(absl::StartsWith(d.fixes.front(), "skip the steps whose gradients are not "
                                                "finite: NANHUNT_SKIP_NONFINITE_STEPS=1 now"))
      << d.fixes.front();
  EXPECT_TRUE(absl::StartsWith(d.fixes.back(),
                               "or train in bf16: model.bfloat16() instead of model.half()"))
      << d.fixes.back();

  s.fp16_updates = false;  // fp32 weights under autocast
  d = Diagnose(s);
  EXPECT_TRUE(absl::StartsWith(d.fixes.front(), "use loss scaling with skipping: "
                                                "torch.amp.GradScaler"))
      << d.fixes.front();
  EXPECT_TRUE(absl::StartsWith(d.fixes.back(), "or bf16 autocast")) << d.fixes.back();
}

TEST(Diagnosis, TheProgramsScalerSettlingThenSkippingRarelyIsHealthy) {
  RunSummary s = ProgramScaler(30, {0, 1, 2, 3, 4, 5, 6, 11, 16, 21, 26});
  EXPECT_EQ(StepsTheScalerHandled(s, SkipsOf(s)), 7);
  const Diagnosis d = Diagnose(s);
  EXPECT_EQ(d.kind, "healthy");
  EXPECT_EQ(d.title, "Healthy: every inf/NaN was in gradients the program's loss scaler skipped");
  EXPECT_EQ(d.evidence[0].rfind("the program skipped 11 of 30 updates (37%; steps 0-6, 11, "
                                "16, 21, 26)", 0),
            0u)
      << d.evidence[0];
}

// A scaler settling at the start is healthy, but iterations the program
// gave up on a non-finite loss were lost: what made their inf/NaN is the
// diagnosis, and the evidence says they were given up.
TEST(Diagnosis, IterationsGivenUpAreDiagnosedThoughAScalerHandledTheRest) {
  RunSummary s = ProgramScaler(30, {0, 1, 2});
  FindingRow forward = BackwardOrigin(12);  // as it, in the forward pass
  forward.op = "aten::addmm";
  forward.top_op = "aten::linear";
  forward.phase = "forward";
  forward.forward_op.clear();
  forward.max_abs = 147302;
  s.nonfinite_steps = {0, 1, 2, 12, 13};
  s.given_up_steps = {12, 13};
  ASSERT_EQ(Diagnose(s).kind, "healthy") << "without the finding in a step given up";
  s.first_given_up = forward;
  const Diagnosis d = Diagnose(s);
  EXPECT_EQ(d.kind, "forward_overflow") << d.title;
  EXPECT_NE(d.title.find("at step 12"), std::string::npos) << d.title;
  EXPECT_TRUE(std::any_of(d.evidence.begin(), d.evidence.end(), [](const std::string& e) {
    return e.rfind("the program gave up 2 iterations on a non-finite loss (steps 12-13)", 0) == 0;
  }));
}

TEST(Diagnosis, TheProgramsScalerSkippingEveryOtherUpdateStalls) {
  RunSummary s = ProgramScaler(20, {0, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19});
  EXPECT_EQ(StepsTheScalerHandled(s, SkipsOf(s)), -1);
  const Diagnosis d = Diagnose(s);
  EXPECT_EQ(d.kind, "skipped_steps");
  EXPECT_EQ(d.title, "Stalled training: the program's loss scaler skipped 55% of the steps");
  EXPECT_EQ(d.op, "aten::addmm") << "the forward op of the overflowing backward op";
}

// Sample mode counts, without judging them, iterations with non-finite
// gradients that ended without an optimizer step: an overflow diagnosis
// then says a loss scaler of the program's own may have skipped them, and
// to check every op. Not for a GradScaler run, whose skips are known, nor
// for a healthy one.
TEST(Diagnosis, SampleModeCautionsThatItDoesNotFollowAProgramsScaler) {
  RunSummary s;
  s.steps = 19;
  s.first_origin = BackwardOrigin(4);
  s.nonfinite_steps = {4, 9};
  s.nonfinite_steps_kept = {4, 9};  // sample mode does not follow what was freed
  s.op_sampling = "torch";
  s.iterations_unjudged_in_sample_mode = 2;
  Diagnosis d = Diagnose(s);
  EXPECT_EQ(d.kind, "backward_overflow");
  ASSERT_FALSE(d.fixes.empty());
  EXPECT_EQ(d.fixes[0].rfind("if the program scales its loss itself, run with every op "
                             "checked (NANHUNT_MODE=check", 0),
            0u)
      << d.fixes[0];
  EXPECT_EQ(d.evidence.back().rfind("sample mode: 2 times, non-finite gradients were "
                                    "followed by the next batch without an optimizer step",
                                    0),
            0u)
      << d.evidence.back();
  s.skipped_steps = {4, 9};  // GradScaler's
  d = Diagnose(s);
  EXPECT_TRUE(std::none_of(d.evidence.begin(), d.evidence.end(), [](const std::string& e) {
    return e.rfind("sample mode: ", 0) == 0;
  }));
  s.skipped_steps.clear();
  s.first_origin.reset();
  s.nonfinite_steps.clear();
  s.nonfinite_steps_kept.clear();
  d = Diagnose(s);
  EXPECT_EQ(d.kind, "healthy");
  EXPECT_TRUE(d.fixes.empty());
}

// Inf/NaN no checked op made, first seen after a torch.compile region ran:
// its fused kernels made them or it was given them; not "the data", and the
// way to the op is running the region eagerly.
TEST(Diagnosis, InfNanOutOfACompiledRegionAreNotCalledTheData) {
  RunSummary s;
  s.steps = 4;
  FindingRow f = UpdateFinding("compiled", "aten::mean", 0);
  f.phase = "forward";
  f.compiled_region = "Torch-Compiled Region: 0/0, called at train.py:11 in <module>";
  s.first_origin = f;
  s.nonfinite_steps = {0, 1, 2, 3};
  const Diagnosis d = Diagnose(s);
  EXPECT_EQ(d.kind, "compiled_region");
  EXPECT_EQ(d.title, "Non-finite values came out of a torch.compile region");
  ASSERT_FALSE(d.evidence.empty());
  EXPECT_NE(d.evidence[0].find("Torch-Compiled Region: 0/0, called at train.py:11"),
            std::string::npos) << d.evidence[0];
  ASSERT_FALSE(d.fixes.empty());
  EXPECT_NE(d.fixes[0].find("TORCHDYNAMO_DISABLE=1"), std::string::npos) << d.fixes[0];
}

// A GPU origin after a compiled region may only have passed on what the
// region made (its inputs were not read): the diagnosis says so first.
TEST(Diagnosis, AGpuOriginAfterACompiledRegionSaysTheRegionMayHaveMadeThem) {
  RunSummary s;
  s.steps = 4;
  FindingRow f = UpdateFinding("origin", "aten::mean", 0);
  f.phase = "forward";
  s.first_origin = f;
  s.nonfinite_steps = {0};
  s.nonfinite_steps_kept = {0};  // the weights took them: an overflow to fix
  const Diagnosis plain = Diagnose(s);
  f.compiled_region = "Torch-Compiled Region: 0/0, called at train.py:11 in <module>";
  s.first_origin = f;
  const Diagnosis d = Diagnose(s);
  EXPECT_EQ(d.kind, plain.kind);
  ASSERT_EQ(d.evidence.size(), plain.evidence.size() + 1) << d.kind << ": " << d.title;
  EXPECT_NE(d.evidence.back().find("if the region's outputs held inf/NaN already"),
            std::string::npos) << d.evidence.back();
  ASSERT_EQ(d.fixes.size(), plain.fixes.size() + 1);
  EXPECT_NE(d.fixes[0].find("TORCHDYNAMO_DISABLE=1"), std::string::npos) << d.fixes[0];
}

// Sample mode checks a share of ops: inf/NaN going into a checked op that
// no checked op made were as likely made by an unchecked one as by the
// data. With every op checked they came from outside.
TEST(Diagnosis, InfNanNoCheckedOpMadeInSampleModeNeedNotBeTheData) {
  RunSummary s;
  s.steps = 10;
  s.first_origin =
      UpdateFinding("input", "aten::_amp_foreach_non_finite_check_and_unscale_", 2);
  s.nonfinite_steps = {2};
  EXPECT_EQ(Diagnose(s).kind, "nonfinite_input");
  s.op_sampling = "torch";
  s.op_calls_checked = 191;
  Diagnosis d = Diagnose(s);
  EXPECT_EQ(d.kind, "unchecked_maker");
  EXPECT_EQ(d.title, "Non-finite values from an op that sample mode did not check");
  ASSERT_GE(d.evidence.size(), 2u);
  EXPECT_EQ(d.evidence.back().rfind("sample mode checked 191 op calls: the op that made them "
                                    "was most likely one it did not check",
                                    0),
            0u)
      << d.evidence.back();
  ASSERT_FALSE(d.fixes.empty());
  EXPECT_EQ(d.fixes[0].rfind("rerun with every op checked (NANHUNT_MODE=check, the default), "
                             "from a checkpoint before step 2",
                             0),
            0u)
      << d.fixes[0];
  // An escalation that began within step 2, before its inf/NaN reached a
  // checked op, found that input first, and nothing after it.
  RunSummary::Escalation escalation;
  escalation.row.step = 2;
  escalation.row.until_step = 22;
  escalation.found = *s.first_origin;
  s.escalations.push_back(escalation);
  EXPECT_EQ(Diagnose(s).kind, "unchecked_maker");
  // It caught the origin when the overflow recurred: that is the
  // diagnosis, and the evidence says what came first (before, only the
  // escalation's first finding was looked at, the input, and a run whose
  // program skipped each overflow itself stayed unchecked_maker).
  s.escalations.back().origin = BackwardOrigin(7);
  s.nonfinite_steps = s.nonfinite_steps_kept = {2, 7};
  d = Diagnose(s);
  EXPECT_EQ(d.kind, "backward_overflow");
  EXPECT_NE(std::find_if(d.evidence.begin(), d.evidence.end(),
                         [](const std::string& e) {
                           return e.rfind("sample mode saw inf/NaN first at step 2: ", 0) == 0 &&
                                  e.find("caught this origin at step 7") != std::string::npos;
                         }),
            d.evidence.end());
}

// Only carried inf/NaN, none a checked op made or an input held first (a
// constant torch's kernel handed to an op inside another): "every checked
// output was finite" was untrue. Healthy only if each step dropped them;
// in sample mode, an unchecked op made them.
TEST(Diagnosis, CarriedValuesWithoutAnOriginAreNeverEveryOutputFinite) {
  RunSummary s;
  s.steps = 4;
  FindingRow carried;
  carried.kind = "propagated";
  carried.op = "aten::where";
  carried.top_op = "aten::logdet";
  carried.phase = "forward";
  carried.step = 1;
  carried.source = "flow.py:9 in <module>";
  carried.inputs = "#0 Bool[] (not checked); #1 scalar max|x|=0 nan=1";
  s.first_propagated = carried;
  s.propagated = 3;
  s.nonfinite_steps = {1, 2, 3};
  Diagnosis d = Diagnose(s);
  EXPECT_EQ(d.kind, "healthy");
  EXPECT_EQ(d.title, "Healthy: inf/NaN in 3 steps, dropped before any weight; no checked op made "
                     "them");
  ASSERT_GE(d.evidence.size(), 3u);
  EXPECT_EQ(d.evidence[0],
            "first seen at step 1: aten::where in aten::logdet (forward) was given them, at "
            "flow.py:9 in <module>");
  EXPECT_EQ(d.evidence[1], "its inputs: " + carried.inputs);
  for (const std::string& e : d.evidence) {
    EXPECT_EQ(e.find("every checked output"), std::string::npos) << e;
  }
  s.nonfinite_steps_kept = {3};
  d = Diagnose(s);
  EXPECT_EQ(d.kind, "unknown_origin");
  EXPECT_EQ(d.title, "Non-finite values that no checked op made, in 3 steps");
  ASSERT_FALSE(d.fixes.empty());
  EXPECT_EQ(d.fixes[0].rfind("NANHUNT_ON_NONFINITE=raise", 0), 0u) << d.fixes[0];
  s.op_sampling = "torch";
  EXPECT_EQ(Diagnose(s).kind, "unchecked_maker");
  // With an origin, the origin is the diagnosis.
  s.op_sampling.clear();
  s.first_origin = BackwardOrigin(1);
  EXPECT_EQ(Diagnose(s).kind, "backward_overflow");
}

TEST(Diagnosis, AStepTheRunStoppedInBeforeTheScalerDecidedIsNoOverflow) {
  // GradScaler skipped steps 0-2; the run was stopped after step 29's
  // backward pass overflowed, before its scaler update.
  RunSummary s;
  s.steps = 30;
  for (int64_t step = 0; step < 29; ++step) s.loss_scale.push_back({step, 65536.0, step < 3});
  s.skipped_steps = {0, 1, 2};
  s.first_origin = BackwardOrigin(0);
  s.nonfinite_steps = {0, 1, 2, 29};
  s.nonfinite_steps_kept = {0, 1, 2, 29};
  EXPECT_EQ(Diagnose(s).kind, "backward_overflow");
  s.unfinished_steps = {29};
  EXPECT_EQ(StepsTheScalerHandled(s, SkipsOf(s)), 3);
  EXPECT_EQ(Diagnose(s).kind, "healthy");
}

TEST(Diagnosis, InfNanKeptPastASkipAreAnOverflowStill) {
  RunSummary s = ProgramScaler(30, {0, 1, 2});
  s.nonfinite_steps.push_back(9);  // NaN that reached the weights
  s.nonfinite_steps_kept = {9};
  EXPECT_EQ(Diagnose(s).kind, "backward_overflow");
}

TEST(Diagnosis, OnlyTheOpsOwnFp16WarningsBeforeItOverflowedAreItsTrend) {
  RunSummary s;
  s.steps = 30;
  s.first_origin = BackwardOrigin(10);
  s.nonfinite_steps = s.nonfinite_steps_kept = {10};
  FindingRow w = BackwardOrigin(4);
  w.kind = "near_max";
  w.posinf = 0;
  w.max_abs = 32752;
  FindingRow wider = w;  // a forecast about an fp32 tensor of the same op
  wider.dtype = "float32";
  wider.max_abs = 1.6e7;
  FindingRow forward = w;
  forward.phase = "forward";
  FindingRow after = w;
  after.step = 12;
  after.max_abs = 60000;
  s.warnings = {wider, w, forward, after};
  const Diagnosis d = Diagnose(s);
  ASSERT_EQ(d.kind, "backward_overflow");
  EXPECT_NE(std::find(d.evidence.begin(), d.evidence.end(),
                      "it was warned about at step 4: |x| reached 50% of 65504 before it "
                      "overflowed"),
            d.evidence.end())
      << ::testing::PrintToString(d.evidence);
}

TEST(Diagnosis, ABackwardOpAHookOrCustomBackwardCalledIsNamedWithItsLine) {
  RunSummary s;
  s.steps = 4;
  s.first_origin = BackwardOrigin(2);
  s.first_origin->op = "aten::mul";
  s.first_origin->forward_op = "Blowup";  // a custom autograd.Function
  s.first_origin->source = s.first_origin->stack = "train.py:16 in backward";
  s.nonfinite_steps = s.nonfinite_steps_kept = {2};
  const Diagnosis d = Diagnose(s);
  ASSERT_EQ(d.kind, "backward_overflow");
  EXPECT_EQ(d.evidence[0],
            "step 2: aten::mul (backward of Blowup) turned finite values into float16 inf/NaN, "
            "called in the backward pass at train.py:16 in backward; the forward pass was "
            "finite");
  // No operator for NANHUNT_FP32_OPS to run: autocast's decorators instead.
  for (const std::string& fix : d.fixes) EXPECT_FALSE(absl::StrContains(fix, "FP32_OPS")) << fix;
  EXPECT_TRUE(std::any_of(d.fixes.begin(), d.fixes.end(), [](const std::string& fix) {
    return absl::StartsWith(fix, "run Blowup in fp32: decorate its forward with "
                                 "@torch.amp.custom_fwd(");
  })) << ::testing::PrintToString(d.fixes);

  // Autograd's own node: its line is its forward op's.
  s.first_origin->forward_op = "aten::addmm";
  s.first_origin->source = "model.py:12 in forward";
  s.first_origin->stack.clear();
  const Diagnosis own = Diagnose(s);
  EXPECT_EQ(own.evidence[0],
            "step 2: aten::mul (backward of aten::addmm, called at model.py:12 in forward) "
            "turned finite values into float16 inf/NaN; the forward pass was finite");
  EXPECT_TRUE(std::any_of(own.fixes.begin(), own.fixes.end(), [](const std::string& fix) {
    return absl::StrContains(fix, "NANHUNT_FP32_OPS=aten::addmm");
  }));
}

// Whether one of `lines` (evidence, fixes) starts with `prefix`.
bool AnyStartsWith(const std::vector<std::string>& lines, absl::string_view prefix) {
  return std::any_of(lines.begin(), lines.end(),
                     [&](const std::string& line) { return absl::StartsWith(line, prefix); });
}

// Diagnoses `s`, which must be invalid_math with evidence that starts
// with `evidence` and a first fix that holds `first_fix`.
void ExpectInvalidMath(const RunSummary& s, absl::string_view evidence,
                       absl::string_view first_fix) {
  const Diagnosis d = Diagnose(s);
  ASSERT_EQ(d.kind, "invalid_math");
  EXPECT_TRUE(AnyStartsWith(d.evidence, evidence)) << ::testing::PrintToString(d.evidence);
  ASSERT_FALSE(d.fixes.empty());
  EXPECT_TRUE(absl::StrContains(d.fixes[0], first_fix)) << d.fixes[0];
}

// A backward `aten::div` of `forward_op` in fp32 that made NaN alone.
FindingRow NanGradient(const char* forward_op, int64_t step, int64_t nan, int64_t elements) {
  FindingRow g = BackwardOrigin(step);
  g.op = "aten::div";
  g.forward_op = forward_op;
  g.dtype = "float32";
  g.elements = elements;
  g.posinf = 0;
  g.nan = nan;
  return g;
}

// An fp32 loss `op` inside `top_op` that made inf/NaN of `elements`
// values at step 3 (the counts are the caller's).
FindingRow LossOrigin(const char* op, const char* top_op, int64_t elements) {
  FindingRow f = BackwardOrigin(3);
  f.op = op;
  f.top_op = top_op;
  f.phase = "forward";
  f.forward_op.clear();
  f.dtype = "float32";
  f.elements = elements;
  f.posinf = 0;
  return f;
}

// A run of `steps` steps whose first origin is the fp32 loss `op` inside
// `top_op`, NaN in `nan` of its `elements` values, read from `inputs`, and
// whose inf/NaN reached the weights at the steps `kept`.
RunSummary NanLossRun(int64_t steps, const char* op, const char* top_op, int64_t elements,
                      int64_t nan, const char* inputs, std::vector<int64_t> kept) {
  RunSummary s;
  s.steps = steps;
  FindingRow f = LossOrigin(op, top_op, elements);
  f.nan = nan;
  f.inputs = inputs;
  s.first_origin = f;
  s.nonfinite_steps = s.nonfinite_steps_kept = std::move(kept);
  return s;
}

// sum / count by hand over a mask that selected nothing: 0 / 0 of two
// single numbers (the count an integer, unchecked). Not "keep the
// denominator away from 0 ... F.normalize".
TEST(Diagnosis, ZeroByZeroOfTwoSingleNumbersIsAMeanOverNothing) {
  for (const char* count : {"#1 float32[] max|x|=0", "#1 Long[] (not checked)"}) {
    const std::string inputs = absl::StrCat("#0 float32[] max|x|=0; ", count);
    RunSummary s = NanLossRun(4, "aten::div", "", 1, 1, inputs.c_str(), {2, 3});
    const Diagnosis d = Diagnose(s);
    EXPECT_EQ(d.kind, "invalid_math");
    EXPECT_TRUE(AnyStartsWith(d.evidence, "it divided 0 by 0, two single numbers"))
        << ::testing::PrintToString(d.evidence);
    ASSERT_FALSE(d.fixes.empty());
    EXPECT_TRUE(absl::StartsWith(d.fixes[0], "divide by the count clamped at 1")) << d.fixes[0];
    EXPECT_FALSE(AnyStartsWith(d.fixes, "keep the denominator away from 0"));
  }
  // A tensor's 0 / 0, or a single number's 1 / 0: a division by 0 as such.
  for (const char* inputs : {"#0 float32[4] max|x|=0; #1 float32[4] max|x|=0",
                             "#0 float32[] max|x|=1; #1 float32[] max|x|=0"}) {
    RunSummary s = NanLossRun(4, "aten::div", "", 1, 1, inputs, {2, 3});
    const Diagnosis d = Diagnose(s);
    EXPECT_FALSE(AnyStartsWith(d.evidence, "it divided 0 by 0")) << inputs;
    EXPECT_TRUE(AnyStartsWith(d.fixes, "keep the denominator away from 0")) << inputs;
  }
}

// -(p * p.log()) where p is 0: the mul made NaN of each -inf the log made,
// with p itself for its other input. No torch.where was involved.
TEST(Diagnosis, XLogXAtZeroIsComputedFromTheLogitsNotADoubleWhere) {
  RunSummary s = NanLossRun(5, "aten::log", "", 192, 0, "#0 float32[32, 6] max|x|=1", {2, 3, 4});
  s.first_origin->neginf = 24;
  s.first_origin_gradient = NanGradient("aten::log", 3, 24, 192);
  FindingRow mul = LossOrigin("aten::mul", "", 192);
  mul.kind = "propagated";
  mul.nan = 24;
  mul.inputs = "#0 float32[32, 6] max|x|=1; #1 float32[32, 6] max|x|=inf -inf=24";
  s.first_origin_consumers = {mul};
  ExpectInvalidMath(s, "the next op, aten::mul, multiplied it by the log's own argument",
                    "compute it from the logits, in log space");

  // A BCE by hand, (1 - y) * log(1 - p): where y is 0 the -inf stays.
  s.first_origin_consumers[0].nan = 10;
  s.first_origin_consumers[0].neginf = 14;
  Diagnosis d = Diagnose(s);
  EXPECT_FALSE(AnyStartsWith(d.evidence, "the next op")) << ::testing::PrintToString(d.evidence);
  // Another tensor than the log's argument: no x * log(x).
  s.first_origin_consumers[0].nan = 24;
  s.first_origin_consumers[0].neginf = 0;
  s.first_origin_consumers[0].inputs = "#0 float32[32, 6] max|x|=0.5; #1 float32[32, 6] -inf=24";
  d = Diagnose(s);
  EXPECT_FALSE(AnyStartsWith(d.evidence, "the next op")) << ::testing::PrintToString(d.evidence);
  // A KL divergence by hand, p * (p.log() - logq): a sub keeps each -inf
  // before the mul makes it NaN.
  FindingRow sub = mul;
  sub.op = "aten::sub";
  sub.nan = 0;
  sub.neginf = 24;
  s.first_origin_consumers = {sub, mul};
  ExpectInvalidMath(s, "the next ops, aten::sub then aten::mul, multiplied it by the log's own "
                       "argument: x * (log(x) - y) (a KL divergence's term)",
                    "compute it with F.kl_div(logq, p, reduction=\"batchmean\")");
  // A sub that made NaN of them (log(x) - log(x)) is no such step.
  s.first_origin_consumers[0].nan = 24;
  s.first_origin_consumers[0].neginf = 0;
  d = Diagnose(s);
  EXPECT_FALSE(AnyStartsWith(d.evidence, "the next op")) << ::testing::PrintToString(d.evidence);
}

// CTC's loss is +inf for a transcript its input is too short for: not
// fp16's range, and not a mask; the lengths are what to check, and
// zero_infinity=True what drops it.
TEST(Diagnosis, CtcsInfiniteLossPointsAtTheLengthsAndZeroInfinity) {
  RunSummary s;
  s.steps = 6;
  FindingRow f = LossOrigin("aten::_ctc_loss", "aten::ctc_loss", 4);
  f.posinf = 1;
  f.inputs = "#0 float32[20, 4, 6] max|x|=3.02527; #1 Long[4, 8] (not checked); "
             "#2 input_lengths=[20, 17, 15, 12]; #3 target_lengths=[5, 4, 3, 8]";
  s.first_origin = f;
  s.nonfinite_steps = s.nonfinite_steps_kept = {3, 4, 5};
  Diagnosis d = Diagnose(s);
  ASSERT_EQ(d.kind, "invalid_math");
  EXPECT_TRUE(AnyStartsWith(d.evidence, "CTC's loss is +inf (-log 0) for a target that no alignment fits"))
      << ::testing::PrintToString(d.evidence);
  EXPECT_TRUE(absl::StrContains(d.evidence.back(), "target_lengths=[5, 4, 3, 8]"))
      << ::testing::PrintToString(d.evidence);
  EXPECT_TRUE(absl::StrContains(d.fixes[0], "nn.CTCLoss(zero_infinity=True)")) << d.fixes[0];

  // zero_infinity=True: the step dropped it before any weight.
  s.nonfinite_steps = {3};
  s.nonfinite_steps_kept.clear();
  d = Diagnose(s);
  ASSERT_EQ(d.kind, "healthy");
  ASSERT_EQ(d.fixes.size(), 1u);
  EXPECT_TRUE(absl::StartsWith(d.fixes[0], "nothing harms training: the loss of targets no "
                                           "alignment fits into their input was dropped"))
      << d.fixes[0];
  // A mask's advice is for masks.
  s.first_origin->op = "aten::sum";
  s.first_origin->top_op.clear();
  d = Diagnose(s);
  ASSERT_EQ(d.kind, "healthy");
  EXPECT_TRUE(absl::StrContains(d.fixes[0], "torch.finfo(dtype).min")) << d.fixes[0];
}

// A loss's NaN from finite inputs is a mean over no targets (every label
// ignore_index); its +inf at a target masked with -inf is a mask's doing.
TEST(Diagnosis, ALossNanIsAMeanOverNoTargetsItsInfAMask) {
  RunSummary s = NanLossRun(
      6, "aten::nll_loss_forward", "aten::cross_entropy_loss", 2, 1,
      "#0 float32[32, 50] max|x|=6.1; #1 target Long[32]: 32 of 32 are ignore_index (-100)", {3});
  ExpectInvalidMath(s, "a mean over no targets is 0/0 = NaN", "(labels != -100).any()");

  s.first_origin->nan = 0;
  s.first_origin->posinf = 1;
  s.first_origin->inputs = "#0 float32[32, 50] max|x|=6.1 -inf=64, put there by a mask";
  const Diagnosis d = Diagnose(s);
  EXPECT_EQ(d.kind, "mask_made_nonfinite");
  for (const std::string& e : d.evidence) EXPECT_FALSE(absl::StrContains(e, "no targets")) << e;
}

// An fp16 overflow whose inf the next ops absorbed (rsqrt(inf) = 0) is no
// healthy run that dropped them: it is the overflow, said to be silent;
// in a model.half() model (fp16 updates) the fp32 op list cannot help a
// result past 65504, and bf16 means the model's.
TEST(Diagnosis, AnAbsorbedFp16OverflowIsTheOverflowNotHealthy) {
  RunSummary s;
  s.steps = 5;
  FindingRow f = LossOrigin("aten::pow", "", 512);
  f.top_op.clear();
  f.dtype = "float16";
  f.posinf = 129;
  f.fp32_max_abs = 440896;
  s.first_origin = f;
  s.nonfinite_steps = {2, 3, 4};  // each dropped by its end
  Diagnosis d = Diagnose(s);
  ASSERT_EQ(d.kind, "forward_overflow");
  EXPECT_TRUE(std::any_of(d.evidence.begin(), d.evidence.end(), [](const std::string& e) {
    return absl::StrContains(e, "so the loss stayed finite");
  })) << ::testing::PrintToString(d.evidence);
  EXPECT_TRUE(absl::StartsWith(d.fixes[0], "run aten::pow in fp32: NANHUNT_FP32_OPS=aten::pow"))
      << d.fixes[0];
  EXPECT_TRUE(absl::StartsWith(d.fixes[1], "square in fp32")) << d.fixes[1];

  s.fp16_updates = true;
  d = Diagnose(s);
  EXPECT_TRUE(absl::StrContains(d.fixes[0], "its values, up to 440896, do not fit")) << d.fixes[0];
  EXPECT_TRUE(std::any_of(d.fixes.begin(), d.fixes.end(), [](const std::string& fix) {
    return absl::StrContains(fix, "model.bfloat16() instead of model.half()");
  })) << ::testing::PrintToString(d.fixes);

  // No recomputation past 65504 (a softmax's NaN over a masked row): dropped.
  s.first_origin->op = "aten::_softmax";
  s.first_origin->fp32_max_abs.reset();
  s.first_origin->posinf = 0;
  s.first_origin->nan = 8;
  EXPECT_EQ(Diagnose(s).kind, "healthy");
}

// log(0)'s -inf kept out of the loss by a torch.where still has a NaN
// gradient (0 / 0): the fix is a safe input, not a masked output. An inf
// gradient (the loss itself was -inf) is no such trap.
TEST(Diagnosis, AWhereOverLogOfZeroHasANanGradientAndSaysWhy) {
  RunSummary s;
  s.steps = 4;
  FindingRow f = LossOrigin("aten::log", "", 96);
  f.neginf = 31;
  s.first_origin = f;
  s.first_origin_gradient = NanGradient("aten::log", 3, 31, 96);
  s.nonfinite_steps = s.nonfinite_steps_kept = {3};
  ExpectInvalidMath(s, "its gradient is NaN: aten::div (backward of aten::log)",
                    "torch.where(ok, z, 1).log()");

  s.first_origin_gradient->nan = 0;
  s.first_origin_gradient->posinf = 31;
  const Diagnosis d = Diagnose(s);
  for (const std::string& fix : d.fixes) EXPECT_FALSE(absl::StrContains(fix, "double where"));
}

// A square root's backward at 0 divides by 0: its NaN is the derivative's,
// not a division of the program's (whose advice, to mask, is the trap).
TEST(Diagnosis, ASquareRootsNanGradientAtZeroIsItsDerivative) {
  RunSummary s;
  s.steps = 4;
  s.first_origin = NanGradient("aten::sqrt", 2, 16, 144);
  s.nonfinite_steps = s.nonfinite_steps_kept = {2, 3};
  ExpectInvalidMath(s, "the derivative of aten::sqrt at 0 is infinite",
                    "keep the argument off 0 before the square root");
  const Diagnosis d = Diagnose(s);
  EXPECT_FALSE(AnyStartsWith(d.evidence, "a division by 0")) << ::testing::PrintToString(d.evidence);
  // The program's own division (a forward op's) keeps its advice.
  s.first_origin->forward_op = "aten::div";
  ExpectInvalidMath(s, "a division by 0", "keep the denominator away from 0");
}

// A gradient penalty's norm by hand, x.pow(2).sum(-1).sqrt(), over a zero
// gradient row: its square root's backward made -inf, which a ReLU's
// backward dropped before any weight. Healthy, and the way to stop it is
// the square root's, not a mask's finfo.min.
TEST(Diagnosis, ASquareRootsDroppedInfAtZeroIsHealthyWithTheSquareRootsFix) {
  RunSummary s;
  s.steps = 5;
  s.first_origin = NanGradient("aten::sqrt", 2, 0, 8);
  s.first_origin->neginf = 1;
  s.nonfinite_steps = {2};
  const Diagnosis d = Diagnose(s);
  ASSERT_EQ(d.kind, "healthy");
  EXPECT_TRUE(AnyStartsWith(d.evidence, "the derivative of aten::sqrt at 0 is infinite"))
      << ::testing::PrintToString(d.evidence);
  EXPECT_FALSE(AnyStartsWith(d.evidence, "a division by 0")) << ::testing::PrintToString(d.evidence);
  ASSERT_EQ(d.fixes.size(), 1u);
  EXPECT_TRUE(absl::StartsWith(d.fixes[0], "nothing harms training")) << d.fixes[0];
  EXPECT_TRUE(absl::StrContains(d.fixes[0], "torch.linalg.vector_norm")) << d.fixes[0];
  EXPECT_FALSE(absl::StrContains(d.fixes[0], "finfo")) << d.fixes[0];
}

// acos of a cosine rounded past 1 is NaN, and so is its derivative: no
// where-trap (nothing masked a -inf), and the fix is the clamp into the
// domain, before the op.
TEST(Diagnosis, AnAcosPastItsDomainHasANanGradientOfItsOwn) {
  RunSummary s =
      NanLossRun(4, "aten::acos", "", 320, 1, "#0 float32[32, 10] max|x|=1.00000012", {3});
  s.first_origin_gradient = NanGradient("aten::acos", 3, 1, 320);
  s.first_origin_gradient->op = "aten::rsqrt";
  ExpectInvalidMath(s, "its gradient is NaN as well: aten::rsqrt (backward of aten::acos)",
                    "clamp the argument into the domain");
  const Diagnosis d = Diagnose(s);
  for (const std::string& e : d.evidence) {
    EXPECT_FALSE(absl::StrContains(e, "torch.where or masked_fill that keeps")) << e;
  }
  for (const std::string& fix : d.fixes) EXPECT_FALSE(absl::StrContains(fix, "double where")) << fix;
}

// A BCE written by hand in fp16: 1 - sigmoid(x) rounds to 0 from x of
// about 8.3, and its log is -inf; fp32 would have kept it finite.
TEST(Diagnosis, AnFp16LogOfAProbabilityRoundedToOneSaysSo) {
  RunSummary s = NanLossRun(6, "aten::log", "", 64, /*nan=*/0, "", {0, 1});
  s.first_origin->dtype = "float16";
  s.first_origin->neginf = 5;
  s.first_origin->fp32_max_abs = std::numeric_limits<double>::infinity();
  ExpectInvalidMath(s, "in float16 a probability rounds to exactly 1 from a logit of about 8.3",
                    "stay in log space");
  s.first_origin->dtype = "bfloat16";
  ExpectInvalidMath(s, "in bfloat16 a probability rounds to exactly 1 from a logit of about 6.2",
                    "stay in log space");
  // fp32's log of 0 is no rounding of ours to speak of.
  s.first_origin->dtype = "float32";
  const Diagnosis d = Diagnose(s);
  EXPECT_FALSE(AnyStartsWith(d.evidence, "in float32")) << ::testing::PrintToString(d.evidence);
}

// An inverse CDF at its ends (a probit of p = 1, erfinv of 1): infinite,
// and the fix is a clamp inside the open interval.
TEST(Diagnosis, AnInverseCdfAtItsEndsIsInfinite) {
  for (const char* op : {"aten::erfinv", "aten::special_ndtri"}) {
    RunSummary s = NanLossRun(4, op, "", 64, 0, "#0 float32[64] max|x|=1", {2, 3});
    s.first_origin->posinf = 1;
    ExpectInvalidMath(s, "an inverse CDF is infinite at its ends",
                      "keep its argument inside the open interval");
  }
}

// eigh's and svd's backward divide by differences of their values: NaN
// where two repeat is their formula's, not a division of the program's.
TEST(Diagnosis, ADecompositionsGradientAtRepeatedValuesIsItsFormulas) {
  RunSummary s = NanLossRun(4, "aten::div_", "", 16, 2, "#0 float32[4, 4] max|x|=1", {0});
  s.first_origin->phase = "backward";
  for (const char* forward_op : {"aten::_linalg_eigh", "aten::_linalg_svd"}) {
    s.first_origin->forward_op = forward_op;
    const Diagnosis d = Diagnose(s);
    EXPECT_EQ(d.kind, "invalid_math");
    EXPECT_TRUE(AnyStartsWith(d.evidence, "the backward of an ")) << forward_op;
    EXPECT_FALSE(AnyStartsWith(d.evidence, "a division by 0")) << forward_op;
    EXPECT_FALSE(AnyStartsWith(d.fixes, "keep the denominator away from 0")) << forward_op;
  }
  s.first_origin->forward_op = "aten::div";  // the program's own division
  EXPECT_TRUE(AnyStartsWith(Diagnose(s).fixes, "keep the denominator away from 0"));
}

// x.mean() of NaN markers the program placed: the nan-skipping mean.
TEST(Diagnosis, AMeanOverNanMarkersIsNamedWithTorchNanmean) {
  RunSummary s = NanLossRun(3, "aten::sum", "aten::mean", 1, 1,
                            "#0 float32[4] max|x|=0.29 nan=1, NaN put there on purpose (a marker)",
                            {0, 1, 2});
  const Diagnosis d = Diagnose(s);
  EXPECT_EQ(d.kind, "nan_marker_reached");
  EXPECT_EQ(d.op, "aten::mean");
  ASSERT_FALSE(d.fixes.empty());
  EXPECT_TRUE(absl::StartsWith(d.fixes[0], "skip the markers where they are reduced: "
                                           "torch.nanmean(x) instead of x.mean()"))
      << d.fixes[0];
  s.first_origin->inputs = "#0 float32[4] max|x|=0.29 nan=1";  // no marker: data
  EXPECT_NE(Diagnose(s).kind, "nan_marker_reached");
}

// Markers a backward formula computed with (0 x NaN), left out of the
// forward's loss: named at the forward op, with the fix that selects first.
TEST(Diagnosis, NanMarkersInABackwardFormulaAreNamedAtItsForwardOp) {
  RunSummary s = NanLossRun(3, "aten::pow", "", 48, 16,
                            "#0 float32[16, 3] max|x|=3.4 nan=16, NaN put there on purpose "
                            "(a marker)",
                            {0, 1, 2});
  s.first_origin->phase = "backward";
  s.first_origin->forward_op = "aten::pow";
  const Diagnosis d = Diagnose(s);
  EXPECT_EQ(d.kind, "nan_marker_reached");
  EXPECT_EQ(d.op, "aten::pow");
  EXPECT_EQ(d.title, "NaN markers reached the gradients: the backward of aten::pow at step 3");
  EXPECT_TRUE(AnyStartsWith(d.fixes, "or select the known entries first"));
  EXPECT_FALSE(AnyStartsWith(d.fixes, "skip the markers where they are reduced"));
}

// A NaN the program placed, that a linear spread: its input, with the
// marker's own fix before "find the record".
TEST(Diagnosis, ANanTheProgramPlacedThatALinearWasGivenIsItsInput) {
  RunSummary s = NanLossRun(3, "aten::addmm", "aten::linear", 16, 16,
                            "#1 float32[16, 8] max|x|=2.1 nan=1, NaN put there on purpose "
                            "(a marker)",
                            {2});
  s.first_origin->kind = "input";
  const Diagnosis d = Diagnose(s);
  EXPECT_EQ(d.kind, "nonfinite_input");
  EXPECT_TRUE(AnyStartsWith(d.evidence, "the NaN was placed by the program itself"));
  ASSERT_GE(d.fixes.size(), 2u);
  EXPECT_TRUE(absl::StartsWith(d.fixes[0], "if the NaN marks missing values")) << d.fixes[0];
  EXPECT_TRUE(absl::StartsWith(d.fixes[1], "find the record")) << d.fixes[1];
}

// GRPO-style advantages: a group of one sample has a std of NaN; so has
// a batch standardised by hand at an epoch's last batch of one sample.
TEST(Diagnosis, AStdOverOneValueIsBesselsCorrection) {
  RunSummary s = NanLossRun(4, "aten::std", "", 1, 1, "#0 float32[1] max|x|=1.02241", {2, 3});
  ExpectInvalidMath(s, "a standard deviation or variance with Bessel's correction",
                    "correction=0");
  ExpectInvalidMath(s, "a standard deviation", "DataLoader(..., drop_last=True)");
  // A variance's +inf is an overflow of its squares, no such thing.
  s.first_origin->nan = 0;
  s.first_origin->posinf = 1;
  const Diagnosis d = Diagnose(s);
  EXPECT_FALSE(AnyStartsWith(d.evidence, "a standard deviation"))
      << ::testing::PrintToString(d.evidence);
}

// A 4-step run whose first origin is `op`, in the backward of `forward_op`
// at step 2, that gave `posinf` +inf of `elements` fp32 values from
// `inputs`; steps 2 and 3 kept inf/NaN.
RunSummary InfiniteGradientAtStep2(const char* op, const char* forward_op, int64_t posinf,
                                   int64_t elements, const char* inputs) {
  RunSummary s;
  s.steps = 4;
  FindingRow g = BackwardOrigin(2);
  g.op = op;
  g.forward_op = forward_op;
  g.dtype = "float32";
  g.posinf = posinf;
  g.elements = elements;
  g.inputs = inputs;
  s.first_origin = g;
  s.nonfinite_steps = s.nonfinite_steps_kept = {2, 3};
  return s;
}

// A focal loss's (1 - p) ** 0.5 where p is 1: pow's backward is
// 0.5 * 0 ** -0.5, +inf, with a nonzero incoming gradient.
TEST(Diagnosis, AFractionalPowersInfiniteGradientAtZeroIsItsDerivative) {
  RunSummary s = InfiniteGradientAtStep2("aten::pow", "aten::pow", 32, 32,
                                         "#0 float32[32] max|x|=0");
  ExpectInvalidMath(s, "the derivative of aten::pow at 0 is infinite",
                    "x.clamp_min(eps) ** e");
  const Diagnosis d = Diagnose(s);
  EXPECT_TRUE(AnyStartsWith(d.evidence, "the derivative of aten::pow at 0 is infinite (a power's "
                                        "with an exponent below 1"))
      << ::testing::PrintToString(d.evidence);
  for (const std::string& e : d.evidence) EXPECT_FALSE(absl::StrContains(e, "0 x inf is NaN")) << e;
  // Inputs that had exploded overflow the power: no derivative at 0.
  s.first_origin->inputs = "#0 float32[32] max|x|=1e+30";
  ExpectInvalidMath(s, "an input reached |x| = 1e+30", "clip gradients");
}

// GeM pooling's learned p over signed features: the gradient of p, x ** p *
// log(x), is NaN at each negative x. It was said to be pow's derivative at
// 0 "with an exponent below 1", and a log's "stay in log space".
TEST(Diagnosis, ALearnedExponentsNanGradientOverANegativeBaseIsItsLog) {
  RunSummary s;
  s.steps = 4;
  s.first_origin = NanGradient("aten::pow", 0, 36799, 73728);
  s.first_origin->op = "aten::log";
  s.first_origin->inputs = "#0 float32[8, 16, 24, 24] max|x|=4.45534";
  s.nonfinite_steps = s.nonfinite_steps_kept = {0, 1, 2, 3};
  ExpectInvalidMath(s, "the gradient of a tensor exponent, d(x ** p)/dp = x ** p * log(x)",
                    "keep the base positive before a learned exponent");
  const Diagnosis d = Diagnose(s);
  for (const std::string& e : d.evidence) {
    EXPECT_FALSE(absl::StrContains(e, "exponent below 1")) << e;
    EXPECT_FALSE(absl::StartsWith(e, "a logarithm of 0")) << e;
  }
  // Dropped before any weight: healthy, with the same way to stop it.
  s.nonfinite_steps_kept.clear();
  const Diagnosis dropped = Diagnose(s);
  ASSERT_EQ(dropped.kind, "healthy");
  EXPECT_TRUE(AnyStartsWith(dropped.evidence, "the gradient of a tensor exponent"))
      << ::testing::PrintToString(dropped.evidence);
  EXPECT_TRUE(absl::StrContains(dropped.fixes[0], "x.clamp(min=eps) ** p")) << dropped.fixes[0];
  // The base's gradient, a pow in pow's backward, keeps its steep point.
  s.first_origin->op = "aten::pow";
  EXPECT_TRUE(AnyStartsWith(Diagnose(s).evidence, "the derivative of aten::pow at 0"));
}

// cosh of a long tangent vector (a hyperboloid's exponential map): no
// maximum to subtract, as exp's fix says, but a length to clamp.
TEST(Diagnosis, ACoshPastTheRangeIsALengthToClampNotAMaximumToSubtract) {
  RunSummary s = NanLossRun(3, "aten::cosh", "", 64, 0, "#0 float32[64] max|x|=92.5", {1});
  s.first_origin->posinf = 3;
  ExpectInvalidMath(s, "sinh and cosh pass fp32's range", "clamp the argument before them");
  for (const std::string& f : Diagnose(s).fixes) EXPECT_FALSE(absl::StrContains(f, "maximum"));
}

// weight_norm of a zeroed weight: v / |v| is 0 / 0.
TEST(Diagnosis, AZeroedWeightUnderWeightNormIsNamedWithItsScale) {
  RunSummary s = NanLossRun(3, "aten::_weight_norm_interface", "aten::_weight_norm", 68, 64,
                            "#0 float32[4, 16] max|x|=0; #1 float32[4, 1] max|x|=0", {0});
  ExpectInvalidMath(s, "weight normalisation, w = g * v / |v|",
                    "layer.parametrizations.weight.original0");
}

// An op torch's own code made for the program's line: a distribution's log
// is its parameter's to fix, nn.MultiheadAttention's softmax over masked
// keys its key_padding_mask's; a transform's keeps its function's fix.
TEST(Diagnosis, AnOpInsideTorchsCodeIsFixedWhereTheProgramGaveItsArguments) {
  RunSummary s = NanLossRun(3, "aten::log", "", 16, 0, "#0 float32[16] max|x|=0.96", {0});
  s.first_origin->neginf = 5;
  s.first_origin->via = "Normal.log_prob (torch/distributions/normal.py:95)";
  ExpectInvalidMath(s, "the op is torch.distributions' own, in Normal.log_prob",
                    "keep the distribution's parameters inside their support");
  for (const std::string& f : Diagnose(s).fixes) EXPECT_FALSE(absl::StrContains(f, "clamp_min"));
  // A GPU origin has no line, nor code it was inside: its later findings'.
  s.first_origin->via.clear();
  s.first_origin_later_lines = {"train.py:29 in <module>, inside Normal.log_prob (...)"};
  s.first_origin_later_via = "Normal.log_prob (torch/distributions/normal.py:95)";
  ExpectInvalidMath(s, "the op is torch.distributions' own, in Normal.log_prob",
                    "keep the distribution's parameters inside their support");

  s = NanLossRun(3, "aten::_softmax", "aten::softmax", 1600, 800,
                 "#0 float32[16, 10, 10] max|x|=inf -inf=1280, put there by a mask", {0});
  s.first_origin->via = "multi_head_attention_forward (torch/nn/functional.py:7112)";
  ExpectInvalidMath(s, "the op is nn.MultiheadAttention's own",
                    "key_padding_mask that is True at the padding only");
  for (const std::string& f : Diagnose(s).fixes) EXPECT_FALSE(absl::StrContains(f, "finfo"));

  s = NanLossRun(3, "aten::atanh", "", 64, 0, "#0 float32[32, 2] max|x|=1", {0});
  s.first_origin->posinf = 11;
  s.first_origin->via = "TanhTransform._inverse (torch/distributions/transforms.py:728)";
  ExpectInvalidMath(s, "the op is torch.distributions' own, in TanhTransform._inverse",
                    "keep the argument inside (-1, 1)");
}

// A norm with eps=0 over a constant row: 1 / sqrt(0), then 0 * inf (CPU's
// rms_norm, op by op, shows its rsqrt's +inf). The norm's eps, not a
// denominator of the program's.
TEST(Diagnosis, ANormsNonFiniteIsItsEpsOfZeroOverAConstantRow) {
  struct Case {
    const char* op;
    const char* top_op;
    int64_t nan;
    const char* cause;
  };
  for (const Case& c : {Case{"aten::native_layer_norm", "aten::layer_norm", 384,
                             "layer and group normalisation divide by sqrt(var + eps)"},
                        Case{"aten::rsqrt", "aten::rms_norm", 0,
                             "RMS normalisation divides by sqrt(mean(x^2) + eps)"}}) {
    RunSummary s = NanLossRun(3, c.op, c.top_op, 1632, c.nan, "#0 float32[4, 12, 32] max|x|=3.4",
                              {0});
    s.first_origin->posinf = 12;
    ExpectInvalidMath(s, c.cause, "give the norm an eps > 0");
    for (const std::string& e : Diagnose(s).evidence) {
      EXPECT_FALSE(absl::StartsWith(e, "a division by 0")) << e;
    }
  }
  // A layer norm's +inf alone is no such row's, which 0 * inf makes NaN.
  RunSummary s = NanLossRun(3, "aten::native_layer_norm", "aten::layer_norm", 1632, 0,
                            "#0 float32[4, 12, 32] max|x|=3.4", {0});
  s.first_origin->posinf = 12;
  for (const std::string& e : Diagnose(s).evidence) {
    EXPECT_FALSE(absl::StrContains(e, "normalisation divide")) << e;
  }
}

// Inputs past 1.8e19: the variance passes fp32's range whatever the eps
// (nn.LayerNorm's default 1e-5 included), and the values had exploded
// before the norm. It said "give the norm an eps > 0" of a norm with one.
TEST(Diagnosis, ANormOverExplodedInputsIsTheirsNotItsEps) {
  for (const char* top_op : {"aten::layer_norm", "aten::rms_norm"}) {
    RunSummary s = NanLossRun(5, top_op == std::string("aten::layer_norm")
                                     ? "aten::native_layer_norm" : "aten::_fused_rms_norm",
                              top_op, 4608, 4352, "#0 float32[256, 16] max|x|=4.09374e+30", {0});
    const Diagnosis d = Diagnose(s);
    EXPECT_EQ(d.kind, "invalid_math") << top_op;
    EXPECT_TRUE(AnyStartsWith(d.evidence, "an input reached |x| = 4.09374e+30, past 1.8e19"))
        << ::testing::PrintToString(d.evidence);
    for (const std::string& e : d.evidence) {
      EXPECT_FALSE(absl::StrContains(e, "normalisation divide")) << e;
    }
    for (const std::string& f : d.fixes) EXPECT_FALSE(absl::StrContains(f, "eps > 0")) << f;
  }
  // float64 has the range for their squares: the eps is still the cause.
  RunSummary s = NanLossRun(5, "aten::native_layer_norm", "aten::layer_norm", 4608, 4352,
                            "#0 float64[256, 16] max|x|=4.09374e+30", {0});
  s.first_origin->dtype = "float64";
  ExpectInvalidMath(s, "layer and group normalisation divide", "give the norm an eps > 0");
}

// torch.logit(p, eps=1e-6) clamps at 1 - 1e-6, which is 1 in float16 and
// bfloat16: the eps to pass is one their spacing below 1 keeps.
TEST(Diagnosis, ALogitsEpsIsOneItsFormatHolds) {
  RunSummary s = NanLossRun(3, "aten::logit", "", 128, 0, "#0 float32[32, 4] max|x|=1", {0});
  s.first_origin->posinf = 1;
  ExpectInvalidMath(s, "logit(p) = log(p / (1 - p))", "torch.logit(p, eps=1e-6)");
  // Recomputed in fp32, whose clamp at 1 - 1e-6 is below 1, it is finite.
  for (const auto& [dtype, eps] : {std::pair{"float16", "eps=1e-3"}, {"bfloat16", "eps=1e-2"}}) {
    s.first_origin->dtype = dtype;
    s.first_origin->fp32_max_abs = 13.8155;
    ExpectInvalidMath(s, absl::StrCat("recomputed in fp32 it is finite and within ", dtype,
                                      "'s range (max|x| 13.8155): not ", dtype,
                                      "'s range but its precision, which put an argument on "
                                      "the function's singular point"),
                      absl::StrCat("torch.logit(p, ", eps, ")"));
    EXPECT_TRUE(absl::StrContains(Diagnose(s).fixes[0], "1 - 1e-6, enough in fp32, rounds to 1"));
  }
}

// log1p's edge is -1, not 0: log's clamp_min(eps) would make log1p(-p)
// log1p(eps) for every p.
TEST(Diagnosis, ALog1pIsKeptAboveMinusOneNotClampedAtEps) {
  RunSummary s = NanLossRun(3, "aten::log1p", "", 64, 0, "#0 float16[64, 1] max|x|=1", {0});
  s.first_origin->neginf = 5;
  ExpectInvalidMath(s, "log1p(x) = log(1 + x) is -inf at x = -1",
                    "torch.log1p(-p.clamp_max(1 - eps))");
  for (const std::string& f : Diagnose(s).fixes) EXPECT_FALSE(absl::StrContains(f, "clamp_min"));
}

// rsqrt's NaN is a negative argument's (a variance by hand, E[x^2] -
// E[x]^2 + eps); its +inf a division by 0.
TEST(Diagnosis, AnRsqrtsNanIsANegativeArgumentsAndItsInfAZeroOnes) {
  RunSummary s = NanLossRun(4, "aten::rsqrt", "", 32, 10, "#0 float32[32, 1] max|x|=2.99999", {0});
  ExpectInvalidMath(s, "a square root or fractional power of a negative number is NaN",
                    "torch.var");
  s.first_origin->nan = 0;
  s.first_origin->posinf = 10;
  ExpectInvalidMath(s, "a division by 0 is inf", "keep the denominator away from 0");
}

// Hyperbolic embeddings' distance of a point and itself: acosh of 1, or
// of a value rounded below it. acos's domain, [-1, 1], is acosh's NaN.
TEST(Diagnosis, AnAcoshAtOrBelowOneIsAHyperbolicDistancesNotAcossDomain) {
  RunSummary nan_run = NanLossRun(4, "aten::acosh", "", 256, 10, "#0 float32[16, 16] max|x|=2.6", {0});
  ExpectInvalidMath(nan_run, "acosh is NaN below 1", "torch.acosh(z.clamp_min(1 + 1e-5))");
  RunSummary s = InfiniteGradientAtStep2("aten::rsqrt", "aten::acosh", 22, 256,
                                         "#0 float32[16, 16] max|x|=0.14");
  ExpectInvalidMath(s, "the derivative of aten::acosh at 1 is infinite",
                    "torch.acosh(z.clamp_min(1 + 1e-5))");
  for (const RunSummary& run : {nan_run, s}) {
    for (const std::string& f : Diagnose(run).fixes) {
      EXPECT_FALSE(absl::StrContains(f, "1 - eps")) << f;
      EXPECT_FALSE(absl::StrContains(f, "denominator")) << f;
    }
  }
  // atanh at ±1 is infinite: the Poincare ball's boundary.
  RunSummary atanh = NanLossRun(4, "aten::atanh", "", 16, 0, "#0 float32[16] max|x|=1", {1});
  atanh.first_origin->posinf = 1;
  ExpectInvalidMath(atanh, "atanh is ±inf at ±1", "x.clamp(-1 + 1e-5, 1 - 1e-5) before atanh");
}

// ArcFace's acos of a cosine of exactly 1 (an fp16 cosine within 2.4e-4 of
// 1 rounds there): acos is 0, its derivative -1 / sqrt(1 - x^2) infinite,
// which rsqrt's backward computes. Not the program's division.
TEST(Diagnosis, AnArcCosinesInfiniteGradientAtOneIsItsDerivative) {
  RunSummary s = InfiniteGradientAtStep2("aten::rsqrt", "aten::acos", 1, 320,
                                         "#0 float32[32, 10] max|x|=0.99999994");
  ExpectInvalidMath(s, "the derivative of aten::acos at ±1 is infinite",
                    "keep the cosine inside (-1, 1) before the acos");
  const Diagnosis d = Diagnose(s);
  EXPECT_FALSE(AnyStartsWith(d.evidence, "a division by 0")) << ::testing::PrintToString(d.evidence);
  for (const std::string& f : d.fixes) EXPECT_FALSE(absl::StrContains(f, "denominator")) << f;
}

TEST(Diagnosis, AnFp32UpdateThatSquaresExplodedGradientsSaysTheyExploded) {
  // Adam's exp_avg_sq.addcmul_(grad, grad): gradients of 1.4e21, squared.
  RunSummary s;
  s.steps = 5;
  FindingRow f = UpdateFinding("origin", "aten::addcmul_", 0);
  f.dtype = "float32";
  f.inputs = "#0 float32[8, 16] max|x|=0; #1 float32[8, 16] max|x|=1.44807e+21; "
             "#2 float32[8, 16] max|x|=1.44807e+21";
  s.first_origin = f;
  s.nonfinite_steps = s.nonfinite_steps_kept = {0, 1, 2, 3, 4};
  Diagnosis d = Diagnose(s);
  ASSERT_EQ(d.kind, "invalid_math");
  EXPECT_NE(std::find(d.evidence.begin(), d.evidence.end(),
                      "an input reached |x| = 1.44807e+21, past 1.8e19, where a square or a "
                      "product passes fp32's range (3.4e38): the values had exploded before "
                      "this op; in the update, that is the gradients (Adam's second moment "
                      "squares them)"),
            d.evidence.end())
      << ::testing::PrintToString(d.evidence);
  EXPECT_TRUE(absl::StartsWith(d.fixes[0], "clip gradients before the update"))
      << ::testing::PrintToString(d.fixes);
  // In the forward pass the batch itself may have exploded: no gradient
  // clipping first.
  s.first_origin->phase = "forward";
  d = Diagnose(s);
  EXPECT_TRUE(absl::StartsWith(d.fixes[0], "find where the values grew"))
      << ::testing::PrintToString(d.fixes);

  // Inputs within range: no such claim.
  s.first_origin->inputs = "#0 float32[8, 16] max|x|=3e+18; #1 float32[8, 16] max|x|=inf";
  d = Diagnose(s);
  for (const std::string& e : d.evidence) EXPECT_FALSE(absl::StrContains(e, "exploded")) << e;
}

// Sinkhorn's scaling vectors grow past 1e30 within step 0's forward pass;
// the backward's product overflows fp32. Before any update, no gradient or
// learning rate grew them: the fix is the forward computation's, named.
TEST(Diagnosis, ValuesThatGrewBeforeAnyUpdateAreTheForwardPassOwn) {
  RunSummary s;
  s.steps = 3;
  FindingRow f = BackwardOrigin(0);
  f.op = f.forward_op = "aten::mul";
  f.dtype = "float32";
  f.inputs = "#0 float32[16, 16] max|x|=4.81633e+35; #1 float32[16, 1] max|x|=7.08934e+14";
  s.first_origin = f;
  s.nonfinite_steps = s.nonfinite_steps_kept = {0, 1, 2};
  FindingRow grew = f;
  grew.kind = "near_max";
  grew.op = "aten::div";
  grew.phase = "forward";
  grew.max_abs = 5.01e24;
  grew.source = "ot.py:38 in <module>";
  FindingRow earlier = grew;
  earlier.max_abs = 8.5e13;  // past fp16's limit, not fp32's square
  s.warnings = {earlier, grew};
  Diagnosis d = Diagnose(s);
  ASSERT_EQ(d.kind, "invalid_math");
  EXPECT_TRUE(AnyStartsWith(d.evidence,
                            "no update came before step 0: the values grew within its forward "
                            "pass, past 1.8e19 first in aten::div (forward) at ot.py:38 in "
                            "<module>, |x| = 5.01e+24"))
      << ::testing::PrintToString(d.evidence);
  EXPECT_TRUE(absl::StartsWith(d.fixes[0], "make the computation at ot.py:38 in <module> stable"))
      << ::testing::PrintToString(d.fixes);
  // A forward origin's fix looks at the batch already (a batch scaled by
  // 1e30 passes 1e19 in the forward pass too).
  s.first_origin->phase = "forward";
  d = Diagnose(s);
  EXPECT_TRUE(absl::StartsWith(d.fixes[0], "find where the values grew"))
      << ::testing::PrintToString(d.fixes);
  // After steps, the weights may be what grew (updates of torch.optim, or
  // the program's own, a torch.func loop's, in no optimizer phase).
  s.first_origin->phase = "backward";
  s.first_origin->step = s.warnings[1].step = 2;
  s.first_origin_phase_steps = {{0, "forward", 1.0, 0}, {1, "forward", 1.0, 0}};
  d = Diagnose(s);
  EXPECT_TRUE(absl::StartsWith(d.fixes[0], "clip gradients before the update"))
      << ::testing::PrintToString(d.fixes);
}

// model.half() and F.normalize: its clamp_min(1e-12) is clamp_min(0) in
// float16, and a padding row is 0 / 0. The eps is the cause, not a missing
// one: no "keep the denominator away from 0".
TEST(Diagnosis, ADivisionAfterAnEpsThatWasZeroInItsFormatNamesTheEps) {
  RunSummary s = NanLossRun(3, "aten::div", "", 48, 16, "#0 float16[2, 3, 8] max|x|=1.85", {0});
  s.first_origin->step = 0;
  s.first_origin->dtype = "float16";
  s.first_origin->fp32_max_abs = std::numeric_limits<double>::quiet_NaN();
  s.eps_rounded = {{0, "aten::clamp_min's 1e-12 is 0 in float16 (its smallest value is "
                       "5.96046e-08), at model.py:7 in forward"}};
  Diagnosis d = Diagnose(s);
  ASSERT_EQ(d.kind, "invalid_math");
  EXPECT_TRUE(AnyStartsWith(d.evidence, "an eps was 0 in float16 before it (step 0): "
                                        "aten::clamp_min's 1e-12"))
      << ::testing::PrintToString(d.evidence);
  EXPECT_TRUE(absl::StartsWith(d.fixes[0], "give that op an eps float16 holds")) << d.fixes[0];
  EXPECT_TRUE(absl::StrContains(d.fixes[0], "F.normalize(x, eps=1e-3)")) << d.fixes[0];
  for (const std::string& f : d.fixes) EXPECT_FALSE(absl::StrContains(f, "denominator")) << f;
  // An eps after the origin, or of another format, is no cause of it.
  s.eps_rounded[0].step = 1;
  for (const std::string& e : Diagnose(s).evidence) EXPECT_FALSE(absl::StartsWith(e, "an eps")) << e;
  s.eps_rounded[0] = {0, "aten::add's 1e-46 is 0 in float32 (its smallest value is 1.4e-45)"};
  for (const std::string& e : Diagnose(s).evidence) EXPECT_FALSE(absl::StartsWith(e, "an eps")) << e;
}

// F.cosine_similarity clamps each norm at its eps, 1e-8 by default: 0 in
// float16. Its fix is that function's eps argument, not F.normalize's;
// nn.CosineEmbeddingLoss has none to give.
TEST(Diagnosis, ACosineSimilarityWhoseEpsWasZeroNamesItsEpsArgument) {
  RunSummary s = NanLossRun(3, "aten::div", "aten::cosine_similarity", 48, 16,
                            "#0 float16[2, 3, 8] max|x|=1.85", {0});
  s.first_origin->step = 0;
  s.first_origin->dtype = "float16";
  s.first_origin->fp32_max_abs = std::numeric_limits<double>::quiet_NaN();
  s.eps_rounded = {{0, "aten::clamp_min_'s 1e-08 is 0 in float16 (its smallest value is "
                       "5.96046e-08), at model.py:7 in forward"}};
  const Diagnosis d = Diagnose(s);
  ASSERT_EQ(d.kind, "invalid_math");
  EXPECT_TRUE(absl::StartsWith(d.fixes[0], "give F.cosine_similarity an eps float16 holds: "
                                           "F.cosine_similarity(x1, x2, dim=-1, eps=1e-3)"))
      << d.fixes[0];
  for (const std::string& f : d.fixes) {
    EXPECT_FALSE(absl::StrContains(f, "F.normalize") || absl::StrContains(f, "denominator")) << f;
  }
  // nn.CosineEmbeddingLoss's 1e-12 is a constant of torch's: the loss by hand.
  s.first_origin->top_op = "aten::cosine_embedding_loss";
  s.eps_rounded[0].detail = "aten::add's 1e-12 is 0 in float16 (its smallest value is 5.96046e-08)";
  const std::string fix = Diagnose(s).fixes[0];
  EXPECT_TRUE(absl::StartsWith(fix, "compute the loss from F.cosine_similarity with an eps float16 "
                                    "holds: cos = F.cosine_similarity(x1, x2, dim=-1, eps=1e-3)"))
      << fix;
}

// model.half() and F.poisson_nll_loss(log_input=False) of a ReLU's rate:
// its log(rate + 1e-8) is log(0) in float16, finite in fp32 (22.7 at
// most). It said "produced values past fp16's 65504" and "run it in fp32".
TEST(Diagnosis, AnFp16ResultFiniteInFp32WithinRangeIsItsLostEpsNotAnOverflow) {
  RunSummary s = NanLossRun(3, "aten::poisson_nll_loss", "", 1, 1,
                            "#0 float16[64, 1] max|x|=0.93; #1 float16[64, 1] max|x|=11", {});
  s.first_origin->step = 0;
  s.first_origin->dtype = "float16";
  s.first_origin->fp32_max_abs = 22.6979;
  // An op of no singular point, with no eps that was 0: an overflow inside
  // it, not of its result.
  s.first_origin->op = "aten::mm";
  Diagnosis d = Diagnose(s);
  EXPECT_EQ(d.kind, "forward_overflow");
  EXPECT_TRUE(absl::StartsWith(d.title, "Forward overflow inside aten::mm at step 0: its result "
                                        "fits fp16 (fp32 gives at most 22.6979)"))
      << d.title;
  s.first_origin->op = "aten::poisson_nll_loss";
  s.eps_rounded = {{0, "aten::add's 1e-08 is 0 in float16 (its smallest value is 5.96046e-08)"}};
  d = Diagnose(s);
  ASSERT_EQ(d.kind, "invalid_math");
  EXPECT_TRUE(AnyStartsWith(d.evidence, "recomputed in fp32 it is finite and within float16's "
                                        "range (max|x| 22.6979)"))
      << ::testing::PrintToString(d.evidence);
  // The rate is not negative: the loss's own singular point is the eps's.
  for (const std::string& e : d.evidence) EXPECT_FALSE(absl::StrContains(e, "negative")) << e;
  EXPECT_TRUE(absl::StartsWith(d.fixes[0], "give F.poisson_nll_loss an eps float16 holds: "
                                           "F.poisson_nll_loss(rate, target, log_input=False, "
                                           "eps=1e-3)"))
      << d.fixes[0];
  // Past fp16's range in fp32 it is an overflow, eps or not.
  s.first_origin->fp32_max_abs = 1e6;
  EXPECT_EQ(Diagnose(s).kind, "forward_overflow");
}

TEST(Diagnosis, AnFp16UpdateThatDividesByItsStateIsTheOptimizersState) {
  RunSummary s;
  s.steps = 5;
  s.first_origin = UpdateFinding("origin", "aten::_foreach_addcdiv_", 0);
  s.nonfinite_steps = s.nonfinite_steps_kept = {0, 1, 2, 3, 4};
  Diagnosis d = Diagnose(s);
  EXPECT_EQ(d.kind, "fp16_optimizer_state");
  EXPECT_EQ(d.op, "aten::_foreach_addcdiv_");
  // bf16 state holds eps and small squares; SGD's update divides nothing.
  s.first_origin->dtype = "bfloat16";
  EXPECT_NE(Diagnose(s).kind, "fp16_optimizer_state");
  s.first_origin->dtype = "float16";
  s.first_origin->op = "aten::_foreach_add_";
  EXPECT_EQ(Diagnose(s).kind, "backward_overflow");
}

// Under a loss scaler, fp32 gradients (autocast's parameter gradients) are
// as large as the scale made them: no forecast that the model's values
// would overflow in fp16. A forward fp32 value past the threshold still is.
TEST(Diagnosis, AWiderFormatsScaledGradientIsNoForecast) {
  RunSummary s;
  s.steps = 30;
  for (int64_t step = 0; step < 30; ++step) s.loss_scale.push_back({step, 65536.0, step < 2});
  s.skipped_steps = {0, 1};
  s.first_origin = BackwardOrigin(0);
  s.nonfinite_steps = s.nonfinite_steps_kept = {0, 1};
  FindingRow gradient = BackwardOrigin(5);
  gradient.kind = "near_max";
  gradient.posinf = 0;
  gradient.dtype = "float32";
  gradient.max_abs = 3.2e6;
  s.warnings = {gradient};
  Diagnosis d = Diagnose(s);
  ASSERT_EQ(d.kind, "healthy");
  for (const std::string& line : d.evidence) {
    EXPECT_EQ(line.find("float32 values of"), std::string::npos) << line;
  }
  FindingRow forward = gradient;
  forward.phase = "forward";
  forward.max_abs = 70000;
  forward.top_op = "aten::matmul";  // named with the op it ran in
  s.warnings = {gradient, forward};
  d = Diagnose(s);
  EXPECT_NE(std::find(d.evidence.begin(), d.evidence.end(),
                      "float32 values of aten::mm in aten::matmul (forward) reached |x| = 70000 at step 5: past "
                      "fp16's near-max threshold, safe as they run"),
            d.evidence.end())
      << ::testing::PrintToString(d.evidence);
}

// A script that never stepped an optimizer has no steps to count.
TEST(Diagnosis, AHealthyRunSaysHowManyStepsItCheckedOnlyWhenItHadSome) {
  RunSummary s;
  EXPECT_EQ(Diagnose(s).evidence.front(), "every checked output was finite");
  s.steps = 1;
  EXPECT_EQ(Diagnose(s).evidence.front(), "every checked output of 1 step was finite");
  s.steps = 12;
  EXPECT_EQ(Diagnose(s).evidence.front(), "every checked output of 12 steps was finite");
  // An evaluation script: its steps are forward passes.
  s.forward_passes = true;
  EXPECT_EQ(Diagnose(s).evidence.front(), "every checked output of 12 forward passes was finite");
  EXPECT_NE(RenderText(s, 100, false).find("12 forward passes, no training"), std::string::npos);
  s.steps = 1;
  EXPECT_EQ(Diagnose(s).evidence.front(), "every checked output of 1 forward pass was finite");
}

// A GPU result has no fp32 recomputation to tell overflow from the
// function's own inf/NaN. Functions whose values stay in range (a softmax,
// a log, a square root), and NaN alone (an overflow gives ±inf), are the
// function's; an fp16 division's or exp's inf may be range.
TEST(Diagnosis, WithoutRecomputationBoundedFunctionsAndNaNAloneAreNoOverflow) {
  const auto diagnose = [](const char* op, int64_t nan, int64_t posinf, int64_t neginf) {
    RunSummary s;
    s.steps = 3;
    FindingRow f;
    f.kind = "origin";
    f.op = op;
    f.phase = "forward";
    f.dtype = "float16";
    f.step = 1;
    f.nan = nan;
    f.posinf = posinf;
    f.neginf = neginf;
    f.inputs = "#0 Half[4, 4] on the GPU";
    s.first_origin = f;
    s.nonfinite_steps = s.nonfinite_steps_kept = {1, 2};
    return Diagnose(s);
  };
  Diagnosis d = diagnose("aten::_softmax", 4, 0, 0);
  EXPECT_EQ(d.kind, "invalid_math");
  EXPECT_NE(std::find(d.evidence.begin(), d.evidence.end(),
                      "aten::_softmax cannot overflow: its values stay within fp16's range, so "
                      "more range would not help"),
            d.evidence.end())
      << ::testing::PrintToString(d.evidence);
  EXPECT_EQ(diagnose("aten::log", 0, 0, 2).kind, "invalid_math");
  EXPECT_EQ(diagnose("aten::sqrt", 3, 0, 0).kind, "invalid_math");
  d = diagnose("aten::div", 1, 0, 0);  // 0/0
  EXPECT_EQ(d.kind, "invalid_math");
  EXPECT_NE(std::find(d.evidence.begin(), d.evidence.end(),
                      "only NaN came out, and an overflow gives ±inf: more range would not help"),
            d.evidence.end())
      << ::testing::PrintToString(d.evidence);
  EXPECT_EQ(diagnose("aten::div", 1, 2, 0).kind, "forward_overflow");  // x / 1e-6 too
  EXPECT_EQ(diagnose("aten::exp", 0, 5, 0).kind, "forward_overflow");
  EXPECT_EQ(diagnose("aten::mm", 0, 5, 0).kind, "forward_overflow");
}

TEST(Diagnosis, ARunningStatisticThatOverflowedIsBatchNormsBuffers) {
  RunSummary s;
  s.steps = 6;
  FindingRow f = UpdateFinding("origin", "aten::native_batch_norm", 3);
  f.top_op = "aten::batch_norm";
  f.phase = "forward";
  f.source = "train.py:10 in <module>";
  f.outputs =
      "float16[64, 32] max|x|=3.17383; float16[32] max|x|=330.25; float16[32] "
      "max|x|=0.000798702; float16[32] (running_mean, updated in place) max|x|=33.0312; "
      "float16[32] (running_var, updated in place) max|x|=inf +inf=32";
  s.first_origin = f;
  Diagnosis d = Diagnose(s);
  EXPECT_EQ(d.kind, "fp16_running_statistics");
  EXPECT_EQ(d.op, "aten::batch_norm");
  EXPECT_TRUE(absl::StartsWith(d.title, "Batch norm's running_var overflowed in float16 (step 3)"))
      << d.title;
  ASSERT_FALSE(d.fixes.empty());
  EXPECT_TRUE(absl::StrContains(d.fixes[0], "m.float()")) << d.fixes[0];
  // NANHUNT_FP32_OPS would write fp32 results back into fp16 buffers.
  for (const std::string& fix : d.fixes) EXPECT_FALSE(absl::StrContains(fix, "FP32_OPS")) << fix;

  // The normalised output overflowing is an ordinary forward overflow.
  s.first_origin->outputs =
      "float16[64, 32] max|x|=inf +inf=32; float16[32] (running_var, updated in place) "
      "max|x|=0.5";
  EXPECT_EQ(Diagnose(s).kind, "forward_overflow");

  // Read, never made in this run: the model came with it, not the data.
  s.first_origin->kind = "input";
  s.first_origin->inputs =
      "#0 float16[16, 3] max|x|=99.6875; #4 float16[3] (running_var) max|x|=inf +inf=1";
  d = Diagnose(s);
  EXPECT_EQ(d.kind, "nonfinite_input");
  EXPECT_EQ(d.title, "Non-finite values came in with the model: batch norm's running_var held "
                     "inf/NaN");
  s.first_origin->inputs = "#0 float16[16, 3] max|x|=inf +inf=1; #4 float16[3] (running_var) "
                           "max|x|=0.5";
  EXPECT_EQ(Diagnose(s).title, "Non-finite values came in with the data, not from an op");
}

TEST(Diagnosis, InfNanAModelOrOptimizerCameWithAreTheCheckpointsNotTheData) {
  RunSummary s;
  s.steps = 3;
  FindingRow f = UpdateFinding("input", "aten::linear", 0);
  f.phase = "forward";
  f.source = "train.py:14 in <module>";
  f.inputs = "#0 float16[32, 16] max|x|=2.35; #1 float32[1, 16] (parameter 2.weight) "
             "max|x|=0.24 nan=1; #2 float32[1] max|x|=0.04";
  s.first_origin = f;
  Diagnosis d = Diagnose(s);
  EXPECT_EQ(d.kind, "nonfinite_input");
  EXPECT_EQ(d.op, "aten::linear");
  EXPECT_EQ(d.title, "The model's parameters brought NaN, not the data");
  ASSERT_FALSE(d.evidence.empty());
  EXPECT_TRUE(absl::StartsWith(d.evidence[0], "step 0: aten::linear (forward) read parameter "
                                              "2.weight, whose inf/NaN no op of this run had "
                                              "made, at train.py:14"))
      << d.evidence[0];
  ASSERT_EQ(d.fixes.size(), 3u);
  EXPECT_TRUE(absl::StrContains(d.fixes[0], "model.named_parameters()")) << d.fixes[0];

  // Several, of both kinds: the first three are named.
  s.first_origin->inputs =
      "#0 float32[4] (buffer a) max|x|=inf +inf=1; #1 float32[4] (parameter b) nan=1; "
      "#2 float32[4] (parameter c) nan=2; #3 float32[4] (parameter d) nan=1";
  d = Diagnose(s);
  EXPECT_EQ(d.title, "The model's parameters and buffers brought inf and NaN, not the data");
  EXPECT_TRUE(absl::StrContains(d.evidence[0], "read buffer a, parameter b, parameter c and 1 "
                                               "more,"))
      << d.evidence[0];

  // Copied into a parameter (load_state_dict converting an fp16 checkpoint).
  s.first_origin->op = "aten::copy_";
  s.first_origin->inputs = "#1 float16[1, 16] (copied into parameter 2.weight) max|x|=0.24 nan=1";
  d = Diagnose(s);
  EXPECT_EQ(d.title, "The model's parameters were loaded with NaN; the data is not to blame");
  EXPECT_TRUE(absl::StartsWith(d.evidence[0], "step 0: aten::copy_ (forward) copied inf/NaN into "
                                              "parameter 2.weight from a tensor no op"))
      << d.evidence[0];
  EXPECT_TRUE(absl::StartsWith(d.fixes[0], "find them in the checkpoint")) << d.fixes[0];

  // An optimizer's state: the advice is to start it afresh.
  s.first_origin = UpdateFinding("input", "aten::mul_", 0);
  s.first_origin->inputs =
      "#0 float32[1, 16] (Adam state exp_avg_sq of 2.weight) max|x|=inf +inf=1; #1 float64[] "
      "max|x|=0.999";
  d = Diagnose(s);
  EXPECT_EQ(d.title, "The optimizer's state brought inf, not the data");
  ASSERT_FALSE(d.fixes.empty());
  EXPECT_TRUE(absl::StartsWith(d.fixes[0], "keep the model and start the optimizer afresh"))
      << d.fixes[0];

  // Unnamed, in an update: no batch goes into one.
  s.first_origin->inputs = "#0 float32[1, 16] max|x|=inf +inf=1; #1 float64[] max|x|=0.999";
  EXPECT_EQ(Diagnose(s).title, "Non-finite values came into the optimizer step, not from an op");

  // A finite named tensor beside a batch that holds NaN: the data.
  s.first_origin = f;
  s.first_origin->inputs = "#0 float16[32, 16] max|x|=2.35 nan=3; #1 float32[1, 16] "
                           "(parameter 2.weight) max|x|=0.24";
  EXPECT_EQ(Diagnose(s).title, "Non-finite values came in with the data, not from an op");

  // Sample mode: an op it did not check may have made them.
  s.first_origin->inputs = f.inputs;
  s.op_sampling = "torch";
  EXPECT_EQ(Diagnose(s).kind, "unchecked_maker");
}

TEST(Diagnosis, AnFp16GradientNormThatOverflowedIsTheClippingsNotTheGradients) {
  RunSummary s;
  s.steps = 4;
  FindingRow f = UpdateFinding("origin", "aten::linalg_vector_norm", 0);
  f.top_op = "aten::_foreach_norm";
  f.fp32_max_abs = 102335;
  f.source = "train.py:13 in <module>";
  f.inputs = "#0 float16[1024, 1024] max|x|=100";
  s.first_origin = f;
  Diagnosis d = Diagnose(s);
  EXPECT_EQ(d.kind, "fp16_gradient_norm");
  EXPECT_EQ(d.op, "aten::_foreach_norm");
  EXPECT_TRUE(absl::StrContains(d.evidence[0], "(recomputed in fp32 it is 102335), at train.py:13"))
      << d.evidence[0];
  // "Clip gradients" is what overflowed: never the advice here.
  for (const std::string& fix : d.fixes) {
    EXPECT_FALSE(absl::StartsWith(fix, "clip gradients")) << fix;
    EXPECT_FALSE(absl::StrContains(fix, "SKIP_NONFINITE")) << fix;
  }
  // A forward norm (a layer's) is a forward overflow; fp32 norms are no fp16 problem.
  s.first_origin->phase = "forward";
  EXPECT_EQ(Diagnose(s).kind, "forward_overflow");
  s.first_origin->phase = "optimizer";
  s.first_origin->op = "aten::mul";
  s.first_origin->top_op = "";
  d = Diagnose(s);
  EXPECT_EQ(d.kind, "backward_overflow");
  EXPECT_TRUE(absl::StrContains(d.evidence[0], ", called at train.py:13")) << d.evidence[0];
}


// torch.arange(n, dtype=torch.float16) of positions past 65504: no op grew
// past the range, and neither NANHUNT_FP32_OPS nor autocast changes the
// dtype the code asked for.
FindingRow MadeFromNumbersOrigin(const char* op, int64_t posinf, int64_t neginf) {
  FindingRow f;
  f.kind = "origin";
  f.op = f.top_op = op;
  f.phase = "forward";
  f.dtype = "float16";
  f.step = 3;
  f.elements = 70000;
  f.posinf = posinf;
  f.neginf = neginf;
  f.source = "rope.py:12 in _grow";
  return f;
}

TEST(Diagnosis, ValuesMadeFromTheProgramsNumbersAreTheCodesDtypeNotAnOpToRunInFp32) {
  RunSummary s;
  s.steps = 8;
  s.fp16_updates = true;
  s.first_origin = MadeFromNumbersOrigin("aten::arange", 4472, 0);
  Diagnosis d = Diagnose(s);
  EXPECT_EQ(d.kind, "forward_overflow");
  EXPECT_EQ(d.op, "aten::arange");
  EXPECT_EQ(d.title, "Forward overflow: aten::arange was asked for float16 values past 65504 at "
                     "step 3");
  const std::string evidence = absl::StrJoin(d.evidence, " | ");
  EXPECT_TRUE(absl::StrContains(evidence, "made a float16 sequence of 70000 values from the "
                                          "program's numbers, +inf=4472 of them past 65504"))
      << evidence;
  EXPECT_TRUE(absl::StrContains(evidence, "counts whole numbers exactly only up to 2048"));
  EXPECT_TRUE(absl::StrContains(evidence, "dtype=self.inv_freq.dtype"));
  EXPECT_FALSE(absl::StrContains(evidence, "as activations grew"));
  ASSERT_EQ(d.fixes.size(), 1u);
  EXPECT_TRUE(absl::StartsWith(d.fixes[0], "make it in float32 (torch.arange(n, "
                                           "dtype=torch.float32))"))
      << d.fixes[0];
  EXPECT_TRUE(absl::StrContains(d.fixes[0], "at rope.py:12 in _grow"));

  // A heavy-tailed draw in an autocast run: its own fixes, bf16 allowed.
  s.fp16_updates = false;
  s.first_origin = MadeFromNumbersOrigin("aten::cauchy_", 58, 45);
  d = Diagnose(s);
  EXPECT_EQ(d.title, "Forward overflow: aten::cauchy_ was asked for float16 values past 65504 "
                     "at step 3");
  EXPECT_TRUE(absl::StrContains(d.evidence[0], "random draw of 70000 values from the program's "
                                               "numbers, +inf=58 -inf=45 of them"))
      << d.evidence[0];
  EXPECT_EQ(d.evidence.size(), 2u);  // no buffer's dtype, no whole numbers
  ASSERT_EQ(d.fixes.size(), 2u);
  EXPECT_TRUE(absl::StartsWith(d.fixes[0], "draw in float32")) << d.fixes[0];
  EXPECT_EQ(d.fixes[1], "or draw in bfloat16 (float32's range)");

  // Not an op of the program's numbers, or not float16's range: the
  // generic forward overflow.
  for (FindingRow f : {MadeFromNumbersOrigin("aten::mul", 5, 0),
                       MadeFromNumbersOrigin("aten::arange", 5, 0)}) {
    if (f.op == "aten::arange") f.dtype = "bfloat16";
    s.first_origin = f;
    d = Diagnose(s);
    EXPECT_FALSE(absl::StrContains(d.title, "was asked for")) << f.op << " " << f.dtype;
  }
}

// A softmax over rows masked entirely, whose -inf was -1e9 in float16: the
// fix is a mask float16 holds, put in place; without that event, the
// softmax's own advice.
TEST(Diagnosis, ARowMaskedEntirelyByANumberPastFloat16sRangeNamesThatNumber) {
  FindingRow f;
  f.kind = "origin";
  f.op = "aten::_softmax";
  f.top_op = "aten::softmax";
  f.phase = "forward";
  f.dtype = "float16";
  f.step = 1;
  f.elements = 72;
  f.nan = 36;
  f.inputs = "#0 float16[2, 6, 6] max|x|=inf -inf=48, put there by a mask";
  RunSummary s;
  s.steps = 3;
  s.first_origin = f;
  const std::string told =
      "aten::mul made -inf of the program's 1e+09, past float16's largest value (65504), at "
      "m.py:9 in <module>";
  s.mask_literals = {{0, told}, {0, "aten::mul made -inf of the program's 1e+40, past "
                                   "float32's largest value (3.40282e+38)"}};
  Diagnosis d = Diagnose(s);
  ASSERT_EQ(d.kind, "invalid_math");
  EXPECT_TRUE(std::find(d.evidence.begin(), d.evidence.end(),
                        "the mask's -inf was a number the program wrote past float16's range "
                        "(step 0): " + told) != d.evidence.end())
      << absl::StrJoin(d.evidence, " | ");
  EXPECT_TRUE(absl::StartsWith(d.fixes[0], "put torch.finfo(scores.dtype).min in the masked "
                                           "places, scores.masked_fill(~keep, "
                                           "torch.finfo(scores.dtype).min) (-65504 in float16)"))
      << d.fixes[0];
  EXPECT_FALSE(absl::StrContains(absl::StrJoin(d.fixes, " | "), "keep at least one position of "
                                                                "every row unmasked, or put"));
  // Told of another format, or after the softmax's step: its own advice.
  s.mask_literals.erase(s.mask_literals.begin());
  s.mask_literals.push_back({2, told});
  d = Diagnose(s);
  EXPECT_TRUE(absl::StartsWith(d.fixes[0], "keep at least one position of every row unmasked"))
      << d.fixes[0];
}

}  // namespace
}  // namespace nanhunt
