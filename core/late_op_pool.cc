#include "core/late_op_pool.h"

namespace nanhunt {

LateOpPool::LateOpPool(size_t keep) : keep_(keep) {
  absl::MutexLock lock(&mu_);
  free_.reserve(keep_);
}

LateOpPool::~LateOpPool() {
  absl::MutexLock lock(&mu_);
  for (LateOp* op : free_) delete op;
}

LateOp* LateOpPool::Take() {
  {
    absl::MutexLock lock(&mu_);
    if (!free_.empty()) {
      LateOp* op = free_.back();
      free_.pop_back();
      return op;
    }
  }
  return new LateOp();
}

void LateOpPool::Give(LateOp* op) {
  if (op == nullptr) return;
  if (op->outputs.capacity() > kMaxKeptOutputs || op->inputs.capacity() > kMaxKeptInputs) {
    delete op;
    return;
  }
  op->Reset();  // here, on the giving thread: the drain thread, not the training's
  {
    absl::MutexLock lock(&mu_);
    if (free_.size() < keep_) {
      free_.push_back(op);
      return;
    }
  }
  delete op;
}

size_t LateOpPool::kept() const {
  absl::MutexLock lock(&mu_);
  return free_.size();
}

}  // namespace nanhunt
