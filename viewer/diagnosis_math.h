// A diagnosis class of its own: inf/NaN that fp16's range did not cause.
// log(0), a division by zero, the square root of a negative number give
// inf/NaN in any precision; telling the user to run that op in fp32 or bf16
// would send them the wrong way.
#pragma once

#include <optional>

#include "viewer/diagnosis.h"

namespace nanhunt {

// The `invalid_math` diagnosis when the first origin `f` is not an fp16
// range problem: its outputs are in a format with fp32's range, or its fp32
// recomputation is not finite either. Otherwise nullopt.
std::optional<Diagnosis> InvalidMath(const RunSummary& s, const FindingRow& f);

// The `mask_made_nonfinite` diagnosis when the first origin `f` made real
// inf/NaN of a mask's deliberate -inf (a loss over a masked position, a sum
// over masked entries), but not a softmax over a row masked entirely, which
// InvalidMath explains. Otherwise nullopt.
std::optional<Diagnosis> MaskMadeNonFinite(const RunSummary& s, const FindingRow& f);

// The `nan_marker_reached` diagnosis when the first origin `f` is an op
// that does not skip NaN (a mean, a sum) given NaN the program placed as
// markers of missing values. Otherwise nullopt.
std::optional<Diagnosis> NanMarkerReached(const FindingRow& f);

// A healthy diagnosis when the first origin `f` was made by an op (not
// data, not another rank) and every step with inf/NaN dropped them before
// they reached a weight: each such step's trace says its inf/NaN were all
// freed with the temporaries that held them by its optimizer step's end
// (a softmax's NaN over a fully masked row, zeroed right after, and the
// NaN its backward makes there, which masked_fill's backward zeroes), and
// `f` is no fp16 overflow (Fp16RangeOverflow). Otherwise nullopt.
std::optional<Diagnosis> DroppedWithinSteps(const RunSummary& s, const FindingRow& f);

// Whether `f` made fp16 inf whose fp32 recomputation is finite and past
// 65504: values the computation meant, out of fp16's range.
bool Fp16RangeOverflow(const FindingRow& f);

// The fix for an exponential (exp, exp2, expm1) whose outputs overflowed
// `f.dtype`: where its argument passes that format's range, and what keeps
// the argument in it (a softmax's max subtracted, softplus, a clamped
// log-variance). Empty for other ops.
std::string ExponentialFix(const FindingRow& f);

// Whether every step with inf/NaN had them all freed by its optimizer
// step's end (and every output was checked): no weight took any.
bool AllDroppedWithinSteps(const RunSummary& s);

}  // namespace nanhunt
