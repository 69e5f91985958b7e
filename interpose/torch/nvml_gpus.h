// The machine's NVIDIA GPUs, read through NVML, which the driver ships.
// NVML creates no CUDA context, so asking at start-up does not touch the
// training's CUDA state or break fork-based DataLoader workers.
#pragma once

#include <vector>

#include "core/bf16_support.h"

namespace nanhunt {

// Empty when there is no driver (a CPU machine) or NVML fails.
std::vector<GpuInfo> NvmlGpus();

}  // namespace nanhunt
