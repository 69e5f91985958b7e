#include "cupti/cuda_checks.h"

#include <cuda_runtime.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace nanhunt::gpu {
namespace {

bool Ok(cudaError_t e, const char* call, std::string* error) {
  if (e == cudaSuccess) return true;
  if (error != nullptr) {
    *error = absl::StrCat(call, ": ", cudaGetErrorString(e));
  }
  return false;
}

cudaEvent_t Event(void** events, int slot) {
  return static_cast<cudaEvent_t>(events[slot]);
}

// Makes `device` current for a scope and restores the thread's device after.
// The current device is the driver's, shared with torch's CUDA runtime: a
// check for a cuda:1 output runs after the op's own device guard is gone
// (a launch into a stream of another device fails), and leaving cuda:1
// current would move the training's next allocations there.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) status_ = cudaSetDevice(device);
  }
  ~DeviceScope() {
    int now = -1;
    if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_) {
      cudaSetDevice(previous_);
    }
  }
  cudaError_t status() const { return status_; }

 private:
  int previous_ = -1;
  cudaError_t status_ = cudaSuccess;
};

// Lets this thread make CUDA calls that a graph capture in progress (on
// any thread, in torch's default "global" mode) would otherwise treat as
// unsafe and answer by invalidating the capture: the drain thread's event
// queries, and the allocations of a device's first check. None of them
// touches a capturing stream; this is how torch's own NCCL watchdog and
// caching allocator query events during captures (the watchdog's queries
// ended users' captures: pytorch/pytorch#104555, fixed the same way in
// #148594).
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

// With the stream's device current.
bool NotCapturing(cudaStream_t stream, std::string* error) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (!Ok(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing", error)) {
    return false;
  }
  if (capture != cudaStreamCaptureStatusNone) {
    if (error != nullptr) *error = "stream is capturing a CUDA graph";
    return false;
  }
  return true;
}

}  // namespace

bool StreamTakesChecks(int device, void* stream, std::string* error) {
  DeviceScope scope(device);
  if (!Ok(scope.status(), "cudaSetDevice", error)) return false;
  return NotCapturing(static_cast<cudaStream_t>(stream), error);
}

bool CaptureForbidsLegacyStream(int device, void* stream) {
  DeviceScope scope(device);
  auto s = static_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  unsigned int flags = 0;
  if (scope.status() != cudaSuccess || cudaStreamIsCapturing(s, &capture) != cudaSuccess) {
    return true;  // cannot tell: do not risk the capture
  }
  if (capture == cudaStreamCaptureStatusNone) return false;
  return cudaStreamGetFlags(s, &flags) != cudaSuccess || (flags & cudaStreamNonBlocking) == 0;
}

CudaChecks::CudaChecks(int device, int slots) : device_(device), slots_(slots) {}

std::unique_ptr<CudaChecks> CudaChecks::Create(int device, int slots,
                                               std::string* error) {
  std::unique_ptr<CudaChecks> c(new CudaChecks(device, slots));
  RelaxedCaptureMode relaxed;
  DeviceScope scope(device);
  if (!Ok(scope.status(), "cudaSetDevice", error)) return nullptr;
  if (!Ok(cudaMalloc(&c->device_slots_, sizeof(CheckCounts) * slots),
          "cudaMalloc", error) ||
      !Ok(cudaMalloc(&c->blocks_done_, sizeof(unsigned int) * slots),
          "cudaMalloc", error) ||
      !Ok(cudaHostAlloc(reinterpret_cast<void**>(&c->host_slots_),
                        sizeof(CheckCounts) * slots,
                        cudaHostAllocMapped | cudaHostAllocPortable),
          "cudaHostAlloc", error) ||
      !Ok(cudaHostGetDevicePointer(reinterpret_cast<void**>(&c->host_slots_on_device_),
                                   c->host_slots_, 0),
          "cudaHostGetDevicePointer", error)) {
    return nullptr;
  }
  // Slots start zeroed, and must be before any check uses one, whatever
  // stream it runs on: zero them on a private stream and wait for that
  // alone (not for the device, whose queues hold the training's work).
  cudaStream_t zeroing;
  if (!Ok(cudaStreamCreateWithFlags(&zeroing, cudaStreamNonBlocking),
          "cudaStreamCreate", error)) {
    return nullptr;
  }
  const bool zeroed =
      Ok(cudaMemsetAsync(c->device_slots_, 0, sizeof(CheckCounts) * slots, zeroing),
         "cudaMemsetAsync", error) &&
      Ok(cudaMemsetAsync(c->blocks_done_, 0, sizeof(unsigned int) * slots, zeroing),
         "cudaMemsetAsync", error) &&
      Ok(cudaStreamSynchronize(zeroing), "cudaStreamSynchronize", error);
  cudaStreamDestroy(zeroing);
  if (!zeroed) return nullptr;
  c->event_of_ = new int[slots];
  for (int i = 0; i < slots; ++i) c->event_of_[i] = i;
  c->events_ = new void*[slots]();
  for (int i = 0; i < slots; ++i) {
    cudaEvent_t e;
    if (!Ok(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
            "cudaEventCreate", error)) {
      return nullptr;
    }
    c->events_[i] = e;
  }
  return c;
}

CudaChecks::~CudaChecks() {
  if (events_ != nullptr) {
    for (int i = 0; i < slots_; ++i) {
      if (events_[i]) cudaEventDestroy(Event(events_, i));
    }
    delete[] events_;
  }
  delete[] event_of_;
  cudaFreeHost(host_slots_);
  cudaFree(blocks_done_);
  cudaFree(device_slots_);
}

bool CudaChecks::Enqueue(int slot, const DeviceTensor& tensor,
                         const CheckLimits& limits, void* stream,
                         std::string* error) {
  auto s = static_cast<cudaStream_t>(stream);
  DeviceScope scope(device_);
  if (!Ok(scope.status(), "cudaSetDevice", error)) return false;
  if (!NotCapturing(s, error)) return false;
  CheckCounts* d = device_slots_ + slot;
  FinalCopy final_copy;
  final_copy.blocks_done = blocks_done_ + slot;
  final_copy.host = host_slots_on_device_ + slot;
  const int launch =
      tensor.dense
          ? LaunchCheck(tensor.format, tensor.data, tensor.count, limits, d, s,
                        &final_copy)
          : LaunchCheckStrided(tensor.format, tensor.data, tensor.layout, limits,
                               d, s, &final_copy);
  if (!Ok(static_cast<cudaError_t>(launch), "check kernel launch", error)) {
    return false;
  }
  event_of_[slot] = slot;
  if (Ok(cudaEventRecord(Event(events_, slot), s), "cudaEventRecord", error)) return true;
  // The slot goes back to the ring: the kernel launched into it must be
  // done first (an error path: the host waits for this stream alone).
  RelaxedCaptureMode relaxed;
  cudaStreamSynchronize(s);
  return false;
}

bool CudaChecks::EnqueueBatch(const int* slots, const DeviceTensor* tensors, int n,
                              const CheckLimits& limits, void* stream,
                              std::string* error) {
  if (n < 1 || n > kMaxBatch) {
    if (error != nullptr) *error = "a batch of checks holds 1 to 32 tensors";
    return false;
  }
  auto s = static_cast<cudaStream_t>(stream);
  DeviceScope scope(device_);
  if (!Ok(scope.status(), "cudaSetDevice", error)) return false;
  if (!NotCapturing(s, error)) return false;
  // One launch per format among the dense tensors (an op's list of outputs
  // has one; NANHUNT_GPU_BATCH's batches under autocast, fp16 and fp32),
  // one per strided tensor. All on `s`: the event after the last launch
  // marks every slot of the batch finished.
  bool done[kMaxBatch] = {};
  bool launched = false;
  // A launch that fails after others succeeded: the slots go back to the
  // ring, so the kernels already launched into them must have finished
  // (an error path: the host waits for this stream alone).
  auto fail = [&] {
    if (launched) {
      RelaxedCaptureMode relaxed;
      cudaStreamSynchronize(s);
    }
    return false;
  };
  for (int i = 0; i < n; ++i) {
    if (done[i]) continue;
    FinalCopy copy;
    copy.blocks_done = blocks_done_ + slots[i];
    copy.host = host_slots_on_device_ + slots[i];
    if (!tensors[i].dense) {
      done[i] = true;
      const int launch = LaunchCheckStrided(tensors[i].format, tensors[i].data,
                                            tensors[i].layout, limits,
                                            device_slots_ + slots[i], s, &copy);
      if (!Ok(static_cast<cudaError_t>(launch), "check kernel launch", error)) return fail();
      launched = true;
      continue;
    }
    BatchItem items[kMaxBatch];
    int count = 0;
    for (int j = i; j < n; ++j) {
      if (done[j] || !tensors[j].dense || tensors[j].format != tensors[i].format) continue;
      done[j] = true;
      items[count].data = tensors[j].data;
      items[count].count = tensors[j].count;
      items[count].result = device_slots_ + slots[j];
      items[count].final_copy.blocks_done = blocks_done_ + slots[j];
      items[count].final_copy.host = host_slots_on_device_ + slots[j];
      ++count;
    }
    if (!Ok(static_cast<cudaError_t>(LaunchCheckBatch(tensors[i].format, items, count,
                                                      limits, s)),
            "check kernel launch", error)) {
      return fail();
    }
    launched = true;
  }
  const int last = slots[n - 1];
  for (int i = 0; i < n; ++i) event_of_[slots[i]] = last;
  return Ok(cudaEventRecord(Event(events_, last), s), "cudaEventRecord", error) || fail();
}

bool CudaChecks::OrderAfterChecks(void* checked_stream, void* waiting_stream,
                                  std::string* error) {
  DeviceScope scope(device_);
  if (!Ok(scope.status(), "cudaSetDevice", error)) return false;
  auto waiting = static_cast<cudaStream_t>(waiting_stream);
  if (!NotCapturing(waiting, error)) return false;
  cudaEvent_t e;
  if (!Ok(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate", error)) {
    return false;
  }
  // Destroying the event right after the wait is enqueued is allowed: CUDA
  // releases it once the device is done with it.
  const bool ok =
      Ok(cudaEventRecord(e, static_cast<cudaStream_t>(checked_stream)), "cudaEventRecord",
         error) &&
      Ok(cudaStreamWaitEvent(waiting, e, 0), "cudaStreamWaitEvent", error);
  cudaEventDestroy(e);
  return ok;
}

bool CudaChecks::Poll(int slot, CheckCounts* result) {
  RelaxedCaptureMode relaxed;
  if (cudaEventQuery(Event(events_, event_of_[slot])) != cudaSuccess) return false;
  std::memcpy(result, host_slots_ + slot, sizeof(CheckCounts));
  return true;
}

void CudaChecks::Wait(int slot, CheckCounts* result) {
  RelaxedCaptureMode relaxed;
  if (cudaEventSynchronize(Event(events_, event_of_[slot])) != cudaSuccess) {
    // The context is gone (process exit) or broken: the result is lost, and
    // the pinned copy may be unmapped. Delivered as "nothing checked".
    *result = CheckCounts{};
    return;
  }
  std::memcpy(result, host_slots_ + slot, sizeof(CheckCounts));
}

}  // namespace nanhunt::gpu
