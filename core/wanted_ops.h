// Op names whose calls are worth their source line, for a while: capturing
// a line walks the Python stack under the GIL, too dear for every op, so
// nanhunt captures it only for ops that came near fp16's limit or made
// inf/NaN before (late GPU results, backward ops' forward ops), which are
// likely to again.
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace nanhunt {

class WantedOps {
 public:
  static constexpr int64_t kForever = std::numeric_limits<int64_t>::max();

  // `op` wanted up to step `until` (inclusive); a later `until` extends it.
  void Want(absl::string_view op, int64_t until = kForever) {
    absl::MutexLock lock(&mu_);
    auto [it, added] = until_.try_emplace(op, until);
    if (!added && it->second < until) it->second = until;
    if (last_until_.load(std::memory_order_relaxed) < until) {
      last_until_.store(until, std::memory_order_release);
    }
  }

  // Whether any op may be wanted now: one load, for callers that would
  // otherwise build the name to ask with.
  bool AnyOpen() const { return last_until_.load(std::memory_order_acquire) >= 0; }

  // Whether `op` is wanted now, `step_now()` being the step (asked only
  // while a window is open). Asked at every call of the ops that could
  // want a line: one load and no lock while no window is open, and again
  // once every window has closed.
  template <class StepNow>
  bool Wanted(absl::string_view op, StepNow&& step_now) {
    if (!AnyOpen()) return false;
    const int64_t step = step_now();
    absl::MutexLock lock(&mu_);
    if (step > last_until_.load(std::memory_order_relaxed)) {
      until_.clear();
      last_until_.store(-1, std::memory_order_release);
      return false;
    }
    auto it = until_.find(op);
    return it != until_.end() && step <= it->second;
  }
  // For ops wanted kForever.
  bool Wanted(absl::string_view op) {
    return Wanted(op, [] { return int64_t{0}; });
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, int64_t> until_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> last_until_{-1};  // the latest `until` of any op; -1: none open
};

}  // namespace nanhunt
