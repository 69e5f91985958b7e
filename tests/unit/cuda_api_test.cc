// libnanhunt_cuda.so as the plugin uses it (dlopen, C interface). Without a
// driver (CI), an enqueue must fail with the CUDA call named and keep the
// caller's context; with a GPU, an empty check is delivered. Either way the
// process goes on.
#include <dlfcn.h>

#include <atomic>
#include <string>

#include "cupti/cuda_api.h"
#include "gtest/gtest.h"

namespace {

std::atomic<int> g_delivered{0};
void Deliver(void*, const nanhunt::CheckCounts* counts) {
  if (counts->elements == 0) g_delivered.fetch_add(1);
}

TEST(CudaApiTest, EnqueueWithoutADriverFailsCleanlyAndWithAGpuDelivers) {
  void* lib = dlopen(NANHUNT_CUDA_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  auto start = reinterpret_cast<decltype(&nanhunt_cuda_start)>(dlsym(lib, "nanhunt_cuda_start"));
  auto enqueue = reinterpret_cast<decltype(&nanhunt_cuda_enqueue)>(dlsym(lib, "nanhunt_cuda_enqueue"));
  auto drain = reinterpret_cast<decltype(&nanhunt_cuda_drain)>(dlsym(lib, "nanhunt_cuda_drain"));
  ASSERT_TRUE(start && enqueue && drain);
  char error[256] = {};
  ASSERT_EQ(start(16376.0, &Deliver, error, sizeof(error)), 0) << error;
  NanhuntDeviceTensor empty{};
  empty.format = static_cast<int>(nanhunt::Format::kF16);
  empty.dense = 1;
  int context = 0;
  const int rc = enqueue(0, /*default stream*/ nullptr, &empty, &context, error,
                         sizeof(error));
  if (rc != 0) {
    // No driver or no device: the message names the CUDA call that failed.
    EXPECT_NE(std::string(error).find("cuda"), std::string::npos) << error;
    EXPECT_EQ(g_delivered.load(), 0);
  } else {
    drain();
    EXPECT_EQ(g_delivered.load(), 1);
  }
}

TEST(CudaApiTest, StridedViewsBeyondTheKernelsDimensionsAreRefusedNotRead) {
  // The strided kernel reads at most 8 sizes: a 9-dimensional view must be
  // refused before anything reaches the device (which would fault there).
  void* lib = dlopen(NANHUNT_CUDA_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  auto start = reinterpret_cast<decltype(&nanhunt_cuda_start)>(dlsym(lib, "nanhunt_cuda_start"));
  auto enqueue = reinterpret_cast<decltype(&nanhunt_cuda_enqueue)>(dlsym(lib, "nanhunt_cuda_enqueue"));
  ASSERT_TRUE(start && enqueue);
  char error[256] = {};
  ASSERT_EQ(start(16376.0, &Deliver, error, sizeof(error)), 0) << error;
  NanhuntDeviceTensor view{};
  view.format = static_cast<int>(nanhunt::Format::kF32);
  view.count = 512;
  view.dense = 0;
  view.dims = 9;
  int context = 0;
  EXPECT_NE(enqueue(0, nullptr, &view, &context, error, sizeof(error)), 0);
  EXPECT_NE(std::string(error).find("8 dimensions"), std::string::npos) << error;
}

TEST(CudaApiTest, ABatchIsDeliveredOnePerTensorOrRefusedWhole) {
  void* lib = dlopen(NANHUNT_CUDA_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  auto start = reinterpret_cast<decltype(&nanhunt_cuda_start)>(dlsym(lib, "nanhunt_cuda_start"));
  auto many = reinterpret_cast<decltype(&nanhunt_cuda_enqueue_many)>(
      dlsym(lib, "nanhunt_cuda_enqueue_many"));
  auto drain = reinterpret_cast<decltype(&nanhunt_cuda_drain)>(dlsym(lib, "nanhunt_cuda_drain"));
  ASSERT_TRUE(start && many && drain);
  char error[256] = {};
  ASSERT_EQ(start(16376.0, &Deliver, error, sizeof(error)), 0) << error;
  NanhuntDeviceTensor empty[33]{};
  int contexts[33] = {};
  void* handles[33];
  for (int i = 0; i < 33; ++i) {
    empty[i].format = static_cast<int>(nanhunt::Format::kF32);
    empty[i].dense = 1;
    handles[i] = &contexts[i];
  }
  EXPECT_NE(many(0, nullptr, empty, 33, handles, error, sizeof(error)), 0);
  EXPECT_NE(std::string(error).find("1 to 32"), std::string::npos) << error;
  const int before = g_delivered.load();
  if (many(0, nullptr, empty, 3, handles, error, sizeof(error)) != 0) {
    EXPECT_NE(std::string(error).find("cuda"), std::string::npos) << error;
    EXPECT_EQ(g_delivered.load(), before);
  } else {
    drain();
    EXPECT_EQ(g_delivered.load(), before + 3);
  }
}

TEST(CudaApiTest, BatchingsEntryPointsAnswerWithOrWithoutADriver) {
  // NANHUNT_GPU_BATCH asks whether a stream takes checks before holding
  // one back, and orders a stream after late checks; a mixed batch (fp16,
  // fp32, a strided view) is one call.
  void* lib = dlopen(NANHUNT_CUDA_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  auto start = reinterpret_cast<decltype(&nanhunt_cuda_start)>(dlsym(lib, "nanhunt_cuda_start"));
  auto takes = reinterpret_cast<decltype(&nanhunt_cuda_stream_takes_checks)>(
      dlsym(lib, "nanhunt_cuda_stream_takes_checks"));
  auto order = reinterpret_cast<decltype(&nanhunt_cuda_order_after)>(
      dlsym(lib, "nanhunt_cuda_order_after"));
  auto many = reinterpret_cast<decltype(&nanhunt_cuda_enqueue_many)>(
      dlsym(lib, "nanhunt_cuda_enqueue_many"));
  auto drain = reinterpret_cast<decltype(&nanhunt_cuda_drain)>(dlsym(lib, "nanhunt_cuda_drain"));
  ASSERT_TRUE(start && takes && order && many && drain);
  char error[256] = {};
  ASSERT_EQ(start(16376.0, &Deliver, error, sizeof(error)), 0) << error;
  const bool gpu = takes(0, nullptr, error, sizeof(error)) == 1;
  if (!gpu) {
    EXPECT_NE(std::string(error).find("cuda"), std::string::npos) << error;
  }
  NanhuntDeviceTensor mixed[3]{};
  mixed[0].format = static_cast<int>(nanhunt::Format::kF16);
  mixed[0].dense = 1;
  mixed[1].format = static_cast<int>(nanhunt::Format::kF32);
  mixed[1].dense = 1;
  mixed[2].format = static_cast<int>(nanhunt::Format::kF16);
  mixed[2].dense = 0;
  mixed[2].dims = 1;  // no values: sizes[0] is 0
  int contexts[3] = {};
  void* handles[3] = {&contexts[0], &contexts[1], &contexts[2]};
  const int before = g_delivered.load();
  const int rc = many(0, nullptr, mixed, 3, handles, error, sizeof(error));
  EXPECT_EQ(rc == 0, gpu) << error;
  if (rc == 0) {
    drain();
    EXPECT_EQ(g_delivered.load(), before + 3);
  } else {
    EXPECT_EQ(g_delivered.load(), before);
  }
  // Without checks on a device (or without a driver) there is nothing to
  // wait for; with them, the default stream waits for itself.
  EXPECT_EQ(order(gpu ? 0 : 5, nullptr, nullptr, error, sizeof(error)), 0) << error;
}

}  // namespace
