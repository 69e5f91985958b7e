// libnanhunt_cuda.so's C interface, for the torch plugin, which dlopens it
// at the first op output it finds on a GPU (a process that never uses CUDA
// never loads it) and includes no CUDA header.
//
// Each check is enqueued on the op's own stream; results come back, in
// enqueue order per device, through `deliver` on a drain thread. A check
// that could not be enqueued (a stream capturing a CUDA graph, a CUDA
// error) is reported by the return value and never delivered.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/check_semantics.h"

extern "C" {

struct NanhuntDeviceTensor {
  int format;  // nanhunt::Format
  const void* data;
  int64_t count;
  int dense;  // one block of `count` values from `data`; else sizes/strides
  int dims;
  int64_t sizes[8];
  int64_t strides[8];  // in elements
};

typedef void (*NanhuntDeliverFn)(void* context, const nanhunt::CheckCounts* counts);

// Once, before any enqueue. 0 on success.
int nanhunt_cuda_start(double near_max, NanhuntDeliverFn deliver, char* error,
                       int error_len);

// 0 on success: `context` comes back through `deliver`. Otherwise `error`
// says why and `context` stays the caller's.
int nanhunt_cuda_enqueue(int device, void* stream,
                         const NanhuntDeviceTensor* tensor, void* context,
                         char* error, int error_len);

// The most tensors nanhunt_cuda_enqueue_many takes (cupti/check_kernel.h).
enum { NANHUNT_MAX_BATCH = 32 };

// The same for `n` (1 to 32) tensors with one kernel launch per format
// among the dense ones (one per strided one) and one event, each delivered
// with its own context (in order). All or nothing: on failure every
// context stays the caller's.
int nanhunt_cuda_enqueue_many(int device, void* stream,
                              const NanhuntDeviceTensor* tensors, int n,
                              void* const* contexts, char* error, int error_len);

// 1 when a check may be enqueued on `stream` now (not capturing a CUDA
// graph); 0 with `error` saying why. Asked before a check is held back
// for a later batch (NANHUNT_GPU_BATCH).
int nanhunt_cuda_stream_takes_checks(int device, void* stream, char* error,
                                     int error_len);

// 1 when `stream` captures a graph and is not non-blocking: work on the
// legacy default stream now would end its capture (CUDA's rule).
int nanhunt_cuda_capture_forbids_legacy_stream(int device, void* stream);

// Makes `waiting_stream` wait, on the device, for what `checked_stream`
// holds so far (checks enqueued late included). 0 on success.
int nanhunt_cuda_order_after(int device, void* checked_stream, void* waiting_stream,
                             char* error, int error_len);

// Delivers everything enqueued so far (waits for the GPU): at exit.
void nanhunt_cuda_drain(void);

// Times a full ring made an enqueuing thread wait (README: the policy).
long long nanhunt_cuda_waits(void);

// Kernel names through CUPTI (cupti/kernel_names.h). 1 when subscribed;
// 0 with `why` saying who holds CUPTI or what is missing.
int nanhunt_cupti_start(char* why, int why_len);
// The calling thread's launches: a mark, then those since it as
// "name<<<x,y,z>>>; ..." (mangled names), then forgetting them.
size_t nanhunt_kernels_mark(void);
int nanhunt_kernels_since(size_t mark, char* text, int text_len);
void nanhunt_kernels_forget(void);
long long nanhunt_kernel_launches(void);

}  // extern "C"
