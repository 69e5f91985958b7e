// What an absl::Mutex lock costs with abseil's deadlock detection (on in
// Debian's build) and without it, alone and shared by two threads, as
// nanhunt's op thread and drain thread share the check ring's lock. Prints
// nanoseconds per lock-and-unlock of two nested mutexes.
#include <chrono>
#include <cstdio>
#include <thread>

#include "absl/synchronization/mutex.h"

namespace {

double NsPerPair(int threads) {
  absl::Mutex outer, inner;
  long counter = 0;
  constexpr int kPairs = 1000000;
  auto work = [&] {
    for (int i = 0; i < kPairs; ++i) {
      absl::MutexLock a(&outer);
      absl::MutexLock b(&inner);
      ++counter;
    }
  };
  const auto t0 = std::chrono::steady_clock::now();
  std::thread other;
  if (threads == 2) other = std::thread(work);
  work();
  if (other.joinable()) other.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s / (static_cast<double>(kPairs) * threads) * 1e9;
}

}  // namespace

int main() {
  // Detection is a process-wide mode: measure it first, then switch it off.
  const double detect_one = NsPerPair(1), detect_two = NsPerPair(2);
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  const double plain_one = NsPerPair(1), plain_two = NsPerPair(2);
  printf("%-34s%12s%12s\n", "ns per nested lock pair", "1 thread", "2 threads");
  printf("%-34s%12.1f%12.1f\n", "deadlock detection (default)", detect_one, detect_two);
  printf("%-34s%12.1f%12.1f\n", "detection off (nanhunt's plugin)", plain_one, plain_two);
}
