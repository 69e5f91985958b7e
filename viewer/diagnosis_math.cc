#include "viewer/diagnosis_math.h"

#include <cmath>
#include <limits>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/check_limits.h"
#include "core/op_policy.h"
#include "viewer/diagnosis_growth.h"

namespace nanhunt {
namespace {

// What makes a family of functions non-finite on finite inputs, and what an
// expert does about it.
struct Singularity {
  std::initializer_list<const char*> ops;
  const char* cause;
  const char* fix;
  // Those of `ops` whose values stay within fp16's range for every finite
  // input (a log, a square root, a softmax's [0, 1]): inf/NaN from them is
  // the function's, whatever the format, even where no fp32 recomputation
  // says so (results checked on a GPU, after the inputs may have changed).
  std::initializer_list<const char*> bounded = {};
  // What to try when every step dropped them before any weight
  // (DroppedWithinSteps); the advice for masks when null.
  const char* when_dropped = nullptr;
  // The cause is the one of NaN alone: ±inf from these ops is something
  // else (a loss's +inf at a target masked with -inf is a mask's doing).
  bool only_nan = false;
  // Its argument is often a probability, or 1 minus one, which fp16 and
  // bf16 round to exactly 0 or 1 long before fp32 does (a log of p).
  bool takes_probabilities = false;
  // NaN must be among what came out (±inf beside it is the same cause's):
  // ±inf alone from these ops is an overflow.
  bool needs_nan = false;
  // Not the cause where an input is past 1.8e19: a variance (a mean
  // square) of such values passes fp32's range whatever the eps, and the
  // values had exploded before the op.
  bool inputs_in_range = false;
};

constexpr char kAcoshFix[] =
    "clamp the argument at 1 + eps before the acosh, torch.acosh(z.clamp_min(1 + 1e-5)) "
    "(1 + 1e-3 in fp16), as hyperbolic libraries do (geoopt): acosh's derivative at 1 is "
    "infinite, so the clamp must come before it, and masking the distances of a point to "
    "itself after it leaves their gradient NaN";

constexpr char kLogitFix[] =
    "pass logit an eps, torch.logit(p, eps=1e-6), which clamps p into [eps, 1 - eps] (an "
    "inverse sigmoid by hand: clamp first, as Deformable DETR's inverse_sigmoid does)";

// What layer, group and RMS normalisation need where a row can be constant.
constexpr char kNormEpsFix[] =
    "give the norm an eps > 0: nn.LayerNorm's and nn.GroupNorm's default, 1e-5 (nn.RMSNorm's "
    "default, eps=None, is the dtype's machine epsilon); with eps=0 every constant row (an "
    "all-zero one for RMSNorm) is NaN in the forward pass, and in the gradients of the norm's "
    "weight and of everything before it even where the loss leaves the row out";

constexpr char kNormEpsWhenDropped[] =
    "nothing harms training; to stop making them (NANHUNT_ON_NONFINITE=raise stops at the "
    "first): give the norm an eps > 0 (nn.LayerNorm's default is 1e-5)";

const Singularity kSingularities[] = {
    // Before the log's: the argument is the loss's, out of the program's
    // reach. (Its Stirling term's log(0) is torch's own, masked.)
    {{"aten::poisson_nll_loss"},
     "F.poisson_nll_loss(log_input=False) takes log(input + eps) of the predicted rate: NaN "
     "wherever that rate is negative (a linear layer's raw output)",
     "predict the log of the rate and pass log_input=True (the default), whose loss, exp(x) - "
     "target * x, takes no log, or make the rate positive first: F.softplus(x) + 1e-4",
     {}, nullptr, /*only_nan=*/true},
    {{"aten::log", "aten::log2", "aten::log10", "aten::xlogy"},
     "a logarithm of 0 is -inf, of a negative number NaN",
     "clamp the argument away from 0 (x.clamp_min(eps)), or stay in log space: "
     "F.logsigmoid, F.binary_cross_entropy_with_logits, F.log_softmax, "
     "torch.logsumexp",
     {"aten::log", "aten::log2", "aten::log10"}, nullptr, false,
     /*takes_probabilities=*/true},
    // Its edge is -1: a clamp at eps, a log's fix, would turn log1p(-p) into
    // log1p(eps) for every p.
    {{"aten::log1p"},
     "log1p(x) = log(1 + x) is -inf at x = -1 and NaN below: log(1 - p) written as "
     "torch.log1p(-p) is -inf where p is exactly 1, and so is the inverse of a tanh, "
     "0.5 * (log1p(y) - log1p(-y)) (torch.distributions' TanhTransform, a squashed "
     "policy's log_prob), at an action of exactly ±1, which tanh gives from |x| of about 9 "
     "in fp32 (4.5 in fp16)",
     "keep the argument above -1: torch.log1p(-p.clamp_max(1 - eps)) (eps 1e-6 in fp32, 1e-3 in fp16, "
     "whose largest value below 1 is 0.9995), or stay in log space: log(1 - sigmoid(z)) is "
     "F.logsigmoid(-z), a BCE is F.binary_cross_entropy_with_logits; for a squashed policy, "
     "clamp replayed actions into (-1 + 1e-6, 1 - 1e-6), or take log_prob of the sampled "
     "action itself with TanhTransform(cache_size=1), which keeps its pre-tanh value",
     {"aten::log1p"}, nullptr, false, /*takes_probabilities=*/true},
    // Before the square roots' and divisions': their eps is the norm's.
    {{"aten::native_layer_norm", "aten::layer_norm", "aten::native_group_norm",
      "aten::group_norm"},
     "layer and group normalisation divide by sqrt(var + eps): with eps=0, a row (a group) "
     "whose values are all equal has a variance of 0, and 1 / sqrt(0) is +inf (the inverse "
     "standard deviation among the outputs), (x - mean) * inf = 0 * inf NaN. A padding "
     "embedding makes such rows: nn.Embedding(padding_idx=...) starts its row at zeros and "
     "never updates it; so do a constant feature and an all-zero input",
     kNormEpsFix, {}, kNormEpsWhenDropped, false, false, /*needs_nan=*/true,
     /*inputs_in_range=*/true},
    // torch's rms_norm computes op by op on the CPU: its rsqrt's +inf.
    {{"aten::rms_norm", "aten::_fused_rms_norm"},
     "RMS normalisation divides by sqrt(mean(x^2) + eps): with eps=0, a row of zeros has a "
     "mean square of 0, and 1 / sqrt(0) is +inf, 0 * inf NaN. A padding embedding makes such "
     "rows: nn.Embedding(padding_idx=...) starts its row at zeros and never updates it",
     kNormEpsFix, {}, kNormEpsWhenDropped, false, false, false, /*inputs_in_range=*/true},
    // pow's +inf is a square past 65504: an overflow, not this; rsqrt's is a
    // division by 0 (below), its NaN a negative argument's.
    {{"aten::sqrt", "aten::pow", "aten::float_power", "aten::rsqrt"},
     "a square root or fractional power of a negative number is NaN (a variance "
     "computed by hand as E[x^2] - E[x]^2 can come out negative, and an eps added to it "
     "does not lift it back to 0)",
     "clamp the argument at 0 (x.clamp_min(0)), or use torch.var, torch.std, "
     "F.layer_norm, which compute it stably (they subtract the mean first)",
     {"aten::sqrt", "aten::rsqrt"}, nullptr, /*only_nan=*/true},
    {{"aten::div", "aten::div_", "aten::reciprocal", "aten::rsqrt", "aten::true_divide",
      "aten::remainder", "aten::fmod"},
     "a division by 0 is inf (0/0 is NaN)",
     "keep the denominator away from 0 (x / (d + eps), d.clamp_min(eps); a normalisation "
     "by hand, x / x.norm(dim=-1, keepdim=True), is F.normalize(x, dim=-1), which clamps "
     "the norm at eps), or mask the entries where it is 0",
     {"aten::rsqrt"},
     "nothing harms training; to stop making them (NANHUNT_ON_NONFINITE=raise stops at the "
     "first): keep the denominator away from 0 (x / (d + eps), d.clamp_min(eps)), or "
     "mask the entries where it is 0 before the division, not after"},
    {{"aten::exp", "aten::exp2", "aten::expm1"},
     "exp passes even fp32's range from about 88.7 on",
     "subtract the maximum first, as torch.logsumexp, F.softmax and "
     "F.log_softmax do"},
    // No maximum to subtract: their argument is a length.
    {{"aten::sinh", "aten::cosh"},
     "sinh and cosh pass fp32's range from |x| of about 89.4 on (fp16's from 11.8): the "
     "hyperboloid's exponential map, cosh(|v|) x + sinh(|v|) v / |v|, of a long tangent "
     "vector, or a distance grown that far",
     "clamp the argument before them (the tangent vector's norm, as hyperbolic libraries "
     "do: |v|.clamp_max(50) in fp32), or keep the map in log space: log(cosh(x)) is |x| + "
     "F.softplus(-2 * |x|) - log(2)"},
    {{"aten::_softmax", "aten::softmax", "aten::_log_softmax", "aten::log_softmax",
      "aten::_safe_softmax"},
     "a softmax over a row whose every entry is -inf (every position masked) is "
     "NaN",
     "keep at least one position of every row unmasked, or put torch.finfo(dtype).min "
     "in the masked places instead of -inf (or of -1e9, which is -inf in float16)",
     {"aten::_softmax", "aten::softmax", "aten::_safe_softmax"}},
    {{"aten::_ctc_loss", "aten::_cudnn_ctc_loss", "aten::ctc_loss"},
     "CTC's loss is +inf (-log 0) for a target that no alignment fits into its "
     "input: a target needs a frame for each label and one more between two "
     "equal labels, and its input_length is shorter (lengths swapped or "
     "wrong, or the input downsampled below the target)",
     "check input_lengths and target_lengths of that step's samples (a target "
     "needs its length plus its repeated labels in frames), or let "
     "nn.CTCLoss(zero_infinity=True) zero those samples' loss and gradient",
     {},
     "nothing harms training: the loss of targets no alignment fits into their "
     "input was dropped (nn.CTCLoss(zero_infinity=True) zeroes it); those "
     "samples teach nothing, so check their input_lengths and target_lengths "
     "(a target needs its length plus its repeated labels in frames)"},
    {{"aten::nll_loss_forward", "aten::nll_loss2d_forward", "aten::nll_loss",
      "aten::nll_loss_nd", "aten::nll_loss2d", "aten::cross_entropy_loss"},
     "a mean over no targets is 0/0 = NaN: every target of the batch was "
     "ignore_index (-100: padding, or a prompt's tokens masked out) or had a "
     "class weight of 0, so the total weight, nll_loss's second output, is 0",
     "skip the loss of a batch without a target (if (labels != -100).any()), "
     "or divide a reduction='sum' loss by max(number of targets, 1); when "
     "fine-tuning on packed or chunked sequences, drop the chunks that hold "
     "only prompt tokens",
     {},
     "nothing harms training: a batch without a target gave a NaN loss, which "
     "was dropped; to stop making it, skip the loss of a batch whose every "
     "target is ignore_index (if (labels != -100).any())",
     /*only_nan=*/true},
    // Finite inputs give a variance NaN only so; its +inf is an overflow.
    {{"aten::std", "aten::var", "aten::std_mean", "aten::var_mean"},
     "a standard deviation or variance with Bessel's correction (the default, "
     "correction=1) over a single value divides by N - 1 = 0: NaN (a group, "
     "batch or dimension of size 1)",
     "skip groups of one value, or pass correction=0 (unbiased=False), whose "
     "std of one value is 0; x.std() + eps does not help, NaN + eps is NaN. A "
     "batch of one that comes once an epoch is a DataLoader's last, the rest "
     "of the dataset: DataLoader(..., drop_last=True)",
     {}, nullptr, /*only_nan=*/true},
    {{"aten::logdet", "aten::linalg_slogdet", "aten::_linalg_slogdet", "aten::slogdet"},
     "torch.logdet is NaN for a matrix whose determinant is negative (a random rotation's "
     "is -1 half the time) and -inf for a singular one, as torch.linalg.slogdet's log |det| "
     "is",
     "take log |det| with torch.linalg.slogdet(W).logabsdet, finite for either sign (a "
     "flow's change of variables needs |det|), and keep W invertible: learn it as P L U "
     "with the log of U's diagonal, as Glow's invertible 1x1 convolution does",
     {"aten::logdet", "aten::linalg_slogdet", "aten::_linalg_slogdet", "aten::slogdet"}},
    {{"aten::logit", "aten::special_logit"},
     "logit(p) = log(p / (1 - p)) is -inf at p = 0 and +inf at p = 1 (a hard label "
     "among soft ones, a box coordinate on the image's border)",
     kLogitFix, {"aten::logit", "aten::special_logit"}, nullptr, false,
     /*takes_probabilities=*/true},
    {{"aten::lgamma", "aten::digamma", "aten::polygamma", "aten::mvlgamma",
      "aten::special_gammaln", "aten::special_digamma", "aten::special_polygamma",
      "aten::special_multigammaln"},
     "lgamma is +inf at 0 and at the negative integers, and digamma infinite there: a "
     "Gamma, Beta, Dirichlet, Poisson or negative binomial likelihood whose concentration, "
     "rate or dispersion reached 0",
     "keep that parameter positive and off 0: F.softplus(x) + 1e-4, or x.exp() of a "
     "clamped x, instead of a ReLU or a clamp at 0"},
    {{"aten::erfinv", "aten::special_erfinv", "aten::special_ndtri"},
     "an inverse CDF is infinite at its ends: erfinv at -1 and 1, ndtri at 0 and 1",
     "keep its argument inside the open interval: x.clamp(-1 + 1e-6, 1 - 1e-6) before "
     "erfinv, p.clamp(1e-6, 1 - 1e-6) before ndtri",
     {}, nullptr, false, /*takes_probabilities=*/true},
    {{"aten::_weight_norm", "aten::_weight_norm_interface"},
     "weight normalisation, w = g * v / |v|, divides by the norm of each row of v: 0 / 0 = "
     "NaN for a row that is all zeros (a layer zero-initialised before weight_norm was "
     "applied to it, or a row that training zeroed)",
     "give v non-zero values and zero the scale g instead, which starts the layer at 0 as "
     "intended: nn.init.zeros_(layer.parametrizations.weight.original0) (weight_g with the old "
     "torch.nn.utils.weight_norm) after applying weight_norm, not nn.init.zeros_ on the "
     "weight before it",
     {}, nullptr, /*only_nan=*/true},
    {{"aten::acos", "aten::asin"},
     "acos and asin are NaN outside [-1, 1] (a cosine computed by hand, a dot product of "
     "normalised vectors, rounds past ±1)",
     "clamp the argument into the domain (x.clamp(-1 + eps, 1 - eps))",
     {"aten::acos", "aten::asin"}},
    {{"aten::acosh"},
     "acosh is NaN below 1: a hyperbolic distance, acosh(-<x, y>) on the hyperboloid or acosh(1 "
     "+ 2|u - v|^2 / ((1 - |u|^2)(1 - |v|^2))) in the Poincare ball, is acosh of 1 for a point "
     "and itself (a distance matrix's diagonal, a batch's repeated items), which rounding puts "
     "below 1",
     kAcoshFix,
     {"aten::acosh"}},
    {{"aten::atanh"},
     "atanh is ±inf at ±1 and NaN beyond: the inverse of a tanh at a value of exactly ±1 "
     "(a squashed policy's action, which tanh gives from |x| of about 9 in fp32, 4.5 in "
     "fp16), or the Poincare ball's distance and exponential maps, which take artanh of a "
     "norm that reaches 1 where a point rounds onto the ball's boundary",
     "keep the argument inside (-1, 1): x.clamp(-1 + 1e-5, 1 - 1e-5) before atanh (1e-3 in "
     "fp16); keep the pre-tanh value where there is one instead of inverting the tanh; in the "
     "Poincare ball, project the points back inside after each update, x * (1 - 1e-5) / "
     "x.norm(dim=-1, keepdim=True).clamp_min(1 - 1e-5), as geoopt's PoincareBall does"},
};

// `s`'s fix for `f`. torch.logit's eps of 1e-6 is none in float16 or
// bfloat16, where 1 - 1e-6 rounds to 1 and logit(1) is inf again.
std::string SingularFix(const Singularity& s, const FindingRow& f) {
  if (s.fix == kLogitFix && (f.dtype == "float16" || f.dtype == "bfloat16")) {
    const char* eps = f.dtype == "float16" ? "1e-3" : "1e-2";
    return absl::StrCat("pass logit an eps ", f.dtype, " holds, torch.logit(p, eps=", eps,
                        "), which clamps p into [eps, 1 - eps]: 1 - 1e-6, enough in fp32, "
                        "rounds to 1 in ", f.dtype, ", where logit is inf again (an inverse "
                        "sigmoid by hand: clamp first, as Deformable DETR's inverse_sigmoid "
                        "does)");
  }
  return s.fix;
}

// The largest finite max|x| among a finding's inputs ("#1 float32[8, 16]
// max|x|=1.44807e+21; ..."); nullopt when none says one.
std::optional<double> LargestFiniteInput(const FindingRow& f) {
  std::optional<double> largest;
  const std::string kMark = "max|x|=";
  for (size_t at = f.inputs.find(kMark); at != std::string::npos;
       at = f.inputs.find(kMark, at + 1)) {
    const size_t begin = at + kMark.size();
    const size_t end = f.inputs.find_first_of(" ;", begin);
    double v = 0;
    if (absl::SimpleAtod(absl::string_view(f.inputs).substr(begin, end - begin), &v) &&
        std::isfinite(v) && (!largest || v > *largest)) {
      largest = v;
    }
  }
  return largest;
}

// Above it, a square or product of finite fp32 values passes fp32's range
// (3.4e38): the square root of its largest value.
constexpr double kFp32SquareLimit = 1.8446742e19;

bool HasFp32Range(const std::string& dtype) {
  return dtype == "float32" || dtype == "float64" || dtype == "bfloat16";
}

// The largest finite input when it is past 1.8e19 in a format of fp32's
// range, whose square or product passes it: values that exploded before
// `f`. nullopt otherwise (float64 squares them still).
std::optional<double> ExplodedInput(const FindingRow& f) {
  if (f.dtype == "float64" || !HasFp32Range(f.dtype)) return std::nullopt;
  const std::optional<double> largest = LargestFiniteInput(f);
  if (!largest || *largest <= kFp32SquareLimit) return std::nullopt;
  return largest;
}

const Singularity* SingularityOf(const FindingRow& f) {
  for (const Singularity& s : kSingularities) {
    if (s.only_nan && (f.nan == 0 || f.posinf != 0 || f.neginf != 0)) continue;
    if (s.needs_nan && f.nan == 0) continue;
    if (s.inputs_in_range && ExplodedInput(f)) continue;
    for (const char* op : s.ops) {
      if (f.op == op || f.top_op == op) return &s;
    }
  }
  return nullptr;
}

bool IsBounded(const Singularity& s, const FindingRow& f) {
  for (const char* op : s.bounded) {
    if (f.op == op || f.top_op == op) return true;
  }
  return false;
}

// Why inf/NaN with no fp32 recomputation to judge by (a GPU result) are
// the function's and no overflow: its values stay in range, or only NaN
// came out, which an overflow never makes (it gives ±inf). Empty if
// neither.
std::string NoOverflowWithoutRecomputation(const Singularity* s, const FindingRow& f) {
  if (s == nullptr || f.fp32_max_abs) return "";
  if (IsBounded(*s, f)) {
    return absl::StrCat(f.op, " cannot overflow: its values stay within fp16's range, "
                        "so more range would not help");
  }
  if (f.nan > 0 && f.posinf == 0 && f.neginf == 0) {
    return "only NaN came out, and an overflow gives ±inf: more range would not help";
  }
  return "";
}

std::string WhatCameOut(const FindingRow& f) {
  std::string out;
  auto add = [&](const char* what, int64_t n) {
    if (n > 0) absl::StrAppend(&out, out.empty() ? "" : ", ", what, "=", n);
  };
  add("NaN", f.nan);
  add("+inf", f.posinf);
  add("-inf", f.neginf);
  return absl::StrCat(out, " of ", f.elements);
}

// "step 3: aten::bmm in aten::matmul gave float16 outputs with +inf=2 of
// 64, at model.py:12 in forward".
std::string WhatItGave(const FindingRow& f) {
  return absl::StrCat(
      "step ", f.step, ": ", OpWithinTop(f), BackwardOf(f),
      " gave ", f.dtype, " outputs with ", WhatCameOut(f),
      f.source.empty() || SourceIsForwardLine(f) ? "" : ", at " + f.source);
}

// Why a log in fp16 or bf16 met an exact 0: a probability it or 1 minus it
// was rounded to 0 or 1, where fp32 would have kept it apart (sigmoid's
// thresholds, measured). Empty for other ops and formats.
std::string ProbabilitiesRoundedToEdges(const Singularity* s, const FindingRow& f) {
  if (s == nullptr || !s->takes_probabilities || f.neginf == 0) return "";
  const char* to_one = f.dtype == "float16" ? "8.3" : f.dtype == "bfloat16" ? "6.2" : nullptr;
  if (to_one == nullptr) return "";
  return absl::StrCat(
      "in ", f.dtype, " a probability rounds to exactly 1 from a logit of about ", to_one,
      " on (a sigmoid's; a softmax's confident class likewise)",
      f.dtype == "float16" ? ", and to 0 below about -17.3" : "",
      ": log(1 - p) or log(p) is then -inf where the model was merely confident. fp32 rounds "
      "to 1 only from about 16.6, and a loss computed from the logits never does");
}

// " (backward)" after an op's name, nothing for the forward.
std::string PhaseNote(const FindingRow& f) {
  return f.phase == "forward" ? "" : " (" + f.phase + ")";
}

}  // namespace

std::optional<Diagnosis> MaskMadeNonFinite(const RunSummary& s, const FindingRow& f) {
  if (f.kind != "origin" || !FromMask(f)) return std::nullopt;
  const Singularity* singular = SingularityOf(f);
  if (singular != nullptr) return std::nullopt;  // its own explanation says more
  Diagnosis d;
  d.kind = "mask_made_nonfinite";
  d.op = f.op;
  d.title = absl::StrCat("A mask became real inf/NaN: ", f.op, PhaseNote(f),
                         " computed with -inf put there on purpose, at step ", f.step);
  d.evidence.push_back(WhatItGave(f));
  d.evidence.push_back(absl::StrCat(
      "an input holds a mask's -inf, and ", f.op,
      " is no op that keeps a mask a mask (selection, arithmetic with finite "
      "values, log_softmax): it turned the mask into values the rest of the "
      "step computes with (a loss over a masked position, a sum over masked "
      "entries)"));
  d.evidence.push_back(absl::StrCat("its inputs: ", f.inputs));
  d.fixes.push_back(
      "keep masked positions out of this op: a loss's ignore_index (-100) for "
      "targets that are masked, no label_smoothing over masked classes, "
      "masked_fill(mask, 0) before a sum");
  d.fixes.push_back(
      "or mask with a large negative number (torch.finfo(dtype).min) instead "
      "of -inf: finite, it cannot turn into inf or NaN");
  return d;
}

std::optional<Diagnosis> NanMarkerReached(const FindingRow& f) {
  if (f.kind != "origin" || !FromNanMarker(f)) return std::nullopt;
  Diagnosis d;
  d.kind = "nan_marker_reached";
  if (!f.forward_op.empty()) {
    // The forward left the markers out of the loss; the backward formula
    // of an op that computed with them did not.
    d.op = f.forward_op;
    d.title = absl::StrCat("NaN markers reached the gradients: the backward of ", f.forward_op,
                           " at step ", f.step);
    d.evidence.push_back(WhatItGave(f));
    d.evidence.push_back(absl::StrCat(
        "an input holds NaN the program placed on purpose, a marker of a missing value "
        "(y[missing] = float(\"nan\"), torch.where(ok, y, float(\"nan\"))): the forward kept "
        "them out of the loss (selected, masked), but ", f.forward_op,
        "'s backward computes with the values its forward saved, markers included, and a "
        "zero gradient times NaN is NaN: every gradient after it holds NaN"));
    d.evidence.push_back(absl::StrCat("its inputs: ", f.inputs));
    d.fixes.push_back(
        "replace the markers before computing with them and keep the mask for the loss: "
        "y = torch.nan_to_num(y, nan=0.0) (or torch.where(known, y, 0.0)), then "
        "((pred - y) ** 2)[known].mean()");
    d.fixes.push_back(
        "or select the known entries first: ((pred[known] - y[known]) ** 2).mean()");
    return d;
  }
  // The program's op: a mean, not the sum it is made of.
  const std::string& op = f.top_op.empty() ? f.op : f.top_op;
  const absl::string_view method = absl::StripSuffix(absl::StripPrefix(op, "aten::"), "_");
  d.op = op;
  d.title = absl::StrCat("A NaN marker reached an op that does not skip NaN: ", op,
                         PhaseNote(f), " at step ", f.step);
  d.evidence.push_back(WhatItGave(f));
  d.evidence.push_back(absl::StrCat(
      "an input holds NaN the program placed on purpose, a marker of a missing value "
      "(torch.where(ok, x, float(\"nan\")), masked_fill(m, float(\"nan\"))), and ", op,
      " does not skip NaN as torch.nanmean, torch.nansum and torch.nan_to_num do: the marker "
      "became the NaN the rest of the step computes with"));
  d.evidence.push_back(absl::StrCat("its inputs: ", f.inputs));
  d.fixes.push_back(HasNanSkippingTwin(op)
                        ? absl::StrCat("skip the markers where they are reduced: torch.nan",
                                       method, "(x) instead of x.", method,
                                       "(), or torch.nan_to_num(x, nan=0.0) before it")
                        : absl::StrCat("replace the markers before ", op,
                                       ": torch.nan_to_num(x, nan=0.0), or select the known "
                                       "entries first"));
  d.fixes.push_back(
      "or keep a boolean mask beside the values instead of NaN markers, and reduce "
      "x[mask]");
  return d;
}

namespace {

// Whether `f`, a forward origin that made ±inf, had a gradient that was
// NaN (0/0, 0 x inf): what a zero gradient gives where the forward made inf,
// as torch.where's and masked_fill's backward send to the entries they did
// not select.
bool MaskedOutputsGradientIsNan(const RunSummary& s, const FindingRow& f) {
  return f.phase == "forward" && (f.posinf > 0 || f.neginf > 0) && s.first_origin_gradient &&
         s.first_origin_gradient->nan > 0 && s.first_origin_gradient->posinf == 0 &&
         s.first_origin_gradient->neginf == 0;
}

// The mul of x * log(x) at x = 0 (an entropy's term), or of x * (log(x) -
// y) (a KL divergence's), when forward origin `f` is that log: a log that
// made -inf, whose next op is a mul of it and of the very tensor the log
// read (described the same: dtype, shape and counts) that made NaN of each
// -inf, or whose next op is a sub or add that kept each -inf infinite and
// then such a mul. Null otherwise.
const FindingRow* XLogXAtZero(const RunSummary& s, const FindingRow& f) {
  const absl::string_view op = absl::StripSuffix(f.op, "_");
  if (f.phase != "forward" || f.neginf == 0 || s.first_origin_consumers.empty() ||
      (op != "aten::log" && op != "aten::log2" && op != "aten::log10")) {
    return nullptr;
  }
  const FindingRow* next = &s.first_origin_consumers[0];
  const absl::string_view next_op = absl::StripSuffix(next->op, "_");
  if ((next_op == "aten::sub" || next_op == "aten::add" || next_op == "aten::rsub") &&
      next->nan == 0 && next->posinf + next->neginf == f.neginf &&
      s.first_origin_consumers.size() > 1) {
    next = &s.first_origin_consumers[1];
  }
  // Every -inf became NaN, and nothing else did: each was multiplied by
  // 0, as x is where log(x) is -inf. (A BCE by hand, (1 - y) * log(1 - p),
  // keeps the -inf where y is 0.)
  if (absl::StripSuffix(next->op, "_") != "aten::mul" || next->nan != f.neginf ||
      next->posinf != 0 || next->neginf != 0) {
    return nullptr;
  }
  // "#0 float32[32, 6] max|x|=1": the log's one input, without its index.
  const size_t space = f.inputs.find(' ');
  if (space == std::string::npos || f.inputs.find(';') != std::string::npos) return nullptr;
  return absl::StrContains(next->inputs, absl::string_view(f.inputs).substr(space)) ? next
                                                                                     : nullptr;
}

// Whether `f` is 0 / 0 of two single numbers: a division of a one-value
// tensor of 0 by another one-value tensor (its count, unchecked when an
// integer), NaN: a mean by hand, sum / count, over nothing.
bool MeanOverNothing(const FindingRow& f) {
  const absl::string_view op = absl::StripSuffix(f.op, "_");
  if (f.phase != "forward" || (op != "aten::div" && op != "aten::true_divide") ||
      f.elements != 1 || f.nan != 1) {
    return false;
  }
  const std::vector<absl::string_view> inputs = absl::StrSplit(f.inputs, "; ");
  return inputs.size() == 2 && absl::StartsWith(inputs[0], "#0 ") &&
         absl::EndsWith(inputs[0], "[] max|x|=0") && absl::StartsWith(inputs[1], "#1 ") &&
         absl::StrContains(inputs[1], "[] ");
}

// Whether `f`, a forward origin that made NaN alone (an argument outside
// the function's domain), had a NaN gradient: the derivative there is NaN
// too, whatever gradient came in.
bool DomainErrorsGradientIsNan(const RunSummary& s, const FindingRow& f) {
  return f.phase == "forward" && f.nan > 0 && f.posinf == 0 && f.neginf == 0 &&
         s.first_origin_gradient && s.first_origin_gradient->nan > 0;
}

// A function whose derivative at a point (`at`: 0, or ±1) is infinite
// though its value there is finite, and what keeps its argument off it.
struct SteepPoint {
  std::initializer_list<const char*> forward_ops;
  const char* at;
  const char* what;
  const char* fix;
};

const SteepPoint kSteepPoints[] = {
    {{"aten::sqrt", "aten::norm", "aten::linalg_vector_norm", "aten::frobenius_norm",
      "aten::_foreach_norm"},
     "0",
     "a square root's, or a norm's of a zero vector",
     "keep the argument off 0 before the square root: (d2 + eps).sqrt(), or "
     "torch.where(d2 > 0, d2, 1).sqrt() inside the where (the \"double where\"); "
     "torch.cdist and F.pairwise_distance do it with an eps of their own, and a norm by "
     "hand, x.pow(2).sum(-1).sqrt() (a gradient penalty's), is torch.linalg.vector_norm(x, "
     "dim=-1), whose gradient at a zero vector is 0"},
    {{"aten::pow", "aten::float_power"},
     "0",
     "a power's with an exponent below 1, e * x ** (e - 1): a square root's, or a focal "
     "loss's (1 - p) ** gamma with gamma < 1 where p is 1",
     "keep the base off 0 before the power: x.clamp_min(eps) ** e (a focal loss's "
     "(1 - p).clamp_min(eps) ** gamma), or an exponent of 1 or more, whose derivative "
     "at 0 is finite"},
    {{"aten::acosh"},
     "1",
     "an inverse hyperbolic cosine's, 1 / sqrt(x^2 - 1): a hyperbolic distance between a "
     "point and itself (a distance matrix's diagonal, a batch's repeated items), whose "
     "argument is exactly 1",
     kAcoshFix},
    {{"aten::acos", "aten::asin"},
     "±1",
     "an arc cosine's or arc sine's, -1 / sqrt(1 - x^2): ArcFace's or an angular loss's "
     "acos of a cosine of exactly 1, an embedding on its class centre (or -1, opposite it)",
     "keep the cosine inside (-1, 1) before the acos: cos.clamp(-1 + 1e-7, 1 - 1e-7) in fp32 "
     "(1e-3 in fp16, whose steps near 1 are 5e-4); clamp(-1, 1) is not enough, as 1 itself "
     "is where the derivative is infinite"},
};

// Whether `f` is the log in the gradient of a tensor exponent, d(x ** y)/dy
// = x ** y * log(x), made NaN: a negative base's log. (torch drops the
// -inf of a zero base itself, where y >= 0.)
bool NegativeBaseOfLearnedExponent(const FindingRow& f) {
  return f.phase == "backward" && f.nan > 0 && absl::StripSuffix(f.op, "_") == "aten::log" &&
         IsTensorPower(f.forward_op);
}

constexpr absl::string_view kNegativeBaseCause =
    "the gradient of a tensor exponent, d(x ** p)/dp = x ** p * log(x), is NaN wherever the "
    "base x is negative (the log of a negative number), even where x ** p itself was finite "
    "(a whole-number p, a square of signed values): a learned exponent (GeM pooling's p, a "
    "learned power or gamma) over a base that can be negative";
constexpr absl::string_view kNegativeBaseFix =
    "keep the base positive before a learned exponent: x.clamp(min=eps) ** p, as GeM "
    "pooling does (eps 1e-6), or F.relu(x) before it; for signed values, x.sign() * "
    "x.abs().clamp_min(eps) ** p; or p.detach() if the exponent need not learn";

// The function `f` is the backward of when it is one of kSteepPoints and
// `f` made inf/NaN there, with inputs too small to have overflowed: its
// derivative at that point times the incoming gradient (a zero gradient gives 0 / 0,
// NaN; another one ±inf). Null otherwise.
const SteepPoint* SteepPointGradient(const FindingRow& f) {
  if (f.phase != "backward" || (f.nan == 0 && f.posinf == 0 && f.neginf == 0)) return nullptr;
  // The exponent's gradient, not the base's.
  if (NegativeBaseOfLearnedExponent(f)) return nullptr;
  const std::optional<double> largest = LargestFiniteInput(f);
  if (largest && *largest > kFp32SquareLimit) return nullptr;
  for (const SteepPoint& steep : kSteepPoints) {
    for (const char* op : steep.forward_ops) {
      if (f.forward_op == op) return &steep;
    }
  }
  return nullptr;
}

// A decomposition whose backward divides by differences of its values: its
// vectors' gradient is inf or NaN where two values are equal, however the
// program computes with them.
struct RepeatedValuesGradient {
  std::initializer_list<const char*> forward_ops;
  const char* cause;
  const char* fix;
};

const RepeatedValuesGradient kRepeatedValuesGradients[] = {
    {{"aten::_linalg_eigh", "aten::linalg_eigh", "aten::linalg_eig", "aten::_linalg_eig"},
     "the backward of an eigendecomposition (torch.linalg.eigh, eig) divides by the "
     "differences of its eigenvalues, lambda_j - lambda_i: where two are equal (a repeated "
     "eigenvalue: two dead or identical features, isotropic features, a symmetric "
     "configuration) the eigenvectors' gradient is inf or NaN, as torch's documentation warns",
     "keep gradients away from the eigenvectors of repeated eigenvalues: whiten with a "
     "Cholesky factor (torch.linalg.cholesky) or Newton-Schulz iterations for the inverse "
     "square root, whose gradients stay finite; use the eigenvalues alone where they suffice "
     "(torch.linalg.eigvalsh, whose gradient is finite); or drop the features that repeat "
     "(dead units)"},
    {{"aten::_linalg_svd", "aten::linalg_svd", "aten::svd"},
     "the backward of an SVD (torch.linalg.svd, torch.svd) divides by the differences of "
     "its squared singular values, sigma_j^2 - sigma_i^2: where two are equal (a repeated "
     "singular value, two zero ones of a rank-deficient matrix) the singular vectors' "
     "gradient is inf or NaN, as torch's documentation warns",
     "take the singular values alone where they suffice (torch.linalg.svdvals, "
     "torch.linalg.matrix_norm(x, 'nuc') or 2, whose gradients are finite), or keep them "
     "apart before the SVD (a small distinct jitter on the diagonal), or use power or "
     "Newton-Schulz iterations for what the vectors were for"},
};

// The decomposition `f` is the backward of, when it is one of
// kRepeatedValuesGradients and `f` made inf/NaN. Null otherwise.
const RepeatedValuesGradient* RepeatedValuesGradientOf(const FindingRow& f) {
  if (f.phase != "backward" || (f.nan == 0 && f.posinf == 0 && f.neginf == 0)) return nullptr;
  for (const RepeatedValuesGradient& r : kRepeatedValuesGradients) {
    for (const char* op : r.forward_ops) {
      if (f.forward_op == op) return &r;
    }
  }
  return nullptr;
}

// In the run's first step, before any update, values past 1.8e19 that a
// backward or update op was given were computed within that step's
// forward pass: no gradient or learning rate grew them. The step's first
// forward warning past that, or null. (A forward origin's fix already
// looks at the batch; updates a program writes itself, as torch.func
// loops do, are no optimizer phase: no step before is asked for, not only
// no update.)
const FindingRow* GrewBeforeAnyUpdate(const RunSummary& s, const FindingRow& f) {
  if (f.phase == "forward") return nullptr;
  for (const PhaseStep& p : s.first_origin_phase_steps) {
    if (p.step < f.step) return nullptr;
  }
  for (const FindingRow& w : s.warnings) {
    if (w.step == f.step && w.phase == "forward" && w.max_abs > kFp32SquareLimit) return &w;
  }
  return nullptr;
}

// An eps that was 0 in `f`'s format at or before its step (F.normalize's
// clamp_min(1e-12) in float16), or null.
const StepEvent* EpsRoundedBefore(const RunSummary& s, const FindingRow& f) {
  const std::string in_format = absl::StrCat(" is 0 in ", f.dtype, " ");
  for (const StepEvent& e : s.eps_rounded) {
    if (e.step <= f.step && absl::StrContains(e.detail, in_format)) return &e;
  }
  return nullptr;
}

// A number the program wrote past `f`'s format's range that a mask op made
// -inf of at or before `f`'s step (`(1.0 - mask) * -1e9` in float16), when
// `f` is a softmax of a mask's -inf; else null.
const StepEvent* MaskLiteralBefore(const RunSummary& s, const FindingRow& f) {
  static constexpr absl::string_view kSoftmaxes[] = {
      "aten::_softmax", "aten::softmax", "aten::_log_softmax", "aten::log_softmax",
      "aten::_safe_softmax"};
  if (!FromMask(f) ||
      std::find(std::begin(kSoftmaxes), std::end(kSoftmaxes), f.op) == std::end(kSoftmaxes)) {
    return nullptr;
  }
  const std::string in_format = absl::StrCat(", past ", f.dtype, "'s largest value");
  for (const StepEvent& e : s.mask_literals) {
    if (e.step <= f.step && absl::StrContains(e.detail, in_format)) return &e;
  }
  return nullptr;
}

// What to do about an eps that was 0 in `f`'s format before `f` divided
// by 0: the eps of torch's function that made the division, where the
// program called one; the program's own otherwise.
std::string RoundedEpsFix(const FindingRow& f) {
  // The backward divides by the eps squared, and a zero vector's
  // gradient is 1 / eps: float16's needs room for both.
  const char* holds = f.dtype == "float16" ? "1e-3" : "1e-6";
  if (f.top_op == "aten::cosine_similarity") {
    // torch's own clamp, of each norm: the program's eps argument is it.
    return absl::StrCat(
        "give F.cosine_similarity an eps ", f.dtype, " holds: F.cosine_similarity(x1, x2, "
        "dim=-1, eps=", holds, "); its default, 1e-8, is 0 in ", f.dtype, ", so a zero "
        "vector (a padding embedding, a dead feature) is 0 / 0; or train under "
        "torch.autocast, which runs cosine_similarity in fp32");
  }
  if (f.op == "aten::poisson_nll_loss" || f.top_op == "aten::poisson_nll_loss") {
    return absl::StrCat(
        "give F.poisson_nll_loss an eps ", f.dtype, " holds: F.poisson_nll_loss(rate, target, "
        "log_input=False, eps=", holds, "); its default, 1e-8, is 0 in ", f.dtype, ", and "
        "log(rate + 0) is -inf at a rate of 0 (a ReLU's); or predict the log of the rate and "
        "pass log_input=True (the default), whose loss, exp(x) - target * x, takes no log");
  }
  if (f.top_op == "aten::cosine_embedding_loss") {
    // Its 1e-12 is a constant of torch's C++, no argument. In fp32 the
    // gradient at a zero vector, about 1e6, overflows float16 on its way
    // back: the loss wants an eps float16 holds, not more range.
    return absl::StrCat(
        "compute the loss from F.cosine_similarity with an eps ", f.dtype, " holds: cos = "
        "F.cosine_similarity(x1, x2, dim=-1, eps=", holds, "); loss = torch.where(target == 1, "
        "1 - cos, (cos - margin).clamp_min(0)).mean(). nn.CosineEmbeddingLoss's eps, 1e-12, is "
        "a constant of torch's (no argument sets it) and 0 in ", f.dtype, ", so a zero vector "
        "(a padding embedding, a dead feature) is 0 / 0; the loss in fp32 is finite, but its "
        "gradient at a zero vector, about 1e6, overflows ", f.dtype, " on its way back");
  }
  return absl::StrCat(
      "give that op an eps ", f.dtype, " holds with room for the backward pass, which "
      "divides by its square (a zero vector's gradient is 1 / eps): ", holds,
      " (F.normalize(x, eps=", holds, "), x / (d + ", holds, ")); or train under "
      "torch.autocast, whose weights stay fp32 and whose norms run in fp32");
}

// Why `f`, the backward of `steep`'s function, made inf/NaN.
std::string SteepPointCause(const SteepPoint& steep, const FindingRow& f) {
  return absl::StrCat(
      "the derivative of ", f.forward_op, " at ", steep.at, " is infinite (", steep.what,
      "): its backward multiplies the incoming gradient by inf there, ",
      f.nan > 0 ? "and 0 x inf is NaN where that gradient was 0 (entries a torch.where or "
                  "masked_fill did not select)"
                : "which is inf wherever that gradient was not 0",
      ", though the forward value at ", steep.at, " was finite");
}

}  // namespace

bool Fp16RangeOverflow(const FindingRow& f) {
  return f.dtype == "float16" && f.fp32_max_abs && std::isfinite(*f.fp32_max_abs) &&
         *f.fp32_max_abs > kFp16Max;
}

std::string ExponentialFix(const FindingRow& f) {
  const absl::string_view op = absl::StripSuffix(f.op, "_");
  const bool base2 = op == "aten::exp2";
  if (op != "aten::exp" && op != "aten::expm1" && !base2) return "";
  // ln (or log2) of the format's largest finite value: past it, inf.
  const double largest = f.dtype == "float16"  ? kFp16Max
                         : f.dtype == "float64" ? std::numeric_limits<double>::max()
                                                : std::numeric_limits<float>::max();
  const double limit = base2 ? std::log2(largest) : std::log(largest);
  const std::optional<double> input = LargestFiniteInput(f);
  return absl::StrCat(
      absl::StripPrefix(op, "aten::"), " passes ", f.dtype, "'s range from x = ",
      absl::StrFormat("%.2f", limit), " on",
      input ? absl::StrCat(" (here its input reached |x| = ", absl::SixDigits(*input), ")") : "",
      ": a softmax or log-sum-exp by hand wants F.softmax, torch.logsumexp or "
      "F.log_softmax, which subtract the max first; log(1 + exp(x)) is F.softplus; the "
      "exp of a log-variance or log-scale (a VAE's logvar, a policy's log_std) wants its "
      "argument clamped first, logvar.clamp(max=10).exp()");
}

bool AllDroppedWithinSteps(const RunSummary& s) {
  // Outputs no check read could have carried them anywhere.
  return !s.nonfinite_steps.empty() && s.nonfinite_steps_kept.empty() && s.unchecked.empty();
}

std::optional<Diagnosis> DroppedWithinSteps(const RunSummary& s, const FindingRow& f) {
  // An fp16 overflow is no value anything meant: the ops after it computed
  // with its inf (an rsqrt of inf is 0: a hand-written RMSNorm zeroed its
  // rows, and the loss stayed finite) or selected it away, which the trace
  // does not tell apart. It is diagnosed as the overflow it is.
  if (f.kind != "origin" || !AllDroppedWithinSteps(s) || Fp16RangeOverflow(f)) {
    return std::nullopt;
  }
  Diagnosis d;
  d.kind = "healthy";
  d.op = f.op;
  d.title = "Healthy: the inf/NaN made in each step were dropped before any weight";
  d.evidence.push_back(WhatItGave(f));
  // The division is the square root's derivative, not one of the program's.
  const SteepPoint* steep = SteepPointGradient(f);
  const bool negative_base = NegativeBaseOfLearnedExponent(f);
  const Singularity* singular = steep != nullptr || negative_base ? nullptr : SingularityOf(f);
  if (singular != nullptr) d.evidence.push_back(singular->cause);
  if (steep != nullptr) d.evidence.push_back(SteepPointCause(*steep, f));
  if (negative_base) d.evidence.push_back(std::string(kNegativeBaseCause));
  if (!f.inputs.empty()) d.evidence.push_back(absl::StrCat("its inputs: ", f.inputs));
  d.evidence.push_back(absl::StrCat(
      "in ", s.nonfinite_steps.size(), " of ", s.steps,
      " steps; by the end of each one's optimizer step every tensor that held "
      "them had been freed: they were zeroed or selected away (masked_fill, "
      "where, nan_to_num, a ReLU's backward), and no weight, gradient or buffer "
      "held inf/NaN"));
  constexpr absl::string_view kHarmless =
      "nothing harms training; to stop making them (NANHUNT_ON_NONFINITE=raise stops at the "
      "first): ";
  d.fixes.push_back(
      steep != nullptr    ? absl::StrCat(kHarmless, steep->fix)
      : negative_base     ? absl::StrCat(kHarmless, kNegativeBaseFix)
      : singular != nullptr && singular->when_dropped != nullptr
          ? std::string(singular->when_dropped)
          : absl::StrCat(kHarmless,
                         "mask with torch.finfo(dtype).min instead of -inf, or keep one "
                         "position of every row unmasked"));
  return d;
}

// For a finding whose op torch's own code made for the program's line
// (FindingRow::via): that code, as evidence, and the fix of its arguments
// where there is one; whether that fix replaces `singular`'s, whose
// argument the program never wrote. A transform's (TanhTransform's
// inverse) is its value's, which the function's own fix covers.
bool AddViaEvidenceAndFix(const RunSummary& s, const FindingRow& f, const Singularity* singular,
                          Diagnosis& d) {
  // `f` is the first origin (InvalidMath's). On a GPU it has no line of its
  // own: its later findings' say the code (summary.h).
  const std::string& via = f.via.empty() && f.source.empty() ? s.first_origin_later_via : f.via;
  if (via.empty()) return false;
  const bool attention = absl::StartsWith(via, "multi_head_attention_forward (") ||
                         absl::StartsWith(via, "MultiheadAttention.forward (");
  // Its softmax over keys that were all masked (need_weights=True computes
  // it op by op; scaled_dot_product_attention otherwise).
  const bool masked_rows = attention && singular != nullptr &&
                           (absl::StrContains(f.op, "softmax") ||
                            absl::StrContains(f.op, "scaled_dot_product"));
  const bool distribution = absl::StrContains(via, "(torch/distributions/") &&
                            !absl::StrContains(via, "(torch/distributions/transforms.py:");
  d.evidence.push_back(absl::StrCat(
      attention ? "the op is nn.MultiheadAttention's own" : "the op is torch.distributions' own",
      ", in ", via, ", which the program's line called",
      distribution
          ? ": a distribution's log, division or power is not finite from finite arguments "
            "where a parameter is at the edge of its support (a scale, rate or concentration "
            "of 0, a probability of exactly 0 or 1) or a value is outside the support"
      : masked_rows
          ? ": it turns a boolean key_padding_mask (or attn_mask) into -inf where it is True, "
            "so a sample whose every key is True has no position left to attend to"
          : ""));
  if (distribution) {
    d.fixes.push_back(
        "keep the distribution's parameters inside their support: a scale or rate as "
        "F.softplus(raw) + 1e-4, or the exp of a clamped log-scale (log_std.clamp(-20, 2).exp()), "
        "not a ReLU or a clamp at 0; probabilities as logits (Categorical(logits=...), "
        "Bernoulli(logits=...)). Leave validate_args on (the default; validate_args=False or "
        "Distribution.set_default_validate_args(False) turn it off): it raises a ValueError "
        "naming the parameter or value out of its support");
  }
  if (masked_rows) {
    d.fixes.push_back(
        "give nn.MultiheadAttention a key_padding_mask that is True at the padding only: it "
        "masks where True, the opposite of a Hugging Face attention_mask (1 = attend), which "
        "goes in as ~attention_mask.bool(); a sample that is all padding (an empty sequence) "
        "needs one key left unmasked, or to leave the batch");
  }
  return distribution || masked_rows;
}

std::optional<Diagnosis> InvalidMath(const RunSummary& s, const FindingRow& f) {
  const bool recomputed_non_finite = f.fp32_max_abs && !std::isfinite(*f.fp32_max_abs);
  const bool wide = HasFp32Range(f.dtype) && !(f.fp32_max_abs && std::isfinite(*f.fp32_max_abs));
  const SteepPoint* steep = SteepPointGradient(f);
  const RepeatedValuesGradient* repeated = steep != nullptr ? nullptr : RepeatedValuesGradientOf(f);
  const bool negative_base = NegativeBaseOfLearnedExponent(f);
  // The division is the square root's derivative, or the decomposition's
  // formula, the log a power's, not one of the program's.
  const Singularity* singular =
      steep != nullptr || repeated != nullptr || negative_base ? nullptr : SingularityOf(f);
  const std::string no_overflow = NoOverflowWithoutRecomputation(singular, f);
  // The eps meant to keep a denominator or a log's argument off 0 was 0
  // itself in f's format.
  const StepEvent* eps = EpsRoundedBefore(s, f);
  // Recomputed in fp32 it is finite and fits its 16-bit format: that
  // format's precision broke, not its range, where an eps was 0 in it and
  // is not in fp32 (F.poisson_nll_loss's log(rate + 1e-8) at a rate of 0
  // in float16), or put the argument on the function's singular point
  // (torch.logit's clamp at 1 - 1e-6, which is 1 in float16 and bfloat16).
  const bool fits_format =
      (f.dtype == "float16" || f.dtype == "bfloat16") && f.fp32_max_abs &&
      std::isfinite(*f.fp32_max_abs) && (f.dtype != "float16" || *f.fp32_max_abs <= kFp16Max);
  const bool lost_eps = fits_format && eps != nullptr;
  const bool precision_only = fits_format && (eps != nullptr || singular != nullptr);
  if (!recomputed_non_finite && !wide && no_overflow.empty() && !precision_only) {
    return std::nullopt;
  }
  Diagnosis d;
  d.kind = "invalid_math";
  d.op = f.op;
  d.title = absl::StrCat("Not an fp16 overflow: ", f.op, PhaseNote(f),
                         " made inf/NaN from finite inputs at step ", f.step);
  d.evidence.push_back(WhatItGave(f));
  d.evidence.push_back(
      precision_only
          ? absl::StrCat("recomputed in fp32 it is finite and within ", f.dtype, "'s range "
                         "(max|x| ", FormatAbs(*f.fp32_max_abs), "): not ", f.dtype,
                         "'s range but its precision, ",
                         lost_eps ? "in which an eps it computes with is 0 (below)"
                                  : "which put an argument on the function's singular point")
      : HasFp32Range(f.dtype)
          ? absl::StrCat("the outputs are ", f.dtype,
                         ", with fp32's range: fp16's limit is not what broke")
      : recomputed_non_finite
          ? "recomputed in fp32 it is not finite either: more range would not help"
          : no_overflow);
  // With its eps, the function is finite here: its singular point is the
  // eps's doing.
  if (singular != nullptr && !lost_eps) d.evidence.push_back(singular->cause);
  const std::string rounded = ProbabilitiesRoundedToEdges(singular, f);
  if (!rounded.empty()) d.evidence.push_back(rounded);
  if (!f.inputs.empty()) d.evidence.push_back(absl::StrCat("its inputs: ", f.inputs));
  // That eps, first.
  if (eps != nullptr) {
    d.evidence.push_back(absl::StrCat("an eps was 0 in ", f.dtype, " before it (step ", eps->step,
                                      "): ", eps->detail, ", so it kept nothing off 0"));
    d.fixes.push_back(RoundedEpsFix(f));
  }
  if (const FindingRow* mul = XLogXAtZero(s, f)) {
    // No mask: the mul's gradient into the log is x, 0 there, and the
    // log's backward divides it by x.
    const bool divergence = mul != &s.first_origin_consumers[0];
    const std::string what = absl::StrCat(
        divergence ? absl::StrCat("the next ops, ", s.first_origin_consumers[0].op, " then ",
                                  mul->op, ", multiplied it")
                   : absl::StrCat("the next op, ", mul->op, ", multiplied it"),
        " by the log's own argument: ",
        divergence ? "x * (log(x) - y) (a KL divergence's term)"
                   : "x * log(x) (an entropy's or a KL divergence's term)",
        " is 0 x -inf = NaN where x is 0 (", mul->dtype, " NaN=", mul->nan, " of ",
        mul->elements, "). Its limit at 0 is 0, but ",
        divergence ? "computed so it is NaN there"
                   : "neither it nor its gradient, which divides 0 by x, is finite there");
    d.evidence.push_back(what);
    if (divergence) {
      d.fixes.push_back(
          "compute it with F.kl_div(logq, p, reduction=\"batchmean\") (logq the model's "
          "F.log_softmax), which is 0 where p is 0, or from p's logits in log space: "
          "F.kl_div(logq, F.log_softmax(p_logits, dim=-1), log_target=True)");
    } else {
      d.fixes.push_back(
          "compute it from the logits, in log space: logp = F.log_softmax(logits, dim=-1); "
          "entropy = -(logp.exp() * logp).sum(-1), as torch.distributions.Categorical("
          "logits=logits).entropy() does (a KL divergence: F.kl_div(logq, logp, "
          "log_target=True)); torch.special.entr and xlogy are 0 at 0, but their gradients "
          "there are NaN still");
    }
  } else if (MaskedOutputsGradientIsNan(s, f)) {
    const FindingRow& g = *s.first_origin_gradient;
    d.evidence.push_back(absl::StrCat(
        "its gradient is NaN: ", g.op, " (backward of ", f.op, ") gave ", g.dtype,
        " NaN=", g.nan, " of ", g.elements, " at step ", g.step,
        ". A torch.where or masked_fill that keeps these values out of the loss still "
        "sends a gradient into every entry of ", f.op, ", 0 where it did not select, and "
        "0 times the derivative there (1/0, inf) is NaN"));
    absl::string_view method = absl::StripSuffix(absl::StripPrefix(f.op, "aten::"), "_");
    d.fixes.push_back(absl::StrCat(
        "make the input safe before ", f.op, ", not only its output after: "
        "torch.where(ok, z, 1).", method, "() inside the where (the \"double where\"), or "
        "z.clamp_min(eps); masking the output leaves the gradient NaN"));
  } else if (DomainErrorsGradientIsNan(s, f)) {
    const FindingRow& g = *s.first_origin_gradient;
    d.evidence.push_back(absl::StrCat(
        "its gradient is NaN as well: ", g.op, " (backward of ", f.op, ") gave ", g.dtype,
        " NaN=", g.nan, " of ", g.elements, " at step ", g.step,
        ". Where a function is NaN its derivative is too, so masking its output (torch.where, "
        "masked_fill) would still leave NaN in the gradients: the argument must be made "
        "valid before ", f.op));
  }
  if (steep != nullptr) {
    d.evidence.push_back(SteepPointCause(*steep, f));
    d.fixes.push_back(steep->fix);
  }
  if (repeated != nullptr) {
    d.evidence.push_back(repeated->cause);
    d.fixes.push_back(repeated->fix);
  }
  if (negative_base) {
    d.evidence.push_back(std::string(kNegativeBaseCause));
    d.fixes.push_back(std::string(kNegativeBaseFix));
  }
  const bool mean_over_nothing = MeanOverNothing(f);
  if (mean_over_nothing) {
    d.evidence.push_back(
        "it divided 0 by 0, two single numbers: a mean taken by hand, sum / count, over a "
        "step with nothing to count ((loss * mask).sum() / mask.sum() where the mask selected "
        "nothing: a batch of padding only, a class absent from the batch)");
    d.fixes.push_back(
        "divide by the count clamped at 1, (loss * mask).sum() / mask.sum().clamp_min(1), "
        "which is 0 for a step with nothing to average; or skip the loss of such a step");
  }
  // Finite inputs so large that their square is past fp32's range: values
  // that exploded before this op, which only squared or multiplied them.
  if (const std::optional<double> largest = ExplodedInput(f)) {
    d.evidence.push_back(absl::StrCat(
        "an input reached |x| = ", absl::SixDigits(*largest),
        ", past 1.8e19, where a square or a product passes fp32's range (3.4e38): the values "
        "had exploded before this op",
        f.phase == "optimizer"
            ? "; in the update, that is the gradients (Adam's second moment squares them)"
            : ""));
    // In the forward pass the data may be what exploded (a batch scaled
    // by mistake), not the weights that gradients grew: the updates'
    // growth before it tells which, where the trace has them.
    if (const std::optional<UpdateGrowth> growth = UpdatesBefore(s, f)) {
      d.evidence.push_back(growth->evidence);
      d.fixes.push_back(growth->fix);
    } else if (const FindingRow* grew = GrewBeforeAnyUpdate(s, f)) {
      const std::string where = grew->source.empty() ? "" : absl::StrCat(" at ", grew->source);
      d.evidence.push_back(absl::StrCat(
          "no update came before step ", f.step, ": the values grew within its forward pass, "
          "past 1.8e19 first in ", OpInTopOp(*grew), " (forward)", where, ", |x| = ",
          FormatAbs(grew->max_abs), "; clipping gradients or a lower learning rate cannot "
          "stop that"));
      d.fixes.push_back(absl::StrCat(
          "make the computation", where.empty() ? " of " + grew->op : where,
          " stable: values that grow without bound within one pass come from an iteration "
          "or a product of many factors (Sinkhorn's u = a / (K @ v), whose K = exp(-C / eps) "
          "underflows: iterate in the log domain with torch.logsumexp, or a larger eps; a "
          "product of probabilities: a sum of their logs)"));
    } else {
      d.fixes.push_back(
        f.phase == "forward"
            ? "find where the values grew: WOULD OVERFLOW and the ops table give each op's "
              "max|x| by step (the batch itself, scaled or unnormalised by mistake, or weights "
              "grown by earlier updates: then clip gradients, "
              "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0), or lower the learning "
              "rate)"
            : "clip gradients before the update (torch.nn.utils.clip_grad_norm_(model."
              "parameters(), 1.0)) and find where the values grow: the ops table's max|x| per "
              "step, or a lower learning rate");
    }
  }
  // torch's own code made the op call for the program's line: its
  // arguments are what to fix, not a log or softmax the program never wrote.
  const bool via_fixed = AddViaEvidenceAndFix(s, f, singular, d);
  // The program masked with a number it meant as finite, and the format
  // made it -inf: a mask the format holds leaves a row masked entirely
  // finite (a uniform softmax, which the loss or the padding ignores).
  const StepEvent* literal = MaskLiteralBefore(s, f);
  if (literal != nullptr) {
    d.evidence.push_back(absl::StrCat(
        "the mask's -inf was a number the program wrote past ", f.dtype, "'s range (step ",
        literal->step, "): ", literal->detail));
    d.fixes.push_back(absl::StrCat(
        "put torch.finfo(scores.dtype).min in the masked places, scores.masked_fill(~keep, "
        "torch.finfo(scores.dtype).min)",
        f.dtype == "float16" ? " (-65504 in float16)" : "", ", instead of a number past ",
        f.dtype, "'s range, which ", f.dtype, " makes -inf (added to a negative score, even "
        "finfo.min passes the range): a row masked entirely then softmaxes to uniform "
        "weights, not NaN (ignore that row's output); or keep at least one position of every "
        "row unmasked"));
  }
  // The program kept its denominator off 0 already, with an eps too small.
  if (singular != nullptr && eps == nullptr && !mean_over_nothing && !via_fixed &&
      literal == nullptr) {
    d.fixes.push_back(SingularFix(*singular, f));
  }
  if (const std::string exp_fix = ExponentialFix(f); !exp_fix.empty()) {
    d.fixes.push_back(exp_fix);
  }
  d.fixes.push_back(
      "look at the inputs at that step for zeros, negative numbers or huge "
      "values (NANHUNT_ON_NONFINITE=raise with NANHUNT_SNAPSHOT_DIR saves them)");
  return d;
}

}  // namespace nanhunt
