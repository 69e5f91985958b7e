#include "core/loss_scale_storages.h"

namespace nanhunt {

void LossScaleStorages::Note(const void* storage) {
  if (storage == nullptr || Contains(storage)) return;
  absl::MutexLock lock(&mu_);
  if (Contains(storage)) return;
  const int n = count_.load(std::memory_order_relaxed);
  slots_[n % kSlots].store(storage, std::memory_order_release);
  count_.store(n + 1, std::memory_order_release);
}

bool LossScaleStorages::Contains(const void* storage) const {
  if (storage == nullptr) return false;
  const int n = count_.load(std::memory_order_acquire);
  for (int i = 0; i < n && i < kSlots; ++i) {
    if (slots_[i].load(std::memory_order_acquire) == storage) return true;
  }
  return false;
}

}  // namespace nanhunt
