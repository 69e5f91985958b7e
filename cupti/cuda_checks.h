// The CUDA side of asynchronous checks: result slots in device memory that
// the check kernel accumulates into, a pinned host copy of each that the
// kernel's last block writes (and then zeroes the slot: no memset, no copy
// per check), and an event per slot marking when the kernel was done. One
// CudaChecks per device.
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

// Whether a check may be enqueued on `stream` (of `device`) now: not while
// it captures a CUDA graph (the check would be baked into the graph and
// its slot reused on every replay), nor when CUDA cannot say. Asked before
// a slot is taken, so that a capture never waits for the ring.
bool StreamTakesChecks(int device, void* stream, std::string* error);

// Whether `stream` (of `device`) captures a graph and was not created
// non-blocking: then any work on the legacy default stream would join the
// capture and end it (CUDA's rule), so checks held back there
// (NANHUNT_GPU_BATCH) must not be enqueued now. torch's own streams are
// non-blocking.
bool CaptureForbidsLegacyStream(int device, void* stream);

class CudaChecks final : public DeviceChecks {
 public:
  // Allocates `slots` result slots on `device`. Errors name the CUDA call.
  static std::unique_ptr<CudaChecks> Create(int device, int slots,
                                            std::string* error);
  ~CudaChecks() override;

  int slots() const override { return slots_; }
  bool Poll(int slot, CheckCounts* result) override;
  void Wait(int slot, CheckCounts* result) override;

  // Enqueues on `stream` the check kernel, which leaves its result in the
  // slot's pinned copy, and the slot's event. Never synchronises. A stream
  // that StreamTakesChecks refuses is refused here too: `error` says why.
  // Poll and Wait may run while another thread captures a CUDA graph.
  bool Enqueue(int slot, const DeviceTensor& tensor, const CheckLimits& limits,
               void* stream, std::string* error);
  // The same for `n` tensors (at most kMaxBatch), each into its own slot,
  // with one kernel per format among the dense ones, one per strided one,
  // and one event: every slot of the batch is finished when the batch's
  // last slot's event has passed.
  bool EnqueueBatch(const int* slots, const DeviceTensor* tensors, int n,
                    const CheckLimits& limits, void* stream, std::string* error);
  // Makes `waiting_stream` wait (on the device, the host never does) for
  // everything enqueued on `checked_stream` so far: checks enqueued there
  // late (NANHUNT_GPU_BATCH) finish before a write that another stream
  // makes after synchronising with the producing one. Refused while
  // `waiting_stream` captures a graph (the wait would join the capture).
  bool OrderAfterChecks(void* checked_stream, void* waiting_stream, std::string* error);

 private:
  CudaChecks(int device, int slots);

  const int device_;
  const int slots_;
  CheckCounts* device_slots_ = nullptr;   // accumulators, zero between checks
  unsigned int* blocks_done_ = nullptr;   // per slot, zero between checks
  CheckCounts* host_slots_ = nullptr;     // pinned, mapped
  CheckCounts* host_slots_on_device_ = nullptr;  // the same, as the device sees it
  void** events_ = nullptr;               // cudaEvent_t per slot
  // The slot whose event marks each slot finished: itself, or its batch's
  // last slot (freed last, as slots are delivered in order, so its event
  // is not recorded again while the batch's other slots wait on it).
  int* event_of_ = nullptr;
};

}  // namespace nanhunt::gpu
