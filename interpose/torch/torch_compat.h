// Everything that depends on the torch version, in one place. The plugin is
// built against whatever torch 2.x the active Python has; where an API moved
// between versions, this header hides it.
#pragma once

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/record_function.h>
#include <torch/version.h>

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <dlfcn.h>

#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "core/check_semantics.h"

// Whether the torch being built against is MAJOR.MINOR or newer.
#define NANHUNT_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||          \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace nanhunt::torch_compat {

// The check's format of a real torch dtype; nullopt for integers, bool and
// complex (whose parts FormatOfValues in op_check.h gives).
inline std::optional<Format> FormatOf(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return Format::kF16;
    case at::kBFloat16: return Format::kBF16;
    case at::kFloat: return Format::kF32;
    case at::kDouble: return Format::kF64;
#if NANHUNT_TORCH_AT_LEAST(2, 1)
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

// The op's overload as operator_name() says it, interned: what
// OverloadName answers before torch 2.7, compiled with every torch so that
// tests/cpp/torch_compat_probe.cc holds it to overload_name() where both
// are. operator_name() is a copy of two strings; name() is the schema's
// own string, one per overload, so its address keys the overload, interned
// once. A scope named by a string has no operator name (and its name's
// address is not its own for long): "", not cached.
inline const char* OverloadNameByOperatorName(const at::RecordFunction& fn) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* interned ABSL_GUARDED_BY(mu) = new absl::node_hash_set<std::string>();
  thread_local absl::flat_hash_map<const char*, const char*> by_name;
  const char* name = fn.name();
  if (auto it = by_name.find(name); it != by_name.end()) return it->second;
  std::optional<c10::OperatorName> op = fn.operator_name();
  if (!op.has_value()) return "";
  const char* overload;
  {
    absl::MutexLock lock(&mu);
    overload = interned->insert(op->overload_name).first->c_str();
  }
  by_name.emplace(name, overload);
  return overload;
}

// The op's overload ("Tensor", "out"; "" for none and for scopes named by
// a string). Its address is stable for as long as the op is registered: the
// traits cache keys on it.
inline const char* OverloadName(const at::RecordFunction& fn) {
#if NANHUNT_TORCH_AT_LEAST(2, 7)
  return fn.overload_name();
#else
  return OverloadNameByOperatorName(fn);  // overload_name() came in 2.7
#endif
}

// The cudaStream_t of a CUDA `stream` as libc10_cuda's
// CUDAStream::stream() says it, into `handle`: what CurrentStreamHandle
// answers before torch 2.11 (getStreamNativeHandle came in 2.11), compiled
// with every torch so that tests/cpp/torch_compat_probe.cc calls it. A
// CUDAStream's one member (c10/cuda/CUDAStream.h, torch 2.0 to 2.10) is
// the c10::Stream the device guard returns, so that Stream is passed as
// `this` to the member function, looked up by its (Itanium) name: the
// plugin links no CUDA library and loads none. In the process's global
// scope first (where a program may stand in for it, as
// tests/cpp/host_gpu_ops.cc does), then in the libc10_cuda already loaded
// (Python loads torch's libraries locally). False, with `why`, when it is
// not there or throws (no driver).
inline bool StreamHandleByCudaStream(const c10::Stream& stream, void** handle,
                                     std::string* why) {
  using NativeOfStream = void* (*)(const c10::Stream* cuda_stream);
  static const NativeOfStream native_of_stream = []() -> NativeOfStream {
    constexpr const char* kStream = "_ZNK3c104cuda10CUDAStream6streamEv";
    if (void* f = dlsym(RTLD_DEFAULT, kStream)) return reinterpret_cast<NativeOfStream>(f);
    void* lib = dlopen("libc10_cuda.so", RTLD_NOW | RTLD_NOLOAD);
    return lib == nullptr ? nullptr : reinterpret_cast<NativeOfStream>(dlsym(lib, kStream));
  }();
  if (stream.device_type() != c10::DeviceType::CUDA || native_of_stream == nullptr) {
    *why = "no c10::cuda::CUDAStream::stream() in the process (libc10_cuda.so)";
    return false;
  }
  try {
    *handle = native_of_stream(&stream);
    return true;
  } catch (const std::exception& e) {
    *why = std::string("c10::cuda::CUDAStream::stream(): ") + e.what();
    return false;
  }
}

// The cudaStream_t that the current stream of `device` (a CUDA device)
// wraps, without linking torch's CUDA library, into `handle`; false (with
// `why`) where this torch cannot say. A null handle is a real stream:
// torch's default stream is CUDA's legacy default stream, whose
// cudaStream_t is 0 (c10/cuda/CUDAStream.cpp, CUDAStream::stream()).
inline bool CurrentStreamHandle(c10::Device device, void** handle,
                                std::string* why) {
  const c10::impl::DeviceGuardImplInterface* impl =
      c10::impl::getDeviceGuardImpl(device.type());
#if NANHUNT_TORCH_AT_LEAST(2, 11)
  *handle = impl->getStreamNativeHandle(impl->getStream(device));
  return true;
#else
  try {
    return StreamHandleByCudaStream(impl->getStream(device), handle, why);
  } catch (const std::exception& e) {  // the guard's getStream, 2.7 to 2.10
    *why = std::string("the current CUDA stream: ") + e.what();
    return false;
  }
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
