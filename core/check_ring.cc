#include "core/check_ring.h"

#include <algorithm>

#include "absl/container/inlined_vector.h"
#include "absl/time/time.h"
#include "core/quiet_thread.h"

namespace nanhunt {

CheckRing::CheckRing(DeviceChecks* device, Deliver deliver)
    : device_(device), deliver_(std::move(deliver)) {
  for (int i = device_->slots() - 1; i >= 0; --i) free_slots_.push_back(i);
  thread_ = StartQuietThread([this] { Run(); });
}

CheckRing::~CheckRing() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
  DrainAll();
}

void CheckRing::TakeSlots(size_t n, int* slots) {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (free_slots_.size() >= n) {
        std::copy(free_slots_.end() - static_cast<std::ptrdiff_t>(n), free_slots_.end(), slots);
        free_slots_.resize(free_slots_.size() - n);
        return;
      }
      ++waits_;
    }
    // Full: wait for the oldest result and deliver it; never drop one.
    absl::MutexLock deliver_lock(&deliver_mu_);
    DeliverHead(/*block=*/true);
  }
}

void CheckRing::FreeSlots(const int* slots, size_t n) {
  absl::MutexLock lock(&mu_);
  free_slots_.insert(free_slots_.end(), slots, slots + n);
}

void CheckRing::Queue(void* stream, std::shared_ptr<void>* contexts, const int* slots,
                      size_t n) {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < n; ++i) {
    PendingCheck check;
    check.sequence = next_sequence_++;
    check.stream = stream;
    check.context = std::move(contexts[i]);
    queue_.push_back(Entry{slots[i], std::move(check)});
  }
}

bool CheckRing::Enqueue(void* stream, std::shared_ptr<void> context,
                        const std::function<bool(int slot)>& enqueue_device) {
  int slot = -1;
  TakeSlots(1, &slot);
  if (!enqueue_device(slot)) {
    FreeSlots(&slot, 1);
    return false;
  }
  Queue(stream, &context, &slot, 1);
  return true;
}

bool CheckRing::EnqueueBatch(
    void* stream, std::vector<std::shared_ptr<void>> contexts,
    const std::function<bool(const int* slots, int n)>& enqueue_device) {
  const size_t n = contexts.size();
  if (n == 0) return true;
  if (n > static_cast<size_t>(device_->slots())) return false;
  absl::InlinedVector<int, 32> slots(n);
  TakeSlots(n, slots.data());
  if (!enqueue_device(slots.data(), static_cast<int>(n))) {
    FreeSlots(slots.data(), n);
    return false;
  }
  Queue(stream, contexts.data(), slots.data(), n);
  return true;
}

bool CheckRing::DeliverHead(bool block) {
  Entry head;
  {
    absl::MutexLock lock(&mu_);
    if (queue_.empty()) return false;
    head = queue_.front();
  }
  CheckCounts counts;
  if (block) {
    device_->Wait(head.slot, &counts);
  } else if (!device_->Poll(head.slot, &counts)) {
    return false;
  }
  {
    absl::MutexLock lock(&mu_);
    queue_.pop_front();
  }
  deliver_(head.check, counts);
  absl::MutexLock lock(&mu_);
  free_slots_.push_back(head.slot);
  return true;
}

void CheckRing::DrainReady() {
  absl::MutexLock deliver_lock(&deliver_mu_);
  while (DeliverHead(/*block=*/false)) {
  }
}

void CheckRing::DrainAll() {
  absl::MutexLock deliver_lock(&deliver_mu_);
  while (DeliverHead(/*block=*/true)) {
  }
}

int64_t CheckRing::waits() const {
  absl::MutexLock lock(&mu_);
  return waits_;
}

int64_t CheckRing::in_flight() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(queue_.size());
}

void CheckRing::Run() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      // Sleep until there is something to drain or we stop; poll the
      // device every 200 microseconds while results are outstanding.
      auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || stopping_;
      };
      mu_.Await(absl::Condition(&work));
      if (stopping_) return;
    }
    DrainReady();
    absl::SleepFor(absl::Microseconds(200));
  }
}

}  // namespace nanhunt
