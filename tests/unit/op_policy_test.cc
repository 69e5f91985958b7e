// Which ops a NANHUNT_FP32_OPS list names, and which ops are not checked.
#include "core/op_policy.h"

#include <cmath>

#include "gtest/gtest.h"

namespace nanhunt {
namespace {

TEST(OpPolicy, PatternsMatchNamesGlobsAndOverloads) {
  const std::vector<std::string> p = {"aten::bmm", "aten::*softmax*", "aten::add.Tensor"};
  EXPECT_TRUE(MatchesOpPattern("aten::bmm", "", p));
  EXPECT_TRUE(MatchesOpPattern("aten::bmm", "out", p)) << "a bare name covers overloads";
  EXPECT_TRUE(MatchesOpPattern("aten::_softmax", "", p));
  EXPECT_TRUE(MatchesOpPattern("aten::log_softmax", "int", p));
  EXPECT_TRUE(MatchesOpPattern("aten::add", "Tensor", p));
  EXPECT_FALSE(MatchesOpPattern("aten::add", "Scalar", p));
  EXPECT_FALSE(MatchesOpPattern("aten::mm", "", p));
}

TEST(OpPolicy, AnEpsIsTheSecondArgumentOfAClampOrAnAddition) {
  EXPECT_EQ(EpsArgument("aten::clamp_min"), 1);  // F.normalize's norm.clamp_min(eps)
  EXPECT_EQ(EpsArgument("aten::clamp"), 1);      // x.clamp(min=eps)
  EXPECT_EQ(EpsArgument("aten::add"), 1);        // var + eps
  EXPECT_EQ(EpsArgument("aten::add_"), 1);       // denom.add_(eps)
  EXPECT_EQ(EpsArgument("aten::mul"), -1);
}

TEST(OpPolicy, UninitialisedCopyingAndFillingOpsAreKnown) {
  EXPECT_TRUE(OutputsAreUninitialised("aten::empty_strided"));
  EXPECT_FALSE(OutputsAreUninitialised("aten::zeros"));
  EXPECT_TRUE(CopiesValues("aten::clone"));
  EXPECT_FALSE(CopiesValues("aten::add"));
  EXPECT_TRUE(FillsWithScalar("aten::fill_"));
  EXPECT_TRUE(IsBookkeepingRecord("autograd::engine::evaluate_function: MulBackward0"));
  EXPECT_TRUE(PassesInputThrough("aten::_unsafe_view"));
  EXPECT_TRUE(CastsResultBufferFirst("aten::mean"));
  EXPECT_FALSE(CastsResultBufferFirst("aten::sum")) << "sums into its result, no cast first";
}

TEST(OpPolicy, OnlyAutogradsDetachRecordsAreKnownToWriteNoValues) {
  // Records without a schema: anything else may write any tensor.
  EXPECT_TRUE(WritesNoValues("detach"));
  EXPECT_TRUE(WritesNoValues("detach_"));
  EXPECT_FALSE(WritesNoValues("aten::detach_"));
  EXPECT_FALSE(WritesNoValues("my_extension_op"));
  EXPECT_TRUE(AnnotatesOnly("aten::record_stream"));
  EXPECT_FALSE(AnnotatesOnly("aten::_foreach_addcdiv_"));
}

TEST(OpPolicy, BatchNormKernelsUpdateRunningStatsWithoutSayingSo) {
  EXPECT_TRUE(UpdatesRunningStats("aten::native_batch_norm"));
  EXPECT_TRUE(UpdatesRunningStats("aten::cudnn_batch_norm"));
  EXPECT_TRUE(UpdatesRunningStats("aten::batch_norm"));
  // Its schema marks them (a!): no list needed.
  EXPECT_FALSE(UpdatesRunningStats("aten::_native_batch_norm_legit"));
  EXPECT_FALSE(UpdatesRunningStats("aten::layer_norm"));
  EXPECT_TRUE(IsRunningStatistic("running_var"));
  EXPECT_FALSE(IsRunningStatistic("weight"));
  EXPECT_TRUE(ConvertsDtype("aten::_to_copy"));
  EXPECT_TRUE(ConvertsDtype("aten::to"));
  EXPECT_FALSE(ConvertsDtype("aten::copy_")) << "a writer: refused as one";
}

TEST(OpPolicy, MaskConstantsAreFormatLimitsOrLargeNegativeFills) {
  // torch.finfo(dtype).min of each float format, as Python hands it over.
  EXPECT_TRUE(IsMaskConstant("aten::full", -65504.0));
  EXPECT_TRUE(IsMaskConstant("aten::mul", -3.4028234663852886e38)) << "(1 - mask) * finfo.min";
  EXPECT_TRUE(IsMaskConstant("aten::mul", -3.3895313892515355e38));
  EXPECT_TRUE(IsMaskConstant("aten::clamp", 3.4028234663852886e38)) << "finfo.max";
  EXPECT_TRUE(IsMaskConstant("aten::masked_fill", -1e9)) << "placed, past fp16";
  EXPECT_TRUE(IsMaskConstant("aten::where", -1e30));
  EXPECT_FALSE(IsMaskConstant("aten::mul", -1e9)) << "arithmetic, not placed";
  EXPECT_FALSE(IsMaskConstant("aten::masked_fill", -10000.0)) << "fp16 holds it";
  EXPECT_FALSE(IsMaskConstant("aten::full", 65536.0)) << "GradScaler's initial scale";
  EXPECT_FALSE(IsMaskConstant("aten::mul", 65536.0)) << "a static loss scale";
  EXPECT_FALSE(IsMaskConstant("aten::masked_fill", -INFINITY)) << "a mask, but not finite";
  EXPECT_FALSE(IsMaskConstant("aten::full", 65503.0));
}

TEST(OpPolicy, MovesCastsAndInitialisersSetParametersUpNoForwardPassRuns) {
  for (const char* op : {"aten::to", "aten::_to_copy", "aten::_has_compatible_shallow_copy_type",
                         "aten::normal_", "aten::mul_", "aten::copy_", "aten::detach"}) {
    EXPECT_TRUE(SetsUpParameters(op)) << op;
  }
  for (const char* op : {"aten::linear", "aten::embedding", "aten::conv2d", "aten::layer_norm",
                         "aten::matmul", "aten::t"}) {
    EXPECT_FALSE(SetsUpParameters(op)) << op;
  }
}

// CTC's forward variables are a workspace for its backward: log(0) and
// unwritten memory, no values of the model; so is the memory-efficient
// attention's +inf-padded log-sum-exp.
TEST(OpPolicy, CtcsForwardVariablesAndPaddedLogSumExpsAreWorkspaces) {
  EXPECT_EQ(WorkspaceOutput("aten::_ctc_loss"), 1);
  EXPECT_EQ(WorkspaceOutput("aten::_scaled_dot_product_efficient_attention"), 1);
  EXPECT_EQ(WorkspaceOutput("aten::_efficient_attention_forward"), 1);
  EXPECT_EQ(WorkspaceOutput("aten::_scaled_dot_product_flash_attention_for_cpu"), -1)
      << "its log-sum-exp is one a query, none padded";
  EXPECT_EQ(WorkspaceOutput("aten::ctc_loss"), -1) << "returns the loss alone";
  EXPECT_EQ(WorkspaceOutput("aten::_ctc_loss_backward"), -1);
  EXPECT_EQ(WorkspaceOutput("aten::native_layer_norm"), -1) << "mean and rstd are values";
}

// GradScaler's own ops are the update wherever they run (sample mode sees
// no backward op before them); the scale's multiplication of the loss is
// an op of the forward pass.
TEST(OpPolicy, GradScalersUnscaleAndUpdateAreTheUpdate) {
  EXPECT_TRUE(ScalesLoss("aten::_amp_foreach_non_finite_check_and_unscale_"));
  EXPECT_TRUE(ScalesLoss("aten::_amp_update_scale_"));
  EXPECT_FALSE(ScalesLoss("aten::mul"));
  EXPECT_FALSE(ScalesLoss("aten::_foreach_mul_"));
}

}  // namespace
}  // namespace nanhunt
