#include "interpose/torch_detect.h"

#include <link.h>
#include <string.h>

namespace nanhunt {
namespace {

constexpr char kTorchCpu[] = "libtorch_cpu.so";

int FindTorch(struct dl_phdr_info* info, size_t, void* data) {
  const char* name = info->dlpi_name;
  if (name == nullptr || *name == '\0') return 0;
  const char* base = strrchr(name, '/');
  base = base ? base + 1 : name;
  if (strncmp(base, kTorchCpu, sizeof(kTorchCpu) - 1) != 0) return 0;
  *static_cast<std::string*>(data) = name;
  return 1;
}

}  // namespace

std::string TorchLibraryDir() {
  std::string path;
  dl_iterate_phdr(FindTorch, &path);
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash);
}

bool TorchIsLoaded() {
  std::string path;
  dl_iterate_phdr(FindTorch, &path);
  return !path.empty();
}

}  // namespace nanhunt
