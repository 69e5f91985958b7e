#include "core/self_time.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace nanhunt {

int64_t SelfTime::NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool SelfTime::TimeThisOne(Kind kind) {
  // The 64th, 128th...: not a thread's first, which pays one-time set-up
  // (loading the GPU library, installing hooks) and would skew a small sample.
  thread_local uint64_t counts[kKinds] = {};
  return ++counts[kind] % kEvery == 0;
}

void SelfTime::Add(Kind kind, int64_t ns) {
  timed_[kind].fetch_add(1, std::memory_order_relaxed);
  ns_[kind].fetch_add(ns, std::memory_order_relaxed);
}

SelfTime::Totals SelfTime::Get(Kind kind) const {
  Totals t;
  t.timed = timed_[kind].load(std::memory_order_relaxed);
  t.events = t.timed * static_cast<int64_t>(kEvery);
  if (t.timed > 0) {
    t.mean_us = static_cast<double>(ns_[kind].load(std::memory_order_relaxed)) / 1000.0 /
                static_cast<double>(t.timed);
  }
  return t;
}

std::vector<std::pair<std::string, std::string>> SelfTime::MetaRows() const {
  std::vector<std::pair<std::string, std::string>> rows;
  const Totals op = Get(kOp), enqueue = Get(kEnqueue), delivery = Get(kDelivery),
               gpu_op = Get(kGpuOp);
  if (op.timed > 0) {
    rows.emplace_back("host_us_per_op", absl::StrFormat("%.2f", op.mean_us));
    rows.emplace_back("ops_observed", absl::StrCat(op.events));
  }
  if (gpu_op.timed > 0) {
    rows.emplace_back("host_us_per_gpu_op", absl::StrFormat("%.2f", gpu_op.mean_us));
  }
  if (enqueue.timed > 0) {
    rows.emplace_back("host_us_per_enqueue", absl::StrFormat("%.2f", enqueue.mean_us));
  }
  if (delivery.timed > 0) {
    rows.emplace_back("delivery_seconds",
                      absl::StrFormat("%.3f", delivery.mean_us * delivery.events / 1e6));
  }
  return rows;
}

SelfTime& GlobalSelfTime() {
  static auto* self_time = new SelfTime;  // leaked: read at exit
  return *self_time;
}

}  // namespace nanhunt
