// Which ops' outputs are not worth checking.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace nanhunt {

// Ops whose outputs are uninitialised memory by contract (torch.empty and
// friends, resize_): whatever bits they hold are not a finding.
bool OutputsAreUninitialised(absl::string_view op);

// Ops that return their input's memory as it is, without a schema alias
// annotation saying so (_unsafe_view, lift_fresh, unsafe_split): checking
// their output would count the producing op's values twice. (Composite
// ones, broadcast_tensors and atleast_2d, are judged by what the registry
// says of their outputs' memory: OpContext::OutputsHoldMasks.)
bool PassesInputThrough(absl::string_view op);

// Ops whose first nested op, on the CPU, casts their result buffer before
// anything has written it: fp16 and bf16 mean sums in fp32
// (ReduceOps.cpp's mean_out: `result.to(kFloat)`, then sum_out into that),
// so the cast reads garbage as an empty tensor's, and its values (up to
// 3e38, NaN) are no finding. The op's own output is checked at its end.
bool CastsResultBufferFirst(absl::string_view op);

// Ops whose outputs hold exactly values of their inputs (copies, casts to
// the same dtype, concatenation, gathers): when no dtype changes, they cannot
// make a non-finite or larger value, and the producer of those values was
// already checked. Checking them again would double the cost for nothing.
bool CopiesValues(absl::string_view op);

// Ops that set a model up rather than run it, when a parameter is their
// input: moves and casts (module.to, .half(): to, _to_copy, and the
// _has_compatible_shallow_copy_type check after each), detach, and in-place
// ops (initialisers, a scaling of the weights). A forward pass is not
// counted by them (StepTracker::OnPassStart): .to() to where the model
// already is reads each parameter, and the .half() after it again.
bool SetsUpParameters(absl::string_view op);

// Ops that return, as it is, the tensor their last nested op wrote whole:
// a cast or clone (a copy_ into a fresh tensor), the factories that fill a
// fresh tensor (zeros: zero_, then fill_; full, ones: fill_), zero_ (fill_)
// (torch's own kernels, for every layout nanhunt checks). That nested op,
// one of WritesWholeTensor, needs no judging of its own: the enclosing op's
// check at its end reads the same memory, and judges it by the inputs that
// made it (a copy_'s other input is the fresh tensor's garbage). Not
// fill_: given a tensor, it copies it, and its shortcut for fills
// (FillsWithScalar) would then hide what the copy_ carried.
bool ReturnsNestedWrite(absl::string_view op);

// The ops that write a whole tensor such an op returns: copy_, fill_,
// zero_, zeros, full.
bool WritesWholeTensor(absl::string_view op);

// Ops that fill their output with a scalar (zeros, ones, fill_, full): their
// output is known from the scalar, so only a non-finite scalar is news.
bool FillsWithScalar(absl::string_view op);

// Masks: -inf (or +inf) put into a tensor on purpose, as attention code
// does (`scores.masked_fill(mask, float("-inf"))`, `torch.full(..., -inf)`).
// Ops that place a scalar argument into memory as it is: a ±inf scalar, or
// a one-value tensor no op made, given to one of them is deliberate: by the
// program, or inside another op by its kernel (amax's and logsumexp's -inf
// to start a maximum from, scaled_dot_product_attention's -inf for a
// boolean mask, pad's value), whose own check at its end then judges what
// it made of it. detach_ and lift_fresh are how torch.tensor(float("-inf"))
// arrives.
bool PlacesScalar(absl::string_view op);
// Ops through which deliberate ±inf stay deliberate as long as no NaN
// comes out: arithmetic with finite values, selection, layout changes,
// max/min/abs, and log_softmax (whose masked entries stay -inf). Any other
// op that makes inf from a mask is an origin (a loss over a masked
// position), as is any op that makes NaN of one (a row masked entirely).
bool CarriesMasks(absl::string_view op);
// Ops that only move values (select, gather, join, sort them): what they
// return holds no value its inputs did not, however many of one kind.
bool MovesValues(absl::string_view op);
// Reductions torch has a NaN-skipping twin of (torch.nanmean, nansum,
// nanmedian, nanquantile): NaN markers they reduce into NaN are the
// program's mistake at that op, where any other op given them was given
// its data.
bool HasNanSkippingTwin(absl::string_view op);

// Backward formulas that divide by a value that may be 0 (a norm, a
// standard deviation, a distance, a complex modulus, an input), then set
// the entries where it was 0 to 0 themselves:
// - a norm's (norm_backward: `grad * (self / norm).masked_fill_(norm == 0,
//   0)`; other p: `grad / norm.pow(p - 1)`, masked the same way; p < 1:
//   `|x|.pow_(p - 1).masked_fill_(x == 0, 0)`), at a zero vector:
//   F.normalize of a padding embedding, a gradient penalty's zero
//   gradient; torch.dist and torch.renorm go through it;
// - a standard deviation's (std_backward: `(grad / (result *
//   2)).masked_fill_(result == 0, 0)`), at a constant input: a dead
//   feature standardised by hand;
// - sinc's (`(πx cos πx - sin πx) / (πx²)`, where x == 0), at 0: a sinc
//   filter's centre tap;
// - a complex angle's (`grad * z / |z|²`, where z == 0) and sign's
//   (`(grad - ...) / |z|`, masked_fill_ where |z| == 0), at 0: the phase of
//   a silent frame's spectrum;
// - atan2's (`1 / (x² + y²)`, masked_fill where that is 0), at (0, 0);
// - copysign's (`result / self`, masked_fill_ where self == 0), 0 / 0 at 0;
// - a Euclidean distance's (_euclidean_dist_backward: `ratio = grad / res;
//   ratio.masked_fill_(res == 0, 0)`), at two equal points: torch.cdist(x,
//   x)'s diagonal;
// - a cumulative product's (cumprod_backward: a reversed cumulative sum
//   divided by the input, kept only before its first zero), at a zero
//   factor: an opaque sample in volume rendering's transmittance;
// - a tensor exponent's (pow_backward_exponent: `where(x == 0 & y >= 0, 0,
//   result * log(x))`), at a zero base: GeM pooling's learned p over a
//   ReLU's zeros. Where y < 0 the forward's 0 ** y is +inf already, an
//   origin, and the product it gives is that inf's, not this formula's;
// - logcumsumexp's (`where(grad > 0, grad.abs().log(), lowest)`), at an
//   incoming gradient of 0: a Cox partial likelihood's censored samples.
// What comes out of that division (or negative power, reciprocal, log) in
// the backward of those ops, of finite inputs, and is the function's own,
// masked right after in every healthy run that has such a zero:
enum class OwnZeroDivision {
  kNone,
  // NaN alone, 0 / 0: a finite x / 0 is ±inf, which a tiny divisor's
  // overflow gives too, and is still judged.
  kNanOnly,
  // ±inf too, in fp32 and fp64 (a complex64's parts are fp32): a gradient
  // divided by a norm, distance, modulus or factor too small to tell from 0
  // there (1e-38) does not come about but at 0. In fp16 and bf16, where it
  // does (a std of fp16 values), NaN alone.
  kAnyWide,
  // -inf alone, in any format: log(0). Its NaN is a negative number's log,
  // which nothing masks.
  kNegInfOnly,
};
OwnZeroDivision MasksItsZeroDivisionInBackward(absl::string_view op,
                                               absl::string_view forward_op);
// What the backward formula of `forward_op` makes of its own at a zero, in
// whichever of its ops carries it to the mask (sinc's `* pi`).
OwnZeroDivision FormulasOwnZeroDivision(absl::string_view forward_op);
// x ** y, whose backward takes log(x) for a tensor exponent y.
bool IsTensorPower(absl::string_view forward_op);
// The same in a forward op's own nested ops, masked before it returns:
// torch.linalg.pinv's reciprocal of its zero singular values, the log(0)
// of F.poisson_nll_loss(full=True)'s Stirling term at a zero count.
OwnZeroDivision MasksItsZeroDivisionInForward(absl::string_view op, absl::string_view top_op);
// What the nested ops of `top_op` carry of that to its mask (the Stirling
// term's 0 * -inf).
OwnZeroDivision FormulasOwnInForward(absl::string_view top_op);

// The argument of `op` that holds an eps, a small number kept in a
// denominator or a lower bound (`norm.clamp_min(1e-12)`, `var + 1e-12`,
// `x.clamp(min=1e-8)`), or -1: one that rounds to 0 in the output's format
// protects nothing (Monitor::OnEpsRoundedToZero).
int EpsArgument(absl::string_view op);

// Ops among those that add a mask to what they compute (baddbmm: mask +
// q @ k^T): +inf from them, when the masks they were given hold none, is
// the computation overflowing.
bool OverflowsBesideMasks(absl::string_view op);

// Ops that return, beside their result, a workspace their backward reads,
// which holds non-finite values or garbage by design:
// - CTC's forward variables (log_alpha, the second output of _ctc_loss):
//   -inf (log 0) at every lattice position no alignment reaches, in every
//   healthy run, and garbage past each sample's input length (torch
//   allocates them with empty and writes what each sample needs: 1.5e37
//   and NaN bit patterns come out);
// - the memory-efficient attention kernel's log-sum-exp (the second output
//   of _scaled_dot_product_efficient_attention and of the
//   _efficient_attention_forward inside it, on a GPU): padded to a
//   multiple of 32 queries with +inf, "to make the backward easier"
//   (PyTorch's kernel_forward.h), in every step whose sequence length is
//   not one.
// They are no values of the model, and what goes wrong in them shows in
// the result beside them. The index of that output, or -1. It is not
// checked, and not counted as unchecked.
int WorkspaceOutput(absl::string_view op);

// Mask constants: finite stand-ins for -inf that masks are made of. The
// largest finite value of a float format, torch.finfo(dtype).min or .max
// (65504, bf16's and fp32's 3.4e38), given to any op (Hugging Face's masks:
// `torch.full(..., torch.finfo(dtype).min)`, `(1.0 - mask) *
// torch.finfo(dtype).min`); or a large negative value a fill places
// (`masked_fill(mask, -1e9)`). They are past fp16's range or at its limit
// on purpose: a cast of them to fp16 gives -inf, a mask. Loss scales are
// neither: positive powers of two (65536), never a format's largest value.
bool IsMaskConstant(absl::string_view op, double value);

// Whether `op` ("aten::bmm", or with its overload, "aten::add.Tensor")
// matches one of `patterns` (names or shell globs as in NANHUNT_FP32_OPS).
// A pattern without a '.' matches every overload of the name.
bool MatchesOpPattern(absl::string_view op, absl::string_view overload,
                      const std::vector<std::string>& patterns);

// Records that are not ops but bookkeeping around them (the autograd
// engine's "autograd::engine::evaluate_function: MulBackward0"): they own
// no tensors and must not count as an enclosing op.
bool IsBookkeepingRecord(absl::string_view name);

// Records without a schema that write no tensor values: autograd's
// `detach` and `detach_` (VariableTypeManual's own RECORD_FUNCTION; detach_
// changes autograd metadata only). Any other record without a schema may
// write anything, as far as held-back GPU checks are concerned.
bool WritesNoValues(absl::string_view record);

// Ops whose schema marks a tensor written though they change none of its
// values: record_stream (the caching allocator's note that another stream
// uses the memory, often a buffer nothing has written yet). An in-place op
// that returns nothing is otherwise checked through what it writes.
bool AnnotatesOnly(absl::string_view op);

// Batch norm's ops that update the running mean and variance in place
// though their schemas do not mark them written (native_batch_norm,
// cudnn_batch_norm, batch_norm_update_stats: `Tensor? running_var`, no
// `(a!)`), and the composite ops that pass them on (batch_norm,
// instance_norm). After model.half() those buffers are fp16: the running
// variance of activations past 256 overflows there, while the op's
// returned values stay finite. _native_batch_norm_legit and
// _batch_norm_with_update say so in their schemas.
bool UpdatesRunningStats(absl::string_view op);
// The arguments such an op writes: running_mean, running_var.
bool IsRunningStatistic(absl::string_view argument);

// Ops that convert a tensor's dtype (to, _to_copy, type_as, autocast's
// casts): no arithmetic to run in fp32, and the fp32 fallback's own
// upcast is one of them (a fallback for them called itself until the
// stack ran out).
bool ConvertsDtype(absl::string_view op);

// GradScaler's update of its scale: it ends an iteration whose optimizer
// step it skipped.
inline constexpr char kScalerUpdate[] = "aten::_amp_update_scale_";

// GradScaler's own ops (unscaling the gradients, updating the scale): the
// update, wherever they run. torch.optim's record does not enclose them,
// and in sample mode no backward op need have been seen before them to
// tell the update from a forward pass.
bool ScalesLoss(absl::string_view op);

}  // namespace nanhunt
