#include "core/step_tracker.h"

namespace nanhunt {

bool StepTracker::OnOp(Phase phase, bool grad_enabled, bool takes_grad_input) {
  if (phase == Phase::kBackward) {
    saw_backward_ = true;
    post_backward_ = true;
    update_ended_ = false;
    fallback_advanced_ = false;
    return false;
  }
  if (phase == Phase::kForward && !grad_enabled && takes_grad_input && update_ended_) {
    post_backward_ = false;  // a forward pass without grad (see the header)
    return false;
  }
  if (phase != Phase::kForward || !grad_enabled || !takes_grad_input) {
    return false;
  }
  post_backward_ = false;
  if (saw_backward_ && !seen_optimizer_) {
    saw_backward_ = false;
    fallback_advanced_ = true;
    ++step_;
    return true;
  }
  return false;
}

Phase StepTracker::Refine(Phase phase, bool grad_enabled, bool takes_grad_input) const {
  // As OnOp decides for a top-level op: parameters fed to ops without grad
  // after the optimizer step are a forward pass (validation), not the update.
  const bool forward_without_grad = takes_grad_input && update_ended_;
  if (phase == Phase::kForward && !grad_enabled && post_backward_ && !forward_without_grad) {
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

StepTracker::ScalerStep StepTracker::OnScalerUpdate() {
  fallback_advanced_ = false;
  if (optimizer_since_update_) {
    optimizer_since_update_ = false;
    return {step_ - 1, false};
  }
  // The optimizer was skipped (non-finite gradients): the update ends the
  // iteration.
  saw_backward_ = false;
  post_backward_ = false;
  ++step_;
  return {step_ - 1, true};
}

bool StepTracker::OnOptimizerStepEnd() {
  optimizer_since_update_ = true;
  update_ended_ = true;
  seen_optimizer_ = true;
  saw_backward_ = false;
  fallback_advanced_ = false;
  ++step_;
  return true;
}

}  // namespace nanhunt
