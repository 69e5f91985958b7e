// The GPU check against the CPU check, on random and edge-value tensors of
// every format, at sizes that are not multiples of the vector width, from
// unaligned starts, and through the strided kernel. Needs a GPU: without
// one every test is skipped (CI builds this; scripts/gpu-check.sh runs it).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "core/check_ring.h"
#include "core/cpu_check.h"
#include "cupti/check_kernel.h"
#include "cupti/cuda_checks.h"
#include "gtest/gtest.h"
#include "tests/expect_counts.h"

namespace nanhunt::gpu {
namespace {

const CheckLimits kLimits(16376.0);

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define REQUIRE_GPU() \
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device"

template <class Bits>
std::vector<Bits> RandomBits(size_t n, std::mt19937_64& rng) {
  std::vector<Bits> v(n);
  for (auto& b : v) b = static_cast<Bits>(rng());
  return v;
}

CheckCounts RunDense(Format f, const void* host, size_t bytes, size_t offset_values,
                     size_t width, int64_t count) {
  void* d = nullptr;
  CheckCounts* result = nullptr;
  EXPECT_EQ(cudaMalloc(&d, bytes + 64), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&result, sizeof(CheckCounts)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemset(result, 0, sizeof(CheckCounts)), cudaSuccess);
  EXPECT_EQ(LaunchCheck(f, static_cast<char*>(d) + offset_values * width, count,
                        kLimits, result, nullptr),
            0);
  CheckCounts out;
  EXPECT_EQ(cudaMemcpy(&out, result, sizeof(out), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d);
  cudaFree(result);
  return out;
}

// Random finite values: every vector then takes the kernel's lane-wise
// path (core/check_vector.h) rather than the value-by-value one.
template <Format F>
void MakeFinite(std::vector<typename FormatBits<F>::Bits>& v) {
  for (auto& b : v) {
    while (!IsFiniteMagnitude<F>(MagnitudeOf<F>(b))) b = static_cast<typename FormatBits<F>::Bits>(b >> 1);
  }
}

template <Format F>
void CompareFormat() {
  using Bits = typename FormatBits<F>::Bits;
  const Format f = F;
  std::mt19937_64 rng(7);
  for (size_t n : {1u, 7u, 8u, 9u, 15u, 16u, 17u, 255u, 4097u, 1000003u}) {
   for (bool finite : {false, true}) {
    auto v = RandomBits<Bits>(n + 3, rng);
    if (finite) MakeFinite<F>(v);
    for (size_t offset : {0u, 1u, 3u}) {
      const CheckCounts cpu = CheckHostBuffer(f, v.data() + offset, n, kLimits);
      const CheckCounts gpu = RunDense(f, v.data(), v.size() * sizeof(Bits), offset,
                                       sizeof(Bits), static_cast<int64_t>(n));
      ExpectSameCounts(gpu, cpu, std::string(FormatName(f)) + (finite ? " finite" : ""));
    }
   }
  }
}

TEST(GpuCheck, EveryFormatMatchesTheCpuCheckAtOddSizesAndOffsets) {
  REQUIRE_GPU();
  CompareFormat<Format::kF16>();
  CompareFormat<Format::kBF16>();
  CompareFormat<Format::kF32>();
  CompareFormat<Format::kF64>();
  CompareFormat<Format::kF8E4M3FN>();
  CompareFormat<Format::kF8E5M2>();
}

TEST(GpuCheck, EdgeValuesOfFp16) {
  REQUIRE_GPU();
  const std::vector<uint16_t> v = {0x7BFF, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFE01,
                                   0x0001, 0x0400, 0x8000, 0x0000, 0x6FFF};
  const CheckCounts cpu = CheckHostBuffer(Format::kF16, v.data(), v.size(), kLimits);
  ExpectSameCounts(RunDense(Format::kF16, v.data(), v.size() * 2, 0, 2, v.size()), cpu, "edges");
  EXPECT_EQ(cpu.nan, 3u);
}

TEST(GpuCheck, StridedKernelSeesOnlyTheViewsElements) {
  REQUIRE_GPU();
  // A 64 x 100 fp32 matrix; the view is its first 37 columns.
  std::vector<float> m(64 * 100, 1.0f);
  for (int r = 0; r < 64; ++r) m[r * 100 + 50] = INFINITY;  // outside the view
  m[5 * 100 + 3] = NAN;                                      // inside
  void* d = nullptr;
  CheckCounts* result = nullptr;
  ASSERT_EQ(cudaMalloc(&d, m.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&result, sizeof(CheckCounts)), cudaSuccess);
  cudaMemcpy(d, m.data(), m.size() * 4, cudaMemcpyHostToDevice);
  cudaMemset(result, 0, sizeof(CheckCounts));
  StridedLayout layout;
  layout.dims = 2;
  layout.sizes[0] = 64;
  layout.sizes[1] = 37;
  layout.strides[0] = 100;
  layout.strides[1] = 1;
  ASSERT_EQ(LaunchCheckStrided(Format::kF32, d, layout, kLimits, result, nullptr), 0);
  CheckCounts out;
  cudaMemcpy(&out, result, sizeof(out), cudaMemcpyDeviceToHost);
  EXPECT_EQ(out.elements, 64u * 37u);
  EXPECT_EQ(out.nan, 1u);
  EXPECT_EQ(out.posinf, 0u);
  cudaFree(d);
  cudaFree(result);
}

TEST(GpuCheck, RingDeliversResultsWithoutHostSyncPerCheck) {
  REQUIRE_GPU();
  std::string error;
  auto device = CudaChecks::Create(0, 4, &error);
  ASSERT_NE(device, nullptr) << error;
  std::vector<uint16_t> v(1 << 20, 0x3C00);
  v[12345] = 0x7C00;
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, v.size() * 2), cudaSuccess);
  cudaMemcpy(d, v.data(), v.size() * 2, cudaMemcpyHostToDevice);
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  std::vector<uint64_t> posinf;
  {
    CheckRing ring(device.get(), [&](const PendingCheck&, const CheckCounts& c) {
      posinf.push_back(c.posinf);
    });
    DeviceTensor t;
    t.format = Format::kF16;
    t.data = d;
    t.count = static_cast<int64_t>(v.size());
    for (int i = 0; i < 10; ++i) {  // more than the 4 slots: waits happen
      ASSERT_TRUE(ring.Enqueue(stream, nullptr, [&](int slot) {
        return device->Enqueue(slot, t, kLimits, stream, &error);
      })) << error;
    }
    ring.DrainAll();
  }
  EXPECT_EQ(posinf, std::vector<uint64_t>(10, 1));
  cudaStreamDestroy(stream);
  cudaFree(d);
}

// Each slot is reused many times: the kernel's last block must hand over
// one check's counts and leave the slot clean, across many blocks, for any
// size (none at all included), on more than one stream.
TEST(GpuCheck, ReusedSlotsCarryNothingOverBetweenChecks) {
  REQUIRE_GPU();
  std::string error;
  auto device = CudaChecks::Create(0, 3, &error);
  ASSERT_NE(device, nullptr) << error;
  std::vector<uint16_t> a(3 << 20, 0x3C00), b(1001, 0x3C00);
  a[7] = 0x7C00;                 // +inf
  b[0] = b[1000] = 0x7E00;       // two NaN
  void *da = nullptr, *db = nullptr;
  ASSERT_EQ(cudaMalloc(&da, a.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&db, b.size() * 2), cudaSuccess);
  cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(db, b.data(), b.size() * 2, cudaMemcpyHostToDevice);
  cudaStream_t streams[2];
  cudaStreamCreateWithFlags(&streams[0], cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&streams[1], cudaStreamNonBlocking);
  std::vector<CheckCounts> got;
  {
    CheckRing ring(device.get(), [&](const PendingCheck&, const CheckCounts& c) {
      got.push_back(c);
    });
    for (int i = 0; i < 30; ++i) {
      DeviceTensor t;
      t.format = Format::kF16;
      t.data = i % 3 == 0 ? da : db;
      t.count = i % 3 == 0 ? static_cast<int64_t>(a.size())
                           : i % 3 == 1 ? static_cast<int64_t>(b.size()) : 0;
      cudaStream_t s = streams[i % 2];
      ASSERT_TRUE(ring.Enqueue(s, nullptr, [&](int slot) {
        return device->Enqueue(slot, t, kLimits, s, &error);
      })) << error;
    }
    ring.DrainAll();
  }
  ASSERT_EQ(got.size(), 30u);
  for (int i = 0; i < 30; ++i) {
    const CheckCounts& c = got[i];
    const std::string what = "check " + std::to_string(i);
    if (i % 3 == 0) {
      EXPECT_EQ(c.elements, a.size()) << what;
      EXPECT_EQ(c.posinf, 1u) << what;
      EXPECT_EQ(c.nan, 0u) << what;
    } else if (i % 3 == 1) {
      EXPECT_EQ(c.elements, b.size()) << what;
      EXPECT_EQ(c.nan, 2u) << what;
      EXPECT_EQ(c.posinf, 0u) << what;
    } else {
      EXPECT_EQ(c.elements, 0u) << what;
      EXPECT_EQ(c.nan + c.posinf + c.max_abs_bits, 0u) << what;
    }
  }
  cudaStreamDestroy(streams[0]);
  cudaStreamDestroy(streams[1]);
  cudaFree(da);
  cudaFree(db);
}

// An op's list of outputs, checked by one launch per kMaxBatch tensors:
// each tensor's counts equal the CPU check's (random values of every
// format, odd sizes, unaligned starts, none at all, many blocks), and the
// batch's slots, reused across batches and between single checks (fewer
// slots than checks: the ring waits), carry nothing over.
template <Format F>
void CompareBatches() {
  using Bits = typename FormatBits<F>::Bits;
  std::string error;
  auto device = CudaChecks::Create(0, 40, &error);
  ASSERT_NE(device, nullptr) << error;
  std::mt19937_64 rng(11);
  const size_t sizes[] = {0, 1, 7, 9, 17, 255, 4097, 300001};
  struct Item {
    std::vector<Bits> host;
    size_t offset, n;
    void* device = nullptr;
  };
  std::vector<Item> items;
  for (int i = 0; i < 3 * kMaxBatch + 5; ++i) {
    Item it;
    it.n = sizes[i % 8];
    it.offset = static_cast<size_t>(i % 3);
    it.host = RandomBits<Bits>(it.n + 3, rng);
    if (i % 2 == 0) MakeFinite<F>(it.host);
    ASSERT_EQ(cudaMalloc(&it.device, it.host.size() * sizeof(Bits) + 16), cudaSuccess);
    cudaMemcpy(it.device, it.host.data(), it.host.size() * sizeof(Bits), cudaMemcpyHostToDevice);
    items.push_back(std::move(it));
  }
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  std::vector<std::pair<int, CheckCounts>> got;
  {
    CheckRing ring(device.get(), [&](const PendingCheck& check, const CheckCounts& c) {
      got.emplace_back(*static_cast<int*>(check.context.get()), c);
    });
    auto tensor = [&](int i) {
      DeviceTensor t;
      t.format = F;
      t.data = static_cast<Bits*>(items[i].device) + items[i].offset;
      t.count = static_cast<int64_t>(items[i].n);
      return t;
    };
    size_t next = 0;
    while (next < items.size()) {
      // A batch of up to kMaxBatch, then one single check.
      const int n = static_cast<int>(std::min<size_t>(kMaxBatch, items.size() - next));
      std::vector<std::shared_ptr<void>> contexts;
      std::vector<DeviceTensor> tensors;
      for (int k = 0; k < n; ++k) {
        contexts.push_back(std::make_shared<int>(static_cast<int>(next) + k));
        tensors.push_back(tensor(static_cast<int>(next) + k));
      }
      ASSERT_TRUE(ring.EnqueueBatch(stream, contexts, [&](const int* slots, int count) {
        return device->EnqueueBatch(slots, tensors.data(), count, kLimits, stream, &error);
      })) << error;
      next += static_cast<size_t>(n);
      if (next < items.size()) {
        const int single = static_cast<int>(next++);
        const DeviceTensor t = tensor(single);
        ASSERT_TRUE(ring.Enqueue(stream, std::make_shared<int>(single), [&](int slot) {
          return device->Enqueue(slot, t, kLimits, stream, &error);
        })) << error;
      }
    }
    ring.DrainAll();
    EXPECT_GT(ring.waits(), 0) << "40 slots for more checks: slots were reused";
  }
  ASSERT_EQ(got.size(), items.size());
  for (size_t k = 0; k < got.size(); ++k) {
    const auto& [i, counts] = got[k];
    EXPECT_EQ(i, static_cast<int>(k)) << "delivered in enqueue order";
    const Item& it = items[static_cast<size_t>(i)];
    const CheckCounts cpu = CheckHostBuffer(F, it.host.data() + it.offset, it.n, kLimits);
    ExpectSameCounts(counts, cpu, std::string(FormatName(F)) + " item " + std::to_string(i) +
                                      " of " + std::to_string(it.n));
  }
  cudaStreamDestroy(stream);
  for (Item& it : items) cudaFree(it.device);
}

TEST(GpuCheck, BatchesOfTensorsMatchTheCpuCheckEachInItsOwnSlot) {
  REQUIRE_GPU();
  CompareBatches<Format::kF16>();
  CompareBatches<Format::kBF16>();
  CompareBatches<Format::kF32>();
  CompareBatches<Format::kF64>();
  CompareBatches<Format::kF8E4M3FN>();
  CompareBatches<Format::kF8E5M2>();
}

TEST(GpuCheck, TooManyTensorsForOneBatchAreRefused) {
  REQUIRE_GPU();
  std::string error;
  auto device = CudaChecks::Create(0, 64, &error);
  ASSERT_NE(device, nullptr) << error;
  DeviceTensor t[kMaxBatch + 1];
  int slots[kMaxBatch + 1];
  for (int i = 0; i <= kMaxBatch; ++i) slots[i] = i;
  EXPECT_FALSE(device->EnqueueBatch(slots, t, kMaxBatch + 1, kLimits, nullptr, &error));
  EXPECT_NE(error.find("1 to 32"), std::string::npos) << error;
}

// NANHUNT_GPU_BATCH's batches: outputs of several ops, fp16 and fp32
// interleaved (autocast), bf16, and strided views, in one batch. Each slot
// gets its own tensor's counts, whatever launch checked it.
TEST(GpuCheck, ABatchOfMixedFormatsAndStridedViewsMatchesTheCpuCheck) {
  REQUIRE_GPU();
  std::string error;
  auto device = CudaChecks::Create(0, 64, &error);
  ASSERT_NE(device, nullptr) << error;
  std::mt19937_64 rng(13);
  struct Item {
    Format format;
    std::vector<uint8_t> host;  // the values' bytes
    size_t width, n;
    bool strided;               // every other value of 2n
    void* device = nullptr;
  };
  std::vector<Item> items;
  const Format formats[] = {Format::kF16, Format::kF32, Format::kF16, Format::kBF16,
                            Format::kF32, Format::kF16};
  const size_t sizes[] = {1, 9, 4097, 300001, 17, 0};
  for (int i = 0; i < 29; ++i) {
    Item it;
    it.format = formats[i % 6];
    it.width = it.format == Format::kF32 ? 4 : 2;
    it.n = sizes[(i * 5) % 6];
    it.strided = i % 4 == 3;
    const size_t values = it.strided ? 2 * it.n : it.n;
    it.host.resize(values * it.width);
    for (auto& b : it.host) b = static_cast<uint8_t>(rng());
    if (i % 2 == 0) {  // finite: the lane-wise path
      if (it.format == Format::kF32) {
        auto* f = reinterpret_cast<uint32_t*>(it.host.data());
        for (size_t k = 0; k < values; ++k) f[k] &= 0xBF7FFFFFu;  // exponent below all-ones
      } else {
        auto* h = reinterpret_cast<uint16_t*>(it.host.data());
        for (size_t k = 0; k < values; ++k) h[k] &= 0xBF7Fu;
      }
    }
    ASSERT_EQ(cudaMalloc(&it.device, it.host.size() + 16), cudaSuccess);
    cudaMemcpy(it.device, it.host.data(), it.host.size(), cudaMemcpyHostToDevice);
    items.push_back(std::move(it));
  }
  std::vector<DeviceTensor> tensors;
  std::vector<std::shared_ptr<void>> contexts;
  for (size_t i = 0; i < items.size(); ++i) {
    DeviceTensor t;
    t.format = items[i].format;
    t.data = items[i].device;
    t.count = static_cast<int64_t>(items[i].n);
    t.dense = !items[i].strided;
    if (items[i].strided) {
      t.layout.dims = 1;
      t.layout.sizes[0] = static_cast<int64_t>(items[i].n);
      t.layout.strides[0] = 2;
    }
    tensors.push_back(t);
    contexts.push_back(std::make_shared<int>(static_cast<int>(i)));
  }
  std::vector<std::pair<int, CheckCounts>> got;
  {
    CheckRing ring(device.get(), [&](const PendingCheck& check, const CheckCounts& c) {
      got.emplace_back(*static_cast<int*>(check.context.get()), c);
    });
    ASSERT_TRUE(ring.EnqueueBatch(nullptr, contexts, [&](const int* slots, int count) {
      return device->EnqueueBatch(slots, tensors.data(), count, kLimits, nullptr, &error);
    })) << error;
    ring.DrainAll();
  }
  ASSERT_EQ(got.size(), items.size());
  for (size_t k = 0; k < got.size(); ++k) {
    const Item& it = items[k];
    EXPECT_EQ(got[k].first, static_cast<int>(k)) << "delivered in order";
    std::vector<uint8_t> values;
    for (size_t v = 0; v < it.n; ++v) {
      const size_t at = (it.strided ? 2 * v : v) * it.width;
      values.insert(values.end(), it.host.begin() + at, it.host.begin() + at + it.width);
    }
    ExpectSameCounts(got[k].second, CheckHostBuffer(it.format, values.data(), it.n, kLimits),
                     std::string(FormatName(it.format)) + " item " + std::to_string(k) +
                         (it.strided ? " strided" : ""));
  }
  for (Item& it : items) cudaFree(it.device);
}

// A check enqueued late on one stream, and a write on another stream that
// synchronised with the first before the check was enqueued: the write
// waits for the check (CudaChecks::OrderAfterChecks), so the check sees
// the values the producing op left.
TEST(GpuCheck, AWriteOnAnotherStreamWaitsForALateCheck) {
  REQUIRE_GPU();
  std::string error;
  auto device = CudaChecks::Create(0, 8, &error);
  ASSERT_NE(device, nullptr) << error;
  const size_t n = 1 << 24;  // large enough that the check takes a while
  std::vector<uint16_t> ones(n, 0x3C00);  // fp16 1.0
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, n * 2), cudaSuccess);
  cudaMemcpy(d, ones.data(), n * 2, cudaMemcpyHostToDevice);
  cudaStream_t producer, writer;
  cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&writer, cudaStreamNonBlocking);
  // The producing stream is held for 50 ms before the check: without the
  // wait, the write would land first.
  ASSERT_EQ(cudaLaunchHostFunc(producer, [](void*) {
              std::this_thread::sleep_for(std::chrono::milliseconds(50));
            }, nullptr),
            cudaSuccess);
  CheckCounts counts;
  bool delivered = false;
  {
    CheckRing ring(device.get(), [&](const PendingCheck&, const CheckCounts& c) {
      counts = c;
      delivered = true;
    });
    DeviceTensor t;
    t.format = Format::kF16;
    t.data = d;
    t.count = static_cast<int64_t>(n);
    ASSERT_TRUE(ring.Enqueue(producer, std::make_shared<int>(0), [&](int slot) {
      return device->Enqueue(slot, t, kLimits, producer, &error);
    })) << error;
    ASSERT_TRUE(device->OrderAfterChecks(producer, writer, &error)) << error;
    // The write: every value becomes NaN (0x7C7C).
    ASSERT_EQ(cudaMemsetAsync(d, 0x7C, n * 2, writer), cudaSuccess);
    ring.DrainAll();
  }
  ASSERT_TRUE(delivered);
  EXPECT_EQ(counts.elements, n);
  EXPECT_EQ(counts.nan, 0u) << "the check ran after the other stream's write";
  cudaStreamSynchronize(writer);
  cudaStreamDestroy(producer);
  cudaStreamDestroy(writer);
  cudaFree(d);
}

// Checks held back on the legacy default stream must not be launched while
// a blocking stream captures (CUDA ends that capture); torch's streams are
// non-blocking, and a stream that does not capture forbids nothing.
TEST(GpuCheck, OnlyABlockingCapturingStreamForbidsTheLegacyStream) {
  REQUIRE_GPU();
  cudaStream_t blocking, nonblocking;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking), cudaSuccess);
  EXPECT_FALSE(CaptureForbidsLegacyStream(0, blocking));
  EXPECT_FALSE(CaptureForbidsLegacyStream(0, nonblocking));
  for (cudaStream_t s : {blocking, nonblocking}) {
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
    EXPECT_EQ(CaptureForbidsLegacyStream(0, s), s == blocking);
    cudaGraph_t graph = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess) << "the question left it valid";
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(blocking);
  cudaStreamDestroy(nonblocking);
}

// A check for a tensor on cuda:1 is enqueued from a thread whose current
// device is cuda:0 (torch's guard for the op is gone by then); it must run
// there and leave cuda:0 current.
TEST(GpuCheck, SecondDeviceIsCheckedAndTheCurrentDeviceKept) {
  REQUIRE_GPU();
  int devices = 0;
  cudaGetDeviceCount(&devices);
  if (devices < 2) GTEST_SKIP() << "one CUDA device";
  std::string error;
  auto device1 = CudaChecks::Create(1, 2, &error);
  ASSERT_NE(device1, nullptr) << error;
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  std::vector<float> v(4096, 1.0f);
  v[100] = std::numeric_limits<float>::quiet_NaN();
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, v.size() * 4), cudaSuccess);
  cudaMemcpy(d, v.data(), v.size() * 4, cudaMemcpyHostToDevice);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  uint64_t nan = 0;
  {
    CheckRing ring(device1.get(), [&](const PendingCheck&, const CheckCounts& c) { nan = c.nan; });
    DeviceTensor t;
    t.data = d;
    t.count = static_cast<int64_t>(v.size());
    ASSERT_TRUE(ring.Enqueue(stream, nullptr, [&](int slot) {
      return device1->Enqueue(slot, t, kLimits, stream, &error);
    })) << error;
    int current = -1;
    cudaGetDevice(&current);
    EXPECT_EQ(current, 0) << "the check moved the thread to another device";
    ring.DrainAll();
  }
  EXPECT_EQ(nan, 1u);
  cudaSetDevice(1);
  cudaStreamDestroy(stream);
  cudaFree(d);
  cudaSetDevice(0);
}

TEST(GpuCheck, CapturingStreamIsRefusedAndCaptureStaysValid) {
  REQUIRE_GPU();
  std::string error;
  auto device = CudaChecks::Create(0, 2, &error);
  ASSERT_NE(device, nullptr) << error;
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  float* d = nullptr;
  cudaMalloc(&d, 1024 * sizeof(float));
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  DeviceTensor t;
  t.data = d;
  t.count = 1024;
  EXPECT_FALSE(device->Enqueue(0, t, kLimits, stream, &error));
  EXPECT_NE(error.find("capturing"), std::string::npos);
  cudaGraph_t graph;
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess) << "capture invalidated";
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  cudaFree(d);
}

// A check still in flight when the training begins a CUDA graph capture in
// torch's default "global" mode: the drain thread keeps querying the
// check's event during the capture, which CUDA treats as unsafe (it ended
// captures under torch's NCCL watchdog the same way) unless the querying
// thread relaxes its capture mode. The capture must come out valid and the
// result still arrive.
TEST(GpuCheck, DrainThreadPollingDuringAGlobalCaptureLeavesItValid) {
  REQUIRE_GPU();
  std::string error;
  auto device = CudaChecks::Create(0, 4, &error);
  ASSERT_NE(device, nullptr) << error;
  cudaStream_t busy, capturing;
  ASSERT_EQ(cudaStreamCreateWithFlags(&busy, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&capturing, cudaStreamNonBlocking), cudaSuccess);
  std::vector<float> v(1 << 20, 1.0f);
  v[12345] = std::numeric_limits<float>::quiet_NaN();
  float *d = nullptr, *scratch = nullptr;
  ASSERT_EQ(cudaMalloc(&d, v.size() * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&scratch, sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  // Holds `busy` until released, so that the check behind it is still in
  // flight (and polled) for the whole capture.
  static std::atomic<bool> release{false};
  release = false;
  ASSERT_EQ(cudaLaunchHostFunc(busy, [](void*) {
              while (!release.load()) std::this_thread::yield();
            }, nullptr),
            cudaSuccess);
  std::atomic<int> delivered{0};
  uint64_t nan = 0;
  {
    CheckRing ring(device.get(), [&](const PendingCheck&, const CheckCounts& c) {
      nan = c.nan;
      delivered.fetch_add(1);
    });
    DeviceTensor t;
    t.data = d;
    t.count = static_cast<int64_t>(v.size());
    ASSERT_TRUE(ring.Enqueue(busy, nullptr, [&](int slot) {
      return device->Enqueue(slot, t, kLimits, busy, &error);
    })) << error;
    ASSERT_EQ(cudaStreamBeginCapture(capturing, cudaStreamCaptureModeGlobal), cudaSuccess);
    EXPECT_EQ(cudaMemsetAsync(scratch, 0, sizeof(float), capturing), cudaSuccess);
    // Refused before the ring: no slot is taken, nothing waits.
    std::string refused;
    EXPECT_FALSE(StreamTakesChecks(0, capturing, &refused));
    EXPECT_NE(refused.find("capturing"), std::string::npos) << refused;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // ~100 polls
    cudaGraph_t graph = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(capturing, &graph), cudaSuccess) << "capture invalidated";
    if (graph != nullptr) cudaGraphDestroy(graph);
    EXPECT_EQ(delivered.load(), 0) << "the check ran before the stream was released";
    release = true;
    ring.DrainAll();
  }
  EXPECT_EQ(delivered.load(), 1);
  EXPECT_EQ(nan, 1u);
  cudaStreamDestroy(busy);
  cudaStreamDestroy(capturing);
  cudaFree(scratch);
  cudaFree(d);
}

}  // namespace
}  // namespace nanhunt::gpu
