#include "interpose/torch/loading_names.h"

#include <atomic>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace nanhunt {
namespace {

absl::Mutex g_mu;
// Leaked on purpose: read by callbacks until the process ends.
absl::flat_hash_map<const void*, std::string>& Names() ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_mu) {
  static auto* names = new absl::flat_hash_map<const void*, std::string>();
  return *names;
}
// Whether a load is under way: asked at every GPU copy without the lock.
std::atomic<bool> g_loading{false};

}  // namespace

void NoteLoadingInto(const void* storage, std::string name) {
  if (storage == nullptr) return;
  absl::MutexLock lock(&g_mu);
  Names()[storage] = std::move(name);
  g_loading.store(true, std::memory_order_release);
}

std::optional<std::string> LoadingNameOf(const void* storage) {
  if (!g_loading.load(std::memory_order_acquire) || storage == nullptr) return std::nullopt;
  absl::MutexLock lock(&g_mu);
  auto it = Names().find(storage);
  if (it == Names().end()) return std::nullopt;
  return it->second;
}

void ForgetLoadingNames() {
  absl::MutexLock lock(&g_mu);
  Names().clear();
  g_loading.store(false, std::memory_order_release);
}

}  // namespace nanhunt
