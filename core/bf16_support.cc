#include "core/bf16_support.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace nanhunt {

std::vector<GpuInfo> VisibleGpus(const std::vector<GpuInfo>& all,
                                 const std::optional<std::string>& visible) {
  if (!visible) return all;
  std::vector<GpuInfo> out;
  // CUDA stops at the first entry it cannot resolve.
  for (absl::string_view entry : absl::StrSplit(*visible, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    const GpuInfo* found = nullptr;
    int index = 0;
    if (absl::SimpleAtoi(entry, &index)) {
      for (const GpuInfo& g : all) {
        if (g.index == index) found = &g;
      }
    } else if (!entry.empty()) {
      for (const GpuInfo& g : all) {
        if (absl::StartsWith(g.uuid, entry) ||
            absl::StartsWith(absl::StripPrefix(g.uuid, "GPU-"), entry)) {
          found = &g;
        }
      }
    }
    if (found == nullptr) break;
    out.push_back(*found);
  }
  return out;
}

absl::Status CheckBf16Support(const std::vector<GpuInfo>& gpus) {
  for (const GpuInfo& g : gpus) {
    if (g.major >= 8) continue;
    return absl::FailedPreconditionError(absl::StrCat(
        "NANHUNT_AUTOCAST_DTYPE=bf16: GPU ", g.index, " (", g.name,
        ", compute capability ", g.major, ".", g.minor,
        ") cannot compute in bf16, which needs compute capability 8.0 "
        "(Ampere) or newer; allowed on this machine: keep (fp16 with "
        "GradScaler), or NANHUNT_FP32_OPS for the ops that overflow"));
  }
  return absl::OkStatus();
}

}  // namespace nanhunt
