#include "core/divergence_watch.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace nanhunt {

std::string DivergenceWatch::Growth::Describe() const {
  return absl::StrFormat("the updates grew from max|x| %.6g at step %d to %.6g at step %d", from,
                         from_step, now, step);
}

std::optional<DivergenceWatch::Growth> DivergenceWatch::OnUpdate(int64_t step, double max_abs) {
  if (!(max_abs > 0)) return std::nullopt;  // nothing written, or NaN
  // A step seen again (a GPU result after its row): its larger value.
  bool merged = false;
  for (auto& [s, v] : recent_) {
    if (s == step) {
      v = std::max(v, max_abs);
      max_abs = v;
      merged = true;
    }
  }
  if (!merged) {
    if (!recent_.empty() && step < recent_.back().first) return std::nullopt;  // too old
    recent_.emplace_back(step, max_abs);
  }
  while (!recent_.empty() && recent_.front().first <= step - kRecentSteps) {
    before_recent_ = std::max(before_recent_, recent_.front().second);
    if (!smallest_ || recent_.front().second < smallest_->second) smallest_ = recent_.front();
    recent_.pop_front();
  }
  // The smallest of every step before this one.
  std::optional<std::pair<int64_t, double>> smallest = smallest_;
  for (const auto& [s, v] : recent_) {
    if (s < step && (!smallest || v < smallest->second)) smallest = std::make_pair(s, v);
  }
  if (!smallest || !PassesDivergenceBars(max_abs, smallest->second, before_recent_) ||
      (warned_at_ > 0 && max_abs < kDivergedGrowth * warned_at_)) {
    return std::nullopt;
  }
  warned_at_ = max_abs;
  return Growth{smallest->first, smallest->second, step, max_abs};
}

}  // namespace nanhunt
