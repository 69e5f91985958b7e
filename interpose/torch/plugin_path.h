// Where libnanhunt_torch.so itself lies, for finding nanhunt's files next
// to it (libnanhunt_cuda.so, ../share/nanhunt/).
#pragma once

#include <dlfcn.h>

#include <string>

namespace nanhunt {

inline std::string PluginPath() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&PluginPath), &info) == 0 ||
      info.dli_fname == nullptr) {
    return "";
  }
  return info.dli_fname;
}

}  // namespace nanhunt
