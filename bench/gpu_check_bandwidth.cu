// GPU check kernel speed: reads of a 256 MiB fp16 tensor per second, against
// a device-to-device copy of the same tensor measured in the same run
// (target: the check reaches 85% of the copy's read bandwidth), and the CPU
// cost of enqueueing one check through the ring (target: at most 3 us),
// per tensor when an op's list of outputs goes in batches, and what a bare
// launch, an event record and a capture query cost on this machine.
#include <cuda_runtime.h>

#include <chrono>
#include <memory>
#include <cstdio>
#include <string>
#include <vector>

#include "cupti/check_kernel.h"
#include "cupti/cuda_checks.h"

using namespace nanhunt;

// The cheapest launch there is: what any kernel launch costs the CPU here.
__global__ void EmptyKernel() {}

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device\n");
    return 2;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const size_t bytes = 256u << 20;
  const int64_t count = bytes / 2;
  void *src = nullptr, *dst = nullptr;
  CheckCounts* result = nullptr;
  cudaMalloc(&src, bytes);
  cudaMalloc(&dst, bytes);
  cudaMalloc(&result, sizeof(CheckCounts));
  cudaMemset(src, 0x3C, bytes);  // 0x3C3C: a finite fp16
  const CheckLimits limits(16376.0);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  const int reps = 20;
  auto time_ms = [&](auto&& body) {
    body();  // warm up
    cudaEventRecord(a);
    for (int i = 0; i < reps; ++i) body();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    return ms / reps;
  };
  const float copy_ms = time_ms([&] { cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice); });
  auto check_ms = [&](const void* data) {
    return time_ms([&] {
      cudaMemsetAsync(result, 0, sizeof(CheckCounts));
      gpu::LaunchCheck(Format::kF16, data, count, limits, result, nullptr);
    });
  };
  const float constant_ms = check_ms(src);
  // Random finite values: every magnitude pattern below 2^15 equally likely
  // (every exponent, 3% subnormal), random signs.
  {
    std::vector<uint16_t> host(count);
    uint64_t x = 88172645463325252ull;
    for (auto& v : host) {
      x ^= x << 13; x ^= x >> 7; x ^= x << 17;
      v = static_cast<uint16_t>(x % 0x7800) | static_cast<uint16_t>((x >> 20) & 0x8000);
    }
    cudaMemcpy(dst, host.data(), bytes, cudaMemcpyHostToDevice);
  }
  const float random_ms = check_ms(dst);
  // A copy reads and writes `bytes`; the check only reads them. The target
  // compares read bandwidths (the copy's is bytes / time); its read+write
  // bandwidth, what HBM can move, is printed beside it.
  const double copy_read = bytes / (copy_ms * 1e-3) / 1e9;
  const double check_read = bytes / (constant_ms * 1e-3) / 1e9;
  const double random_read = bytes / (random_ms * 1e-3) / 1e9;

  std::string error;
  auto checks = gpu::CudaChecks::Create(0, 1024, &error);
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  gpu::DeviceTensor small;
  small.format = Format::kF16;
  small.data = src;
  small.count = 4096;
  double enqueue_us = 0;
  {
    CheckRing ring(checks.get(), [](const PendingCheck&, const CheckCounts&) {});
    const int n = 512;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      ring.Enqueue(stream, nullptr, [&](int slot) {
        return checks->Enqueue(slot, small, limits, stream, &error);
      });
    }
    enqueue_us = std::chrono::duration<double, std::micro>(
                     std::chrono::steady_clock::now() - t0).count() / n;
    ring.DrainAll();
  }
  // CPU cost per tensor of enqueueing batches of kMaxBatch `tensors`.
  auto per_tensor_us = [&](const std::vector<gpu::DeviceTensor>& tensors) {
    CheckRing ring(checks.get(), [](const PendingCheck&, const CheckCounts&) {});
    const int batches = 16;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < batches; ++i) {
      ring.EnqueueBatch(stream, std::vector<std::shared_ptr<void>>(gpu::kMaxBatch),
                        [&](const int* slots, int n) {
                          return checks->EnqueueBatch(slots, tensors.data(), n, limits,
                                                      stream, &error);
                        });
    }
    const double us = std::chrono::duration<double, std::micro>(
                          std::chrono::steady_clock::now() - t0).count() /
                      (batches * gpu::kMaxBatch);
    ring.DrainAll();
    return us;
  };
  // An op with a list of outputs (the optimizer's foreach ops): one launch
  // per kMaxBatch tensors of one format.
  const double batch_us = per_tensor_us(std::vector<gpu::DeviceTensor>(gpu::kMaxBatch, small));
  // NANHUNT_GPU_BATCH's batches: outputs of consecutive ops under autocast,
  // fp16 and fp32 alternating (two launches a batch).
  std::vector<gpu::DeviceTensor> mixed(gpu::kMaxBatch, small);
  for (int i = 1; i < gpu::kMaxBatch; i += 2) {
    mixed[i].format = Format::kF32;
    mixed[i].count = 2048;
  }
  const double mixed_us = per_tensor_us(mixed);
  // What one enqueue is made of, measured alone: the floor under it.
  auto per_call_us = [](int n, auto&& call) {
    call();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) call();
    return std::chrono::duration<double, std::micro>(
               std::chrono::steady_clock::now() - t0).count() / n;
  };
  const double launch_us = per_call_us(512, [&] { EmptyKernel<<<1, 32, 0, stream>>>(); });
  cudaEvent_t marker;
  cudaEventCreateWithFlags(&marker, cudaEventDisableTiming);
  const double record_us = per_call_us(512, [&] { cudaEventRecord(marker, stream); });
  const double capturing_us = per_call_us(512, [&] {
    cudaStreamCaptureStatus c;
    cudaStreamIsCapturing(stream, &c);
  });
  // The enqueue without the ring (device scope, capture query, launch,
  // event), and the check kernel's launch alone: with the figures above they
  // split the enqueue into the launch, the CUDA calls around it, and the
  // ring with its drain thread (whose event queries take the driver's locks
  // while the enqueuing thread launches).
  int next_slot = 0;
  const double device_enqueue_us = per_call_us(512, [&] {
    checks->Enqueue(next_slot, small, limits, stream, &error);
    next_slot = (next_slot + 1) % 1024;
  });
  cudaStreamSynchronize(stream);
  const double check_launch_us = per_call_us(512, [&] {
    gpu::LaunchCheck(Format::kF16, small.data, small.count, limits, result, stream);
  });
  cudaStreamSynchronize(stream);
  std::printf("device: %s\n", prop.name);
  std::printf("%-44s %10s\n", "measure", "value");
  std::printf("%-44s %9.1f\n", "d2d copy read+write bandwidth, GB/s", 2 * copy_read);
  std::printf("%-44s %9.1f\n", "d2d copy read bandwidth, GB/s", copy_read);
  std::printf("%-44s %9.1f\n", "check read bandwidth, GB/s (fp16, 1.06)", check_read);
  std::printf("%-44s %9.1f\n", "check read bandwidth, GB/s (fp16, random)", random_read);
  std::printf("%-44s %9.2f\n", "check (random) / copy read+write", random_read / (2 * copy_read));
  std::printf("%-44s %9.2f  (target >= 0.85)\n", "check / copy read", check_read / copy_read);
  std::printf("%-44s %9.2f  (target >= 0.85)\n", "check (random) / copy read", random_read / copy_read);
  std::printf("%-44s %9.2f  (target <= 3)\n", "enqueue one check (ring + kernel), us", enqueue_us);
  std::printf("%-44s %9.2f\n", "  per tensor, batches of 32, us", batch_us);
  std::printf("%-44s %9.2f\n", "  per tensor, 32 of fp16+fp32 (GPU_BATCH), us", mixed_us);
  std::printf("%-44s %9.2f\n", "  one check without the ring, us", device_enqueue_us);
  std::printf("%-44s %9.2f\n", "  of which: check kernel launch, us", check_launch_us);
  std::printf("%-44s %9.2f\n", "  of which: empty kernel launch, us", launch_us);
  std::printf("%-44s %9.2f\n", "  of which: cudaEventRecord, us", record_us);
  std::printf("%-44s %9.2f\n", "  of which: cudaStreamIsCapturing, us", capturing_us);
  return 0;
}
