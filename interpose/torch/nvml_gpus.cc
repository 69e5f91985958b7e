#include "interpose/torch/nvml_gpus.h"

#include <dlfcn.h>

namespace nanhunt {
namespace {

// The few NVML entry points used, with their C signatures (nvml.h).
using NvmlDevice = void*;
using InitFn = int (*)();
using CountFn = int (*)(unsigned*);
using HandleFn = int (*)(unsigned, NvmlDevice*);
using NameFn = int (*)(NvmlDevice, char*, unsigned);
using CapabilityFn = int (*)(NvmlDevice, int*, int*);

template <class F>
F Symbol(void* lib, const char* name) {
  return reinterpret_cast<F>(dlsym(lib, name));
}

}  // namespace

std::vector<GpuInfo> NvmlGpus() {
  std::vector<GpuInfo> gpus;
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return gpus;
  auto init = Symbol<InitFn>(lib, "nvmlInit_v2");
  auto shutdown = Symbol<InitFn>(lib, "nvmlShutdown");
  auto count = Symbol<CountFn>(lib, "nvmlDeviceGetCount_v2");
  auto handle = Symbol<HandleFn>(lib, "nvmlDeviceGetHandleByIndex_v2");
  auto name = Symbol<NameFn>(lib, "nvmlDeviceGetName");
  auto uuid = Symbol<NameFn>(lib, "nvmlDeviceGetUUID");
  auto capability = Symbol<CapabilityFn>(lib, "nvmlDeviceGetCudaComputeCapability");
  unsigned n = 0;
  if (init && shutdown && count && handle && name && uuid && capability &&
      init() == 0) {
    if (count(&n) == 0) {
      for (unsigned i = 0; i < n; ++i) {
        NvmlDevice device = nullptr;
        GpuInfo g;
        g.index = static_cast<int>(i);
        char text[96] = {};
        if (handle(i, &device) != 0) continue;
        if (name(device, text, sizeof(text)) == 0) g.name = text;
        if (uuid(device, text, sizeof(text)) == 0) g.uuid = text;
        if (capability(device, &g.major, &g.minor) != 0) continue;
        gpus.push_back(g);
      }
    }
    shutdown();
  }
  dlclose(lib);
  return gpus;
}

}  // namespace nanhunt
