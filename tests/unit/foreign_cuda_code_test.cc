// ForeignCudaCode reads what each loaded object needs from its dynamic
// section: a library that needs the "runtime" and lives outside the
// trusted folders is foreign once loaded, not before; one that needs
// nothing of the kind, or lives in a trusted folder, never is.
#include "core/foreign_cuda_code.h"

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <string>

#include "gtest/gtest.h"

namespace nanhunt {
namespace {

const std::string kProbes = NANHUNT_FOREIGN_PROBES;
const std::string kRuntime = "libforeign_probe_runtime.so";

std::vector<std::string> NeededByLoaded(const std::string& path) {
  struct Search {
    std::string path;
    std::vector<std::string> needed;
  } search{path, {}};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* s = static_cast<Search*>(data);
        if (info->dlpi_name == nullptr || s->path != info->dlpi_name) return 0;
        s->needed = NeededBy(info);
        return 1;
      },
      &search);
  return search.needed;
}

TEST(ForeignCudaCodeTest, ALibraryThatNeedsTheRuntimeIsForeignOnceLoaded) {
  ForeignCudaCode foreign({}, {kRuntime});
  ForeignCudaCode trusting({kProbes}, {kRuntime});
  ForeignCudaCode real({});  // libcudart, libcuda: none in this process
  EXPECT_EQ(foreign.Find(), "");
  EXPECT_EQ(real.Find(), "");

  const std::string plain = kProbes + "/libforeign_probe_plain.so";
  ASSERT_NE(dlopen(plain.c_str(), RTLD_NOW | RTLD_LOCAL), nullptr) << dlerror();
  EXPECT_EQ(foreign.Find(), "") << "needs no runtime";

  const std::string user = kProbes + "/libforeign_probe_user.so";
  ASSERT_NE(dlopen(user.c_str(), RTLD_NOW | RTLD_LOCAL), nullptr) << dlerror();
  const std::vector<std::string> needed = NeededByLoaded(user);
  EXPECT_NE(std::find(needed.begin(), needed.end(), kRuntime), needed.end())
      << "read from its dynamic section";
  EXPECT_EQ(foreign.Find(), user);
  EXPECT_EQ(foreign.Find(), user) << "and stays found";
  EXPECT_EQ(trusting.Find(), "") << "in a trusted folder";
  EXPECT_EQ(real.Find(), "");
}

#ifdef NANHUNT_FOREIGN_CUDART_PROBE
TEST(ForeignCudaCodeTest, ALibraryLinkedAgainstTheCudaRuntimeIsForeign) {
  // The default names: libcudart.so.N as an extension needs it.
  ForeignCudaCode real({});
  ForeignCudaCode trusting({kProbes});
  ASSERT_NE(dlopen(NANHUNT_FOREIGN_CUDART_PROBE, RTLD_NOW | RTLD_LOCAL), nullptr) << dlerror();
  EXPECT_EQ(real.Find(), NANHUNT_FOREIGN_CUDART_PROBE);
  EXPECT_EQ(trusting.Find(), "");
}
#endif

}  // namespace
}  // namespace nanhunt
