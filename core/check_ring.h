// Host side of asynchronous (GPU) checks: a fixed ring of result slots,
// each filled by the device in stream order, drained in enqueue order by a
// background thread into a consumer (the Monitor). No host-device sync per
// op: the op's thread only enqueues.
//
// Full ring policy (documented in the README): when every slot is in
// flight, the enqueuing thread waits for the oldest slot, delivers it, and
// reuses it; results are never dropped. Each wait is counted (waits()) and
// goes into the trace.
//
// The device is behind DeviceChecks so that this logic is tested without a
// GPU (tests/unit/check_ring_test.cc) and shared by the CUDA build.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "core/check_semantics.h"

namespace nanhunt {

// What the ring needs from the device. Slots are numbered 0..slots()-1;
// the ring never reuses a slot before its result was taken. Enqueueing a
// check into a slot is the caller's business (it knows the tensor): see
// CheckRing::Enqueue.
class DeviceChecks {
 public:
  virtual ~DeviceChecks() = default;
  virtual int slots() const = 0;
  // The result, if the device has finished the slot. Never blocks.
  virtual bool Poll(int slot, CheckCounts* result) = 0;
  // Blocks until the slot is finished.
  virtual void Wait(int slot, CheckCounts* result) = 0;
};

// What a finished check is delivered with: whatever the caller attached
// when it enqueued (op name, phase, step, shapes...), opaque to the ring.
struct PendingCheck {
  uint64_t sequence = 0;  // enqueue order, from 1
  void* stream = nullptr;
  std::shared_ptr<void> context;
};

class CheckRing {
 public:
  using Deliver = std::function<void(const PendingCheck&, const CheckCounts&)>;

  // `deliver` runs on the drain thread (or on an enqueuing thread that had
  // to wait), one result at a time, in enqueue order.
  CheckRing(DeviceChecks* device, Deliver deliver);
  ~CheckRing();  // drains everything, then stops the thread

  // Enqueues one check. `enqueue_device` is called with the slot to use and
  // enqueues, on `stream`, the check that leaves its result in the slot's
  // host-visible memory and marks the slot finished. Returns false when that
  // failed (nothing pending was added; the slot is free again).
  bool Enqueue(void* stream, std::shared_ptr<void> context,
               absl::FunctionRef<bool(int slot)> enqueue_device);
  // The same for several checks enqueued together (one launch for a list
  // of tensors): `enqueue_device` gets one slot per context, and the
  // results are delivered in that order, each with its context. All or
  // nothing: false leaves every slot free. More contexts than slots fail.
  bool EnqueueBatch(void* stream, std::vector<std::shared_ptr<void>> contexts,
                    absl::FunctionRef<bool(const int* slots, int n)> enqueue_device);

  // Delivers every finished result at the head of the queue. Never blocks
  // on the device. Called by the drain thread; callable by tests.
  void DrainReady();
  // Waits for and delivers everything enqueued so far.
  void DrainAll();

  int64_t waits() const;     // times a full ring made a thread wait
  int64_t in_flight() const;

 private:
  struct Entry {
    int slot;
    PendingCheck check;
  };
  void Run();
  // Takes `n` free slots into `slots`, delivering the oldest results while
  // too few are free (each such wait counted).
  void TakeSlots(size_t n, int* slots);
  void FreeSlots(const int* slots, size_t n);
  // Queues the enqueued checks for delivery, in order.
  void Queue(void* stream, std::shared_ptr<void>* contexts, const int* slots, size_t n);
  // Waits for the head entry's result and delivers it; false when empty.
  bool WaitForHead() ABSL_EXCLUSIVE_LOCKS_REQUIRED(deliver_mu_);
  // Delivers the finished entries at the head, up to kDeliverAtOnce, taking
  // the queue's lock twice for all of them. True when there may be more.
  static constexpr size_t kDeliverAtOnce = 64;
  bool DeliverReady() ABSL_EXCLUSIVE_LOCKS_REQUIRED(deliver_mu_);
  // Takes the head entry off the queue (its result was read) and frees its
  // slot; returns what it is delivered with.
  PendingCheck PopHead() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  DeviceChecks* const device_;
  const Deliver deliver_;

  mutable absl::Mutex mu_;  // guards the queue and free slots
  // The queue, in a circular buffer of slots() entries (each entry holds a
  // slot, so no more are ever in flight): enqueueing and delivering never
  // allocate, and the drain thread never frees what the training thread
  // allocated.
  std::vector<Entry> queue_ ABSL_GUARDED_BY(mu_);
  size_t queue_head_ ABSL_GUARDED_BY(mu_) = 0;
  size_t queue_size_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int> free_slots_ ABSL_GUARDED_BY(mu_);
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t waits_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  // Serialises delivery so results reach the consumer in order.
  absl::Mutex deliver_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::thread thread_;
};

}  // namespace nanhunt
