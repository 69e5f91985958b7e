// CUPTI kernel attribution without a GPU: the subscription's failure when
// another tool holds CUPTI (named, nothing of theirs touched), and the
// launch callback fed with the data CUPTI would pass.
#include "cupti/kernel_names.h"

#include <cupti_callbacks.h>
#include <cupti_driver_cbid.h>
#include <cupti_result.h>

#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace nanhunt::gpu {
namespace {

int g_subscribe_result = CUPTI_SUCCESS;
std::vector<int> g_enabled;

int FakeSubscribe(void** handle, void*, void*, void* params) {
  auto* p = static_cast<CUpti_SubscriberParams*>(params);
  EXPECT_STREQ(p->subscriberName, "nanhunt");
  EXPECT_GE(p->oldSubscriberSize, static_cast<size_t>(CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN));
  if (g_subscribe_result == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) {
    strcpy(p->oldSubscriberName, "CUPTI for Nsight Systems");
  }
  *handle = reinterpret_cast<void*>(0x1);
  return g_subscribe_result;
}

int FakeEnable(uint32_t enable, void*, int domain) {
  EXPECT_EQ(enable, 1u);
  g_enabled.push_back(domain);
  return CUPTI_SUCCESS;
}

std::vector<uint32_t> g_enabled_callbacks;
int FakeEnableCallback(uint32_t enable, void*, int domain, uint32_t cbid) {
  EXPECT_EQ(enable, 1u);
  EXPECT_EQ(domain, CUPTI_CB_DOMAIN_DRIVER_API);
  g_enabled_callbacks.push_back(cbid);
  return CUPTI_SUCCESS;
}

CuptiCalls Fake(bool per_callback = true) {
  CuptiCalls c;
  c.subscribe = &FakeSubscribe;
  c.enable_domain = &FakeEnable;
  if (per_callback) c.enable_callback = &FakeEnableCallback;
  return c;
}

TEST(KernelNamesTest, AnotherToolHoldingCuptiIsNamedAndLeftAlone) {
  g_subscribe_result = CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
  g_enabled.clear();
  std::string why;
  EXPECT_FALSE(StartKernelNames(Fake(), &why));
  EXPECT_EQ(why, "CUPTI is held by CUPTI for Nsight Systems; kernel names are off, "
                 "checks go on");
  EXPECT_TRUE(g_enabled.empty()) << "nothing may be enabled on a failed subscription";
}

TEST(KernelNamesTest, SubscribingEnablesEveryLaunchCallAndResources) {
  g_subscribe_result = CUPTI_SUCCESS;
  g_enabled.clear();
  g_enabled_callbacks.clear();
  std::string why;
  EXPECT_TRUE(StartKernelNames(Fake(), &why)) << why;
  // Launches one by one, not the whole driver domain (every driver call).
  EXPECT_EQ(g_enabled, (std::vector<int>{CUPTI_CB_DOMAIN_RESOURCE}));
  EXPECT_EQ(g_enabled_callbacks,
            (std::vector<uint32_t>{CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
                                   CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
                                   CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel,
                                   CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz,
                                   CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx,
                                   CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz}));
}

TEST(KernelNamesTest, WithoutPerCallEnablingTheDriverDomainIsEnabled) {
  g_subscribe_result = CUPTI_SUCCESS;
  g_enabled.clear();
  std::string why;
  EXPECT_TRUE(StartKernelNames(Fake(/*per_callback=*/false), &why)) << why;
  EXPECT_EQ(g_enabled, (std::vector<int>{CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_CB_DOMAIN_RESOURCE}));
}

TEST(KernelNamesTest, NoCuptiMeansNoNamesAndAReason) {
  std::string why;
  EXPECT_FALSE(StartKernelNames(CuptiCalls{}, &why));
  EXPECT_FALSE(why.empty());
}

void Launch(const char* name, unsigned grid, CUpti_ApiCallbackSite site = CUPTI_API_ENTER,
            uint32_t cbid = CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel) {
  LaunchKernelParams params{};
  params.grid_x = grid;
  params.grid_y = 1;
  params.grid_z = 1;
  CUpti_CallbackData data{};
  data.callbackSite = site;
  data.symbolName = name;
  data.functionParams = &params;
  KernelCallback(nullptr, CUPTI_CB_DOMAIN_DRIVER_API, cbid, &data);
}

TEST(KernelNamesTest, LaunchesOfAnOpAreNamedWithTheirGrids) {
  ForgetKernels();
  Launch("_Z6kernelPf", 4);
  const size_t mark = KernelMark();
  Launch("gemm_kernel", 80);
  Launch("gemm_kernel", 80, CUPTI_API_EXIT);  // one launch, two callbacks
  Launch("coop", 2, CUPTI_API_ENTER, CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel);
  SetOwnLaunches(true);
  Launch("nanhunt_check", 132);  // nanhunt's own check is not the op's
  SetOwnLaunches(false);
  EXPECT_EQ(KernelsSince(mark), "gemm_kernel<<<80,1,1>>>; coop<<<2,1,1>>>");
  for (int i = 0; i < 8; ++i) Launch("k", 1);
  EXPECT_EQ(KernelsSince(mark, 3), "gemm_kernel<<<80,1,1>>>; coop<<<2,1,1>>>; k<<<1,1,1>>>; +7 more");
  ForgetKernels();
  EXPECT_EQ(KernelsSince(mark), "");
}

}  // namespace
}  // namespace nanhunt::gpu
