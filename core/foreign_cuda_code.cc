#include "core/foreign_cuda_code.h"

#include <link.h>
#include <string.h>

#include <cstddef>

namespace nanhunt {
namespace {

// glibc relocates the address entries of a loaded object's dynamic section
// in place on most targets, but not where that section is read-only (the
// vDSO): an address below the object's base is still unrelocated.
ElfW(Addr) Relocated(const dl_phdr_info* info, ElfW(Addr) address) {
  return address < info->dlpi_addr ? address + info->dlpi_addr : address;
}

struct FirstAdds {
  unsigned long long adds = 0;
  bool known = false;
};

int ReadAdds(dl_phdr_info* info, size_t size, void* data) {
  auto* first = static_cast<FirstAdds*>(data);
  if (size >= offsetof(dl_phdr_info, dlpi_adds) + sizeof(info->dlpi_adds)) {
    first->adds = info->dlpi_adds;
    first->known = true;
  }
  return 1;  // the first object says it for all
}

}  // namespace

std::vector<std::string> NeededBy(const dl_phdr_info* info) {
  std::vector<std::string> needed;
  const ElfW(Dyn)* dynamic = nullptr;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    if (info->dlpi_phdr[i].p_type == PT_DYNAMIC) {
      dynamic = reinterpret_cast<const ElfW(Dyn)*>(info->dlpi_addr +
                                                   info->dlpi_phdr[i].p_vaddr);
    }
  }
  if (dynamic == nullptr) return needed;
  const char* strings = nullptr;
  for (const ElfW(Dyn)* d = dynamic; d->d_tag != DT_NULL; ++d) {
    if (d->d_tag == DT_STRTAB) {
      strings = reinterpret_cast<const char*>(Relocated(info, d->d_un.d_ptr));
    }
  }
  if (strings == nullptr) return needed;
  for (const ElfW(Dyn)* d = dynamic; d->d_tag != DT_NULL; ++d) {
    if (d->d_tag == DT_NEEDED) needed.emplace_back(strings + d->d_un.d_val);
  }
  return needed;
}

ForeignCudaCode::ForeignCudaCode(std::vector<std::string> trusted_dirs,
                                 std::vector<std::string> runtimes)
    : trusted_(std::move(trusted_dirs)), runtimes_(std::move(runtimes)) {}

bool ForeignCudaCode::Foreign(const char* path,
                              const std::vector<std::string>& needed) const {
  bool cuda = false;
  for (const std::string& n : needed) {
    for (const std::string& r : runtimes_) cuda = cuda || n.compare(0, r.size(), r) == 0;
  }
  if (!cuda) return false;
  for (const std::string& dir : trusted_) {
    if (!dir.empty() && strncmp(path, dir.c_str(), dir.size()) == 0) return false;
  }
  return true;
}

int ForeignCudaCode::Visit(dl_phdr_info* info, size_t, void* self) {
  auto* me = static_cast<ForeignCudaCode*>(self);
  // The program itself has no name here: a C++ program linked against the
  // CUDA runtime launches its own kernels as much as an extension does.
  const char* path = info->dlpi_name != nullptr && info->dlpi_name[0] != '\0'
                         ? info->dlpi_name
                         : "the program";
  if (strncmp(path, "linux-vdso", 10) == 0) return 0;
  if (me->Foreign(path, NeededBy(info))) {
    me->found_ = path;
    return 1;
  }
  return 0;
}

const std::string& ForeignCudaCode::Find() {
  if (!found_.empty()) return found_;
  FirstAdds first;
  dl_iterate_phdr(ReadAdds, &first);
  if (first.known && first.adds == adds_seen_) return found_;
  adds_seen_ = first.adds;
  dl_iterate_phdr(Visit, this);
  return found_;
}

}  // namespace nanhunt
