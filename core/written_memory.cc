#include "core/written_memory.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"

namespace nanhunt {

void WrittenMemory::Known(absl::Span<const Memory> reads, absl::Span<bool> known) const {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < reads.size() && i < known.size(); ++i) {
    const auto it = entries_.find(reads[i].key);
    // The entry's reference keeps its storage's address from being reused:
    // the same address is the same storage.
    known[i] = it != entries_.end() && it->second.impl() == reads[i].identity;
  }
}

void WrittenMemory::NoteKnown(absl::Span<const Memory> written,
                              absl::FunctionRef<WeakStorage(size_t)> weak) {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < written.size(); ++i) {
    if (written[i].key == nullptr || written[i].identity == nullptr) continue;
    WeakStorage& entry = entries_[written[i].key];
    if (entry.impl() != written[i].identity) entry = weak(i);
  }
  if (entries_.size() < sweep_at_) return;
  // Storages that are gone own no memory: their entries say nothing.
  absl::erase_if(entries_, [&](const auto& e) {
    return e.second.impl() == nullptr || !alive_(e.second.impl());
  });
  sweep_at_ = std::max(kFirstSweep, 2 * entries_.size());
}

size_t WrittenMemory::size() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

}  // namespace nanhunt
