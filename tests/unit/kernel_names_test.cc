// CUPTI kernel attribution without a GPU: the subscription's failure when
// another tool holds CUPTI (named, nothing of theirs touched), and the
// launch callback fed with the data CUPTI would pass.
#include "cupti/kernel_names.h"

#include <cupti_callbacks.h>
#include <cupti_driver_cbid.h>
#include <cupti_result.h>
#include <cupti_runtime_cbid.h>

#include <algorithm>
#include <cstring>
#include <utility>
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

std::vector<std::pair<int, uint32_t>> g_enabled_callbacks;
int FakeEnableCallback(uint32_t enable, void*, int domain, uint32_t cbid) {
  EXPECT_EQ(enable, 1u);
  g_enabled_callbacks.emplace_back(domain, cbid);
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
  // Launches one by one, not the whole domains (every runtime and driver call).
  EXPECT_EQ(g_enabled, (std::vector<int>{CUPTI_CB_DOMAIN_RESOURCE}));
  const auto enabled = [](int domain, uint32_t cbid) {
    return std::find(g_enabled_callbacks.begin(), g_enabled_callbacks.end(),
                     std::make_pair(domain, cbid)) != g_enabled_callbacks.end();
  };
  // torch's own kernels: `<<<>>>` from CUDA 13, cudaLaunchKernel before.
  EXPECT_TRUE(enabled(CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000));
  EXPECT_TRUE(enabled(CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000));
  EXPECT_TRUE(enabled(CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060));
  EXPECT_TRUE(enabled(CUPTI_CB_DOMAIN_RUNTIME_API,
                      CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_v9000));
  // Triton's and the libraries' driver launches.
  EXPECT_TRUE(enabled(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel));
  EXPECT_TRUE(enabled(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx));
  EXPECT_TRUE(enabled(CUPTI_CB_DOMAIN_DRIVER_API,
                      CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz));
  EXPECT_EQ(g_enabled_callbacks.size(), kLaunchCallbackCount);
}

TEST(KernelNamesTest, WithoutPerCallEnablingTheDriverDomainIsEnabled) {
  g_subscribe_result = CUPTI_SUCCESS;
  g_enabled.clear();
  std::string why;
  EXPECT_TRUE(StartKernelNames(Fake(/*per_callback=*/false), &why)) << why;
  EXPECT_EQ(g_enabled, (std::vector<int>{CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_CB_DOMAIN_DRIVER_API,
                                          CUPTI_CB_DOMAIN_RESOURCE}));
}

TEST(KernelNamesTest, NoCuptiMeansNoNamesAndAReason) {
  std::string why;
  EXPECT_FALSE(StartKernelNames(CuptiCalls{}, &why));
  EXPECT_FALSE(why.empty());
}

// What CUPTI hands the callback for one call of `cbid`.
void Callback(int domain, uint32_t cbid, const char* name, CUpti_ApiCallbackSite site,
              const void* params) {
  CUpti_CallbackData data{};
  data.callbackSite = site;
  data.symbolName = name;
  data.functionParams = params;
  KernelCallback(nullptr, domain, cbid, &data);
}

void Launch(const char* name, unsigned grid, CUpti_ApiCallbackSite site = CUPTI_API_ENTER,
            uint32_t cbid = CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel) {
  LaunchKernelParams params{};
  params.grid_x = grid;
  params.grid_y = 1;
  params.grid_z = 1;
  Callback(CUPTI_CB_DOMAIN_DRIVER_API, cbid, name, site, &params);
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

void RuntimeLaunch(const char* name, unsigned grid, CUpti_ApiCallbackSite site,
                   uint32_t cbid = CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000) {
  RuntimeLaunchParams params{};
  params.grid = Dim3{grid, 2, 1};
  Callback(CUPTI_CB_DOMAIN_RUNTIME_API, cbid, name, site, &params);
}

TEST(KernelNamesTest, RuntimeLaunchesAreNamedOnceEvenWhenTheDriverSeesThemToo) {
  ForgetKernels();
  const size_t mark = KernelMark();
  // A torch kernel: the runtime's callback names it; should the runtime's
  // way to the driver raise a driver callback, that is the same launch.
  RuntimeLaunch("_ZN2at6native18elementwise_kernel", 1024, CUPTI_API_ENTER);
  Launch("_ZN2at6native18elementwise_kernel", 1024);
  RuntimeLaunch("_ZN2at6native18elementwise_kernel", 1024, CUPTI_API_EXIT);
  // Outside any runtime launch, a driver launch (Triton) is its own.
  Launch("triton_poi_fused_add_0", 16);
  RuntimeLaunch("_Z7oldpathPf", 3, CUPTI_API_ENTER, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000);
  RuntimeLaunch("_Z7oldpathPf", 3, CUPTI_API_EXIT, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000);
  // An extended launch reads its grid from the launch config.
  Dim3 config_grid{7, 1, 1};
  RuntimeLaunchExParams ex{};
  ex.config = &config_grid;
  for (CUpti_ApiCallbackSite site : {CUPTI_API_ENTER, CUPTI_API_EXIT}) {
    Callback(CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060,
             "cutlass_gemm", site, &ex);
  }
  // Any other runtime call (the whole domain on, without per-call enabling).
  Callback(CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020,
           nullptr, CUPTI_API_ENTER, nullptr);
  Launch("after_a_memcpy", 5);  // not taken for part of a runtime launch
  EXPECT_EQ(KernelsSince(mark, 10),
            "_ZN2at6native18elementwise_kernel<<<1024,2,1>>>; triton_poi_fused_add_0<<<16,1,1>>>; "
            "_Z7oldpathPf<<<3,2,1>>>; cutlass_gemm<<<7,1,1>>>; after_a_memcpy<<<5,1,1>>>");
  ForgetKernels();
}

}  // namespace
}  // namespace nanhunt::gpu
