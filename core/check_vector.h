// AccumulateValue (check_semantics.h) sixteen bytes at a time: the GPU
// kernel's body. The counts are by definition those of AccumulateValue over
// each value of the vector; tests/unit/check_vector_test.cc holds this file
// to that on every edge value, on the host, where the same code compiles.
//
// Why it exists: per value, AccumulateValue is a dozen compares and 64-bit
// adds, about 33 instructions per fp16 value on sm_90, so a kernel built on
// it alone is bound by instruction issue at roughly half of HBM bandwidth.
// Here each 32-bit word holds 1, 2 or 4 values ("lanes") and is handled
// with a few integer instructions, because a magnitude (sign cleared) has
// its lane's top bit H clear, which makes two lane-wise tricks exact:
//   - a + (H - t) sets the lane's top bit exactly when a >= t;
//   - (a | H) - b sets it exactly when a >= b;
// no carry or borrow ever crosses into the next lane.
// A vector holding a NaN or an infinity goes value by value through
// AccumulateValue: rare, and it keeps NaN out of the lane-wise maximum.
//
// Contract: like check_semantics.h, self-contained and allocation-free for
// nvcc. Formats of 8, 16 and 32 bits (fp64 stays value by value).
#pragma once

#include <cstdint>

#include "core/check_semantics.h"

namespace nanhunt {

// `lane`, a value of `width` bits, copied into every lane of a word.
NH_HD constexpr uint32_t Replicate(int width, uint32_t lane) {
  return width == 32 ? lane : width == 16 ? lane * 0x00010001u : lane * 0x01010101u;
}

template <Format F>
struct Lanes {
  using Bits = typename FormatBits<F>::Bits;
  static_assert(sizeof(Bits) <= 4, "fp64 is checked value by value");
  static constexpr int kWidth = 8 * sizeof(Bits);
  static constexpr int kPerWord = 4 / sizeof(Bits);
  static constexpr int kPerVector = 16 / sizeof(Bits);
  static constexpr uint32_t kTop = Replicate(kWidth, 1u << (kWidth - 1));
  static constexpr uint32_t kMagnitude =
      Replicate(kWidth, static_cast<Bits>(~FormatBits<F>::kSign));
  // The smallest magnitude that is not finite: infinity, or, without
  // infinities, the NaN pattern (which is then the largest magnitude).
  static constexpr uint32_t kFirstNonFinite =
      FormatBits<F>::kHasInf ? FormatBits<F>::kExp : FormatBits<F>::kNanAbs;
};

// The thresholds as the addends of the a + (H - t) trick, per lane.
struct VectorThresholds {
  uint32_t near_max;
  uint32_t tiny;
  uint32_t one;  // a >= 1: not zero
  uint32_t fp16_overflow;
  uint32_t non_finite;
  // False when no finite value of the format reaches the fp16-overflow
  // pattern (fp16 and fp8 with the default limits): that count is then
  // always zero on the lane-wise path and is not computed.
  bool count_fp16_overflow;
};

template <Format F>
NH_HD VectorThresholds VectorThresholdsFor(const Thresholds<typename FormatBits<F>::Bits>& t) {
  using L = Lanes<F>;
  constexpr uint32_t h = 1u << (L::kWidth - 1);
  VectorThresholds v;
  v.near_max = Replicate(L::kWidth, h - t.near_max);
  v.tiny = Replicate(L::kWidth, h - t.tiny);
  v.one = Replicate(L::kWidth, h - 1u);
  v.fp16_overflow = Replicate(L::kWidth, h - t.fp16_overflow);
  v.non_finite = Replicate(L::kWidth, h - L::kFirstNonFinite);
  v.count_fp16_overflow = t.fp16_overflow < L::kFirstNonFinite;
  return v;
}

// Per-thread counts of the vectors that took the lane-wise path. 32 bits
// are enough as long as the owner folds them (FoldVectorCounts) before it
// has counted 2^28 vectors; a kernel thread sees a few tens of thousands.
struct VectorCounts {
  uint32_t vectors = 0;
  uint32_t near_max = 0;
  uint32_t underflow = 0;
  uint32_t fp16_overflow = 0;
  uint32_t max_lanes = 0;  // lane-wise maximum magnitude, none of them NaN
};

NH_HD int PopCount(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __popc(x);
#else
  return __builtin_popcount(x);
#endif
}

// Lane-wise unsigned maximum of two words of magnitudes.
template <Format F>
NH_HD uint32_t LaneMax(uint32_t x, uint32_t y) {
  using L = Lanes<F>;
  if constexpr (L::kWidth == 32) {
    return x > y ? x : y;
  } else {
#if defined(__CUDA_ARCH__)
    // One VIMNMX.U16x2 on sm_90; the same lane-wise maximum as below.
    if constexpr (L::kWidth == 16) return __vmaxu2(x, y);
#endif
    const uint32_t x_ge_y = ((x | L::kTop) - y) & L::kTop;
    const uint32_t pick_x = (x_ge_y - (x_ge_y >> (L::kWidth - 1))) | x_ge_y;
    return (x & pick_x) | (y & ~pick_x);
  }
}

// How many lanes of the four words have their top bit set in `masks`, with
// the top bits of each word shifted apart so that one population count does.
NH_HD int CountTopBits(uint32_t m0, uint32_t m1, uint32_t m2, uint32_t m3) {
  return PopCount(m0 | (m1 >> 1) | (m2 >> 2) | (m3 >> 3));
}

// How many of the four words' lanes hold a magnitude a >= t, given the
// addend of t (VectorThresholds).
template <Format F>
NH_HD int CountAtLeast(const uint32_t (&a)[4], uint32_t addend) {
  constexpr uint32_t top = Lanes<F>::kTop;
  return CountTopBits((a[0] + addend) & top, (a[1] + addend) & top,
                      (a[2] + addend) & top, (a[3] + addend) & top);
}

// Adds the values of one 16-byte vector, given as four 32-bit words in
// memory order: all-finite vectors to `v`, any other value by value to `c`.
template <Format F>
NH_HD void AccumulateVector(const uint32_t (&words)[4],
                            const Thresholds<typename FormatBits<F>::Bits>& t,
                            const VectorThresholds& vt, VectorCounts& v,
                            CheckCounts& c) {
  using L = Lanes<F>;
  using Bits = typename L::Bits;
  const uint32_t a[4] = {words[0] & L::kMagnitude, words[1] & L::kMagnitude,
                         words[2] & L::kMagnitude, words[3] & L::kMagnitude};
  const uint32_t largest = LaneMax<F>(LaneMax<F>(a[0], a[1]), LaneMax<F>(a[2], a[3]));
  if (((largest + vt.non_finite) & L::kTop) != 0) {
    for (int w = 0; w < 4; ++w) {
      for (int lane = 0; lane < L::kPerWord; ++lane) {
        AccumulateValue<F>(static_cast<Bits>(words[w] >> (lane * L::kWidth)), t, c);
      }
    }
    return;
  }
  v.vectors += 1;
  v.max_lanes = LaneMax<F>(v.max_lanes, largest);
  v.near_max += CountAtLeast<F>(a, vt.near_max);
  if (vt.count_fp16_overflow) v.fp16_overflow += CountAtLeast<F>(a, vt.fp16_overflow);
  // 1 <= a < tiny: not zero, and below fp16's smallest normal.
  uint32_t under[4];
  for (int w = 0; w < 4; ++w) {
    under[w] = (a[w] + vt.one) & ~(a[w] + vt.tiny) & L::kTop;
  }
  v.underflow += CountTopBits(under[0], under[1], under[2], under[3]);
}

// Adds `v` to `c`: the vectors' values, counts and largest magnitude.
template <Format F>
NH_HD void FoldVectorCounts(const VectorCounts& v, CheckCounts& c) {
  using L = Lanes<F>;
  c.elements += static_cast<unsigned long long>(v.vectors) * L::kPerVector;
  c.near_max += v.near_max;
  c.underflow += v.underflow;
  c.fp16_overflow += v.fp16_overflow;
  constexpr uint32_t lane_mask = L::kWidth == 32 ? 0xFFFFFFFFu : (1u << L::kWidth) - 1;
  for (int lane = 0; lane < L::kPerWord; ++lane) {
    const unsigned long long m = (v.max_lanes >> (lane * L::kWidth)) & lane_mask;
    c.max_abs_bits = m > c.max_abs_bits ? m : c.max_abs_bits;
  }
}

}  // namespace nanhunt
