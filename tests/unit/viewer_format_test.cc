// How the viewer writes magnitudes: short, whatever their size.
#include "gtest/gtest.h"
#include "viewer/summary.h"

namespace nanhunt {
namespace {

TEST(ViewerFormat, MultiplesOfFp16sLimitStayShort) {
  EXPECT_EQ(TimesFp16Max(131008), "2.00x");
  EXPECT_EQ(TimesFp16Max(72442), "1.11x");
  // torch.finfo(torch.float32).max, 5.19e33 times 65504: not 34 digits.
  EXPECT_EQ(TimesFp16Max(3.4028234663852886e38), "5.19e+33x");
  EXPECT_EQ(FormatAbs(3.4028234663852886e38), "3.4e+38");
}

}  // namespace
}  // namespace nanhunt
