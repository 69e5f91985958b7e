// The GPU check: the same counts as core/cpu_check.h, computed by a kernel
// enqueued on the op's own stream. Host-callable; no CUDA headers needed by
// callers (streams are passed as void*).
//
// Contract: `result` is device memory holding one CheckCounts that the
// kernel accumulates into (the caller zeroes it first, stream-ordered).
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

// Returns the CUDA error of the launch (0 on success) as an int, so that
// callers need not include CUDA headers.
int LaunchCheck(Format format, const void* data, int64_t count,
                const CheckLimits& limits, CheckCounts* result, void* stream);

// For tensors that are not one dense block (a slice of a larger tensor):
// `data` points at element 0, `layout` gives sizes and strides.
int LaunchCheckStrided(Format format, const void* data,
                       const StridedLayout& layout, const CheckLimits& limits,
                       CheckCounts* result, void* stream);

}  // namespace nanhunt::gpu
