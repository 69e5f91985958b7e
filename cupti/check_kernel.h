// The GPU check: the same counts as core/cpu_check.h, computed by a kernel
// enqueued on the op's own stream. Host-callable; no CUDA headers needed by
// callers (streams are passed as void*).
//
// Contract: `result` is device memory holding one CheckCounts that the
// kernel accumulates into (zero before the launch: the caller zeroes it, or
// the previous check's FinalCopy left it zeroed).
// Nothing here synchronises the host with the device, and nothing traps on
// the device: a finding is data, the CUDA context always survives.
#pragma once

#include <cstdint>

#include "core/check_limits.h"
#include "core/check_semantics.h"

namespace nanhunt::gpu {

// Up to this many dimensions for tensors that are not one dense block.
inline constexpr int kMaxDims = 8;

struct StridedLayout {
  int dims = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};  // in elements
};

// Where the counts go when the kernel finishes the job itself, so that a
// check costs the stream one kernel and nothing else (no memset before it,
// no copy after it): the last block to finish copies the accumulated counts
// to `host` and zeroes `result` and `blocks_done` for the slot's next check.
struct FinalCopy {
  unsigned int* blocks_done = nullptr;  // device memory, zero at launch
  CheckCounts* host = nullptr;  // pinned host memory, as the device sees it
};

// Returns the CUDA error of the launch (0 on success) as an int, so that
// callers need not include CUDA headers. With `final_copy`, a kernel is
// launched even for no values, so that `host` is always written.
int LaunchCheck(Format format, const void* data, int64_t count,
                const CheckLimits& limits, CheckCounts* result, void* stream,
                const FinalCopy* final_copy = nullptr);

// For tensors that are not one dense block (a slice of a larger tensor):
// `data` points at element 0, `layout` gives sizes and strides.
int LaunchCheckStrided(Format format, const void* data,
                       const StridedLayout& layout, const CheckLimits& limits,
                       CheckCounts* result, void* stream,
                       const FinalCopy* final_copy = nullptr);

// Several dense tensors of one format checked by one launch, each into its
// own result with its own final copy (required): an op with a list of
// outputs (a foreach op's, the optimizer's, GradScaler's unscale) costs
// one kernel launch per kMaxBatch tensors rather than one per tensor.
inline constexpr int kMaxBatch = 32;
struct BatchItem {
  const void* data = nullptr;
  int64_t count = 0;
  CheckCounts* result = nullptr;  // device memory, zero at launch
  FinalCopy final_copy;
};
int LaunchCheckBatch(Format format, const BatchItem* items, int n,
                     const CheckLimits& limits, void* stream);

}  // namespace nanhunt::gpu
