// nanhunt's configuration: NANHUNT_* environment variables, optionally a
// config file (NANHUNT_CONFIG) whose entries the environment overrides.
//
// Every setting is declared once in kSettings (config.cc); the README's
// configuration table and every error message come from that table.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace nanhunt {

enum class Mode { kOff, kCheck, kSample };

// When nanhunt subscribes to CUPTI for the names of the kernels each op
// launched. CUPTI's callback on every launch costs the launching thread
// about 1.5 us (0.07x of an H200's GPT-2 step with every op checked), so by
// default it starts with the first result near fp16's limit or non-finite:
// overflows build up and recur, and the findings after it carry names.
enum class KernelNames { kOff, kFirstWarning, kAlways };

// What happens at the first non-finite origin (or input).
enum class OnNonFinite { kContinue, kRaise, kAbort };

struct Config {
  Mode mode = Mode::kCheck;
  std::string out_dir = "nanhunt-out";
  double near_max = 16376.0;  // a quarter of fp16's 65504
  double underflow_fraction = 0.01;
  int flush_ms = 250;
  int max_findings_per_step = 50;
  bool follow_children = true;
  KernelNames kernel_names = KernelNames::kFirstWarning;
  // NANHUNT_GPU_BATCH: GPU outputs checked together across ops, up to this
  // many per batch; 1 holds nothing back (core/check_batches.h).
  int gpu_batch = 1;
  // NANHUNT_GPU_BATCH=auto: 32 while the process has loaded no code that
  // launches CUDA kernels of its own (core/foreign_cuda_code.h).
  bool gpu_batch_auto = false;
  bool exit_summary = true;
  bool quiet = false;
  OnNonFinite on_nonfinite = OnNonFinite::kContinue;
  bool autocast_bf16 = false;  // fp16 autocast regions run in bf16
  std::vector<std::string> fp32_ops;  // op names or globs run in fp32
  // NANHUNT_FP32_OPS=auto: ops that overflow or come near the limit are
  // switched to fp32 from their next call on.
  bool fp32_auto = false;
  std::string policy_file;  // NANHUNT_POLICY: fp32 ops learned by a run
  bool skip_nonfinite_steps = false;  // GradScaler-style skipping
  int64_t max_trace_mb = 1024;  // size cap of one trace (TraceWriter::Thin)
  int progress_ms = 1000;  // viewer: progress line on a terminal after this
  // NANHUNT_MODE=sample (core/sampler.h).
  double sample_ops = 0.01;
  int64_t sample_steps = 100;
  int64_t sample_seed = 0;
  int64_t escalate_steps = 20;
  double budget = 0;  // NANHUNT_BUDGET as a share (0.01 for 1%); 0: off
  std::string snapshot_dir;  // empty: no snapshot
  std::string torch_plugin;  // empty: next to libnanhunt.so
  std::string run_id;        // empty: one per process
  std::string config_file;   // where file entries came from, if any
};

// One documented setting.
struct SettingInfo {
  const char* name;     // environment variable, e.g. "NANHUNT_MODE"
  const char* fallback; // default as the user would write it
  const char* allowed;  // the allowed values, in words
  const char* meaning;
};

// All settings, in documentation order.
absl::Span<const SettingInfo> AllSettings();

// Looks a variable up; returns nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const char*)>;

// Builds the configuration from `env` and, when NANHUNT_CONFIG names one, a
// config file of `NAME = value` lines (`#` starts a comment; NAME is the
// variable name with or without its NANHUNT_ prefix, in any case).
// `env_names` are the names of all environment variables, used to reject a
// misspelt NANHUNT_* variable. Errors name the setting, the bad value and the
// allowed values; they never throw.
absl::StatusOr<Config> LoadConfig(const EnvLookup& env,
                                  const std::vector<std::string>& env_names);

// LoadConfig over the process environment.
absl::StatusOr<Config> LoadConfigFromProcess();

// Reads a policy file (op names or globs, one per line, `#` comments) as
// written by NANHUNT_FP32_OPS=auto. Errors name NANHUNT_POLICY, the file and
// the bad line.
absl::StatusOr<std::vector<std::string>> ReadPolicyFile(const std::string& path);

// Writes `ops` as a policy file ReadPolicyFile reads back, with a header
// saying where it came from. Replaces the file atomically.
absl::Status WritePolicyFile(const std::string& path,
                             const std::vector<std::string>& ops,
                             const std::string& header);

// The configuration as `NAME=value` lines, for the trace's metadata.
std::string DescribeConfig(const Config& config);

}  // namespace nanhunt
