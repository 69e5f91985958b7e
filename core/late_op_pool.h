// Reused LateOps. Every GPU op's record is made on the training thread and
// let go of on the drain thread once its results are judged; allocated and
// freed that way, each op cost glibc's malloc a lock on the training
// thread's arena from both threads, and the two threads waited for each
// other (perf on tests/cpp/host_gpu_ops: futex waits in malloc on the op
// thread, in free on the drain thread). Given back, an op is reset on the
// giving thread, keeping its strings' and lists' memory, and taken again
// by the next op without a malloc.
#pragma once

#include <cstddef>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "core/late_ops.h"

namespace nanhunt {

class LateOpPool {
 public:
  // Keeps at most `keep` ops; one whose lists grew past kMaxKeptOutputs
  // outputs or kMaxKeptInputs inputs (a foreach op over every parameter)
  // is deleted rather than kept, so that the pool's memory stays that of
  // small ops.
  explicit LateOpPool(size_t keep = 4096);
  ~LateOpPool();
  LateOpPool(const LateOpPool&) = delete;
  LateOpPool& operator=(const LateOpPool&) = delete;

  static constexpr size_t kMaxKeptOutputs = 8;
  static constexpr size_t kMaxKeptInputs = 16;

  // A new op's fields (LateOp::Reset). Any thread.
  LateOp* Take();
  // `op` is no longer referred to by anyone. Any thread.
  void Give(LateOp* op);

  size_t kept() const;

 private:
  const size_t keep_;
  mutable absl::Mutex mu_;
  std::vector<LateOp*> free_ ABSL_GUARDED_BY(mu_);  // reserved: never grows
};

}  // namespace nanhunt
