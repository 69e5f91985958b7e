// What `nanhunt view`'s text says of warnings before overflow: grouped by
// op, phase and dtype, shortened to the width without losing which.
#include <string>

#include "gtest/gtest.h"
#include "viewer/summary.h"
#include "viewer/trace_reader.h"

namespace nanhunt {
namespace {

FindingRow Warning(std::string op, std::string phase, std::string dtype, int64_t step,
                   double max_abs) {
  FindingRow f;
  f.kind = "near_max";
  f.op = std::move(op);
  f.phase = std::move(phase);
  f.dtype = std::move(dtype);
  f.step = step;
  f.max_abs = max_abs;
  return f;
}

// A GradScaler grows its scale until the gradients overflow: their size
// is the scale's, which the line beside them says.
TEST(SummaryText, GradientsUnderALossScalerAreSaidToBeScaled) {
  RunSummary s;
  s.steps = 4;
  for (int64_t step = 0; step < 4; ++step) s.loss_scale.push_back({step, 65536.0, false});
  s.warnings = {Warning("aten::mm", "backward", "float16", 1, 30000),
                Warning("aten::addmm", "forward", "float16", 2, 20000)};
  std::string text = RenderText(s, 100, false);
  EXPECT_NE(text.find("aten::mm  backward float16, scaled by the loss scale\n"),
            std::string::npos) << text;
  EXPECT_NE(text.find("aten::addmm  forward float16\n"), std::string::npos) << text;
  // Without a scaler, a backward value is the model's own.
  s.loss_scale.clear();
  text = RenderText(s, 100, false);
  EXPECT_EQ(text.find("scaled by the loss scale"), std::string::npos) << text;
  EXPECT_NE(text.find("aten::mm  backward float16\n"), std::string::npos) << text;
}

// A GPU origin's line cannot be read after the op returned: the first
// finding has none, the op's later ones have its line, and the torch code
// it was inside; propagations included, as a forward op's first NaN
// reaches it again at the next steps.
TEST(SummaryText, AFirstOriginWithoutALineShowsItsOpsLaterLines) {
  Trace t;
  t.path = "gpu.sqlite";
  FindingRow first;
  first.kind = "origin";
  first.op = "aten::log";
  first.phase = "forward";
  first.neginf = 5;
  FindingRow later = first;
  later.kind = "propagated";
  later.step = 1;
  later.source = "train.py:29 in <module>";
  later.via = "Normal.log_prob (torch/distributions/normal.py:95)";
  FindingRow other = later;
  other.op = "aten::mul";
  other.source = "train.py:30 in <module>";
  t.findings = {first, later, other};
  const RunSummary s = Summarise({t});
  EXPECT_EQ(s.first_origin_later_via, "Normal.log_prob (torch/distributions/normal.py:95)");
  const std::string text = RenderText(s, 120, false);
  EXPECT_NE(text.find("          called at (lines of this op's later findings, from step 1 on):\n"
                      "            train.py:29 in <module>, inside Normal.log_prob "
                      "(torch/distributions/normal.py:95)\n  then:"),
            std::string::npos) << text;
  EXPECT_EQ(text.find("train.py:30"), std::string::npos) << text;
}

// A "compiled" first finding names the region it came out of; a GPU
// origin after a region says the region may have made what it passed on.
TEST(SummaryText, TheFirstFindingNamesTheCompiledRegionBeforeIt) {
  RunSummary s;
  s.steps = 1;
  FindingRow f;
  f.kind = "compiled";
  f.op = "aten::mean";
  f.phase = "forward";
  f.compiled_region = "Torch-Compiled Region: 0/0, called at train.py:11 in <module>";
  s.first_origin = f;
  std::string text = RenderText(s, 100, false);
  EXPECT_NE(text.find("compiled  aten::mean  forward  step 0\n"
                      "          non-finite values came out of a torch.compile region"),
            std::string::npos) << text;
  EXPECT_NE(text.find("          region Torch-Compiled Region: 0/0, called at train.py:11"),
            std::string::npos) << text;
  f.kind = "origin";
  s.first_origin = f;
  text = RenderText(s, 100, false);
  EXPECT_NE(text.find("          after Torch-Compiled Region: 0/0, called at train.py:11 in "
                      "<module>\n          (on a GPU its inputs were not read"),
            std::string::npos) << text;
}

// Flash attention's label is longer than the width: the label is cut,
// never the phase and dtype after it, in both warning sections.
TEST(SummaryText, ALongOpLabelIsShortenedNotItsPhaseAndDtype) {
  const std::string flash = "aten::_scaled_dot_product_flash_attention_for_cpu";
  RunSummary s;
  s.steps = 1;
  FindingRow fp16 = Warning(flash, "forward", "float16", 0, 30000);
  fp16.top_op = "aten::scaled_dot_product_attention";
  FindingRow fp32 = fp16;
  fp32.dtype = "float32";
  fp32.max_abs = 113916;
  s.warnings = {fp16, fp32};
  const std::string text = RenderText(s, 60, false);
  EXPECT_NE(text.find("~  forward float16\n    step 0 46%"), std::string::npos) << text;
  EXPECT_NE(text.find("~  forward float32\n    up to 113916 (1.74x of 65504) at step 0"),
            std::string::npos)
      << text;
  // The label lines themselves fit (the sections' headings are wider).
  for (const char* tail : {"~  forward float16\n", "~  forward float32\n"}) {
    const size_t end = text.find(tail) + std::string(tail).size() - 1;
    const size_t begin = text.rfind('\n', end - 1) + 1;
    EXPECT_LE(end - begin, 60u) << text.substr(begin, end - begin);
  }
}

// The ops whose calls carried masks are named whole: beside the line when
// they fit, wrapped under it when not (they were cut to "aten::sc~").
TEST(SummaryText, TheOpsThatCarriedMasksAreNamedWhole) {
  RunSummary s;
  s.steps = 1;
  s.mask_ops = {"aten::masked_fill"};
  std::string text = RenderText(s, 100, false);
  EXPECT_NE(text.find("  mask: ±inf put there on purpose, never a finding: aten::masked_fill\n"),
            std::string::npos) << text;
  s.mask_ops = {"aten::masked_fill", "aten::masked_fill_", "aten::scalar_tensor", "aten::sort",
                "aten::where"};
  text = RenderText(s, 100, false);
  EXPECT_NE(text.find("  mask: ±inf put there on purpose, never a finding:\n"
                      "    aten::masked_fill, aten::masked_fill_, aten::scalar_tensor, aten::sort, "
                      "aten::where\n"),
            std::string::npos) << text;
  text = RenderText(s, 60, false);
  EXPECT_NE(text.find("    aten::masked_fill, aten::masked_fill_,\n    aten::scalar_tensor, "
                      "aten::sort, aten::where\n"),
            std::string::npos) << text;
}

// The ops table cuts long op names to 29 columns in 100; a wider terminal
// shows them whole, the other columns moved right by as much.
// A diagnosis title longer than the line is wrapped: its end names the
// step, which a cut title lost ("... from finite inputs at ~").
TEST(SummaryText, ALongDiagnosisTitleIsWrappedWithItsStep) {
  RunSummary s;
  s.steps = 8;
  s.first_origin = Warning("aten::_weight_norm_interface", "forward", "float32", 7, 0);
  s.first_origin->kind = "origin";
  s.first_origin->nan = 64;
  s.nonfinite_steps = s.nonfinite_steps_kept = {7};
  const std::string text = RenderText(s, 100, false);
  EXPECT_NE(text.find("made inf/NaN from finite inputs at\n           step 7\n"),
            std::string::npos)
      << text;
}

TEST(SummaryText, AWiderTerminalShowsLongOpNamesWhole) {
  RunSummary s;
  s.steps = 1;
  OpTotals o;
  o.op = "aten::_scaled_dot_product_flash_attention_for_cpu";  // 49 columns
  o.phase = "forward";
  o.calls = 3;
  o.max_abs = 2.5;
  s.ops = {o};
  std::string text = RenderText(s, 100, false);
  EXPECT_NE(text.find("  aten::_scaled_dot_product_fl~ forward"), std::string::npos) << text;
  EXPECT_NE(text.find("  op                            phase"), std::string::npos) << text;
  text = RenderText(s, 160, false);
  EXPECT_NE(text.find("  aten::_scaled_dot_product_flash_attention_for_cpu forward"),
            std::string::npos) << text;
  EXPECT_NE(text.find("  op                                                phase"),
            std::string::npos) << text;
  // In between, as much of the name as the width gives.
  text = RenderText(s, 110, false);
  EXPECT_NE(text.find("  aten::_scaled_dot_product_flash_attent~ forward"), std::string::npos)
      << text;
}

}  // namespace
}  // namespace nanhunt
