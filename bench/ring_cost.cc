// What libnanhunt_cuda.so's check ring (core/check_ring.h) costs the
// training thread per check, with its drain thread delivering beside it as
// on a GPU: the real ring and drain thread, a device that finishes each
// check 64 enqueues later (results behind the host, as a GPU's are) and
// costs nothing itself. Printed against the same loop calling the device
// directly (no ring) in the same run, single checks and batches of 32,
// with the process's voluntary context switches (a thread that waited for
// a lock). What a kernel launch and an event cost is the GPU machine's
// (scripts/gpu-check.sh); this is the rest of an enqueue's host time.
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <vector>

#include "core/check_ring.h"

namespace {

constexpr int kSlots = 4096;  // cupti/cuda_api.cc's kSlotsPerDevice
constexpr uint64_t kLag = 64;

// Finishes a check kLag enqueues after it.
class LaggingDevice : public nanhunt::DeviceChecks {
 public:
  int slots() const override { return kSlots; }
  bool Enqueue(int slot) {
    const uint64_t n = enqueued_.fetch_add(1, std::memory_order_relaxed) + 1;
    sequence_[slot].store(n, std::memory_order_relaxed);
    return true;
  }
  bool Poll(int slot, nanhunt::CheckCounts* result) override {
    if (enqueued_.load(std::memory_order_relaxed) - sequence_[slot].load() < kLag) return false;
    result->elements = 4;
    return true;
  }
  void Wait(int slot, nanhunt::CheckCounts* result) override { result->elements = 4; }
  void Finish() { enqueued_.fetch_add(kLag); }

 private:
  std::atomic<uint64_t> enqueued_{0};
  std::atomic<uint64_t> sequence_[kSlots] = {};
};

long Switches() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  return r.ru_nvcsw;
}

struct Figure {
  double ns;
  double switches_per_1000;
};

template <class Body>
Figure Time(long checks, Body body) {
  const long switches = Switches();
  const auto start = std::chrono::steady_clock::now();
  body();
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  return {took.count() / static_cast<double>(checks) * 1e9,
          static_cast<double>(Switches() - switches) / static_cast<double>(checks) * 1000};
}

// A context handed over as libnanhunt_cuda.so hands it (cupti/cuda_api.cc):
// a pointer, wrapped without an owner.
std::shared_ptr<void> Handle(void* context) {
  return std::shared_ptr<void>(std::shared_ptr<void>(), context);
}

}  // namespace

int main() {
  constexpr long kChecks = 2000000;
  constexpr int kBatch = 32;
  std::atomic<long> delivered{0};
  int contexts[kBatch];
  Figure plain{}, single{}, batched{}, plain_batch{};
  for (int round = 0; round < 2; ++round) {  // the first warms up
    LaggingDevice device;
    plain = Time(kChecks, [&] {
      for (long i = 0; i < kChecks; ++i) device.Enqueue(static_cast<int>(i % kSlots));
    });
    plain_batch = Time(kChecks, [&] {
      for (long i = 0; i < kChecks; i += kBatch) {
        for (int k = 0; k < kBatch; ++k) device.Enqueue(static_cast<int>((i + k) % kSlots));
      }
    });
    LaggingDevice ring_device;
    {
      nanhunt::CheckRing ring(&ring_device, [&](const nanhunt::PendingCheck&,
                                                const nanhunt::CheckCounts& c) {
        delivered.fetch_add(static_cast<long>(c.elements) / 4, std::memory_order_relaxed);
      });
      single = Time(kChecks, [&] {
        for (long i = 0; i < kChecks; ++i) {
          ring.Enqueue(nullptr, Handle(&contexts[0]),
                       [&](int slot) { return ring_device.Enqueue(slot); });
        }
      });
      batched = Time(kChecks, [&] {
        for (long i = 0; i < kChecks; i += kBatch) {
          std::vector<std::shared_ptr<void>> handles;
          for (int k = 0; k < kBatch; ++k) handles.push_back(Handle(&contexts[k]));
          ring.EnqueueBatch(nullptr, std::move(handles), [&](const int* slots, int n) {
            for (int k = 0; k < n; ++k) ring_device.Enqueue(slots[k]);
            return true;
          });
        }
      });
      ring_device.Finish();
    }  // drains the rest
  }
  printf("the check ring's host cost, %ld checks a run (2nd of 2 runs), results %llu "
         "checks behind, drain thread polling every 200 us\n",
         kChecks, static_cast<unsigned long long>(kLag));
  printf("%-34s%10s%10s%20s\n", "", "ns/check", "extra", "switches/1000");
  auto row = [](const char* name, Figure f, Figure base) {
    printf("%-34s%10.1f%10.1f%20.2f\n", name, f.ns, f.ns - base.ns, f.switches_per_1000);
  };
  row("device alone, single", plain, plain);
  row("ring, single checks", single, plain);
  row("device alone, batches of 32", plain_batch, plain_batch);
  row("ring, batches of 32", batched, plain_batch);
  printf("delivered %ld of %ld\n", delivered.load(), 4 * kChecks);
  return delivered.load() == 4 * kChecks ? 0 : 1;
}
