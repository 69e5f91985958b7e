// Field-by-field comparison of two CheckCounts, for the CPU and GPU tests.
#pragma once

#include "core/check_semantics.h"
#include "gtest/gtest.h"

namespace nanhunt {

inline void ExpectSameCounts(const CheckCounts& got, const CheckCounts& want,
                             const std::string& what) {
  EXPECT_EQ(got.elements, want.elements) << what;
  EXPECT_EQ(got.nan, want.nan) << what;
  EXPECT_EQ(got.posinf, want.posinf) << what;
  EXPECT_EQ(got.neginf, want.neginf) << what;
  EXPECT_EQ(got.near_max, want.near_max) << what;
  EXPECT_EQ(got.underflow, want.underflow) << what;
  EXPECT_EQ(got.fp16_overflow, want.fp16_overflow) << what;
  EXPECT_EQ(got.max_abs_bits, want.max_abs_bits) << what;
}

}  // namespace nanhunt
