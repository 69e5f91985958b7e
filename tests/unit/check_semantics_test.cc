// The check's meaning on every edge value, per format, and the vectorised
// CPU check against the per-value semantics shared with the GPU kernel.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/check_limits.h"
#include "core/check_semantics.h"
#include "core/cpu_check.h"
#include "gtest/gtest.h"
#include "tests/expect_counts.h"

namespace nanhunt {
namespace {

const CheckLimits kLimits(16376.0);

template <Format F>
CheckCounts One(typename FormatBits<F>::Bits bits) {
  CheckCounts c;
  AccumulateValue<F>(bits, kLimits.For<F>(), c);
  return c;
}

uint32_t F32Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
uint64_t F64Bits(double d) {
  uint64_t b;
  std::memcpy(&b, &d, 8);
  return b;
}

TEST(CheckSemantics, Fp16LargestFiniteIsNearMaxButFinite) {
  const CheckCounts c = One<Format::kF16>(0x7BFF);  // 65504
  EXPECT_EQ(c.nan + c.posinf + c.neginf, 0u);
  EXPECT_EQ(c.near_max, 1u);
  EXPECT_EQ(c.fp16_overflow, 0u);
  EXPECT_EQ(DecodeMagnitude(Format::kF16, c.max_abs_bits), 65504.0);
}

TEST(CheckSemantics, Fp16InfinitiesAndNanPayloads) {
  EXPECT_EQ(One<Format::kF16>(0x7C00).posinf, 1u);
  EXPECT_EQ(One<Format::kF16>(0xFC00).neginf, 1u);
  for (uint16_t nan : {0x7E00, 0x7C01, 0xFE01, 0xFFFF}) {
    const CheckCounts c = One<Format::kF16>(nan);
    EXPECT_EQ(c.nan, 1u) << std::hex << nan;
    EXPECT_EQ(c.max_abs_bits, 0u) << "NaN must not count as a magnitude";
    EXPECT_EQ(c.near_max, 0u);
  }
  EXPECT_TRUE(std::isinf(DecodeMagnitude(Format::kF16, One<Format::kF16>(0xFC00).max_abs_bits)));
}

TEST(CheckSemantics, Fp16SubnormalsUnderflowButZeroAndNormalsDoNot) {
  EXPECT_EQ(One<Format::kF16>(0x0001).underflow, 1u);  // smallest subnormal
  EXPECT_EQ(One<Format::kF16>(0x83FF).underflow, 1u);  // negative subnormal
  EXPECT_EQ(One<Format::kF16>(0x0400).underflow, 0u);  // 2^-14, normal
  EXPECT_EQ(One<Format::kF16>(0x0000).underflow, 0u);
  EXPECT_EQ(One<Format::kF16>(0x8000).underflow, 0u);  // -0
}

TEST(CheckSemantics, Fp32TellsWhichValuesWouldOverflowInFp16) {
  EXPECT_EQ(One<Format::kF32>(F32Bits(65504.f)).fp16_overflow, 0u);
  EXPECT_EQ(One<Format::kF32>(F32Bits(65519.996f)).fp16_overflow, 0u);
  EXPECT_EQ(One<Format::kF32>(F32Bits(65520.f)).fp16_overflow, 1u);
  EXPECT_EQ(One<Format::kF32>(F32Bits(-3.0e38f)).fp16_overflow, 1u);
  EXPECT_EQ(One<Format::kF32>(F32Bits(std::numeric_limits<float>::max())).posinf, 0u);
  EXPECT_EQ(One<Format::kF32>(F32Bits(16376.f)).near_max, 1u);
  EXPECT_EQ(One<Format::kF32>(F32Bits(16375.998f)).near_max, 0u);
}

TEST(CheckSemantics, Fp32UnderflowIsRelativeToFp16sSmallestNormal) {
  EXPECT_EQ(One<Format::kF32>(F32Bits(6.1035156e-05f)).underflow, 0u);
  EXPECT_EQ(One<Format::kF32>(F32Bits(6.1035149e-05f)).underflow, 1u);
  EXPECT_EQ(One<Format::kF32>(F32Bits(1e-40f)).underflow, 1u);  // fp32 subnormal
  EXPECT_EQ(One<Format::kF32>(F32Bits(-0.0f)).underflow, 0u);
  EXPECT_EQ(One<Format::kF32>(0x7FC00001u).nan, 1u);
  EXPECT_EQ(One<Format::kF32>(0xFF800000u).neginf, 1u);
}

TEST(CheckSemantics, Bf16KeepsFp32sRange) {
  EXPECT_EQ(One<Format::kBF16>(0x7F7F).fp16_overflow, 1u);  // 3.39e38, finite
  EXPECT_EQ(One<Format::kBF16>(0x7F7F).posinf, 0u);
  EXPECT_EQ(One<Format::kBF16>(0x7F80).posinf, 1u);
  EXPECT_EQ(One<Format::kBF16>(0x7FC0).nan, 1u);
  EXPECT_EQ(One<Format::kBF16>(0x3880).underflow, 0u);  // 2^-14
  EXPECT_EQ(One<Format::kBF16>(0x387F).underflow, 1u);
  EXPECT_EQ(DecodeMagnitude(Format::kBF16, 0x3F80), 1.0);
}

TEST(CheckSemantics, Fp64Limits) {
  EXPECT_EQ(One<Format::kF64>(F64Bits(65520.0)).fp16_overflow, 1u);
  EXPECT_EQ(One<Format::kF64>(F64Bits(65519.999)).fp16_overflow, 0u);
  EXPECT_EQ(One<Format::kF64>(F64Bits(std::numeric_limits<double>::denorm_min())).underflow, 1u);
  EXPECT_EQ(One<Format::kF64>(F64Bits(-std::numeric_limits<double>::infinity())).neginf, 1u);
}

TEST(CheckSemantics, Fp8E4M3FnHasNoInfinityAndOneNanPattern) {
  EXPECT_EQ(One<Format::kF8E4M3FN>(0x7E).nan, 0u);  // 448, the largest
  EXPECT_EQ(DecodeMagnitude(Format::kF8E4M3FN, 0x7E), 448.0);
  EXPECT_EQ(One<Format::kF8E4M3FN>(0x7F).nan, 1u);
  EXPECT_EQ(One<Format::kF8E4M3FN>(0xFF).nan, 1u);
  EXPECT_EQ(One<Format::kF8E4M3FN>(0x78).posinf, 0u);  // 256, finite here
  EXPECT_EQ(One<Format::kF8E4M3FN>(0x7E).near_max, 0u);  // far below 16376
}

TEST(CheckSemantics, Fp8E5M2IsIeeeLike) {
  EXPECT_EQ(DecodeMagnitude(Format::kF8E5M2, 0x7B), 57344.0);
  EXPECT_EQ(One<Format::kF8E5M2>(0x7B).near_max, 1u);
  EXPECT_EQ(One<Format::kF8E5M2>(0x7C).posinf, 1u);
  EXPECT_EQ(One<Format::kF8E5M2>(0xFC).neginf, 1u);
  EXPECT_EQ(One<Format::kF8E5M2>(0x7D).nan, 1u);
}

// F.normalize's eps of 1e-12 is 0 in float16 (smallest value 2^-24,
// 6e-8); half of that rounds to 0 too (to even), a little more does not.
TEST(CheckLimits, AnEpsRoundsToZeroBelowHalfTheSmallestValue) {
  EXPECT_TRUE(RoundsToZero(Format::kF16, 1e-12));
  EXPECT_TRUE(RoundsToZero(Format::kF16, -1e-12));
  EXPECT_TRUE(RoundsToZero(Format::kF16, 0x1p-25));
  EXPECT_FALSE(RoundsToZero(Format::kF16, 0x1.01p-25));
  EXPECT_FALSE(RoundsToZero(Format::kF16, 1e-6));
  EXPECT_FALSE(RoundsToZero(Format::kF16, 0)) << "no eps at all";
  EXPECT_FALSE(RoundsToZero(Format::kBF16, 1e-12));
  EXPECT_TRUE(RoundsToZero(Format::kF32, 1e-46));
}

TEST(CheckLimits, ThresholdRoundsUpToTheNextPattern) {
  // 16376 is exactly representable in fp16; 16377 is not (step 16 there).
  EXPECT_EQ(DecodeMagnitude(Format::kF16, SmallestPatternAtLeast(Format::kF16, 16376)), 16376.0);
  EXPECT_EQ(DecodeMagnitude(Format::kF16, SmallestPatternAtLeast(Format::kF16, 16377)), 16384.0);
  // Nothing in e4m3fn reaches 65520: the NaN pattern, which never counts.
  EXPECT_EQ(SmallestPatternAtLeast(Format::kF8E4M3FN, 65520), 0x7Fu);
}

template <Format F>
void ExpectCpuCheckMatchesSemantics(size_t n, std::mt19937_64& rng) {
  using Bits = typename FormatBits<F>::Bits;
  std::vector<Bits> data(n);
  for (auto& b : data) b = static_cast<Bits>(rng());
  // Sprinkle the edge values in.
  const Bits edges[] = {0, static_cast<Bits>(FormatBits<F>::kExp),
                        static_cast<Bits>(FormatBits<F>::kExp | 1),
                        static_cast<Bits>(FormatBits<F>::kSign),
                        static_cast<Bits>(FormatBits<F>::kSign | FormatBits<F>::kExp)};
  for (size_t i = 0; i < n; i += 7) data[i] = edges[(i / 7) % 5];
  CheckCounts expected;
  for (Bits b : data) AccumulateValue<F>(b, kLimits.For<F>(), expected);
  const CheckCounts got = CheckHostBuffer(F, data.data(), static_cast<int64_t>(n), kLimits);
  ExpectSameCounts(got, expected, "n=" + std::to_string(n));
}

TEST(CpuCheck, MatchesPerValueSemanticsForEverySizeAndFormat) {
  std::mt19937_64 rng(42);
  // Sizes around vector widths and the 32767-value block boundary.
  for (size_t n : {1u, 3u, 15u, 16u, 17u, 31u, 33u, 255u, 1000u, 32767u,
                   32768u, 70001u}) {
    ExpectCpuCheckMatchesSemantics<Format::kF16>(n, rng);
    ExpectCpuCheckMatchesSemantics<Format::kBF16>(n, rng);
    ExpectCpuCheckMatchesSemantics<Format::kF32>(n, rng);
    ExpectCpuCheckMatchesSemantics<Format::kF64>(n, rng);
    ExpectCpuCheckMatchesSemantics<Format::kF8E4M3FN>(n, rng);
    ExpectCpuCheckMatchesSemantics<Format::kF8E5M2>(n, rng);
  }
}

TEST(CpuCheck, UnalignedStartIsHandled) {
  std::vector<uint16_t> data(101, 0x3C00);  // 1.0
  data[1] = 0x7C00;
  const CheckCounts c = CheckHostBuffer(Format::kF16, data.data() + 1, 100, kLimits);
  EXPECT_EQ(c.posinf, 1u);
  EXPECT_EQ(c.elements, 100u);
}

}  // namespace
}  // namespace nanhunt
