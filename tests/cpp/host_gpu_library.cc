// A stand-in for libnanhunt_cuda.so on machines without a GPU, with the
// same C interface (cupti/cuda_api.h): the torch plugin's GPU path, run
// end to end on the CPU. Its "device memory" is host memory (the tensors
// of tests/cpp/host_gpu_ops.cc are CUDA tensors over host buffers), its
// check is the CPU check, run when the check is enqueued (the op has
// finished by then, as it has on its stream), and a drain thread delivers
// the results later and in enqueue order, as the real library's does.
// A stream whose handle is kHostGpuCapturingStream captures a CUDA graph:
// checks are refused on it with the real library's words. HOST_GPU_LAG=N
// keeps the drain thread N results behind the enqueues (until the drain at
// exit), as a GPU running behind the host delivers: the op's own thread
// has let go of its op by then, and the drain thread judges it
// (bench/gpu_op_cost.py, whose counts would otherwise depend on which
// thread valgrind happens to run first). HOST_GPU_LOG=FILE gets a line for
// each call that puts work on a stream: "enqueue DEVICE STREAM CHECKS" and
// "order_after DEVICE CHECKED_STREAM WAITING_STREAM" (streams by id), and
// "drain" for each wait for every result. HOST_GPU_POLL_US=N makes the
// drain thread work as the real ring's does (core/check_ring.cc): wake at
// the first result, deliver what is there, sleep N microseconds, so that
// an enqueue seldom has a thread to wake (bench/gpu_op_cost.py's counts
// and times); without it, each enqueue wakes the drain thread.
//
// No CUPTI: kernel names stay off ("this libnanhunt_cuda.so has no CUPTI
// support"), as the plugin handles a library without those symbols.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <thread>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/check_limits.h"
#include "core/cpu_check.h"
#include "cupti/cuda_api.h"
#include "tests/cpp/host_gpu.h"

#define HOST_GPU_API extern "C" __attribute__((visibility("default")))

namespace {

struct Result {
  void* context;
  nanhunt::CheckCounts counts;
};

struct Library {
  absl::Mutex mu;
  std::deque<Result> queue ABSL_GUARDED_BY(mu);
  int in_delivery ABSL_GUARDED_BY(mu) = 0;
  bool draining ABSL_GUARDED_BY(mu) = false;  // nanhunt_cuda_drain: no lag
  size_t lag = 0;                             // HOST_GPU_LAG
  int poll_us = 0;                            // HOST_GPU_POLL_US
  FILE* log ABSL_GUARDED_BY(mu) = nullptr;    // HOST_GPU_LOG
  NanhuntDeliverFn deliver = nullptr;
  const nanhunt::CheckLimits* limits = nullptr;
};

Library& Lib() {
  static auto* lib = new Library;  // leaked: the drain thread outlives exit
  return *lib;
}

void Say(char* error, int len, const char* text) {
  if (error != nullptr && len > 0) snprintf(error, static_cast<size_t>(len), "%s", text);
}

// What the GPU kernel computes, over the same index space: a dense block
// at once, a strided tensor value by value.
nanhunt::CheckCounts Check(const NanhuntDeviceTensor& t) {
  const auto format = static_cast<nanhunt::Format>(t.format);
  if (t.dense != 0) return nanhunt::CheckHostBuffer(format, t.data, t.count, *Lib().limits);
  nanhunt::CheckCounts total;
  const size_t width = nanhunt::FormatWidth(format);
  int64_t index[8] = {};
  for (int64_t n = 0; n < t.count; ++n) {
    int64_t offset = 0;
    for (int d = 0; d < t.dims; ++d) offset += index[d] * t.strides[d];
    nanhunt::MergeCounts(total, nanhunt::CheckHostBuffer(
                                    format, static_cast<const char*>(t.data) + offset * width,
                                    1, *Lib().limits));
    for (int d = t.dims - 1; d >= 0 && ++index[d] == t.sizes[d]; --d) index[d] = 0;
  }
  return total;
}

template <class... Args>
void Log(const char* format, Args... args) ABSL_EXCLUSIVE_LOCKS_REQUIRED(Lib().mu) {
  if (Lib().log == nullptr) return;
  fprintf(Lib().log, format, args...);
  fflush(Lib().log);
}

bool Deliverable(Library* l) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  return l->queue.size() > (l->draining ? 0 : l->lag);
}

void Drain() {
  Library& lib = Lib();
  for (;;) {
    {
      absl::MutexLock lock(&lib.mu);
      lib.mu.Await(absl::Condition(&Deliverable, &lib));
    }
    for (;;) {  // everything deliverable now, one result at a time
      Result r;
      {
        absl::MutexLock lock(&lib.mu);
        if (!Deliverable(&lib)) break;
        r = lib.queue.front();
        lib.queue.pop_front();
        ++lib.in_delivery;
      }
      lib.deliver(r.context, &r.counts);
      absl::MutexLock lock(&lib.mu);
      --lib.in_delivery;
    }
    if (lib.poll_us > 0) absl::SleepFor(absl::Microseconds(lib.poll_us));
  }
}

}  // namespace

HOST_GPU_API int nanhunt_cuda_start(double near_max, NanhuntDeliverFn deliver, char*, int) {
  Lib().deliver = deliver;
  Lib().limits = new nanhunt::CheckLimits(near_max);
  if (const char* lag = getenv("HOST_GPU_LAG"); lag != nullptr) Lib().lag = strtoul(lag, nullptr, 10);
  if (const char* poll = getenv("HOST_GPU_POLL_US"); poll != nullptr) Lib().poll_us = atoi(poll);
  if (const char* log = getenv("HOST_GPU_LOG"); log != nullptr) {
    absl::MutexLock lock(&Lib().mu);
    Lib().log = fopen(log, "w");
  }
  std::thread(Drain).detach();
  return 0;
}

HOST_GPU_API int nanhunt_cuda_stream_takes_checks(int, void* stream, char* error, int len) {
  if (stream == kHostGpuCapturingStream) {
    Say(error, len, "stream is capturing a CUDA graph");
    return 0;
  }
  return 1;
}

HOST_GPU_API int nanhunt_cuda_enqueue_many(int device, void* stream,
                                           const NanhuntDeviceTensor* tensors, int n,
                                           void* const* contexts, char* error, int len) {
  if (nanhunt_cuda_stream_takes_checks(device, stream, error, len) == 0) return 1;
  if (n < 1 || n > NANHUNT_MAX_BATCH) {
    Say(error, len, "batch size out of range");
    return 1;
  }
  std::deque<Result> results;
  for (int i = 0; i < n; ++i) results.push_back({contexts[i], Check(tensors[i])});
  absl::MutexLock lock(&Lib().mu);
  Log("enqueue %d %ld %d\n", device, reinterpret_cast<intptr_t>(stream), n);
  for (Result& r : results) Lib().queue.push_back(r);
  return 0;
}

HOST_GPU_API int nanhunt_cuda_enqueue(int device, void* stream, const NanhuntDeviceTensor* tensor,
                                      void* context, char* error, int len) {
  return nanhunt_cuda_enqueue_many(device, stream, tensor, 1, &context, error, len);
}

HOST_GPU_API int nanhunt_cuda_capture_forbids_legacy_stream(int, void*) { return 0; }

HOST_GPU_API int nanhunt_cuda_order_after(int device, void* checked, void* waiting, char*, int) {
  absl::MutexLock lock(&Lib().mu);
  Log("order_after %d %ld %ld\n", device, reinterpret_cast<intptr_t>(checked),
      reinterpret_cast<intptr_t>(waiting));
  return 0;
}

HOST_GPU_API void nanhunt_cuda_drain(void) {
  Library& lib = Lib();
  absl::MutexLock lock(&lib.mu);
  Log("drain\n");
  lib.draining = true;
  lib.mu.Await(absl::Condition(
      +[](Library* l) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return l->queue.empty() && l->in_delivery == 0;
      },
      &lib));
  lib.draining = false;  // called mid-run too: behind again from here
}

HOST_GPU_API long long nanhunt_cuda_waits(void) { return 0; }

// Not libnanhunt_cuda.so's: for tests/cpp/host_gpu_ops.cc, which finds it
// by this library's soname. Waits until the drain thread has delivered all
// but HOST_GPU_LAG results, as a GPU catches up while the host waits (for
// its next batch, a .item()): what has been delivered by a point of the
// program is then the same in every run.
HOST_GPU_API void host_gpu_settle(void) {
  Library& lib = Lib();
  absl::MutexLock lock(&lib.mu);
  lib.mu.Await(absl::Condition(
      +[](Library* l) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return l->queue.size() <= l->lag && l->in_delivery == 0;
      },
      &lib));
}
