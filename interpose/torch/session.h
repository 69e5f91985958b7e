// One monitored process: its configuration, trace writer and monitor, and
// what happens at exit or on SIGTERM. Torch-free, so that the torch
// translation units stay small.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/config.h"
#include "core/monitor.h"
#include "core/trace_writer.h"

namespace nanhunt {

class Session {
 public:
  // Reads the configuration, creates the output folder and the trace, and
  // writes the run's metadata. `torch_version` goes into the metadata.
  static absl::StatusOr<Session*> Start(const std::string& torch_version);

  // The process-wide session, or null before Start or in a forked child.
  // Leaked on purpose: op callbacks may run during static destruction.
  static Session* Get();

  const Config& config() const { return config_; }
  Monitor& monitor() { return *monitor_; }
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
  std::function<void(TraceWriter&)> on_finish_;
};

// False in a forked child and after Finish(): callbacks return at once.
bool MonitoringActive();

}  // namespace nanhunt
