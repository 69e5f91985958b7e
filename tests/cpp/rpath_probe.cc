// dlopens a bare library name that only this library's RPATH can resolve,
// as torch does for nvrtc and cuDNN. Under libnanhunt.so's dlopen wrapper
// the lookup must still use this library's RPATH.
#include <dlfcn.h>

extern "C" __attribute__((visibility("default"))) int rpath_probe_load() {
  void* h = dlopen("librpath_probe_dep.so", RTLD_NOW);
  if (h == nullptr) return -1;
  auto fn = reinterpret_cast<int (*)()>(dlsym(h, "rpath_probe_dep_value"));
  return fn ? fn() : -2;
}
