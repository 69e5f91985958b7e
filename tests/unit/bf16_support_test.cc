// Which GPUs NANHUNT_AUTOCAST_DTYPE=bf16 refuses, and which GPUs count.
#include "core/bf16_support.h"

#include "gtest/gtest.h"

namespace nanhunt {
namespace {

const std::vector<GpuInfo> kMixed = {
    {0, "Tesla V100-SXM2-16GB", "GPU-aaaa1111", 7, 0},
    {1, "NVIDIA A100-SXM4-80GB", "GPU-bbbb2222", 8, 0},
    {2, "NVIDIA H200", "GPU-cccc3333", 9, 0},
};

TEST(Bf16SupportTest, VoltaIsRefusedWithTheSettingTheGpuAndWhatToDoInstead) {
  absl::Status s = CheckBf16Support(kMixed);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(),
            "NANHUNT_AUTOCAST_DTYPE=bf16: GPU 0 (Tesla V100-SXM2-16GB, compute "
            "capability 7.0) cannot compute in bf16, which needs compute "
            "capability 8.0 (Ampere) or newer; allowed on this machine: keep "
            "(fp16 with GradScaler), or NANHUNT_FP32_OPS for the ops that "
            "overflow");
}

TEST(Bf16SupportTest, AmpereAndNewerAndNoGpuAtAllPass) {
  EXPECT_TRUE(CheckBf16Support({kMixed[1], kMixed[2]}).ok());
  EXPECT_TRUE(CheckBf16Support({}).ok());
}

TEST(Bf16SupportTest, OnlyTheGpusCudaVisibleDevicesLeavesCount) {
  EXPECT_EQ(VisibleGpus(kMixed, std::nullopt).size(), 3u);
  auto by_index = VisibleGpus(kMixed, std::string("2,1"));
  ASSERT_EQ(by_index.size(), 2u);
  EXPECT_EQ(by_index[0].index, 2);
  EXPECT_TRUE(CheckBf16Support(by_index).ok());
  auto by_uuid = VisibleGpus(kMixed, std::string("GPU-bbbb"));
  ASSERT_EQ(by_uuid.size(), 1u);
  EXPECT_EQ(by_uuid[0].index, 1);
  EXPECT_EQ(VisibleGpus(kMixed, std::string("cccc3"))[0].index, 2);
  // CUDA stops at the first entry it cannot resolve; "" hides every GPU.
  EXPECT_EQ(VisibleGpus(kMixed, std::string("1,7,0")).size(), 1u);
  EXPECT_TRUE(VisibleGpus(kMixed, std::string("")).empty());
  EXPECT_TRUE(VisibleGpus(kMixed, std::string("-1")).empty());
}

}  // namespace
}  // namespace nanhunt
