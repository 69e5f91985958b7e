// Which part of a training step an op ran in.
#pragma once

#include <cstdint>
#include "absl/strings/string_view.h"

namespace nanhunt {

enum class Phase : uint8_t { kForward = 0, kBackward = 1, kOptimizer = 2 };
inline constexpr int kPhaseCount = 3;

inline absl::string_view PhaseName(Phase p) {
  switch (p) {
    case Phase::kForward: return "forward";
    case Phase::kBackward: return "backward";
    case Phase::kOptimizer: return "optimizer";
  }
  return "forward";
}

}  // namespace nanhunt
