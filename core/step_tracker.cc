#include "core/step_tracker.h"

namespace nanhunt {

bool StepTracker::OnOp(Phase phase, bool grad_enabled) {
  if (phase == Phase::kBackward) {
    saw_backward_ = true;
    post_backward_ = true;
    fallback_advanced_ = false;
    return false;
  }
  if (phase != Phase::kForward || !grad_enabled) return false;
  post_backward_ = false;
  if (saw_backward_ && !seen_optimizer_) {
    saw_backward_ = false;
    fallback_advanced_ = true;
    ++step_;
    return true;
  }
  return false;
}

Phase StepTracker::Refine(Phase phase, bool grad_enabled) const {
  if (phase == Phase::kForward && !grad_enabled && post_backward_) {
    return Phase::kOptimizer;
  }
  return phase;
}

bool StepTracker::OnOptimizerStepBegin() {
  const bool first = !seen_optimizer_;
  seen_optimizer_ = true;
  if (first && fallback_advanced_) {
    // The ops between backward and this optimizer step (gradient clipping,
    // unscaling) belong to the step the optimizer is about to finish.
    fallback_advanced_ = false;
    --step_;
    return true;
  }
  return false;
}

bool StepTracker::OnOptimizerStepEnd() {
  seen_optimizer_ = true;
  saw_backward_ = false;
  fallback_advanced_ = false;
  ++step_;
  return true;
}

}  // namespace nanhunt
