#include "core/check_ring.h"

#include <algorithm>

#include "absl/container/inlined_vector.h"
#include "absl/time/time.h"
#include "core/quiet_thread.h"

namespace nanhunt {

CheckRing::CheckRing(DeviceChecks* device, Deliver deliver)
    : device_(device), deliver_(std::move(deliver)) {
  {
    absl::MutexLock lock(&mu_);
    for (int i = device_->slots() - 1; i >= 0; --i) free_slots_.push_back(i);
    queue_.resize(static_cast<size_t>(std::max(device_->slots(), 1)));
  }
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
    WaitForHead();
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
    // Room: each entry holds one of the slots() slots.
    Entry& entry = queue_[(queue_head_ + queue_size_) % queue_.size()];
    ++queue_size_;
    entry.slot = slots[i];
    entry.check.sequence = next_sequence_++;
    entry.check.stream = stream;
    entry.check.context = std::move(contexts[i]);
  }
}

bool CheckRing::Enqueue(void* stream, std::shared_ptr<void> context,
                        absl::FunctionRef<bool(int slot)> enqueue_device) {
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
    absl::FunctionRef<bool(const int* slots, int n)> enqueue_device) {
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

bool CheckRing::WaitForHead() {
  // Only this thread (deliver_mu_) takes entries off the head; enqueuers
  // only add behind it. So the head entry stays put while it is read.
  int slot;
  {
    absl::MutexLock lock(&mu_);
    if (queue_size_ == 0) return false;
    slot = queue_[queue_head_].slot;
  }
  CheckCounts counts;
  device_->Wait(slot, &counts);
  PendingCheck check;
  {
    absl::MutexLock lock(&mu_);
    check = PopHead();
  }
  deliver_(check, counts);
  return true;
}

PendingCheck CheckRing::PopHead() {
  // The counts are copied out: the slot may take its next check now.
  Entry& head = queue_[queue_head_];
  PendingCheck check = std::move(head.check);
  head.check = PendingCheck();
  free_slots_.push_back(head.slot);
  queue_head_ = (queue_head_ + 1) % queue_.size();
  --queue_size_;
  return check;
}

bool CheckRing::DeliverReady() {
  // The head entries' slots, under one lock. Only this thread (deliver_mu_)
  // takes entries off the head, so they stay put while they are polled.
  int slots[kDeliverAtOnce];
  size_t n = 0;
  {
    absl::MutexLock lock(&mu_);
    n = std::min(queue_size_, kDeliverAtOnce);
    for (size_t i = 0; i < n; ++i) slots[i] = queue_[(queue_head_ + i) % queue_.size()].slot;
  }
  CheckCounts counts[kDeliverAtOnce];
  size_t ready = 0;
  while (ready < n && device_->Poll(slots[ready], &counts[ready])) ++ready;
  if (ready == 0) return false;
  PendingCheck checks[kDeliverAtOnce];
  {
    // One lock for all of them: the enqueuing thread takes this lock at
    // every check, and a lock per result kept the two threads trading it.
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < ready; ++i) checks[i] = PopHead();
  }
  for (size_t i = 0; i < ready; ++i) deliver_(checks[i], counts[i]);
  return ready == n;  // all of those were finished: there may be more
}

void CheckRing::DrainReady() {
  absl::MutexLock deliver_lock(&deliver_mu_);
  while (DeliverReady()) {
  }
}

void CheckRing::DrainAll() {
  absl::MutexLock deliver_lock(&deliver_mu_);
  while (WaitForHead()) {
  }
}

int64_t CheckRing::waits() const {
  absl::MutexLock lock(&mu_);
  return waits_;
}

int64_t CheckRing::in_flight() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(queue_size_);
}

void CheckRing::Run() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      // Sleep until there is something to drain or we stop; poll the
      // device every 200 microseconds while results are outstanding.
      auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return queue_size_ != 0 || stopping_;
      };
      mu_.Await(absl::Condition(&work));
      if (stopping_) return;
    }
    DrainReady();
    absl::SleepFor(absl::Microseconds(200));
  }
}

}  // namespace nanhunt
