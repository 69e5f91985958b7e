// One monitored process: its configuration, trace writer and monitor, and
// what happens at exit or on SIGTERM. Torch-free, so that the torch
// translation units stay small.
#pragma once

#include <atomic>
#include <functional>
#include <vector>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/config.h"
#include "core/monitor.h"
#include "core/sampler.h"
#include "core/trace_writer.h"

namespace nanhunt {

// The settings that may change while the process runs (config file edits,
// SIGUSR1). Read on hot paths without locks.
struct LiveSettings {
  std::atomic<OnNonFinite> on_nonfinite{OnNonFinite::kContinue};
  std::atomic<bool> autocast_bf16{false};
  std::atomic<bool> fp32_auto{false};
  // fp32_auto, or NANHUNT_FP32_OPS names ops: whether an op's start must
  // note if autocast is on (for the op it encloses).
  std::atomic<bool> fp32_in_use{false};
  std::atomic<bool> skip_nonfinite_steps{false};
  absl::Mutex mu;
  std::string snapshot_dir ABSL_GUARDED_BY(mu);
  std::vector<std::string> fp32_ops ABSL_GUARDED_BY(mu);
  std::atomic<uint64_t> generation{0};  // bumped on every applied reload

  // Takes the live settings from `config` (at start, and on each reload).
  void Set(const Config& config);
};

class Session {
 public:
  // Reads the configuration, creates the output folder and the trace, and
  // writes the run's metadata. `torch_version` goes into the metadata.
  static absl::StatusOr<Session*> Start(const std::string& torch_version);

  // The process-wide session, or null before Start or in a forked child.
  // Leaked on purpose: op callbacks may run during static destruction.
  static Session* Get();

  // The configuration at start; what may change since is in live().
  const Config& config() const { return config_; }
  LiveSettings& live() { return live_; }

  // Called after a reload was applied, with the settings before and after
  // (the plugin installs kernels for newly listed fp32 ops there).
  void set_on_reload(std::function<void(const Config&, const Config&)> fn) {
    on_reload_ = std::move(fn);
  }

  // Re-reads the environment and the config file and applies what may
  // change at run time; records what happened in the trace. Thread-safe.
  void Reload(const char* why);
  Monitor& monitor() { return *monitor_; }
  // NANHUNT_MODE=sample: which ops to check; null in check mode.
  Sampler* sampler() { return sampler_.get(); }

  // Where NANHUNT_FP32_OPS=auto writes what it learned: NANHUNT_POLICY, or
  // next to the trace.
  std::string PolicyPath() const;
  TraceWriter& writer() { return *writer_; }

  // Final flush and the exit summary; idempotent. Registered with atexit.
  void Finish();

  // Called by Finish() before the last commit, to add final metadata.
  void set_on_finish(std::function<void(TraceWriter&)> fn) {
    on_finish_ = std::move(fn);
  }

 private:
  Session(Config config, std::unique_ptr<TraceWriter> writer);

  const Config config_;
  std::unique_ptr<TraceWriter> writer_;
  std::unique_ptr<Monitor> monitor_;
  std::unique_ptr<Sampler> sampler_;
  std::function<void(TraceWriter&)> on_finish_;
  std::function<void(const Config&, const Config&)> on_reload_;
  LiveSettings live_;
  absl::Mutex reload_mu_;
  Config current_ ABSL_GUARDED_BY(reload_mu_);
};

// False in a forked child and after Finish(): callbacks return at once.
bool MonitoringActive();

}  // namespace nanhunt
