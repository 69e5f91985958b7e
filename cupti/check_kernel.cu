// The check kernels. Every value is counted as AccumulateValue<F>
// (core/check_semantics.h) counts it: value by value, or lane-wise through
// core/check_vector.h, which the CPU tests hold to the same counts.
//
// Shape of the dense kernel: 16-byte vector loads over the aligned body,
// grid-stride, two vectors in flight per thread, each counted lane-wise;
// the unaligned head and the tail (fewer than one vector) are done value by
// value; per-thread counts are reduced with warp shuffles, then across warps
// in shared memory, then one set of atomics per block.
#include <cuda_runtime.h>

#include <type_traits>

#include "cupti/check_kernel.h"
#include "core/check_vector.h"

namespace nanhunt::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ void WarpReduce(CheckCounts& c) {
  for (int offset = 16; offset > 0; offset /= 2) {
    c.elements += __shfl_down_sync(0xffffffffu, c.elements, offset);
    c.nan += __shfl_down_sync(0xffffffffu, c.nan, offset);
    c.posinf += __shfl_down_sync(0xffffffffu, c.posinf, offset);
    c.neginf += __shfl_down_sync(0xffffffffu, c.neginf, offset);
    c.near_max += __shfl_down_sync(0xffffffffu, c.near_max, offset);
    c.underflow += __shfl_down_sync(0xffffffffu, c.underflow, offset);
    c.fp16_overflow += __shfl_down_sync(0xffffffffu, c.fp16_overflow, offset);
    const unsigned long long m =
        __shfl_down_sync(0xffffffffu, c.max_abs_bits, offset);
    c.max_abs_bits = m > c.max_abs_bits ? m : c.max_abs_bits;
  }
}

// Folds each thread's counts into `out` with one set of atomics per block.
// With a final copy, the last block to finish then moves the totals to the
// host copy and leaves `out` and the block counter zeroed for the next use
// (the threadfence reduction of the CUDA samples, with atomics for partials).
__device__ void BlockReduceAndPublish(CheckCounts c, CheckCounts* out,
                                      const FinalCopy& final_copy,
                                      unsigned int blocks) {
  __shared__ CheckCounts warp_counts[kWarps];
  WarpReduce(c);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_counts[warp] = c;
  __syncthreads();
  if (warp == 0) {
    c = lane < kWarps ? warp_counts[lane] : CheckCounts{};
    WarpReduce(c);
    if (lane == 0 && c.elements != 0) {
      atomicAdd(&out->elements, c.elements);
      if (c.nan) atomicAdd(&out->nan, c.nan);
      if (c.posinf) atomicAdd(&out->posinf, c.posinf);
      if (c.neginf) atomicAdd(&out->neginf, c.neginf);
      if (c.near_max) atomicAdd(&out->near_max, c.near_max);
      if (c.underflow) atomicAdd(&out->underflow, c.underflow);
      if (c.fp16_overflow) atomicAdd(&out->fp16_overflow, c.fp16_overflow);
      atomicMax(&out->max_abs_bits, c.max_abs_bits);
    }
  }
  // Thread 0 made this block's atomics; it alone reports the block done.
  if (final_copy.host == nullptr || threadIdx.x != 0) return;
  __threadfence();  // this block's atomics before its "done"
  if (atomicAdd(final_copy.blocks_done, 1u) != blocks - 1) return;
  __threadfence();
  // Read-and-zero through atomics: they see every block's atomics (L2), and
  // the slot is clean for its next check.
  CheckCounts total;
  total.elements = atomicExch(&out->elements, 0ull);
  total.nan = atomicExch(&out->nan, 0ull);
  total.posinf = atomicExch(&out->posinf, 0ull);
  total.neginf = atomicExch(&out->neginf, 0ull);
  total.near_max = atomicExch(&out->near_max, 0ull);
  total.underflow = atomicExch(&out->underflow, 0ull);
  total.fp16_overflow = atomicExch(&out->fp16_overflow, 0ull);
  total.max_abs_bits = atomicExch(&out->max_abs_bits, 0ull);
  *final_copy.host = total;  // visible to the host once the kernel is done
  atomicExch(final_copy.blocks_done, 0u);
}

// The body of the dense kernel for 8-, 16- and 32-bit formats: lane-wise
// (core/check_vector.h), two vectors in flight per thread so that enough
// loads are outstanding to cover HBM latency at the occupancy we get.
template <Format F>
__device__ __forceinline__ void CheckBody(const uint4* body, int64_t vectors,
                                          int64_t tid, int64_t stride,
                                          const Thresholds<typename FormatBits<F>::Bits>& t,
                                          CheckCounts& c) {
  const VectorThresholds vt = VectorThresholdsFor<F>(t);
  VectorCounts v;
  int64_t i = tid;
  for (; i + stride < vectors; i += 2 * stride) {
    const uint4 x = __ldg(body + i), y = __ldg(body + i + stride);
    const uint32_t xw[4] = {x.x, x.y, x.z, x.w}, yw[4] = {y.x, y.y, y.z, y.w};
    AccumulateVector<F>(xw, t, vt, v, c);
    AccumulateVector<F>(yw, t, vt, v, c);
  }
  if (i < vectors) {
    const uint4 x = __ldg(body + i);
    const uint32_t xw[4] = {x.x, x.y, x.z, x.w};
    AccumulateVector<F>(xw, t, vt, v, c);
  }
  FoldVectorCounts<F>(v, c);
}

// fp64: two values per vector, value by value.
__device__ __forceinline__ void CheckBodyF64(const uint4* body, int64_t vectors,
                                             int64_t tid, int64_t stride,
                                             const Thresholds<uint64_t>& t,
                                             CheckCounts& c) {
  for (int64_t i = tid; i < vectors; i += stride) {
    const uint4 x = __ldg(body + i);
    AccumulateValue<Format::kF64>((static_cast<uint64_t>(x.y) << 32) | x.x, t, c);
    AccumulateValue<Format::kF64>((static_cast<uint64_t>(x.w) << 32) | x.z, t, c);
  }
}

// One dense tensor's values, counted by `blocks` blocks of which this is
// `block`: the whole grid for one tensor, or its share of a batch's grid.
template <Format F>
__device__ __forceinline__ void DenseCounts(const typename FormatBits<F>::Bits* data,
                                            int64_t count, int64_t head,
                                            const Thresholds<typename FormatBits<F>::Bits>& t,
                                            int64_t block, int64_t blocks, CheckCounts& c) {
  using Bits = typename FormatBits<F>::Bits;
  constexpr int kPerVector = 16 / sizeof(Bits);
  const int64_t tid = block * blockDim.x + threadIdx.x;
  const int64_t stride = blocks * blockDim.x;
  // Head: values before the first 16-byte boundary.
  if (tid < head) AccumulateValue<F>(data[tid], t, c);
  // Body: whole 16-byte vectors.
  const int64_t vectors = (count - head) / kPerVector;
  const uint4* body = reinterpret_cast<const uint4*>(data + head);
  if constexpr (F == Format::kF64) {
    CheckBodyF64(body, vectors, tid, stride, t, c);
  } else {
    CheckBody<F>(body, vectors, tid, stride, t, c);
  }
  // Tail: fewer values than one vector.
  const int64_t tail_start = head + vectors * kPerVector;
  if (tail_start + tid < count) {
    AccumulateValue<F>(data[tail_start + tid], t, c);
  }
}

template <Format F>
__global__ void __launch_bounds__(kThreads)
    DenseCheck(const typename FormatBits<F>::Bits* data, int64_t count,
               int64_t head, Thresholds<typename FormatBits<F>::Bits> t,
               CheckCounts* out, FinalCopy final_copy) {
  CheckCounts c;
  DenseCounts<F>(data, count, head, t, blockIdx.x, gridDim.x, c);
  BlockReduceAndPublish(c, out, final_copy, gridDim.x);
}

// Several dense tensors of one format in one launch (an op's list of
// outputs: a foreach op's, the optimizer's): each gets a run of the grid's
// blocks, found by binary search over the runs' starts, and its own slot.
struct BatchArgs {
  int n = 0;
  int first_block[kMaxBatch + 1] = {};
  const void* data[kMaxBatch] = {};
  int64_t count[kMaxBatch] = {};
  int64_t head[kMaxBatch] = {};
  CheckCounts* out[kMaxBatch] = {};
  FinalCopy copy[kMaxBatch] = {};
};

template <Format F>
__global__ void __launch_bounds__(kThreads)
    BatchCheck(BatchArgs a, Thresholds<typename FormatBits<F>::Bits> t) {
  int lo = 0, hi = a.n - 1;  // the last item whose run starts at or before us
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (a.first_block[mid] <= static_cast<int>(blockIdx.x)) lo = mid; else hi = mid - 1;
  }
  const int blocks = a.first_block[lo + 1] - a.first_block[lo];
  CheckCounts c;
  DenseCounts<F>(static_cast<const typename FormatBits<F>::Bits*>(a.data[lo]), a.count[lo],
                 a.head[lo], t, blockIdx.x - a.first_block[lo], blocks, c);
  BlockReduceAndPublish(c, a.out[lo], a.copy[lo], blocks);
}

template <Format F>
__global__ void __launch_bounds__(kThreads)
    StridedCheck(const typename FormatBits<F>::Bits* data, int64_t count,
                 StridedLayout layout, Thresholds<typename FormatBits<F>::Bits> t,
                 CheckCounts* out, FinalCopy final_copy) {
  CheckCounts c;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < count; i += stride) {
    int64_t rest = i, offset = 0;
    for (int d = layout.dims - 1; d >= 0; --d) {
      offset += (rest % layout.sizes[d]) * layout.strides[d];
      rest /= layout.sizes[d];
    }
    AccumulateValue<F>(data[offset], t, c);
  }
  BlockReduceAndPublish(c, out, final_copy, gridDim.x);
}

int BlocksFor(int64_t work) {
  // Enough blocks to fill the device several times over; the grid-stride
  // loop covers the rest. 1024 blocks of 256 threads saturate an H100/H200.
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > 1024 ? 1024 : blocks));
}

// A dense tensor's unaligned head (values before the first 16-byte
// boundary) and the blocks its check wants.
template <Format F>
void PlanDense(const void* data, int64_t count, int64_t* head, int* blocks) {
  using Bits = typename FormatBits<F>::Bits;
  constexpr int64_t kPerVector = 16 / sizeof(Bits);
  const uintptr_t misalign = reinterpret_cast<uintptr_t>(data) % 16;
  *head = misalign == 0 ? 0 : (16 - misalign) / sizeof(Bits);
  if (*head > count) *head = count;
  // The head is done by the first `head` threads: at most kPerVector - 1.
  *blocks = BlocksFor((count - *head) / kPerVector + kPerVector);
}

template <Format F>
int LaunchDense(const void* data, int64_t count, const CheckLimits& limits,
                CheckCounts* result, cudaStream_t stream,
                const FinalCopy& final_copy) {
  using Bits = typename FormatBits<F>::Bits;
  int64_t head;
  int blocks;
  PlanDense<F>(data, count, &head, &blocks);
  DenseCheck<F><<<blocks, kThreads, 0, stream>>>(
      static_cast<const Bits*>(data), count, head, limits.For<F>(), result, final_copy);
  return static_cast<int>(cudaGetLastError());
}

template <Format F>
int LaunchBatch(const BatchItem* items, int n, const CheckLimits& limits,
                cudaStream_t stream) {
  BatchArgs a;
  a.n = n;
  int blocks = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t count = items[i].count < 0 ? 0 : items[i].count;
    int item_blocks;
    PlanDense<F>(items[i].data, count, &a.head[i], &item_blocks);
    a.first_block[i] = blocks;
    blocks += item_blocks;
    a.data[i] = items[i].data;
    a.count[i] = count;
    a.out[i] = items[i].result;
    a.copy[i] = items[i].final_copy;
  }
  a.first_block[n] = blocks;
  BatchCheck<F><<<blocks, kThreads, 0, stream>>>(a, limits.For<F>());
  return static_cast<int>(cudaGetLastError());
}

template <Format F>
int LaunchStrided(const void* data, const StridedLayout& layout,
                  const CheckLimits& limits, CheckCounts* result,
                  cudaStream_t stream, const FinalCopy& final_copy) {
  using Bits = typename FormatBits<F>::Bits;
  int64_t count = 1;
  for (int d = 0; d < layout.dims; ++d) count *= layout.sizes[d];
  if (count == 0 && final_copy.host == nullptr) return 0;
  StridedCheck<F><<<BlocksFor(count), kThreads, 0, stream>>>(
      static_cast<const Bits*>(data), count, layout, limits.For<F>(), result,
      final_copy);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

namespace {

// Calls fn(std::integral_constant<Format, F>) for the runtime `format`.
template <class Fn>
int WithFormat(Format format, Fn fn) {
  switch (format) {
    case Format::kF16: return fn(std::integral_constant<Format, Format::kF16>());
    case Format::kBF16: return fn(std::integral_constant<Format, Format::kBF16>());
    case Format::kF32: return fn(std::integral_constant<Format, Format::kF32>());
    case Format::kF64: return fn(std::integral_constant<Format, Format::kF64>());
    case Format::kF8E4M3FN: return fn(std::integral_constant<Format, Format::kF8E4M3FN>());
    case Format::kF8E5M2: return fn(std::integral_constant<Format, Format::kF8E5M2>());
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace

int LaunchCheck(Format format, const void* data, int64_t count,
                const CheckLimits& limits, CheckCounts* result, void* stream,
                const FinalCopy* final_copy) {
  const FinalCopy copy = final_copy ? *final_copy : FinalCopy{};
  if (count < 0) count = 0;
  if (count == 0 && copy.host == nullptr) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  return WithFormat(format, [&](auto f) {
    return LaunchDense<decltype(f)::value>(data, count, limits, result, s, copy);
  });
}

int LaunchCheckStrided(Format format, const void* data,
                       const StridedLayout& layout, const CheckLimits& limits,
                       CheckCounts* result, void* stream,
                       const FinalCopy* final_copy) {
  const FinalCopy copy = final_copy ? *final_copy : FinalCopy{};
  auto s = static_cast<cudaStream_t>(stream);
  return WithFormat(format, [&](auto f) {
    return LaunchStrided<decltype(f)::value>(data, layout, limits, result, s, copy);
  });
}

int LaunchCheckBatch(Format format, const BatchItem* items, int n,
                     const CheckLimits& limits, void* stream) {
  if (n < 1 || n > kMaxBatch) return static_cast<int>(cudaErrorInvalidValue);
  for (int i = 0; i < n; ++i) {
    if (items[i].final_copy.host == nullptr || items[i].final_copy.blocks_done == nullptr) {
      return static_cast<int>(cudaErrorInvalidValue);  // each item reports itself
    }
  }
  auto s = static_cast<cudaStream_t>(stream);
  return WithFormat(format, [&](auto f) {
    return LaunchBatch<decltype(f)::value>(items, n, limits, s);
  });
}

}  // namespace nanhunt::gpu
