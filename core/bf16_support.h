// Whether the process's GPUs can run NANHUNT_AUTOCAST_DTYPE=bf16: CUDA
// computes bf16 on compute capability 8.0 (Ampere) and newer. torch would
// otherwise fail or crawl at the first bf16 matmul, hours into a run.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace nanhunt {

struct GpuInfo {
  int index = 0;      // as NVML numbers it
  std::string name;   // "Tesla V100-SXM2-16GB"
  std::string uuid;   // "GPU-6d1c..."
  int major = 0, minor = 0;
};

// The GPUs that CUDA_VISIBLE_DEVICES (`visible`; nullopt: unset) leaves to
// the process: indices or UUID prefixes, as CUDA reads them.
std::vector<GpuInfo> VisibleGpus(const std::vector<GpuInfo>& all,
                                 const std::optional<std::string>& visible);

// An error naming NANHUNT_AUTOCAST_DTYPE and the first GPU that cannot do
// bf16, or OK.
absl::Status CheckBf16Support(const std::vector<GpuInfo>& gpus);

}  // namespace nanhunt
