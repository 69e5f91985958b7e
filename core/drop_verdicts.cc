#include "core/drop_verdicts.h"

#include <cstddef>

namespace nanhunt {

void DropVerdicts::OpJudged(int64_t generation) {
  auto it = outstanding_.find(generation);
  if (it != outstanding_.end() && --it->second <= 0) outstanding_.erase(it);
}

bool DropVerdicts::UpdateEnded(int64_t step, int64_t nonfinite_ops) {
  const int64_t generation = generation_++;
  if (outstanding_.empty()) return false;
  // A later record of the same step (two optimizers, one a parameter):
  // the verdict waits for its ops too.
  if (!waiting_.empty() && waiting_.back().step == step) {
    waiting_.back().generation = generation;
    return true;
  }
  waiting_.push_back(Waiting{step, generation, nonfinite_ops});
  return true;
}

void DropVerdicts::CountNonFinite(int64_t step) {
  for (Waiting& w : waiting_) {
    if (w.step == step) ++w.nonfinite_ops;
  }
}

bool DropVerdicts::AnyReady(int64_t current_step) const {
  return !waiting_.empty() && IsReady(waiting_.front(), current_step);
}

std::vector<DropVerdicts::Waiting> DropVerdicts::TakeReady(int64_t current_step) {
  size_t n = 0;
  while (n < waiting_.size() && IsReady(waiting_[n], current_step)) ++n;
  std::vector<Waiting> ready(waiting_.begin(), waiting_.begin() + static_cast<std::ptrdiff_t>(n));
  waiting_.erase(waiting_.begin(), waiting_.begin() + static_cast<std::ptrdiff_t>(n));
  return ready;
}

bool DropVerdicts::IsReady(const Waiting& w, int64_t current_step) const {
  return w.step < current_step &&
         (outstanding_.empty() || outstanding_.begin()->first > w.generation);
}

}  // namespace nanhunt
