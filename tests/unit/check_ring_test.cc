// The asynchronous check ring, with a fake device whose slots finish when
// the test says so: order of delivery, the full-ring policy, refusals.
#include "core/check_ring.h"

#include <atomic>
#include <map>
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace nanhunt {
namespace {

class FakeDevice : public DeviceChecks {
 public:
  explicit FakeDevice(int slots) : slots_(slots) {}
  int slots() const override { return slots_; }
  bool Enqueue(int slot) {
    absl::MutexLock lock(&mu_);
    done_[slot] = false;
    elements_[slot] = next_elements_++;
    return true;
  }
  bool Poll(int slot, CheckCounts* result) override {
    absl::MutexLock lock(&mu_);
    if (!done_[slot]) return false;
    result->elements = elements_[slot];
    return true;
  }
  void Wait(int slot, CheckCounts* result) override {
    absl::MutexLock lock(&mu_);
    ++blocking_waits_;
    done_[slot] = true;  // the device finishes it while we wait
    result->elements = elements_[slot];
  }
  void Finish(int slot) {
    absl::MutexLock lock(&mu_);
    done_[slot] = true;
  }
  void FinishAll() {
    absl::MutexLock lock(&mu_);
    for (auto& [slot, done] : done_) done = true;
  }
  int blocking_waits() {
    absl::MutexLock lock(&mu_);
    return blocking_waits_;
  }

 private:
  const int slots_;
  absl::Mutex mu_;
  std::map<int, bool> done_;
  std::map<int, uint64_t> elements_;
  uint64_t next_elements_ = 100;
  int blocking_waits_ = 0;
};

struct Delivered {
  absl::Mutex mu;
  std::vector<uint64_t> sequences;
  std::vector<uint64_t> elements;
};

std::unique_ptr<CheckRing> MakeRing(FakeDevice& device, Delivered& out) {
  return std::make_unique<CheckRing>(
      &device, [&out](const PendingCheck& check, const CheckCounts& counts) {
        absl::MutexLock lock(&out.mu);
        out.sequences.push_back(check.sequence);
        out.elements.push_back(counts.elements);
      });
}

bool Enqueue(CheckRing& ring, FakeDevice& device) {
  return ring.Enqueue(nullptr, nullptr,
                      [&](int slot) { return device.Enqueue(slot); });
}

TEST(CheckRing, ResultsArriveInEnqueueOrderEvenWhenTheDeviceFinishesOutOfOrder) {
  FakeDevice device(8);
  Delivered out;
  auto ring = MakeRing(device, out);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Enqueue(*ring, device));
  device.Finish(6);  // slots are handed out from 0; the third is slot 2
  device.Finish(2);
  ring->DrainReady();
  {
    absl::MutexLock lock(&out.mu);
    EXPECT_TRUE(out.sequences.empty()) << "the first is not finished yet";
  }
  device.FinishAll();
  ring->DrainAll();
  absl::MutexLock lock(&out.mu);
  EXPECT_EQ(out.sequences, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(out.elements, (std::vector<uint64_t>{100, 101, 102}));
}

TEST(CheckRing, FullRingWaitsForTheOldestAndNeverDropsAResult) {
  FakeDevice device(2);
  Delivered out;
  auto ring = MakeRing(device, out);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(Enqueue(*ring, device));
  EXPECT_GE(ring->waits(), 3);
  EXPECT_GE(device.blocking_waits(), 3);
  device.FinishAll();
  ring->DrainAll();
  absl::MutexLock lock(&out.mu);
  EXPECT_EQ(out.sequences, (std::vector<uint64_t>{1, 2, 3, 4, 5}));
}

// The drain thread delivers finished results at the head several at a
// time (CheckRing::DeliverReady): past the first 64, and never past an
// unfinished one, whatever finished behind it.
TEST(CheckRing, DrainingDeliversEveryFinishedResultAtTheHeadAndStopsAtTheFirstUnfinished) {
  FakeDevice device(128);
  Delivered out;
  auto ring = MakeRing(device, out);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(Enqueue(*ring, device));
  // Slots are handed out from 0: check i is in slot i.
  for (int slot = 0; slot < 70; ++slot) device.Finish(slot);
  device.Finish(75);
  ring->DrainReady();
  {
    absl::MutexLock lock(&out.mu);
    ASSERT_EQ(out.sequences.size(), 70u);
    for (size_t i = 0; i < 70; ++i) EXPECT_EQ(out.sequences[i], i + 1);
  }
  EXPECT_EQ(ring->in_flight(), 30);
  device.FinishAll();
  ring->DrainReady();
  EXPECT_EQ(ring->in_flight(), 0);
  absl::MutexLock lock(&out.mu);
  ASSERT_EQ(out.sequences.size(), 100u);
  EXPECT_EQ(out.sequences.back(), 100u);
  EXPECT_EQ(out.elements[75], 175u) << "each result with its own slot's counts";
}

// The queue is a circular buffer of slots() entries: round it many times,
// single checks and batches mixed, results finishing while the drain
// thread and the enqueuing thread both deliver, and each result comes once,
// in order, with its own context.
TEST(CheckRing, RoundTheRingManyTimesEveryResultComesOnceInOrderWithItsContext) {
  FakeDevice device(5);
  absl::Mutex mu;
  std::vector<uint64_t> sequences;
  std::vector<intptr_t> contexts;
  CheckRing ring(&device, [&](const PendingCheck& check, const CheckCounts&) {
    absl::MutexLock lock(&mu);
    sequences.push_back(check.sequence);
    contexts.push_back(reinterpret_cast<intptr_t>(check.context.get()));
  });
  // Contexts that own nothing, as libnanhunt_cuda.so hands them over.
  auto handle = [](intptr_t n) {
    return std::shared_ptr<void>(std::shared_ptr<void>(), reinterpret_cast<void*>(n));
  };
  intptr_t next = 1;
  for (int round = 0; round < 400; ++round) {
    if (round % 3 == 0) {
      std::vector<std::shared_ptr<void>> batch;
      for (int i = 0; i < 3; ++i) batch.push_back(handle(next++));
      ASSERT_TRUE(ring.EnqueueBatch(nullptr, std::move(batch), [&](const int* slots, int n) {
        for (int i = 0; i < n; ++i) device.Enqueue(slots[i]);
        return true;
      }));
    } else {
      ASSERT_TRUE(ring.Enqueue(nullptr, handle(next++),
                               [&](int slot) { return device.Enqueue(slot); }));
    }
    ASSERT_LE(ring.in_flight(), 5);
    if (round % 7 == 0) device.FinishAll();
  }
  device.FinishAll();
  ring.DrainAll();
  EXPECT_EQ(ring.in_flight(), 0);
  absl::MutexLock lock(&mu);
  ASSERT_EQ(sequences.size(), static_cast<size_t>(next - 1));
  for (size_t i = 0; i < sequences.size(); ++i) {
    EXPECT_EQ(sequences[i], i + 1);
    EXPECT_EQ(contexts[i], static_cast<intptr_t>(i + 1));
  }
  EXPECT_GT(ring.waits(), 0) << "five slots for 666 checks: the ring was full";
}

TEST(CheckRing, BackgroundThreadDeliversWithoutBeingAsked) {
  FakeDevice device(4);
  Delivered out;
  auto ring = MakeRing(device, out);
  ASSERT_TRUE(Enqueue(*ring, device));
  device.FinishAll();
  for (int i = 0; i < 500; ++i) {
    {
      absl::MutexLock lock(&out.mu);
      if (!out.sequences.empty()) break;
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
  absl::MutexLock lock(&out.mu);
  EXPECT_EQ(out.sequences.size(), 1u);
}

TEST(CheckRing, RefusedEnqueueLeavesNothingPendingAndFreesTheSlot) {
  FakeDevice device(1);
  Delivered out;
  auto ring = MakeRing(device, out);
  EXPECT_FALSE(ring->Enqueue(nullptr, nullptr, [](int) { return false; }));
  EXPECT_EQ(ring->in_flight(), 0);
  ASSERT_TRUE(Enqueue(*ring, device));  // the slot is usable again
  device.FinishAll();
  ring->DrainAll();
  EXPECT_EQ(ring->waits(), 0);
}

bool EnqueueBatch(CheckRing& ring, FakeDevice& device, int n, std::vector<int>* slots_used) {
  std::vector<std::shared_ptr<void>> contexts;
  for (int i = 0; i < n; ++i) contexts.push_back(std::make_shared<int>(i));
  return ring.EnqueueBatch(nullptr, std::move(contexts), [&](const int* slots, int count) {
    for (int i = 0; i < count; ++i) {
      device.Enqueue(slots[i]);
      if (slots_used != nullptr) slots_used->push_back(slots[i]);
    }
    return true;
  });
}

TEST(CheckRing, ABatchTakesOneSlotPerCheckAndDeliversThemInOrderWithTheirContexts) {
  FakeDevice device(8);
  std::vector<int> contexts_seen;
  absl::Mutex mu;
  CheckRing ring(&device, [&](const PendingCheck& check, const CheckCounts&) {
    absl::MutexLock lock(&mu);
    contexts_seen.push_back(check.context ? *static_cast<int*>(check.context.get()) : -1);
  });
  ASSERT_TRUE(Enqueue(ring, device));
  std::vector<int> slots;
  ASSERT_TRUE(EnqueueBatch(ring, device, 3, &slots));
  ASSERT_TRUE(Enqueue(ring, device));
  EXPECT_EQ(slots.size(), 3u);
  EXPECT_EQ(ring.in_flight(), 5);
  device.FinishAll();
  ring.DrainAll();
  absl::MutexLock lock(&mu);
  // The single checks carry no context (-1 here).
  EXPECT_EQ(contexts_seen, (std::vector<int>{-1, 0, 1, 2, -1}));
}

TEST(CheckRing, ABatchWaitsUntilEnoughSlotsAreFreeAndNeverDropsAResult) {
  FakeDevice device(4);
  Delivered out;
  auto ring = MakeRing(device, out);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Enqueue(*ring, device));
  ASSERT_TRUE(EnqueueBatch(*ring, device, 3, nullptr));  // needs two delivered
  EXPECT_GE(ring->waits(), 2);
  EXPECT_FALSE(EnqueueBatch(*ring, device, 5, nullptr)) << "more than the ring holds";
  device.FinishAll();
  ring->DrainAll();
  absl::MutexLock lock(&out.mu);
  EXPECT_EQ(out.sequences, (std::vector<uint64_t>{1, 2, 3, 4, 5, 6}));
}

TEST(CheckRing, ARefusedBatchFreesEverySlot) {
  FakeDevice device(3);
  Delivered out;
  auto ring = MakeRing(device, out);
  std::vector<std::shared_ptr<void>> three(3);
  EXPECT_FALSE(ring->EnqueueBatch(nullptr, three, [](const int*, int) { return false; }));
  EXPECT_EQ(ring->in_flight(), 0);
  ASSERT_TRUE(EnqueueBatch(*ring, device, 3, nullptr));
  EXPECT_EQ(ring->waits(), 0);
  device.FinishAll();
  ring->DrainAll();
}

}  // namespace
}  // namespace nanhunt
