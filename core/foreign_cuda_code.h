// Whether the process has loaded code that launches CUDA kernels of its own,
// outside torch's operators: Triton's launchers (which torch.compile
// loads), apex, flash-attn's bindings, CuPy, any extension linked against
// the CUDA runtime or driver. Checks held back for a batch
// (NANHUNT_GPU_BATCH=auto) are right only while every write to a tensor
// goes through torch's operators, so such code ends batching.
//
// Recognised when it is loaded: a shared object whose dynamic section
// needs one of `runtimes` (libcudart.so, libcuda.so by default) and that
// lives outside the trusted folders (torch's own, NVIDIA's libraries,
// nanhunt's). The loader's count of loads makes a call cheap when nothing
// was loaded since the last one.
#pragma once

#include <link.h>

#include <cstddef>
#include <string>
#include <vector>

namespace nanhunt {

class ForeignCudaCode {
 public:
  // `trusted_dirs`: folder prefixes whose objects are not foreign.
  // `runtimes`: basename prefixes of the libraries that make code CUDA code.
  explicit ForeignCudaCode(std::vector<std::string> trusted_dirs,
                           std::vector<std::string> runtimes = {"libcudart.so",
                                                                "libcuda.so"});

  // The path of the first foreign object loaded so far, or "" when none.
  // Not thread-safe: the caller serialises.
  const std::string& Find();

 private:
  bool Foreign(const char* path, const std::vector<std::string>& needed) const;
  static int Visit(dl_phdr_info* info, size_t size, void* self);

  const std::vector<std::string> trusted_;
  const std::vector<std::string> runtimes_;
  unsigned long long adds_seen_ = 0;
  std::string found_;
};

// The basenames an object needs (DT_NEEDED), from its dynamic section as
// loaded (what Find reads; public for its test).
std::vector<std::string> NeededBy(const dl_phdr_info* info);

}  // namespace nanhunt
