#include "core/cpu_check.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

namespace nanhunt {
namespace {

// Counter type for one block: wide enough for kBlock values, and no wider
// than the data where possible, so that the compiler vectorises the loop
// without widening (16-bit data, 16-bit counters: 16 lanes per AVX2 op).
template <class Bits>
using BlockCounter = std::conditional_t<(sizeof(Bits) < 2), uint16_t, Bits>;

// Values per block: one less than 2^15 so that signed 16-bit counters
// cannot overflow, large enough that folding blocks into totals costs
// nothing.
constexpr int64_t kBlock = (1 << 15) - 1;

// One block, written as independent counters so the compiler vectorises it.
// The per-value meaning is check_semantics.h's, as in AccumulateValue<F>.
// Always inlined: it must be compiled inside each target clone of its
// caller (AVX2 and baseline), not once for the baseline only.
template <Format F>
__attribute__((always_inline)) inline void CheckBlock(
    const typename FormatBits<F>::Bits* p, int64_t n,
                const Thresholds<typename FormatBits<F>::Bits>& t,
                CheckCounts& total) {
  using Bits = typename FormatBits<F>::Bits;
  // Magnitudes have the sign bit clear, so they compare the same as signed
  // integers, which SIMD units compare natively (unsigned compares cost
  // several instructions each on AVX2).
  using Mag = std::make_signed_t<Bits>;
  using Counter = std::make_signed_t<BlockCounter<Bits>>;
  using FB = FormatBits<F>;
  Counter nan = 0, posinf = 0, neginf = 0, near = 0, under = 0, ovf = 0;
  Mag max_abs = 0;
  const Mag near_at = static_cast<Mag>(t.near_max);
  const Mag tiny = static_cast<Mag>(t.tiny);
  const Mag ovf_at = static_cast<Mag>(t.fp16_overflow);
  const Mag exp = static_cast<Mag>(FB::kExp);
  const Mag nan_abs = static_cast<Mag>(FB::kNanAbs);
  for (int64_t i = 0; i < n; ++i) {
    const Bits bits = p[i];
    const Mag abs = static_cast<Mag>(MagnitudeOf<F>(bits));
    const bool neg = (bits & FB::kSign) != 0;
    // The same classification as check_semantics.h, on signed magnitudes.
    const bool is_nan = FB::kHasInf ? abs > exp : abs == nan_abs;
    const bool is_inf = FB::kHasInf && abs == exp;
    const bool finite = FB::kHasInf ? abs < exp : abs != nan_abs;
    nan += is_nan;
    posinf += is_inf & !neg;
    neginf += is_inf & neg;
    near += finite & (abs >= near_at);
    under += (abs != 0) & (abs < tiny);
    ovf += finite & (abs >= ovf_at);
    // NaN must not count towards the largest magnitude: mask it to zero
    // arithmetically (a select here stops GCC from vectorising the loop).
    const Mag candidate = abs & static_cast<Mag>(Mag(is_nan) - Mag{1});
    max_abs = candidate > max_abs ? candidate : max_abs;
  }
  CheckCounts block;
  block.elements = static_cast<unsigned long long>(n);
  block.nan = static_cast<unsigned long long>(nan);
  block.posinf = static_cast<unsigned long long>(posinf);
  block.neginf = static_cast<unsigned long long>(neginf);
  block.near_max = static_cast<unsigned long long>(near);
  block.underflow = static_cast<unsigned long long>(under);
  block.fp16_overflow = static_cast<unsigned long long>(ovf);
  block.max_abs_bits = static_cast<unsigned long long>(max_abs);
  MergeCounts(total, block);
}

template <Format F>
#if defined(__x86_64__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
CheckCounts CheckTyped(const void* data, int64_t count,
                       const CheckLimits& limits) {
  using Bits = typename FormatBits<F>::Bits;
  const Bits* p = static_cast<const Bits*>(data);
  const auto& t = limits.For<F>();
  CheckCounts total;
  for (int64_t start = 0; start < count; start += kBlock) {
    CheckBlock<F>(p + start, std::min(kBlock, count - start), t, total);
  }
  return total;
}

}  // namespace

CheckCounts CheckHostBuffer(Format format, const void* data, int64_t count,
                            const CheckLimits& limits) {
  if (count <= 0) return CheckCounts{};
  switch (format) {
    case Format::kF16: return CheckTyped<Format::kF16>(data, count, limits);
    case Format::kBF16: return CheckTyped<Format::kBF16>(data, count, limits);
    case Format::kF32: return CheckTyped<Format::kF32>(data, count, limits);
    case Format::kF64: return CheckTyped<Format::kF64>(data, count, limits);
    case Format::kF8E4M3FN:
      return CheckTyped<Format::kF8E4M3FN>(data, count, limits);
    case Format::kF8E5M2:
      return CheckTyped<Format::kF8E5M2>(data, count, limits);
  }
  return CheckCounts{};
}

CheckCounts CountScalar(double value) {
  CheckCounts c;
  c.elements = 1;
  c.nan = std::isnan(value);
  c.posinf = std::isinf(value) && value > 0;
  c.neginf = std::isinf(value) && value < 0;
  return c;
}

}  // namespace nanhunt
