// The GPU kernel's lane-wise body (core/check_vector.h) against the
// per-value semantics: every bit pattern of the 8- and 16-bit formats in
// every lane position, edge values and random words for fp32, and
// thresholds of every kind, including ones that make the fp16-overflow
// count live for fp16.
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/check_limits.h"
#include "core/check_semantics.h"
#include "core/check_vector.h"
#include "gtest/gtest.h"
#include "tests/expect_counts.h"

namespace nanhunt {
namespace {

template <Format F>
using BitsOf = typename FormatBits<F>::Bits;

// One 16-byte vector of values, as the kernel loads it.
template <Format F>
struct Vector {
  BitsOf<F> values[16 / sizeof(BitsOf<F>)];
  void Words(uint32_t (&w)[4]) const { std::memcpy(w, values, 16); }
};

// What the kernel computes for `vectors`, and what AccumulateValue says.
template <Format F>
void ExpectVectorsMatch(const std::vector<Vector<F>>& vectors,
                        const Thresholds<BitsOf<F>>& t, const std::string& what) {
  const VectorThresholds vt = VectorThresholdsFor<F>(t);
  VectorCounts lanes;
  CheckCounts got, want;
  for (const Vector<F>& v : vectors) {
    uint32_t w[4];
    v.Words(w);
    AccumulateVector<F>(w, t, vt, lanes, got);
    for (BitsOf<F> b : v.values) AccumulateValue<F>(b, t, want);
  }
  FoldVectorCounts<F>(lanes, got);
  ExpectSameCounts(got, want, what);
}

// Patterns next to every threshold and limit of the format, both signs.
template <Format F>
std::vector<BitsOf<F>> EdgePatterns(const Thresholds<BitsOf<F>>& t) {
  using FB = FormatBits<F>;
  const uint64_t centres[] = {0, 1, t.near_max, t.tiny, t.fp16_overflow,
                              FB::kExp, FB::kNanAbs, FB::kExp | FB::kMant,
                              static_cast<uint64_t>(FB::kExp) >> 1};
  std::vector<BitsOf<F>> edges;
  for (uint64_t c : centres) {
    for (int64_t d = -2; d <= 2; ++d) {
      const auto abs = static_cast<BitsOf<F>>((c + d) & static_cast<BitsOf<F>>(~FB::kSign));
      edges.push_back(abs);
      edges.push_back(static_cast<BitsOf<F>>(abs | FB::kSign));
    }
  }
  return edges;
}

// Threshold sets: the product's defaults at several near-max settings, and
// made-up ones that exercise every branch of the lane-wise path.
template <Format F>
std::vector<Thresholds<BitsOf<F>>> ThresholdSets() {
  std::vector<Thresholds<BitsOf<F>>> sets;
  for (double near_max : {16376.0, 1.0, 65504.0, 1e30}) {
    sets.push_back(CheckLimits(near_max).For<F>());
  }
  using FB = FormatBits<F>;
  const auto half_exp = static_cast<BitsOf<F>>(FB::kExp >> 1);
  sets.push_back({half_exp, half_exp, half_exp});  // fp16-overflow count live
  sets.push_back({0, 0, 0});
  sets.push_back({static_cast<BitsOf<F>>(FB::kExp), 1, 1});
  return sets;
}

// Every pattern of a narrow format, in every lane, among ordinary values.
template <Format F>
void ExpectEveryPatternInEveryLane() {
  static_assert(sizeof(BitsOf<F>) <= 2);
  std::mt19937 rng(7);
  for (const auto& t : ThresholdSets<F>()) {
    const std::vector<BitsOf<F>> edges = EdgePatterns<F>(t);
    std::vector<BitsOf<F>> finite_edges;
    for (BitsOf<F> b : edges) {
      if (IsFiniteMagnitude<F>(MagnitudeOf<F>(b))) finite_edges.push_back(b);
    }
    // Each pattern in each lane twice: among finite neighbours (the
    // lane-wise path) and among any (often the value-by-value path).
    std::vector<Vector<F>> vectors;
    constexpr int kLanes = 16 / sizeof(BitsOf<F>);
    for (uint32_t p = 0; p < (1u << (8 * sizeof(BitsOf<F>))); ++p) {
      for (int lane = 0; lane < kLanes; ++lane) {
        const std::vector<BitsOf<F>>* pools[] = {&finite_edges, &edges};
        for (const auto* pool : pools) {
          Vector<F> v;
          for (auto& b : v.values) b = (*pool)[rng() % pool->size()];
          v.values[lane] = static_cast<BitsOf<F>>(p);
          vectors.push_back(v);
        }
      }
    }
    ExpectVectorsMatch<F>(vectors, t, "near_max pattern " + std::to_string(t.near_max));
    // And one vector at a time, so that no total hides two compensating errors.
    for (size_t i = 0; i < vectors.size(); i += 61) {
      ExpectVectorsMatch<F>({vectors[i]}, t, "vector " + std::to_string(i));
      if (::testing::Test::HasFailure()) return;
    }
  }
}

TEST(CheckVector, Fp16EveryPatternInEveryLane) { ExpectEveryPatternInEveryLane<Format::kF16>(); }
TEST(CheckVector, Bf16EveryPatternInEveryLane) { ExpectEveryPatternInEveryLane<Format::kBF16>(); }
TEST(CheckVector, Fp8E4M3FnEveryPatternInEveryLane) {
  ExpectEveryPatternInEveryLane<Format::kF8E4M3FN>();
}
TEST(CheckVector, Fp8E5M2EveryPatternInEveryLane) {
  ExpectEveryPatternInEveryLane<Format::kF8E5M2>();
}

TEST(CheckVector, Fp32EdgesAndRandomWords) {
  std::mt19937 rng(11);
  for (const auto& t : ThresholdSets<Format::kF32>()) {
    const std::vector<uint32_t> edges = EdgePatterns<Format::kF32>(t);
    std::vector<Vector<Format::kF32>> vectors;
    for (int i = 0; i < 200000; ++i) {
      Vector<Format::kF32> v;
      for (auto& b : v.values) b = (rng() % 3 == 0) ? rng() : edges[rng() % edges.size()];
      vectors.push_back(v);
    }
    ExpectVectorsMatch<Format::kF32>(vectors, t, "near_max pattern " + std::to_string(t.near_max));
  }
}

TEST(CheckVector, AllFiniteVectorsKeepTheLargestMagnitudeOfEveryLane) {
  // The maximum is kept lane-wise and folded at the end: the largest value
  // sits in a different lane of a different vector each time.
  const Thresholds<uint16_t> t = CheckLimits(16376.0).For<Format::kF16>();
  std::vector<Vector<Format::kF16>> vectors(8);
  for (int i = 0; i < 8; ++i) {
    for (auto& b : vectors[i].values) b = 0x3C00;  // 1.0
    vectors[i].values[i] = static_cast<uint16_t>(0x4000 + i);  // 2.0 and up
  }
  vectors[5].values[5] = 0xFBFF;  // -65504, the largest magnitude
  ExpectVectorsMatch<Format::kF16>(vectors, t, "lane-wise maximum");
  const VectorThresholds vt = VectorThresholdsFor<Format::kF16>(t);
  VectorCounts lanes;
  CheckCounts c;
  for (const auto& v : vectors) {
    uint32_t w[4];
    v.Words(w);
    AccumulateVector<Format::kF16>(w, t, vt, lanes, c);
  }
  FoldVectorCounts<Format::kF16>(lanes, c);
  EXPECT_EQ(c.max_abs_bits, 0x7BFFu);
  EXPECT_EQ(c.near_max, 1u);
  EXPECT_EQ(c.elements, 64u);
}

}  // namespace
}  // namespace nanhunt
