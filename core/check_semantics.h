// The meaning of "checking a value", shared by the CPU check and the CUDA
// check kernel so that the CPU unit tests cover what the GPU computes.
//
// Every decision is made on the raw bit pattern of a value, never on a
// converted float: that keeps NaN payloads, -0, subnormals and the values
// next to a format's limits exact, and it is what both a vectorising C++
// compiler and a GPU do fastest (integer compares only).
//
// Contract: this header is self-contained, allocation-free and includes no
// standard library headers beyond <cstdint>, so nvcc can compile it for the
// device. Thresholds are precomputed on the host (check_thresholds.h).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define NH_HD __host__ __device__ __forceinline__
#else
#define NH_HD inline
#endif

namespace nanhunt {

// Floating-point formats the check understands. The numbering is stored in
// traces; append only.
enum class Format : uint8_t {
  kF16 = 0,
  kBF16 = 1,
  kF32 = 2,
  kF64 = 3,
  kF8E4M3FN = 4,  // no infinities; NaN is S.1111.111
  kF8E5M2 = 5,    // IEEE-like, has infinities
};
inline constexpr int kFormatCount = 6;

// Bit layout of each format. kNanAbs is only used by formats without
// infinities, where exactly one magnitude pattern is NaN.
template <Format F> struct FormatBits;
template <> struct FormatBits<Format::kF16> {
  using Bits = uint16_t;
  static constexpr Bits kSign = 0x8000, kExp = 0x7C00, kMant = 0x03FF;
  static constexpr bool kHasInf = true;
  static constexpr Bits kNanAbs = 0;
};
template <> struct FormatBits<Format::kBF16> {
  using Bits = uint16_t;
  static constexpr Bits kSign = 0x8000, kExp = 0x7F80, kMant = 0x007F;
  static constexpr bool kHasInf = true;
  static constexpr Bits kNanAbs = 0;
};
template <> struct FormatBits<Format::kF32> {
  using Bits = uint32_t;
  static constexpr Bits kSign = 0x80000000u, kExp = 0x7F800000u,
                        kMant = 0x007FFFFFu;
  static constexpr bool kHasInf = true;
  static constexpr Bits kNanAbs = 0;
};
template <> struct FormatBits<Format::kF64> {
  using Bits = uint64_t;
  static constexpr Bits kSign = 0x8000000000000000ull,
                        kExp = 0x7FF0000000000000ull,
                        kMant = 0x000FFFFFFFFFFFFFull;
  static constexpr bool kHasInf = true;
  static constexpr Bits kNanAbs = 0;
};
template <> struct FormatBits<Format::kF8E4M3FN> {
  using Bits = uint8_t;
  static constexpr Bits kSign = 0x80, kExp = 0x78, kMant = 0x07;
  static constexpr bool kHasInf = false;
  static constexpr Bits kNanAbs = 0x7F;
};
template <> struct FormatBits<Format::kF8E5M2> {
  using Bits = uint8_t;
  static constexpr Bits kSign = 0x80, kExp = 0x7C, kMant = 0x03;
  static constexpr bool kHasInf = true;
  static constexpr Bits kNanAbs = 0;
};

// Magnitude thresholds expressed as bit patterns of the checked format.
// A magnitude pattern `a` (sign cleared) of a non-NaN value is compared as an
// unsigned integer: for IEEE-style formats that order equals numeric order.
template <class Bits>
struct Thresholds {
  Bits near_max;       // smallest |x| pattern >= the near-max threshold
  Bits tiny;           // pattern of fp16's smallest normal, 2^-14 (rounded up)
  Bits fp16_overflow;  // smallest |x| pattern >= 65520 (rounds to inf in fp16)
};

// Counters one check produces. Unsigned 64-bit so that the device can use
// atomicAdd(unsigned long long*) on them directly.
struct CheckCounts {
  unsigned long long elements = 0;
  unsigned long long nan = 0;
  unsigned long long posinf = 0;
  unsigned long long neginf = 0;
  unsigned long long near_max = 0;       // finite and |x| >= near-max threshold
  unsigned long long underflow = 0;      // x != 0 and |x| < 2^-14
  unsigned long long fp16_overflow = 0;  // finite and |x| >= 65520
  // Largest non-NaN magnitude as a bit pattern of the checked format
  // (infinity included); decode with DecodeMagnitude (check_thresholds.h).
  unsigned long long max_abs_bits = 0;
};

// Classification of one value, as free functions on the magnitude pattern
// (`abs`, the sign cleared) so that vectorised loops can use them directly.
template <Format F>
NH_HD typename FormatBits<F>::Bits MagnitudeOf(typename FormatBits<F>::Bits bits) {
  using FB = FormatBits<F>;
  return static_cast<typename FB::Bits>(bits & static_cast<typename FB::Bits>(~FB::kSign));
}
template <Format F>
NH_HD bool IsNanMagnitude(typename FormatBits<F>::Bits abs) {
  using FB = FormatBits<F>;
  // With infinities: exponent all ones and a non-zero mantissa.
  return FB::kHasInf ? abs > FB::kExp : abs == FB::kNanAbs;
}
template <Format F>
NH_HD bool IsInfMagnitude(typename FormatBits<F>::Bits abs) {
  using FB = FormatBits<F>;
  return FB::kHasInf && abs == FB::kExp;
}
template <Format F>
NH_HD bool IsNegative(typename FormatBits<F>::Bits bits) {
  return (bits & FormatBits<F>::kSign) != 0;
}
// Finite: neither NaN nor infinite. Magnitudes at or above kExp are not
// finite in formats with infinities; without them only the NaN pattern is.
template <Format F>
NH_HD bool IsFiniteMagnitude(typename FormatBits<F>::Bits abs) {
  using FB = FormatBits<F>;
  return FB::kHasInf ? abs < FB::kExp : abs != FB::kNanAbs;
}

// Adds one value to `c`. The loops of the CPU check and of the GPU kernel
// both reduce to this.
template <Format F>
NH_HD void AccumulateValue(typename FormatBits<F>::Bits bits,
                           const Thresholds<typename FormatBits<F>::Bits>& t,
                           CheckCounts& c) {
  const auto abs = MagnitudeOf<F>(bits);
  const bool finite = IsFiniteMagnitude<F>(abs);
  const bool inf = IsInfMagnitude<F>(abs);
  const bool nan = IsNanMagnitude<F>(abs);
  c.elements += 1;
  c.nan += nan;
  c.posinf += inf && !IsNegative<F>(bits);
  c.neginf += inf && IsNegative<F>(bits);
  c.near_max += finite && abs >= t.near_max;
  c.underflow += abs != 0 && abs < t.tiny;
  c.fp16_overflow += finite && abs >= t.fp16_overflow;
  const unsigned long long a = nan ? 0ull : abs;
  c.max_abs_bits = a > c.max_abs_bits ? a : c.max_abs_bits;
}

// Folds the counts of two disjoint parts of a tensor together.
NH_HD void MergeCounts(CheckCounts& into, const CheckCounts& from) {
  into.elements += from.elements;
  into.nan += from.nan;
  into.posinf += from.posinf;
  into.neginf += from.neginf;
  into.near_max += from.near_max;
  into.underflow += from.underflow;
  into.fp16_overflow += from.fp16_overflow;
  into.max_abs_bits =
      from.max_abs_bits > into.max_abs_bits ? from.max_abs_bits
                                            : into.max_abs_bits;
}

NH_HD bool AnyNonFinite(const CheckCounts& c) {
  return (c.nan | c.posinf | c.neginf) != 0;
}

}  // namespace nanhunt
