// What the updates' growth before a first origin says (a diverging run, or
// a batch that jumped while the weights stayed put), and the fix for an
// exponential that left its format's range.
#include "viewer/diagnosis_growth.h"

#include <algorithm>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "viewer/diagnosis_math.h"

namespace nanhunt {
namespace {

// The optimizer phase's max |x| at steps 0, 1, ...
std::vector<PhaseStep> Updates(const std::vector<double>& max_abs) {
  std::vector<PhaseStep> steps;
  for (size_t i = 0; i < max_abs.size(); ++i) {
    steps.push_back({static_cast<int64_t>(i), "forward", 10.0, 0});
    steps.push_back({static_cast<int64_t>(i), "optimizer", max_abs[i], 0});
  }
  return steps;
}

// An fp16 matmul that overflowed under autocast at `step`.
RunSummary MatmulOverflowAt(int64_t step, std::vector<PhaseStep> phase_steps) {
  FindingRow f;
  f.kind = "origin";
  f.op = "aten::addmm";
  f.top_op = "aten::linear";
  f.phase = "forward";
  f.dtype = "float16";
  f.step = step;
  f.neginf = 117;
  f.elements = 256;
  f.fp32_max_abs = 7.3e8;
  f.inputs = "#0 float16[1] max|x|=262.25; #1 float16[256, 64] max|x|=27600";
  RunSummary s;
  s.steps = step + 5;
  s.first_origin = f;
  s.nonfinite_steps = s.nonfinite_steps_kept = {step};
  s.first_origin_phase_steps = std::move(phase_steps);
  return s;
}

TEST(Divergence, UpdatesGrowingTenfoldAStepAreTheDiagnosisWhicheverOpOverflowed) {
  RunSummary s = MatmulOverflowAt(4, Updates({0.82, 1.41, 19.46, 4775.67, 7e9}));
  // The origin's own step (7e9) is not before it.
  Diagnosis d = Diagnose(s);
  ASSERT_EQ(d.kind, "diverged") << d.title;
  EXPECT_EQ(d.title, "Training diverged: updates grew until aten::addmm made inf/NaN at step 4");
  EXPECT_EQ(d.op, "aten::addmm");
  EXPECT_EQ(d.evidence[1],
            "the updates grew step after step before it: the optimizer's outputs (the weights "
            "and its state) reached max|x| 0.82 at step 0, 19.46 at step 2, 4775.67 at step 3. "
            "The training diverged, each update larger than the last; no single batch jumped");
  EXPECT_TRUE(absl::StartsWith(d.fixes[0], "lower the learning rate")) << d.fixes[0];
  for (const std::string& fix : d.fixes) {
    EXPECT_FALSE(absl::StrContains(fix, "NANHUNT_FP32_OPS")) << fix;
  }

  // Without the updates' values it is the overflow it was before.
  s.first_origin_phase_steps.clear();
  EXPECT_EQ(Diagnose(s).kind, "forward_overflow");
}

TEST(Divergence, ALongGrowthShowsItsStartAndItsLastMilestones) {
  const RunSummary s =
      MatmulOverflowAt(9, Updates({1, 2, 30, 400, 5e3, 6e4, 7e5, 8e6, 9e7}));
  const std::optional<UpdateGrowth> g = UpdatesBefore(s, *s.first_origin);
  ASSERT_TRUE(g && g->diverged);
  EXPECT_TRUE(absl::StrContains(g->evidence, "max|x| 1 at step 0, 60000 at step 5, 700000 at "
                                             "step 6, 8e+06 at step 7, 9e+07 at step 8."))
      << g->evidence;
}

TEST(Divergence, AdamsStepCounterGrowingByOneIsNoDivergence) {
  // Adam's step counter is an optimizer output: 1, 2, ..., 500. A
  // five-hundredfold growth, but not tenfold in its last steps.
  std::vector<double> counter;
  for (int i = 1; i <= 500; ++i) counter.push_back(i);
  const RunSummary s = MatmulOverflowAt(500, Updates(counter));
  EXPECT_FALSE(UpdatesBefore(s, *s.first_origin).has_value());
  EXPECT_EQ(Diagnose(s).kind, "forward_overflow");
}

TEST(Divergence, UpdatesThatStayedPutPointAtTheBatch) {
  RunSummary s = MatmulOverflowAt(5, Updates({0.25, 0.26, 0.255, 0.27, 0.26}));
  s.first_origin->op = "aten::mse_loss";
  s.first_origin->top_op.clear();
  s.first_origin->dtype = "float32";
  s.first_origin->fp32_max_abs.reset();
  s.first_origin->inputs = "#0 float32[256, 1] max|x|=1.20741e+30; #1 float32[256, 1] "
                           "max|x|=11.6803";
  Diagnosis d = Diagnose(s);
  ASSERT_EQ(d.kind, "invalid_math");
  EXPECT_NE(std::find(d.evidence.begin(), d.evidence.end(),
                      "the updates did not grow before it: the optimizer's outputs stayed "
                      "between max|x| 0.25 and 0.27 over steps 0-4, so the values grew within "
                      "step 5, from what it was given (its batch) or computed"),
            d.evidence.end())
      << ::testing::PrintToString(d.evidence);
  EXPECT_TRUE(absl::StartsWith(d.fixes[0], "look at the batch of step 5")) << d.fixes[0];

  // In the backward pass the batch is no likelier than the gradients.
  s.first_origin->phase = "backward";
  EXPECT_FALSE(UpdatesBefore(s, *s.first_origin).has_value());
}

TEST(Divergence, FewerThanThreeFiniteUpdatesSayNothing) {
  RunSummary s = MatmulOverflowAt(2, Updates({0.5, 400}));
  EXPECT_FALSE(UpdatesBefore(s, *s.first_origin).has_value());
  // Updates with inf/NaN of their own are no growth to measure.
  s = MatmulOverflowAt(4, Updates({0.5, 4, 400, 4e5}));
  for (PhaseStep& p : s.first_origin_phase_steps) {
    if (p.step >= 1 && p.phase == "optimizer") p.nonfinite = 3;
  }
  EXPECT_FALSE(UpdatesBefore(s, *s.first_origin).has_value());
}

TEST(Divergence, AWarnedDivergenceWithoutNaNYetIsDivergingAndItsNaNSaysItWasWarned) {
  const StepEvent warned = {3, "the updates grew from max|x| 0.82 at step 0 to 4782.83 at step 3"};
  RunSummary healthy;
  healthy.steps = 4;
  healthy.diverging = {warned};
  const Diagnosis d = Diagnose(healthy);
  ASSERT_EQ(d.kind, "diverging") << d.title;
  EXPECT_EQ(d.title,
            "Diverging: the updates grow tenfold within three steps (from step 3); no inf/NaN yet");
  EXPECT_EQ(d.evidence[0], "step 3: " + warned.detail);
  EXPECT_TRUE(absl::StartsWith(d.fixes[0], "lower the learning rate")) << d.fixes[0];

  // A GradScaler run whose every overflow it skipped while its scale
  // settled: healthy, but for the divergence.
  RunSummary scaled = healthy;
  FindingRow skipped;
  skipped.kind = "origin";
  skipped.op = "aten::mm";
  skipped.phase = "backward";
  skipped.dtype = "float16";
  skipped.step = 0;
  skipped.posinf = 3;
  scaled.first_origin = skipped;
  scaled.nonfinite_steps = scaled.nonfinite_steps_kept = {0};
  scaled.skipped_steps = {0};
  scaled.loss_scale = {{0, 32768, 1}, {1, 32768, 0}, {2, 32768, 0}, {3, 32768, 0}};
  const Diagnosis settled = Diagnose(scaled);
  EXPECT_EQ(settled.kind, "diverging") << settled.title;
  EXPECT_TRUE(absl::EndsWith(settled.title, "; every inf/NaN so far was in skipped gradients"))
      << settled.title;

  RunSummary nan = MatmulOverflowAt(4, Updates({0.82, 1.41, 19.46, 4775.67}));
  nan.diverging = {warned};
  const Diagnosis later = Diagnose(nan);
  ASSERT_EQ(later.kind, "diverged");
  EXPECT_NE(std::find(later.evidence.begin(), later.evidence.end(),
                      "nanhunt warned live that the training was diverging at step 3 (" +
                          warned.detail + "), 1 step before the first inf/NaN"),
            later.evidence.end())
      << ::testing::PrintToString(later.evidence);
}

FindingRow ExpOf(const char* op, const char* dtype) {
  FindingRow f;
  f.op = op;
  f.dtype = dtype;
  f.inputs = "#0 float16[64, 8] max|x|=35.6562";
  return f;
}

TEST(ExponentialFix, NamesTheArgumentWhereEachFormatOverflows) {
  EXPECT_TRUE(absl::StartsWith(ExponentialFix(ExpOf("aten::exp", "float16")),
                               "exp passes float16's range from x = 11.09 on (here its input "
                               "reached |x| = 35.6562): "));
  EXPECT_TRUE(absl::StartsWith(ExponentialFix(ExpOf("aten::exp_", "bfloat16")),
                               "exp passes bfloat16's range from x = 88.72 on"));
  EXPECT_TRUE(absl::StartsWith(ExponentialFix(ExpOf("aten::exp2", "float16")),
                               "exp2 passes float16's range from x = 16.00 on"));
  EXPECT_TRUE(absl::StartsWith(ExponentialFix(ExpOf("aten::expm1", "float32")),
                               "expm1 passes float32's range from x = 88.72 on"));
  EXPECT_EQ(ExponentialFix(ExpOf("aten::expand", "float16")), "");
  EXPECT_EQ(ExponentialFix(ExpOf("aten::sum", "float16")), "");
}

}  // namespace
}  // namespace nanhunt
