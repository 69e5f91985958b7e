// The CUDA side of asynchronous checks: result slots in device memory, a
// pinned host copy of each, and an event per slot marking when the copy
// landed. One CudaChecks per device.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/check_limits.h"
#include "core/check_ring.h"
#include "cupti/check_kernel.h"

namespace nanhunt::gpu {

// A tensor on the device as the check needs it.
struct DeviceTensor {
  Format format = Format::kF32;
  const void* data = nullptr;
  int64_t count = 0;
  bool dense = true;      // one block of `count` values from `data`
  StridedLayout layout;   // when not dense
};

class CudaChecks final : public DeviceChecks {
 public:
  // Allocates `slots` result slots on `device`. Errors name the CUDA call.
  static std::unique_ptr<CudaChecks> Create(int device, int slots,
                                            std::string* error);
  ~CudaChecks() override;

  int slots() const override { return slots_; }
  bool Poll(int slot, CheckCounts* result) override;
  void Wait(int slot, CheckCounts* result) override;

  // Enqueues on `stream`: zero the slot, run the check, copy the result to
  // pinned memory, record the slot's event. Never synchronises. A stream
  // that is capturing a CUDA graph is refused (the check would be baked
  // into the graph and its slot reused on every replay): `error` says so.
  bool Enqueue(int slot, const DeviceTensor& tensor, const CheckLimits& limits,
               void* stream, std::string* error);

 private:
  CudaChecks(int device, int slots);

  const int device_;
  const int slots_;
  CheckCounts* device_slots_ = nullptr;
  CheckCounts* host_slots_ = nullptr;  // pinned
  void** events_ = nullptr;            // cudaEvent_t per slot
};

}  // namespace nanhunt::gpu
