#include "core/op_policy.h"

#include <fnmatch.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace nanhunt {
namespace {

// Whether `op` is one of `names`.
template <size_t N>
bool Named(const absl::string_view (&names)[N], absl::string_view op) {
  return std::find(std::begin(names), std::end(names), op) != std::end(names);
}

}  // namespace

bool OutputsAreUninitialised(absl::string_view op) {
  for (absl::string_view prefix :
       {"aten::empty", "aten::new_empty", "aten::_empty", "aten::resize_"}) {
    if (absl::StartsWith(op, prefix)) return true;
  }
  return false;
}

bool CastsResultBufferFirst(absl::string_view op) { return op == "aten::mean"; }

bool PassesInputThrough(absl::string_view op) {
  for (absl::string_view name :
       {"aten::_unsafe_view", "aten::lift_fresh", "aten::_reshape_alias",
        "aten::alias", "aten::detach", "aten::lift", "aten::unsafe_split",
        "aten::unsafe_chunk", "aten::unsafe_split_with_sizes"}) {
    if (op == name) return true;
  }
  return false;
}

bool CopiesValues(absl::string_view op) {
  static constexpr absl::string_view kOps[] = {
      "aten::copy_",          "aten::clone",          "aten::contiguous",
      "aten::_to_copy",       "aten::to",             "aten::cat",
      "aten::stack",          "aten::index_select",   "aten::gather",
      "aten::select_backward", "aten::slice_backward", "aten::embedding",
      "aten::repeat",         "aten::flip",           "aten::roll",
      "aten::narrow_copy",    "aten::expand_copy",    "aten::permute_copy",
      "aten::_reshape_copy",  "aten::constant_pad_nd", "aten::index"};
  return Named(kOps, op);
}

bool ReturnsNestedWrite(absl::string_view op) {
  static constexpr absl::string_view kOps[] = {
      "aten::_to_copy",  "aten::clone",     "aten::zero_",     "aten::zeros",
      "aten::zeros_like", "aten::new_zeros", "aten::ones",      "aten::ones_like",
      "aten::new_ones",  "aten::full",      "aten::full_like", "aten::new_full",
      "aten::scalar_tensor"};
  return Named(kOps, op);
}

bool WritesWholeTensor(absl::string_view op) {
  static constexpr absl::string_view kOps[] = {"aten::copy_", "aten::fill_", "aten::zero_",
                                               "aten::zeros", "aten::full"};
  return Named(kOps, op);
}

bool FillsWithScalar(absl::string_view op) {
  static constexpr absl::string_view kOps[] = {
      "aten::zero_",     "aten::zeros",     "aten::zeros_like", "aten::new_zeros",
      "aten::ones",      "aten::ones_like", "aten::new_ones",   "aten::fill_",
      "aten::full",      "aten::full_like", "aten::new_full",   "aten::scalar_tensor"};
  return Named(kOps, op);
}

bool PlacesScalar(absl::string_view op) {
  static constexpr absl::string_view kOps[] = {
      "aten::fill_",      "aten::fill",          "aten::full",         "aten::full_like",
      "aten::new_full",   "aten::scalar_tensor", "aten::masked_fill",  "aten::masked_fill_",
      "aten::index_fill", "aten::index_fill_",   "aten::where",
      // logits.scatter(-1, banned, -inf); logits[..., banned] = -inf
      // (index_put_ of a one-value tensor torch makes of the number).
      "aten::scatter",    "aten::scatter_",      "aten::index_put",    "aten::index_put_",
      "aten::_index_put_impl_",
      "aten::constant_pad_nd", "aten::pad",  // F.pad(x, ..., value=-inf)
      // How torch.tensor(float("-inf")) materialises a Python literal.
      "aten::detach_",    "aten::lift_fresh"};
  return Named(kOps, op);
}

bool MovesValues(absl::string_view op) {
  static constexpr absl::string_view kOps[] = {
      "aten::index",          "aten::index_select",    "aten::gather",        "aten::masked_select",
      "aten::take",           "aten::take_along_dim",  "aten::topk",          "aten::sort",
      "aten::cat",            "aten::stack",           "aten::clone",         "aten::contiguous",
      "aten::_to_copy",       "aten::to",              "aten::copy_",         "aten::repeat",
      "aten::expand_copy",    "aten::masked_scatter",  "aten::masked_scatter_", "aten::slice_scatter",
      "aten::select_scatter", "aten::index_copy",      "aten::index_copy_",   "aten::flip",
      "aten::roll",           "aten::_unsafe_view"};
  return Named(kOps, op);
}

bool HasNanSkippingTwin(absl::string_view op) {
  static constexpr absl::string_view kOps[] = {"aten::sum", "aten::mean", "aten::median",
                                               "aten::quantile"};
  return Named(kOps, op);
}

bool IsTensorPower(absl::string_view forward_op) {
  static constexpr absl::string_view kOps[] = {"aten::pow", "aten::pow_", "aten::float_power",
                                               "aten::float_power_"};
  return Named(kOps, forward_op);
}

OwnZeroDivision FormulasOwnZeroDivision(absl::string_view forward_op) {
  // A tensor exponent's gradient, x ** y * log(x): 0 * -inf is NaN (or
  // 1 * -inf at y = 0), which where(x == 0 & y >= 0, 0, ...) drops.
  if (IsTensorPower(forward_op)) return OwnZeroDivision::kAnyWide;
  // Their formulas divide 0 by 0 at the masked entries.
  static constexpr absl::string_view kZeroByZero[] = {"aten::sinc", "aten::angle",
                                                       "aten::copysign"};
  // Theirs divide a gradient by 0 there too (a norm's of p != 2, a std's
  // where its gradient is not 0), or take 1 / 0 (atan2's 1 / (x^2 + y^2)).
  static constexpr absl::string_view kAnyByZero[] = {
      "aten::linalg_vector_norm", "aten::norm", "aten::frobenius_norm", "aten::linalg_norm",
      "aten::dist", "aten::renorm", "aten::std", "aten::std_mean", "aten::_euclidean_dist",
      "aten::sgn", "aten::cumprod", "aten::atan2"};
  if (Named(kAnyByZero, forward_op)) return OwnZeroDivision::kAnyWide;
  if (Named(kZeroByZero, forward_op)) return OwnZeroDivision::kNanOnly;
  return OwnZeroDivision::kNone;
}

OwnZeroDivision MasksItsZeroDivisionInBackward(absl::string_view op,
                                               absl::string_view forward_op) {
  // A norm of p < 1 raises |x| to p - 1 < 0 (0 ** (p - 1) is inf), masked
  // where x == 0.
  static constexpr absl::string_view kNorms[] = {
      "aten::linalg_vector_norm", "aten::norm", "aten::linalg_norm", "aten::dist"};
  // The log(0) of a tensor exponent's gradient (pow_backward_exponent), and
  // logcumsumexp's of a zero incoming gradient, log |grad|, which it
  // replaces by the format's lowest where grad is not > 0 (a Cox partial
  // likelihood's censored samples).
  if (op == "aten::log" && (IsTensorPower(forward_op) || forward_op == "aten::logcumsumexp")) {
    return OwnZeroDivision::kNegInfOnly;
  }
  // Power's own formula divides nothing: a division in its backward is not
  // one of those above.
  if (IsTensorPower(forward_op)) return OwnZeroDivision::kNone;
  const bool divides = op == "aten::div" || op == "aten::div_" ||
                       ((op == "aten::pow" || op == "aten::pow_") && Named(kNorms, forward_op)) ||
                       (op == "aten::reciprocal" && forward_op == "aten::atan2");
  return divides ? FormulasOwnZeroDivision(forward_op) : OwnZeroDivision::kNone;
}

int EpsArgument(absl::string_view op) {
  static constexpr absl::string_view kOps[] = {"aten::clamp_min", "aten::clamp_min_",
                                               "aten::clamp",     "aten::clamp_",
                                               "aten::add",       "aten::add_"};
  return Named(kOps, op) ? 1 : -1;
}

namespace {

bool IsPinv(absl::string_view top_op) {
  return top_op == "aten::linalg_pinv" || top_op == "aten::pinverse";
}

}  // namespace

OwnZeroDivision MasksItsZeroDivisionInForward(absl::string_view op, absl::string_view top_op) {
  // pinv: where(S > tol, S.reciprocal(), 0) over the singular values, whose
  // tolerance is above any that overflows.
  if (op == "aten::reciprocal" && IsPinv(top_op)) return OwnZeroDivision::kAnyWide;
  // Poisson's full loss: the Stirling term, target * log(target) - target +
  // 0.5 * log(2 pi target), masked_fill'ed where target <= 1, takes log(0)
  // at every zero count. Its NaN is a negative target's or rate's (the
  // loss's own log(input + eps)): not masked.
  if (op == "aten::log" && top_op == "aten::poisson_nll_loss") return OwnZeroDivision::kNegInfOnly;
  return OwnZeroDivision::kNone;
}

OwnZeroDivision FormulasOwnInForward(absl::string_view top_op) {
  return IsPinv(top_op) || top_op == "aten::poisson_nll_loss" ? OwnZeroDivision::kAnyWide
                                                               : OwnZeroDivision::kNone;
}

bool CarriesMasks(absl::string_view op) {
  // Beyond the ops that place a mask: those that keep it a mask.
  static constexpr absl::string_view kOps[] = {
      "aten::add",        "aten::add_",        "aten::sub",          "aten::sub_",
      "aten::mul",        "aten::mul_",        "aten::div",          "aten::div_",
      "aten::neg",        "aten::maximum",     "aten::minimum",      "aten::clamp",
      "aten::clamp_min",  "aten::clamp_max",   "aten::triu",         "aten::tril",
      "aten::triu_",      "aten::tril_",       "aten::clone",        "aten::contiguous",
      "aten::_to_copy",   "aten::to",          "aten::copy_",        "aten::cat",
      "aten::stack",      "aten::repeat",      "aten::expand_copy",  "aten::index",
      "aten::index_select", "aten::gather",    "aten::_log_softmax", "aten::log_softmax",
      "aten::_unsafe_view", "aten::flip",      "aten::roll",         "aten::constant_pad_nd",
      "aten::pad",        "aten::abs",         "aten::amax",         "aten::amin",
      "aten::max",        "aten::min",         "aten::relu",
      // Placing a tensor's values, or picking some (top-k sampling, MoE
      // routing over -inf masked logits).
      "aten::masked_scatter", "aten::masked_scatter_", "aten::slice_scatter",
      "aten::select_scatter", "aten::diagonal_scatter", "aten::index_copy",
      "aten::index_copy_", "aten::masked_select", "aten::take_along_dim",
      "aten::topk",       "aten::sort",        "aten::cummax",       "aten::cummin",
      "aten::kthvalue",   "aten::median",      "aten::nanmedian",    "aten::mode",
      "aten::fmax",       "aten::fmin",        "aten::max_pool1d",   "aten::max_pool2d",
      "aten::max_pool3d", "aten::max_pool1d_with_indices", "aten::max_pool2d_with_indices",
      "aten::max_pool3d_with_indices", "aten::adaptive_max_pool1d",
      "aten::adaptive_max_pool2d", "aten::adaptive_max_pool3d",
      // Moving values into a new layout, the rest zeros.
      "aten::rot90",      "aten::diag_embed",  "aten::diag",         "aten::block_diag",
      "aten::unfold_copy", "aten::take",       "aten::im2col",
      // An additive mask in a matmul (nn.MultiheadAttention's
      // baddbmm(mask, q, k^T)), log-space sums of masked (log 0) terms.
      "aten::baddbmm",    "aten::rsub",        "aten::logaddexp",    "aten::logsumexp",
      "aten::logcumsumexp", "aten::_logcumsumexp"};
  return PlacesScalar(op) || Named(kOps, op);
}

bool OverflowsBesideMasks(absl::string_view op) {
  static constexpr absl::string_view kOps[] = {"aten::baddbmm"};
  return Named(kOps, op);
}

int WorkspaceOutput(absl::string_view op) {
  static constexpr absl::string_view kSecondOutput[] = {
      "aten::_ctc_loss", "aten::_scaled_dot_product_efficient_attention",
      "aten::_efficient_attention_forward"};
  return Named(kSecondOutput, op) ? 1 : -1;
}

bool IsMaskConstant(absl::string_view op, double value) {
  // Exact: each is what torch.finfo gives as a Python float.
  static constexpr double kLargest[] = {
      65504.0,                              // float16
      3.3895313892515355e38,                // bfloat16
      static_cast<double>(FLT_MAX),         // float32
      DBL_MAX};                             // float64
  const double magnitude = std::fabs(value);
  if (std::find(std::begin(kLargest), std::end(kLargest), magnitude) != std::end(kLargest)) {
    return true;
  }
  // Placed as it is, and past what fp16 holds (it rounds to -inf there).
  return PlacesScalar(op) && std::isfinite(value) && value <= -65520.0;
}

bool MatchesOpPattern(absl::string_view op, absl::string_view overload,
                      const std::vector<std::string>& patterns) {
  const std::string name(op);
  const std::string full =
      overload.empty() ? name : absl::StrCat(name, ".", overload);
  for (const std::string& p : patterns) {
    const bool with_overload = p.find('.') != std::string::npos;
    if (fnmatch(p.c_str(), (with_overload ? full : name).c_str(), 0) == 0) {
      return true;
    }
  }
  return false;
}

bool SetsUpParameters(absl::string_view op) {
  static constexpr absl::string_view kOps[] = {
      "aten::to", "aten::_to_copy", "aten::_has_compatible_shallow_copy_type",
      "aten::detach", "aten::set_"};
  return absl::EndsWith(op, "_") || Named(kOps, op);
}

bool IsBookkeepingRecord(absl::string_view name) {
  return absl::StartsWith(name, "autograd::") ||
         absl::StartsWith(name, "profiler::");
}

bool WritesNoValues(absl::string_view record) {
  return record == "detach" || record == "detach_";
}

bool AnnotatesOnly(absl::string_view op) { return op == "aten::record_stream"; }

bool UpdatesRunningStats(absl::string_view op) {
  static constexpr absl::string_view kOps[] = {
      "aten::native_batch_norm",   "aten::cudnn_batch_norm",
      "aten::miopen_batch_norm",   "aten::batch_norm_update_stats",
      "aten::batch_norm_gather_stats", "aten::batch_norm_gather_stats_with_counts",
      "aten::batch_norm",          "aten::_batch_norm_impl_index",
      "aten::instance_norm"};
  return Named(kOps, op);
}

bool IsRunningStatistic(absl::string_view argument) {
  return argument == "running_mean" || argument == "running_var";
}

bool ConvertsDtype(absl::string_view op) {
  static constexpr absl::string_view kOps[] = {
      "aten::to", "aten::_to_copy", "aten::type_as", "aten::_autocast_to_reduced_precision",
      "aten::_autocast_to_full_precision"};
  return Named(kOps, op);
}

bool ScalesLoss(absl::string_view op) {
  return op == "aten::_amp_foreach_non_finite_check_and_unscale_" ||
         op == kScalerUpdate;
}

}  // namespace nanhunt
