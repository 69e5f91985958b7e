// The memory of GradScaler's loss scales, as the plugin learns it (the
// scale a `GradScaler.scale` call multiplies by, the scale
// `_amp_update_scale_` updates): ops that read or write it make values past
// fp16's range on purpose (OpEvent::loss_scaling). A process has one scale
// per GradScaler and device; a few slots suffice, and a lookup on every op
// is a few relaxed loads.
#pragma once

#include <atomic>

#include "absl/synchronization/mutex.h"

namespace nanhunt {

class LossScaleStorages {
 public:
  static constexpr int kSlots = 8;

  // Remembers `storage` (null is ignored). Past kSlots the oldest is
  // replaced: a scaler made later is the one in use.
  void Note(const void* storage);
  bool Contains(const void* storage) const;
  bool empty() const { return count_.load(std::memory_order_acquire) == 0; }

 private:
  std::atomic<const void*> slots_[kSlots] = {};
  std::atomic<int> count_{0};
  absl::Mutex mu_;  // serialises Note
};

}  // namespace nanhunt
