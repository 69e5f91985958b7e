#include "core/budget.h"

#include <algorithm>
#include <cmath>

namespace nanhunt {

std::optional<double> BudgetController::OnStep(int64_t step_ns, int64_t check_ns,
                                               double rate) {
  if (step_ns <= 0) return std::nullopt;
  const double share = static_cast<double>(check_ns) / static_cast<double>(step_ns);
  smoothed_ = smoothed_ < 0 ? share : 0.6 * smoothed_ + 0.4 * share;
  double wanted;
  if (smoothed_ <= 0) {
    wanted = rate * 2;  // nothing measured: there is room
  } else {
    // Cost is proportional to the share: aim a little under the budget.
    wanted = rate * 0.9 * budget_ / smoothed_;
  }
  wanted = std::clamp(wanted, 1e-6, 1.0);
  if (std::abs(wanted - rate) <= rate / 5) return std::nullopt;
  // Moves of at most 4x a step: one noisy step must not swing it wide.
  wanted = std::clamp(wanted, rate / 4, rate * 4);
  return std::clamp(wanted, 1e-6, 1.0);
}

}  // namespace nanhunt
