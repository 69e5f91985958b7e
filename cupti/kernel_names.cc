#include "cupti/kernel_names.h"

#include <cupti_callbacks.h>
#include <cupti_driver_cbid.h>
#include <cupti_result.h>
#include <cupti_runtime_cbid.h>
#include <dlfcn.h>
#include <cuda.h>

#include <atomic>
#include <vector>

#include "absl/strings/str_cat.h"

namespace nanhunt::gpu {
namespace {

struct Launch {
  std::string name;
  unsigned x, y, z;
};

thread_local std::vector<Launch> t_launches;
thread_local bool t_own = false;
// Inside a runtime launch (between its enter and exit callbacks): a driver
// launch there is the same kernel, already recorded.
thread_local int t_in_runtime_launch = 0;
std::atomic<int64_t> g_launches{0};
std::atomic<int64_t> g_contexts{0};

// Past this many unread launches a thread keeps only the newest: an op
// that launches thousands of kernels is named by its last ones.
constexpr size_t kMaxPerThread = 4096;

void Record(const char* name, unsigned x, unsigned y, unsigned z) {
  g_launches.fetch_add(1, std::memory_order_relaxed);
  if (t_own || name == nullptr) return;
  if (t_launches.size() >= kMaxPerThread) {
    t_launches.erase(t_launches.begin(), t_launches.begin() + kMaxPerThread / 2);
  }
  t_launches.push_back(Launch{name, x, y, z});
}

}  // namespace

const LaunchCallbackId kLaunchCallbacks[] = {
    {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000},
    {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000},
    {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_v9000},
    {CUPTI_CB_DOMAIN_RUNTIME_API,
     CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_ptsz_v9000},
    {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060},
    {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060},
#if CUDA_VERSION >= 13000
    {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000},
    {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_ptsz_v13000},
#endif
    {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel},
    {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz},
    {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel},
    {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz},
    {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx},
    {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz},
};
const size_t kLaunchCallbackCount = sizeof(kLaunchCallbacks) / sizeof(kLaunchCallbacks[0]);

namespace {

void OnRuntimeLaunch(uint32_t cbid, const CUpti_CallbackData& data) {
  const Dim3* grid = nullptr;
  switch (cbid) {
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_v9000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_ptsz_v9000:
#if CUDA_VERSION >= 13000
    case CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000:
    case CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_ptsz_v13000:
#endif
    {
      const auto* p = static_cast<const RuntimeLaunchParams*>(data.functionParams);
      if (p != nullptr) grid = &p->grid;
      break;
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060:
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060: {
      const auto* p = static_cast<const RuntimeLaunchExParams*>(data.functionParams);
      if (p != nullptr) grid = p->config;
      break;
    }
    default:
      return;  // not a launch (the whole domain is on where per-call enabling is not)
  }
  if (data.callbackSite == CUPTI_API_ENTER) {
    ++t_in_runtime_launch;
    Record(data.symbolName, grid ? grid->x : 0, grid ? grid->y : 0, grid ? grid->z : 0);
  } else if (t_in_runtime_launch > 0) {
    --t_in_runtime_launch;
  }
}

}  // namespace

void KernelCallback(void*, int domain, uint32_t cbid, const void* cbdata) {
  if (domain == CUPTI_CB_DOMAIN_RESOURCE) {
    if (cbid == CUPTI_CBID_RESOURCE_CONTEXT_CREATED) {
      g_contexts.fetch_add(1, std::memory_order_relaxed);
    }
    return;
  }
  const auto* data = static_cast<const CUpti_CallbackData*>(cbdata);
  if (data == nullptr) return;
  if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) {
    OnRuntimeLaunch(cbid, *data);
    return;
  }
  if (domain != CUPTI_CB_DOMAIN_DRIVER_API) return;
  if (data->callbackSite != CUPTI_API_ENTER || t_in_runtime_launch > 0) return;
  switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz: {
      const auto* p = static_cast<const LaunchKernelParams*>(data->functionParams);
      Record(data->symbolName, p ? p->grid_x : 0, p ? p->grid_y : 0,
             p ? p->grid_z : 0);
      break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz: {
      const auto* p = static_cast<const LaunchKernelExParams*>(data->functionParams);
      const auto* c = p ? static_cast<const CUlaunchConfig*>(p->config) : nullptr;
      Record(data->symbolName, c ? c->gridDimX : 0, c ? c->gridDimY : 0,
             c ? c->gridDimZ : 0);
      break;
    }
    default:
      break;
  }
}

CuptiCalls LoadCupti(std::string* why) {
  CuptiCalls calls;
  void* lib = nullptr;
  // The libcupti the process already has (torch's) first: two CUPTIs in one
  // process would each think they own the device.
  for (const char* name : {"libcupti.so.13", "libcupti.so.12", "libcupti.so"}) {
    lib = dlopen(name, RTLD_NOW | RTLD_NOLOAD);
    if (lib != nullptr) break;
  }
  for (const char* name : {"libcupti.so.13", "libcupti.so.12", "libcupti.so"}) {
    if (lib != nullptr) break;
    lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  }
  if (lib == nullptr) {
    *why = "no libcupti in the process or on the library path";
    return calls;
  }
  calls.subscribe = reinterpret_cast<decltype(calls.subscribe)>(dlsym(lib, "cuptiSubscribe_v2"));
  calls.enable_domain =
      reinterpret_cast<decltype(calls.enable_domain)>(dlsym(lib, "cuptiEnableDomain"));
  calls.enable_callback =
      reinterpret_cast<decltype(calls.enable_callback)>(dlsym(lib, "cuptiEnableCallback"));
  calls.result_string =
      reinterpret_cast<decltype(calls.result_string)>(dlsym(lib, "cuptiGetResultString"));
  if (calls.subscribe == nullptr || calls.enable_domain == nullptr) {
    *why = "this libcupti has no cuptiSubscribe_v2 (CUPTI 12.6 or newer needed)";
    calls = CuptiCalls{};
  }
  return calls;
}

bool StartKernelNames(const CuptiCalls& cupti, std::string* why) {
  if (cupti.subscribe == nullptr) {
    if (why->empty()) *why = "CUPTI not loaded";
    return false;
  }
  char holder[CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN + 64] = {};
  CUpti_SubscriberParams params{};
  params.structSize = CUpti_SubscriberParams_STRUCT_SIZE;
  params.subscriberName = "nanhunt";
  params.oldSubscriberName = holder;
  params.oldSubscriberSize = sizeof(holder);
  void* handle = nullptr;
  const int rc = cupti.subscribe(&handle, reinterpret_cast<void*>(&KernelCallback),
                                 nullptr, &params);
  if (rc != CUPTI_SUCCESS) {
    if (rc == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) {
      *why = absl::StrCat("CUPTI is held by ", holder[0] ? holder : "another tool",
                          "; kernel names are off, checks go on");
    } else {
      const char* text = nullptr;
      if (cupti.result_string) cupti.result_string(rc, &text);
      *why = absl::StrCat("cuptiSubscribe_v2 failed: ", text ? text : absl::StrCat("error ", rc));
    }
    return false;  // nothing of anyone else's is touched
  }
  bool launches = cupti.enable_callback != nullptr;
  for (const LaunchCallbackId& id : kLaunchCallbacks) {
    if (launches) {
      launches = cupti.enable_callback(1, handle, id.domain, id.cbid) == CUPTI_SUCCESS;
    }
  }
  // Without per-call enabling, the whole launch domains (slower, same names).
  const int domains[] = {launches ? -1 : CUPTI_CB_DOMAIN_RUNTIME_API,
                         launches ? -1 : CUPTI_CB_DOMAIN_DRIVER_API,
                         CUPTI_CB_DOMAIN_RESOURCE};
  for (int domain : domains) {
    if (domain < 0) continue;
    const int e = cupti.enable_domain(1, handle, domain);
    if (e != CUPTI_SUCCESS) {
      *why = absl::StrCat("cuptiEnableDomain(", domain, ") failed: error ", e);
      return false;
    }
  }
  return true;
}

size_t KernelMark() { return t_launches.size(); }

std::string KernelsSince(size_t mark, int max) {
  std::string out;
  if (mark > t_launches.size()) mark = 0;  // forgotten since: all there is
  int shown = 0;
  for (size_t i = mark; i < t_launches.size(); ++i) {
    if (shown == max) {
      absl::StrAppend(&out, "; +", t_launches.size() - i, " more");
      break;
    }
    const Launch& l = t_launches[i];
    absl::StrAppend(&out, shown ? "; " : "", l.name, "<<<", l.x, ",", l.y, ",", l.z, ">>>");
    ++shown;
  }
  return out;
}

void ForgetKernels() { t_launches.clear(); }
void SetOwnLaunches(bool own) { t_own = own; }
int64_t LaunchesSeen() { return g_launches.load(); }
int64_t ContextsSeen() { return g_contexts.load(); }

}  // namespace nanhunt::gpu
