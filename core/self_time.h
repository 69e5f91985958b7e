// nanhunt's own host time, for the trace's meta: what a monitored op's
// callbacks cost the thread that runs the op, how much of that an op with
// GPU outputs spends on them (its late op and checks), what enqueueing a
// GPU check costs, and the time spent delivering GPU results (on the drain thread,
// or on an enqueuing thread when the ring is full). Whether
// every-op checking on a GPU is held back by the host or by the device is
// read from these and the step time (bench/gpt2_bench.py prints both).
//
// Sampled, so that the clock reads cost nothing measurable: each thread
// times one event in kEvery of each kind (its own counter, no shared write
// on the others) and the totals are scaled back up.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace nanhunt {

class SelfTime {
 public:
  static constexpr uint64_t kEvery = 64;
  // kGpuOp: the part of an op's end callback that turns its GPU outputs
  // into a late op and checks (enqueues included), per op with GPU outputs.
  enum Kind { kOp, kEnqueue, kDelivery, kGpuOp, kKinds };

  // Monotonic nanoseconds.
  static int64_t NowNs();

  // Whether the calling thread times its next event of `kind`; counts the
  // event either way. Cheap: a thread-local increment.
  static bool TimeThisOne(Kind kind);

  // A timed event's nanoseconds.
  void Add(Kind kind, int64_t ns);

  struct Totals {
    int64_t events = 0;  // about: timed events times kEvery
    int64_t timed = 0;
    double mean_us = 0;  // of the timed events
  };
  Totals Get(Kind kind) const;

  // Meta rows (key, value): host_us_per_op, ops_observed, and where GPU
  // checks ran, host_us_per_gpu_op, host_us_per_enqueue and
  // delivery_seconds. Kinds nothing was timed for are left out.
  std::vector<std::pair<std::string, std::string>> MetaRows() const;

 private:
  std::atomic<int64_t> timed_[kKinds] = {};
  std::atomic<int64_t> ns_[kKinds] = {};
};

// The process's, leaked like the session.
SelfTime& GlobalSelfTime();

// Times a scope when the thread's counter says so.
class SelfTimer {
 public:
  explicit SelfTimer(SelfTime::Kind kind)
      : kind_(kind), t0_(SelfTime::TimeThisOne(kind) ? SelfTime::NowNs() : -1) {}
  ~SelfTimer() {
    if (t0_ >= 0) GlobalSelfTime().Add(kind_, SelfTime::NowNs() - t0_);
  }
  SelfTimer(const SelfTimer&) = delete;
  SelfTimer& operator=(const SelfTimer&) = delete;

 private:
  const SelfTime::Kind kind_;
  const int64_t t0_;
};

}  // namespace nanhunt
