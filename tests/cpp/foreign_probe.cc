// The shared objects of ForeignCudaCode's test
// (tests/unit/foreign_cuda_code_test.cc): what matters is which library
// each one needs. The "runtime" defines a function; the "user" calls it
// (so the linker keeps it needed, as an extension keeps libcudart); the
// "plain" one needs nothing; the "cudart" one needs the CUDA runtime.
#define PROBE_API extern "C" __attribute__((visibility("default")))

#if defined(NANHUNT_PROBE_CUDART)
// Needs the real CUDA runtime, as an extension that launches kernels does.
#include <cuda_runtime_api.h>
PROBE_API int nanhunt_foreign_probe() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : -1;
}
#elif defined(NANHUNT_PROBE_RUNTIME)
PROBE_API int nanhunt_foreign_probe_runtime() { return 1; }
#elif defined(NANHUNT_PROBE_USER)
PROBE_API int nanhunt_foreign_probe_runtime();
PROBE_API int nanhunt_foreign_probe() { return nanhunt_foreign_probe_runtime(); }
#else
PROBE_API int nanhunt_foreign_probe() { return 1; }
#endif
