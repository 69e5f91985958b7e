// Everything that depends on the torch version, in one place. The plugin is
// built against whatever torch 2.x the active Python has; where an API moved
// between versions, this header hides it.
#pragma once

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/record_function.h>
#include <torch/version.h>

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <optional>
#include <string>

#include "core/check_semantics.h"

namespace nanhunt::torch_compat {

// The check's format of a torch dtype; nullopt for dtypes the check skips
// (integers, bool, complex).
inline std::optional<Format> FormatOf(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return Format::kF16;
    case at::kBFloat16: return Format::kBF16;
    case at::kFloat: return Format::kF32;
    case at::kDouble: return Format::kF64;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
    case at::ScalarType::Float8_e4m3fn: return Format::kF8E4M3FN;
    case at::ScalarType::Float8_e5m2: return Format::kF8E5M2;
#endif
    default: return std::nullopt;
  }
}

// Id of the autograd graph task running on this thread, -1 outside backward.
// Declared by torch/csrc/autograd/graph_task.h, whose includes are heavy.
}  // namespace nanhunt::torch_compat

namespace torch::autograd {
TORCH_API int get_current_graph_task_id();
}  // namespace torch::autograd

namespace nanhunt::torch_compat {

inline bool InBackward() {
  return torch::autograd::get_current_graph_task_id() != -1;
}

inline const char* TorchVersion() { return TORCH_VERSION; }

// The cudaStream_t that the current stream of `device` wraps, without
// linking torch's CUDA library, into `handle`; false (with `why`) where this
// torch cannot say. A null handle is a real stream: torch's default stream
// is CUDA's legacy default stream, whose cudaStream_t is 0
// (c10/cuda/CUDAStream.cpp, CUDAStream::stream()).
inline bool CurrentStreamHandle(c10::Device device, void** handle,
                                std::string* why) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 6)
  const c10::impl::DeviceGuardImplInterface* impl =
      c10::impl::getDeviceGuardImpl(device.type());
  *handle = impl->getStreamNativeHandle(impl->getStream(device));
  return true;
#else
  *why = "the GPU path needs torch 2.6 or newer (stream handles)";
  return false;
#endif
}

// Autocast reads its dtype from thread-local state when each op runs, and
// RecordFunction's start callback runs before the autocast kernel: setting
// the dtype there switches that op. Returns true when it switched.
inline bool SwitchAutocastFp16ToBf16(at::DeviceType device) {
  if (!at::autocast::is_autocast_enabled(device) ||
      at::autocast::get_autocast_dtype(device) != at::kHalf) {
    return false;
  }
  at::autocast::set_autocast_dtype(device, at::kBFloat16);
  return true;
}

}  // namespace nanhunt::torch_compat
