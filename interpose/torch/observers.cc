#include "interpose/torch/observers.h"

#include <atomic>

#include "absl/synchronization/mutex.h"

namespace nanhunt {
namespace {

struct Observers {
  absl::Mutex mu;
  ObserverStart start = nullptr;
  ObserverEnd end = nullptr;
  at::CallbackHandle every = at::INVALID_CALLBACK_HANDLE;    // all scopes
  at::CallbackHandle user = at::INVALID_CALLBACK_HANDLE;     // USER_SCOPE
  at::CallbackHandle sampled = at::INVALID_CALLBACK_HANDLE;  // FUNCTION, sampled
  double share = 0;
  std::atomic<bool> every_on{true};  // read on every op without the lock
};

Observers& Get() {
  static auto* observers = new Observers;  // leaked: callbacks outlive exit
  return *observers;
}

// Added and removed rather than switched: the countdown of a sampled
// callback is drawn when it is added, so re-adding it after a reseed makes
// the draw depend on the seed alone.
void AddSampled(Observers& o) ABSL_EXCLUSIVE_LOCKS_REQUIRED(o.mu) {
  if (o.share <= 0) return;
  o.sampled = at::addGlobalCallback(at::RecordFunctionCallback(o.start, o.end)
                                        .needsInputs(true)
                                        .needsOutputs(true)
                                        .samplingProb(o.share)
                                        .scopes({at::RecordScope::FUNCTION}));
}

void RemoveSampled(Observers& o) ABSL_EXCLUSIVE_LOCKS_REQUIRED(o.mu) {
  if (o.sampled == at::INVALID_CALLBACK_HANDLE) return;
  at::removeCallback(o.sampled);
  o.sampled = at::INVALID_CALLBACK_HANDLE;
}

}  // namespace

void InstallObservers(ObserverStart start, ObserverEnd end, bool sample_mode,
                      double sampled_share) {
  Observers& o = Get();
  absl::MutexLock lock(&o.mu);
  o.start = start;
  o.end = end;
  o.share = sampled_share;
  o.every = at::addGlobalCallback(
      at::RecordFunctionCallback(start, end)
          .needsInputs(true)
          .needsOutputs(true)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                   at::RecordScope::USER_SCOPE}));
  if (sample_mode) {
    o.user = at::addGlobalCallback(
        at::RecordFunctionCallback(start, end).scopes({at::RecordScope::USER_SCOPE}));
    at::disableCallback(o.user);
  }
}

void ObserveEveryOp(bool every) {
  Observers& o = Get();
  if (every == o.every_on.load()) return;  // the common case, without the lock
  absl::MutexLock lock(&o.mu);
  if (every == o.every_on.load() || o.user == at::INVALID_CALLBACK_HANDLE) return;
  o.every_on.store(every);
  // Off before on: a record that got both would be seen twice.
  if (every) {
    RemoveSampled(o);
    at::disableCallback(o.user);
    at::reenableCallback(o.every);
  } else {
    at::disableCallback(o.every);
    at::reenableCallback(o.user);
    AddSampled(o);
  }
}

bool ObservingEveryOp() { return Get().every_on.load(std::memory_order_relaxed); }

void SetSampledShare(double share) {
  Observers& o = Get();
  absl::MutexLock lock(&o.mu);
  o.share = share > 1 ? 1 : share;
}

void ReseedSampling(uint64_t seed) {
  Observers& o = Get();
  absl::MutexLock lock(&o.mu);
  at::set_record_function_seed_for_testing(static_cast<uint32_t>(seed ^ (seed >> 32)));
  if (o.every_on.load()) return;
  RemoveSampled(o);
  AddSampled(o);
}

}  // namespace nanhunt
