#include "viewer/scaler_skips.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace nanhunt {

std::string ScalerSkips::Who() const {
  return grad_scaler ? "GradScaler" : "the program's loss scaler";
}

ScalerSkips SkipsOf(const RunSummary& s) {
  ScalerSkips k;
  if (!s.loss_scale.empty()) {
    k.grad_scaler = true;
    k.steps = s.skipped_steps;
    k.first_step = s.loss_scale.front().step;
    k.decided = static_cast<int64_t>(s.loss_scale.size());
  } else if (!s.program_skipped_steps.empty()) {
    // Each step ended in an update or in a skip: it decided on all of them.
    k.steps = s.program_skipped_steps;
    k.decided = s.steps;
  }
  return k;
}

double SkippedShare(const ScalerSkips& k) {
  if (k.decided == 0) return 0;
  return static_cast<double>(k.steps.size()) / static_cast<double>(k.decided);
}

int64_t StepsTheScalerHandled(const RunSummary& s, const ScalerSkips& k) {
  if (k.decided == 0 || k.steps.empty()) return -1;
  for (int64_t step : s.nonfinite_steps_kept) {
    // A run stopped after a backward pass, before the scaler decided.
    if (std::binary_search(s.unfinished_steps.begin(), s.unfinished_steps.end(), step)) {
      continue;
    }
    if (!std::binary_search(k.steps.begin(), k.steps.end(), step)) return -1;
  }
  int64_t settling = 0;
  while (settling < static_cast<int64_t>(k.steps.size()) &&
         k.steps[settling] == k.first_step + settling) {
    ++settling;
  }
  const int64_t after = k.decided - settling;
  const int64_t skipped_after = static_cast<int64_t>(k.steps.size()) - settling;
  if (after <= 0 ||
      static_cast<double>(skipped_after) >= kSkippedStepsShare * static_cast<double>(after)) {
    return -1;
  }
  return settling;
}

void AddScalerEvidence(const RunSummary& s, const ScalerSkips& k, Diagnosis& d) {
  if (k.decided == 0) return;
  const std::string share = absl::StrFormat("%.0f%%", 100 * SkippedShare(k));
  if (k.grad_scaler) {
    d.evidence.push_back(absl::StrFormat(
        "GradScaler: scale %g at step %d -> %g at step %d; %d of %d steps "
        "skipped (%s)",
        s.loss_scale.front().scale, s.loss_scale.front().step,
        s.loss_scale.back().scale, s.loss_scale.back().step, k.steps.size(),
        k.decided, share));
    return;
  }
  d.evidence.push_back(absl::StrCat(
      "the program skipped ", k.steps.size(), " of ", k.decided, " updates (", share,
      "; steps ", StepRanges(k.steps),
      "): each time, non-finite gradients were thrown away and the next batch "
      "began without an optimizer step, as a dynamic loss scaler does (fairseq's "
      "and Megatron's FP16 optimizers, DeepSpeed's fp16 engine)"));
}

}  // namespace nanhunt
