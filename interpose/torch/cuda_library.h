// libnanhunt_cuda.so, loaded at the first GPU output with dlopen (the
// preload library must run on machines without a driver): its entry
// points, CUPTI's kernel names, and the delivery of its results into
// LateOps (core/late_ops.h). Torch-free: device_outputs.cc turns tensors
// into what is enqueued here.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "core/late_ops.h"
#include "cupti/cuda_api.h"

namespace nanhunt {

class Session;

struct CudaLibrary {
  decltype(&nanhunt_cuda_start) start = nullptr;
  decltype(&nanhunt_cuda_enqueue) enqueue = nullptr;
  decltype(&nanhunt_cuda_enqueue_many) enqueue_many = nullptr;  // optional
  decltype(&nanhunt_cuda_drain) drain = nullptr;
  decltype(&nanhunt_cuda_waits) waits = nullptr;
  decltype(&nanhunt_kernels_mark) kernels_mark = nullptr;
  decltype(&nanhunt_kernels_since) kernels_since = nullptr;
  decltype(&nanhunt_kernels_forget) kernels_forget = nullptr;
  decltype(&nanhunt_kernel_launches) kernel_launches = nullptr;
  decltype(&nanhunt_cuda_stream_takes_checks) stream_takes_checks = nullptr;  // batching
  decltype(&nanhunt_cuda_order_after) order_after = nullptr;                  // batching
  decltype(&nanhunt_cuda_capture_forbids_legacy_stream) legacy_forbidden = nullptr;
  std::string unavailable;  // why not, when it did not load
  int (*cupti_start)(char*, int) = nullptr;
  // Why CUPTI gives no names, if so; changes once when sample mode starts
  // them late (StartKernelNames).
  absl::Mutex names_mu;
  std::string kernel_names_off ABSL_GUARDED_BY(names_mu);
  std::atomic<bool> names_tried{false};  // StartKernelNames ran
};

// Loads it once, next to this plugin (`unavailable` says why it did not),
// and makes the LateOps its results go to, which judge inputs by the
// registry of storages (`state_of`, `remember`).
CudaLibrary& LoadCudaLibrary(Session& session,
                             std::function<StorageState(const void*)> state_of,
                             LateOps::Remember remember);

// The late ops results are delivered to; null before the library loaded.
LateOps* LateResults();

// Subscribes to CUPTI for kernel names, once (said once when it cannot).
void StartKernelNames(CudaLibrary& library, Session& session);
// NameKernelsFromNowOn was called: the next GPU op starts names.
bool KernelNamesWanted();

// Values read back from the device (ReadValuesOnDevice): complete once
// every read has arrived.
struct ValueRead {
  std::function<void(const std::vector<double>&)> then;
  std::vector<Format> formats;
  std::vector<double> values;
  std::atomic<int> pending{0};
};

// What a value read back is delivered with: the read and which of its
// values (index). An op's outputs come back with the ResultContexts their
// LateOp holds.
struct ValueReadContext : ResultContext {
  explicit ValueReadContext(std::shared_ptr<ValueRead> r, int i) : read(std::move(r)) {
    kind = Kind::kValueRead;
    index = i;
  }
  std::shared_ptr<ValueRead> read;
};

// The library's context for `c`: always through the base, so that
// DeliverResult's cast back is exact.
inline void* AsContext(ResultContext* c) { return static_cast<void*>(c); }

// Takes `context` (AsContext of a late op's ResultContext, or of a
// ValueReadContext, which it deletes) with its result: on the drain thread,
// or with nothing checked by whoever could not enqueue it. Results that
// come after monitoring stopped are let go of, except while the session
// drains at exit (DeliverWhileDrainingAtExit), before its trace is closed.
void DeliverResult(void* context, const CheckCounts* counts);

// A late op's record, from the pool its ops go back to once judged
// (core/late_op_pool.h). After LoadCudaLibrary only.
LateOp* NewLateOp();
void DeliverWhileDrainingAtExit(bool on);
// Whether that drain is under way: the program has stopped (its training
// function returned, a C++ program's main), so what is still alive then
// says nothing of what a step left behind.
bool DrainingAtExit();

// Enqueues the checks of `described` (one tensor, or up to
// NANHUNT_MAX_BATCH tensors) on `stream` of `device`; each context comes
// back through DeliverResult. False, with `error` saying why, when they
// could not be enqueued: the contexts are then still the caller's.
bool EnqueueOn(const CudaLibrary& library, int device, void* stream,
               const NanhuntDeviceTensor* described, void* const* contexts, int n,
               std::string* error);

// Folders whose libraries launch kernels only inside torch's operators (or
// are nanhunt's), for NANHUNT_GPU_BATCH=auto (core/foreign_cuda_code.h).
std::vector<std::string> TrustedDirs(const std::string& plugin);

// CUPTI: this thread's kernel launches so far (0 before the GPU library is
// loaded), and forgetting them (at the end of a top-level op). Cheap.
size_t DeviceKernelMark();
void ForgetDeviceKernels();
// The kernels launched since `mark`, when names are on; empty otherwise.
std::string DeviceKernelsSince(size_t mark);
// GPU kernel names with NANHUNT_KERNEL_NAMES=auto: off until the first
// result near fp16's limit or non-finite, or sample mode's first
// escalation, which call this; the next GPU op's thread subscribes (not
// the caller's: it may be the drain thread, inside a delivery), and the
// findings after it name their kernels.
void NameKernelsFromNowOn();

// Called with each late op's verdict (NaN guard, auto fp32), on the drain
// thread. Set once, before any op.
void SetLateVerdictHandler(std::function<void(const LateOp&, Verdict)> fn);

}  // namespace nanhunt
