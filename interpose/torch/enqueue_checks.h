// How output checks reach the GPU: right after their op, the checks of one
// op's outputs together (a foreach op's 150 outputs in 5 launches), or,
// with NANHUNT_GPU_BATCH, held back and enqueued with those of the next ops
// (core/check_batches.h decides when; this file keeps the held tensors
// alive, asks the streams, and launches).
#pragma once

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/check_batches.h"
#include "cupti/cuda_api.h"
#include "interpose/torch/cuda_library.h"
#include "interpose/torch/op_check.h"

namespace nanhunt {

class Session;

// One output check to enqueue, and what became of it. Held back for a
// batch (NANHUNT_GPU_BATCH, core/check_batches.h), its tensor keeps the
// caching allocator from reusing the memory before the check has read it.
struct OutputCheck {
  at::Tensor tensor;
  NanhuntDeviceTensor described;
  ResultContext* result = nullptr;  // inside its LateOp
  bool enqueued = false;
  std::string error;  // when not
  // Held: the storage (kept even if the tensor is set_ to another) and the
  // memory it owned then, which it may give back without any op.
  c10::Storage storage;
  MemoryRange memory;
};

// Enqueues `checks` on each tensor's device's current stream: dense tensors
// of one device and format together, NANHUNT_MAX_BATCH a launch; or holds
// them back for a batch, taking them out of `checks`. Each left ends
// enqueued or with `error` (the caller counts those, CountNotEnqueued).
void EnqueueOrHold(const CudaLibrary& lib, std::vector<OutputCheck>& checks);

// Enqueues `described` (with its `contexts`) on `device`'s current stream
// now. False, with `error` saying why, when it could not.
bool EnqueueOnStream(const CudaLibrary& lib, c10::Device device,
                     const NanhuntDeviceTensor* described, void* const* contexts, int n,
                     std::string* error);

// An output of `owner` whose check was not enqueued, and why (`error`):
// counted, never read as finite (in graph capture, or unchecked).
void CountNotEnqueued(const OutputOwner& owner, const std::string& error);

// What an unchecked output of a GPU op is filed under.
inline OutputOwner OwnerOf(const LateOp& op) { return {op.op, op.phase, op.step}; }

// NANHUNT_GPU_BATCH in every-op mode, from the library's first use on.
void StartHoldingChecks(Session& session, const CudaLibrary& lib);
// Everything held, enqueued now (before values are read back, so that
// results stay in order; at an optimizer step's end).
void EnqueueEverythingHeld();
// At exit: everything held is enqueued, and checks go op by op from then on.
void StopHoldingChecks();

// Whether checks are held back now (cheap, read on every op), and, before
// op `fn` starts, enqueuing those it could change (it writes their memory,
// or has no schema to say) or whose stream it leaves, and dropping those
// whose memory went first.
bool DeviceChecksHeld();
void EnqueueHeldChecksBefore(const at::RecordFunction& fn, const OpTraits& traits);

// For the trace.
struct EnqueueTotals {
  int64_t enqueued = 0;     // checks enqueued
  int64_t bytes = 0;        // what they read
  int64_t in_capture = 0;   // outputs left unchecked in CUDA graph capture
  int64_t batches = 0;      // NANHUNT_GPU_BATCH: batches of held checks enqueued
  int64_t released = 0;     // held outputs whose storage gave its memory back first
  std::string batching_stopped;  // NANHUNT_GPU_BATCH=auto: why, if it stopped
  std::string first_enqueue_error;  // why the first check not enqueued was not
};
EnqueueTotals GetEnqueueTotals();

}  // namespace nanhunt
