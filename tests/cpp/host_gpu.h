// What tests/cpp/host_gpu_ops.cc (CUDA tensors over host memory) and
// tests/cpp/host_gpu_library.cc (the stand-in libnanhunt_cuda.so) agree on.
#pragma once

#include <cstdint>

// The native handle of the stream that "captures a CUDA graph". Handles
// are stream ids; id 0, the default stream, has the null handle, as
// torch's default stream (CUDA's legacy stream) has.
inline constexpr int64_t kHostGpuCapturingStreamId = 0xCA;
inline void* const kHostGpuCapturingStream =
    reinterpret_cast<void*>(static_cast<intptr_t>(kHostGpuCapturingStreamId));
