#include "core/cpu_check.h"

#include <algorithm>
#include <type_traits>

namespace nanhunt {
namespace {

// Counter type for one block: wide enough for kBlock values, and no wider
// than the data where possible, so that the compiler vectorises the loop
// without widening (16-bit data, 16-bit counters: 16 lanes per AVX2 op).
template <class Bits>
using BlockCounter = std::conditional_t<(sizeof(Bits) < 2), uint16_t, Bits>;

// Values per block: one less than 2^15 so that 16-bit counters cannot
// overflow, large enough that folding blocks into totals costs nothing.
constexpr int64_t kBlock = (1 << 15) - 1;

// One block, written as independent counters so the compiler vectorises it.
// The per-value meaning is check_semantics.h's, as in AccumulateValue<F>.
template <Format F>
void CheckBlock(const typename FormatBits<F>::Bits* p, int64_t n,
                const Thresholds<typename FormatBits<F>::Bits>& t,
                CheckCounts& total) {
  using Bits = typename FormatBits<F>::Bits;
  using Counter = BlockCounter<Bits>;
  Counter nan = 0, posinf = 0, neginf = 0, near = 0, under = 0, ovf = 0;
  Bits max_abs = 0;
  const Bits near_at = t.near_max, tiny = t.tiny, ovf_at = t.fp16_overflow;
  for (int64_t i = 0; i < n; ++i) {
    const Bits bits = p[i];
    const Bits abs = MagnitudeOf<F>(bits);
    const Counter is_nan = IsNanMagnitude<F>(abs);
    const Counter is_inf = IsInfMagnitude<F>(abs);
    const Counter neg = IsNegative<F>(bits);
    const Counter finite = IsFiniteMagnitude<F>(abs);
    nan += is_nan;
    posinf += is_inf & (neg ^ 1);
    neginf += is_inf & neg;
    near += finite & Counter(abs >= near_at);
    under += Counter(abs != 0) & Counter(abs < tiny);
    ovf += finite & Counter(abs >= ovf_at);
    // NaN must not count towards the largest magnitude: mask it to zero
    // arithmetically (a select here stops GCC from vectorising the loop).
    const Bits candidate = abs & static_cast<Bits>(Bits(is_nan) - Bits{1});
    max_abs = candidate > max_abs ? candidate : max_abs;
  }
  CheckCounts block;
  block.elements = static_cast<unsigned long long>(n);
  block.nan = nan;
  block.posinf = posinf;
  block.neginf = neginf;
  block.near_max = near;
  block.underflow = under;
  block.fp16_overflow = ovf;
  block.max_abs_bits = max_abs;
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

}  // namespace nanhunt
