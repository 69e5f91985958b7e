// libnanhunt_cuda.so: one CheckRing and one CudaChecks per device, behind
// the C interface of cuda_api.h.
#include "cupti/cuda_api.h"

#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "core/check_ring.h"
#include "cupti/cuda_checks.h"
#include "cupti/kernel_names.h"

namespace nanhunt::gpu {
namespace {

// Result slots per device: enough for a few steps of a large model's ops
// in flight before a thread has to wait (README: full-ring policy).
constexpr int kSlotsPerDevice = 4096;

struct Device {
  std::unique_ptr<CudaChecks> checks;
  std::unique_ptr<CheckRing> ring;
};

absl::Mutex g_mu;
CheckLimits* g_limits = nullptr;
NanhuntDeliverFn g_deliver = nullptr;
// Leaked on purpose: rings drain at exit through nanhunt_cuda_drain, and
// the CUDA runtime may be gone by static destruction.
auto* g_devices = new std::map<int, Device>();

void Fail(char* error, int error_len, const std::string& what) {
  if (error != nullptr && error_len > 0) {
    snprintf(error, static_cast<size_t>(error_len), "%s", what.c_str());
  }
}

CheckRing* RingFor(int device, std::string* error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_mu) {
  auto it = g_devices->find(device);
  if (it != g_devices->end()) return it->second.ring.get();
  Device d;
  d.checks = CudaChecks::Create(device, kSlotsPerDevice, error);
  if (!d.checks) return nullptr;
  d.ring = std::make_unique<CheckRing>(
      d.checks.get(), [](const PendingCheck& check, const CheckCounts& counts) {
        g_deliver(check.context.get(), &counts);
      });
  CheckRing* ring = d.ring.get();
  g_devices->emplace(device, std::move(d));
  return ring;
}

}  // namespace
}  // namespace nanhunt::gpu

using namespace nanhunt;
using namespace nanhunt::gpu;

extern "C" __attribute__((visibility("default"))) int nanhunt_cuda_start(
    double near_max, NanhuntDeliverFn deliver, char* error, int error_len) {
  absl::MutexLock lock(&g_mu);
  if (deliver == nullptr) {
    Fail(error, error_len, "no delivery function");
    return 1;
  }
  g_limits = new CheckLimits(near_max);
  g_deliver = deliver;
  return 0;
}

static_assert(NANHUNT_MAX_BATCH == kMaxBatch, "cuda_api.h's batch size is the kernel's");

namespace {

// Every enqueue: refuse a capturing stream before the ring (a capture must
// not wait for a free slot, nor see this device's first allocations), find
// the device's ring and checks, and run `enqueue` with the launches marked
// as nanhunt's own (the check kernel is not the op's). 0, or 1 with
// `error` saying why.
int Enqueue(int device, void* stream, char* error, int error_len,
            absl::FunctionRef<bool(CheckRing&, CudaChecks&, std::string* why)> enqueue) {
  std::string why;
  CheckRing* ring = nullptr;
  CudaChecks* checks = nullptr;
  if (StreamTakesChecks(device, stream, &why)) {
    absl::MutexLock lock(&g_mu);
    if (g_limits == nullptr) {
      why = "nanhunt_cuda_start was not called";
    } else if ((ring = RingFor(device, &why)) != nullptr) {
      checks = (*g_devices)[device].checks.get();
    }
  }
  bool ok = ring != nullptr;
  if (ok) {
    SetOwnLaunches(true);
    ok = enqueue(*ring, *checks, &why);
    SetOwnLaunches(false);
  }
  if (!ok) Fail(error, error_len, why);
  return ok ? 0 : 1;
}

DeviceTensor FromC(const NanhuntDeviceTensor& t) {
  DeviceTensor tensor;
  tensor.format = static_cast<Format>(t.format);
  tensor.data = t.data;
  tensor.count = t.count;
  tensor.dense = t.dense != 0;
  tensor.layout.dims = t.dims;
  for (int i = 0; i < t.dims && i < kMaxDims; ++i) {
    tensor.layout.sizes[i] = t.sizes[i];
    tensor.layout.strides[i] = t.strides[i];
  }
  return tensor;
}

// The ring owns nothing of the caller's: a context is handed back as is.
// An empty owner aliased to the pointer: no control block to allocate on
// the training thread and free on the drain thread, once per check.
std::shared_ptr<void> Handle(void* context) {
  return std::shared_ptr<void>(std::shared_ptr<void>(), context);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int nanhunt_cuda_enqueue(
    int device, void* stream, const NanhuntDeviceTensor* t, void* context,
    char* error, int error_len) {
  if (t->dense == 0 && (t->dims < 0 || t->dims > kMaxDims)) {
    // The strided kernel indexes at most kMaxDims sizes; reading past them
    // would fault on the device and take the training's context with it.
    Fail(error, error_len, "a strided view of more than 8 dimensions");
    return 1;
  }
  const DeviceTensor tensor = FromC(*t);
  return Enqueue(device, stream, error, error_len,
                 [&](CheckRing& ring, CudaChecks& checks, std::string* why) {
                   return ring.Enqueue(stream, Handle(context), [&](int slot) {
                     return checks.Enqueue(slot, tensor, *g_limits, stream, why);
                   });
                 });
}

extern "C" __attribute__((visibility("default"))) int nanhunt_cuda_enqueue_many(
    int device, void* stream, const NanhuntDeviceTensor* tensors, int n,
    void* const* contexts, char* error, int error_len) {
  if (n < 1 || n > kMaxBatch) {
    Fail(error, error_len, "a batch of checks holds 1 to 32 tensors");
    return 1;
  }
  DeviceTensor batch[kMaxBatch];
  std::vector<std::shared_ptr<void>> handles;
  for (int i = 0; i < n; ++i) {
    if (tensors[i].dense == 0 && (tensors[i].dims < 0 || tensors[i].dims > kMaxDims)) {
      Fail(error, error_len, "a strided view of more than 8 dimensions");
      return 1;
    }
    batch[i] = FromC(tensors[i]);
    handles.push_back(Handle(contexts[i]));
  }
  return Enqueue(device, stream, error, error_len,
                 [&](CheckRing& ring, CudaChecks& checks, std::string* why) {
                   return ring.EnqueueBatch(stream, std::move(handles),
                                            [&](const int* slots, int count) {
                                              return checks.EnqueueBatch(slots, batch, count,
                                                                         *g_limits, stream, why);
                                            });
                 });
}

extern "C" __attribute__((visibility("default"))) int nanhunt_cuda_stream_takes_checks(
    int device, void* stream, char* error, int error_len) {
  std::string why;
  if (StreamTakesChecks(device, stream, &why)) return 1;
  Fail(error, error_len, why);
  return 0;
}

extern "C" __attribute__((visibility("default"))) int
nanhunt_cuda_capture_forbids_legacy_stream(int device, void* stream) {
  return CaptureForbidsLegacyStream(device, stream) ? 1 : 0;
}

extern "C" __attribute__((visibility("default"))) int nanhunt_cuda_order_after(
    int device, void* checked_stream, void* waiting_stream, char* error, int error_len) {
  std::string why;
  CudaChecks* checks = nullptr;
  {
    absl::MutexLock lock(&g_mu);
    auto it = g_devices->find(device);
    if (it != g_devices->end()) checks = it->second.checks.get();
  }
  // No checks on this device yet: nothing to wait for.
  if (checks == nullptr || checks->OrderAfterChecks(checked_stream, waiting_stream, &why)) {
    return 0;
  }
  Fail(error, error_len, why);
  return 1;
}

extern "C" __attribute__((visibility("default"))) void nanhunt_cuda_drain(void) {
  absl::MutexLock lock(&g_mu);
  for (auto& [device, d] : *g_devices) d.ring->DrainAll();
}

extern "C" __attribute__((visibility("default"))) long long nanhunt_cuda_waits(void) {
  absl::MutexLock lock(&g_mu);
  long long waits = 0;
  for (auto& [device, d] : *g_devices) waits += d.ring->waits();
  return waits;
}

extern "C" __attribute__((visibility("default"))) int nanhunt_cupti_start(char* why,
                                                                         int why_len) {
  std::string reason;
  const CuptiCalls calls = LoadCupti(&reason);
  if (StartKernelNames(calls, &reason)) return 1;
  Fail(why, why_len, reason);
  return 0;
}

extern "C" __attribute__((visibility("default"))) size_t nanhunt_kernels_mark(void) {
  return KernelMark();
}

extern "C" __attribute__((visibility("default"))) int nanhunt_kernels_since(
    size_t mark, char* text, int text_len) {
  const std::string s = KernelsSince(mark);
  Fail(text, text_len, s);
  return static_cast<int>(s.size());
}

extern "C" __attribute__((visibility("default"))) void nanhunt_kernels_forget(void) {
  ForgetKernels();
}

extern "C" __attribute__((visibility("default"))) long long nanhunt_kernel_launches(void) {
  return LaunchesSeen();
}
