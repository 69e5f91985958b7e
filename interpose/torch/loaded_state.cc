#include "interpose/torch/loaded_state.h"

#include <atomic>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace nanhunt {
namespace {

absl::Mutex g_mu;
// Leaked on purpose: read by callbacks until the process ends.
absl::flat_hash_map<const void*, LoadedNonFinite>& Noted() ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_mu) {
  static auto* noted = new absl::flat_hash_map<const void*, LoadedNonFinite>();
  return *noted;
}
// Whether anything is noted: asked at every GPU op input without the lock.
std::atomic<bool> g_any{false};
std::atomic<int64_t> g_noted_optimizer{0};
std::atomic<int64_t> g_noted_model{0};

}  // namespace

void NoteLoadedNonFinite(const void* storage, LoadedNonFinite facts) {
  if (storage == nullptr) return;
  absl::MutexLock lock(&g_mu);
  (facts.into == LoadedInto::kModel ? g_noted_model : g_noted_optimizer)
      .fetch_add(1, std::memory_order_relaxed);
  Noted()[storage] = std::move(facts);
  g_any.store(true, std::memory_order_release);
}

std::optional<LoadedNonFinite> LoadedNonFiniteAt(const void* storage) {
  if (!g_any.load(std::memory_order_acquire) || storage == nullptr) return std::nullopt;
  absl::MutexLock lock(&g_mu);
  auto it = Noted().find(storage);
  if (it == Noted().end()) return std::nullopt;
  return it->second;
}

void ForgetLoadedNonFiniteAt(const void* storage) {
  if (!g_any.load(std::memory_order_acquire) || storage == nullptr) return;
  absl::MutexLock lock(&g_mu);
  Noted().erase(storage);
  g_any.store(!Noted().empty(), std::memory_order_release);
}

void ForgetAllLoadedNonFinite() {
  absl::MutexLock lock(&g_mu);
  Noted().clear();
  g_any.store(false, std::memory_order_release);
}

int64_t LoadedNonFiniteNoted(LoadedInto into) {
  return (into == LoadedInto::kModel ? g_noted_model : g_noted_optimizer)
      .load(std::memory_order_relaxed);
}

}  // namespace nanhunt
