// GPU memory whose values nanhunt knows: an op it saw wrote them (their
// check judges them), or a check read them at an op's first read of them.
// On a GPU an op's check reads what the op wrote, not what it read: its
// inputs are judged by their writers' checks. Memory that no op nanhunt saw
// wrote (a CUDA extension's kernel writing into torch.empty's memory, an
// array imported with DLPack, a torch.compile region's fused kernels) has no
// writer's check, and an op reading inf/NaN from it would be called their
// origin. The plugin checks such memory where an op first reads it
// (interpose/torch/device_outputs.cc).
//
// Memory is known by its address and by the storage that owns it (the
// caching allocator hands a freed block's address to the next storage, and
// malloc a freed storage's to the next). An entry keeps a weak reference to
// its storage, so that no other storage takes its identity while the entry
// lasts; entries of storages that are gone are swept out as the table
// grows. Any thread: ops end on the training thread and on autograd's.
#pragma once

#include <cstddef>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "core/weak_storage.h"

namespace nanhunt {

class WrittenMemory {
 public:
  // Whether the storage `impl` (a WeakStorage's) still owns memory: torch's
  // strong count, asked by the plugin.
  using Alive = bool (*)(void* impl);

  explicit WrittenMemory(Alive alive) : alive_(alive) {}
  WrittenMemory(const WrittenMemory&) = delete;
  WrittenMemory& operator=(const WrittenMemory&) = delete;

  // Memory at `key`, owned by the storage `identity`.
  struct Memory {
    const void* key = nullptr;
    const void* identity = nullptr;
  };

  // Whether each of `reads` holds values nanhunt knows (`known`, as long):
  // one lock for an op's inputs.
  void Known(absl::Span<const Memory> reads, absl::Span<bool> known) const;

  // Each of `written` holds values a check reads now. `weak(i)` makes the
  // entry's reference to the i-th's storage; it is called only when the
  // entry is new or was another storage's (an in-place op writes the same
  // storage every step: nothing to make). One lock for an op's outputs.
  void NoteKnown(absl::Span<const Memory> written,
                 absl::FunctionRef<WeakStorage(size_t)> weak);

  size_t size() const;

  // Sweeps start at this many entries, then at twice what the last sweep
  // kept.
  static constexpr size_t kFirstSweep = 4096;

 private:
  const Alive alive_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<const void*, WeakStorage> entries_ ABSL_GUARDED_BY(mu_);
  size_t sweep_at_ ABSL_GUARDED_BY(mu_) = kFirstSweep;
};

}  // namespace nanhunt
