// CUPTI kernel attribution: which kernels (name, grid) each op launched.
//
// nanhunt subscribes as "nanhunt" (cuptiSubscribe_v2) to the kernel
// launches of both APIs and to resource callbacks. The runtime's launches
// are torch's own kernels (`<<<>>>` reaches __cudaLaunchKernel from CUDA
// 13, cudaLaunchKernel before); the runtime's internal way into the driver
// raises no driver callback. The driver's are Triton's cuLaunchKernel and
// libraries that launch through the driver (Kineto added those for Triton,
// pytorch/kineto#752). Cooperative and extended launches are included; a
// driver launch inside a runtime launch is the same kernel, recorded once.
// The callback runs on the launching thread, inside the op that launched:
// it appends to a per-thread list that the plugin reads at the op's end. If
// another tool holds CUPTI (torch.profiler/Kineto, Nsight Systems or
// Compute), nanhunt says once who (`oldSubscriberName`) and goes on without
// kernel names; it never finalizes or unsubscribes anyone else.
//
// CUPTI is reached through CuptiCalls (function pointers): libcupti is
// dlopened (the one already in the process first: torch ships one), and the
// unit tests put a fake there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace nanhunt::gpu {

// The few CUPTI entry points used, as plain function pointers.
struct CuptiCalls {
  // cuptiSubscribe_v2(handle*, callback, userdata, params*)
  int (*subscribe)(void** handle, void* callback, void* userdata, void* params) = nullptr;
  // cuptiEnableDomain(enable, handle, domain)
  int (*enable_domain)(uint32_t enable, void* handle, int domain) = nullptr;
  // cuptiEnableCallback(enable, handle, domain, cbid)
  int (*enable_callback)(uint32_t enable, void* handle, int domain, uint32_t cbid) = nullptr;
  // cuptiGetResultString(result, const char**)
  int (*result_string)(int result, const char** text) = nullptr;
};

// Loads libcupti (already loaded first, then by name). Empty calls and
// `why` set when there is none.
CuptiCalls LoadCupti(std::string* why);

// The calls whose callbacks are enabled: every way to launch a kernel, in
// the runtime and in the driver. Only these, not the whole domains: every
// cudaEventRecord, cuMemcpy and cuStreamQuery of the training would
// otherwise pass through CUPTI.
struct LaunchCallbackId {
  int domain;  // CUpti_CallbackDomain
  uint32_t cbid;
};
extern const LaunchCallbackId kLaunchCallbacks[];
extern const size_t kLaunchCallbackCount;

// Subscribes and enables the launch and resource callbacks. On failure,
// returns false with `why` saying who holds CUPTI or what failed; kernel
// names are then simply absent. Call once.
bool StartKernelNames(const CuptiCalls& cupti, std::string* why);

// The calling thread's launches so far (a mark), and those since a mark as
// "name<<<x,y,z>>>" joined by "; ", at most `max` of them (then "+N more").
size_t KernelMark();
std::string KernelsSince(size_t mark, int max = 6);
// Forgets this thread's launches (at the end of a top-level op).
void ForgetKernels();

// While set on a thread, its launches are nanhunt's own (the check
// kernels) and are not recorded.
void SetOwnLaunches(bool own);

// Counters for the trace: launches seen, contexts created.
int64_t LaunchesSeen();
int64_t ContextsSeen();

// The parameter blocks CUPTI hands over for driver launches, as
// generated_cuda_meta.h declares them (cuLaunchKernel_params and
// cuLaunchKernelEx_params; that header needs cuda.h's internal version
// macros). The cooperative launch's block starts the same way.
struct LaunchKernelParams {
  void* f;
  unsigned grid_x, grid_y, grid_z;
  unsigned block_x, block_y, block_z;
  unsigned shared_bytes;
  void* stream;
  void** kernel_params;
  void** extra;
};
struct LaunchKernelExParams {
  const void* config;  // CUlaunchConfig*: gridDimX, gridDimY, gridDimZ first
  void* f;
  void** kernel_params;
  void** extra;
};

// The runtime's launch parameters (generated_cuda_runtime_api_meta.h):
// cudaLaunchKernel_v7000_params, whose layout cudaLaunchCooperativeKernel
// and CUDA 13's __cudaLaunchKernel (a cudaKernel_t first) share, and
// cudaLaunchKernelExC_v11060_params.
struct Dim3 {
  unsigned x, y, z;
};
struct RuntimeLaunchParams {
  const void* func;
  Dim3 grid;
  Dim3 block;
  void** args;
  size_t shared_bytes;
  void* stream;
};
struct RuntimeLaunchExParams {
  const Dim3* config;  // cudaLaunchConfig_t*: its dim3 gridDim first
  const void* func;
  void** args;
};

// The CUPTI callback itself (exposed for the unit tests, which feed it
// fake callback data).
void KernelCallback(void* userdata, int domain, uint32_t cbid, const void* cbdata);

}  // namespace nanhunt::gpu
