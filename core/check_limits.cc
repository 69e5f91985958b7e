#include "core/check_limits.h"

#include <cmath>
#include <limits>

namespace nanhunt {
namespace {

struct Layout {
  int mantissa_bits;
  int exponent_bits;
  bool has_inf;
};

Layout LayoutOf(Format format) {
  switch (format) {
    case Format::kF16: return {10, 5, true};
    case Format::kBF16: return {7, 8, true};
    case Format::kF32: return {23, 8, true};
    case Format::kF64: return {52, 11, true};
    case Format::kF8E4M3FN: return {3, 4, false};
    case Format::kF8E5M2: return {2, 5, true};
  }
  return {10, 5, true};
}

// Largest magnitude pattern that is not NaN (the infinity pattern for
// formats that have one).
unsigned long long TopPattern(const Layout& l) {
  const unsigned long long exp_all = ((1ull << l.exponent_bits) - 1)
                                     << l.mantissa_bits;
  return l.has_inf ? exp_all : exp_all | ((1ull << l.mantissa_bits) - 2);
}

template <Format F>
Thresholds<typename FormatBits<F>::Bits> Make(double near_max) {
  using Bits = typename FormatBits<F>::Bits;
  return {static_cast<Bits>(SmallestPatternAtLeast(F, near_max)),
          static_cast<Bits>(SmallestPatternAtLeast(F, kFp16MinNormal)),
          static_cast<Bits>(SmallestPatternAtLeast(F, kFp16OverflowAt))};
}

}  // namespace

double DecodeMagnitude(Format format, unsigned long long abs_bits) {
  const Layout l = LayoutOf(format);
  const unsigned long long mant = abs_bits & ((1ull << l.mantissa_bits) - 1);
  const long long exp = static_cast<long long>(abs_bits >> l.mantissa_bits);
  const int bias = (1 << (l.exponent_bits - 1)) - 1;
  if (l.has_inf && exp == (1ll << l.exponent_bits) - 1) {
    return std::numeric_limits<double>::infinity();
  }
  if (exp == 0) {
    return std::ldexp(static_cast<double>(mant), 1 - bias - l.mantissa_bits);
  }
  return std::ldexp(
      static_cast<double>(mant | (1ull << l.mantissa_bits)),
      static_cast<int>(exp) - bias - l.mantissa_bits);
}

unsigned long long SmallestPatternAtLeast(Format format, double value) {
  const Layout l = LayoutOf(format);
  // Magnitude patterns are ordered like their values, so a binary search over
  // [0, top] finds the first one at or above `value`.
  unsigned long long lo = 0, hi = TopPattern(l);
  if (!(DecodeMagnitude(format, hi) >= value)) {
    return l.has_inf ? hi : hi + 1;  // nothing reaches it: never counts
  }
  while (lo < hi) {
    const unsigned long long mid = lo + (hi - lo) / 2;
    if (DecodeMagnitude(format, mid) >= value) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

bool RoundsToZero(Format format, double value) {
  return value != 0 && std::abs(value) <= DecodeMagnitude(format, 1) / 2;
}

size_t FormatWidth(Format format) {
  switch (format) {
    case Format::kF16:
    case Format::kBF16: return 2;
    case Format::kF32: return 4;
    case Format::kF64: return 8;
    case Format::kF8E4M3FN:
    case Format::kF8E5M2: return 1;
  }
  return 4;
}

absl::string_view FormatName(Format format) {
  switch (format) {
    case Format::kF16: return "float16";
    case Format::kBF16: return "bfloat16";
    case Format::kF32: return "float32";
    case Format::kF64: return "float64";
    case Format::kF8E4M3FN: return "float8_e4m3fn";
    case Format::kF8E5M2: return "float8_e5m2";
  }
  return "unknown";
}

CheckLimits::CheckLimits(double near_max)
    : near_max_(near_max),
      f16_(Make<Format::kF16>(near_max)),
      bf16_(Make<Format::kBF16>(near_max)),
      f32_(Make<Format::kF32>(near_max)),
      f64_(Make<Format::kF64>(near_max)),
      e4m3fn_(Make<Format::kF8E4M3FN>(near_max)),
      e5m2_(Make<Format::kF8E5M2>(near_max)) {}

}  // namespace nanhunt
