// Host-side companion of check_semantics.h: turns the user's thresholds
// (values) into the per-format bit patterns the check compares against, and
// turns a checked bit pattern back into a value.
#pragma once

#include <cstddef>
#include <cstdint>
#include "absl/strings/string_view.h"

#include "core/check_semantics.h"

namespace nanhunt {

// fp16's largest finite value and its smallest normal value.
inline constexpr double kFp16Max = 65504.0;
inline constexpr double kFp16MinNormal = 6.103515625e-05;  // 2^-14
// The smallest magnitude that rounds to infinity when cast to fp16.
inline constexpr double kFp16OverflowAt = 65520.0;

// The thresholds of every format, computed once from the configuration.
// Cheap to copy; immutable after construction; safe to share across threads.
class CheckLimits {
 public:
  // `near_max` is the |x| at and above which a finite value counts as close
  // to fp16's limit. Must be positive.
  explicit CheckLimits(double near_max);

  double near_max() const { return near_max_; }

  template <Format F>
  const Thresholds<typename FormatBits<F>::Bits>& For() const {
    if constexpr (F == Format::kF16) return f16_;
    else if constexpr (F == Format::kBF16) return bf16_;
    else if constexpr (F == Format::kF32) return f32_;
    else if constexpr (F == Format::kF64) return f64_;
    else if constexpr (F == Format::kF8E4M3FN) return e4m3fn_;
    else return e5m2_;
  }

 private:
  double near_max_;
  Thresholds<uint16_t> f16_, bf16_;
  Thresholds<uint32_t> f32_;
  Thresholds<uint64_t> f64_;
  Thresholds<uint8_t> e4m3fn_, e5m2_;
};

// The value of a magnitude bit pattern of `format` (sign cleared, not NaN).
// Infinity decodes to +inf.
double DecodeMagnitude(Format format, unsigned long long abs_bits);

// The smallest magnitude pattern of `format` whose value is >= `value`; the
// infinity pattern (or, without infinities, the NaN pattern) when none is.
unsigned long long SmallestPatternAtLeast(Format format, double value);

// Whether `value`, not 0, is 0 in `format`: its magnitude is at most half
// the format's smallest (subnormal) value. F.normalize's eps of 1e-12 in
// float16, whose smallest value is 6e-8.
bool RoundsToZero(Format format, double value);

// Bytes per value of `format`.
size_t FormatWidth(Format format);

// Short lower-case name ("float16", "bfloat16", ...) as torch prints dtypes.
absl::string_view FormatName(Format format);

}  // namespace nanhunt
