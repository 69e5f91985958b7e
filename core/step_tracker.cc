#include "core/step_tracker.h"

namespace nanhunt {

bool StepTracker::OnOp(Phase phase, bool grad_enabled, bool takes_grad_input) {
  if (phase == Phase::kBackward) {
    saw_backward_ = true;
    post_backward_ = true;
    update_ended_ = false;
    fallback_advanced_ = false;
    updated_since_backward_ = false;
    return false;
  }
  if (phase == Phase::kForward && !grad_enabled && post_backward_) {
    updated_since_backward_ = true;  // the update, or a check of the gradients
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
    if (updated_since_backward_) {
      // An update ended the iteration: the advances since the last one
      // were micro-batches of it.
      step_ -= tentative_;
      tentative_ = 0;
    } else {
      ++tentative_;
    }
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
  in_optimizer_ = true;
  if (!first) return false;
  // The micro-batches of gradient accumulation before it, and the ops
  // between backward and this optimizer step (gradient clipping,
  // unscaling), belong to the step the optimizer is about to finish.
  int64_t undo = tentative_;
  if (fallback_advanced_ && undo == 0) undo = 1;
  fallback_advanced_ = false;
  tentative_ = 0;
  step_ -= undo;
  return undo > 0;
}

int64_t StepTracker::UndoTentative() {
  step_ -= tentative_;
  tentative_ = 0;
  return step_;
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
  UndoTentative();
  ++step_;
  return {step_ - 1, true};
}

bool StepTracker::AtIterationWithoutUpdate(Phase phase, bool grad_enabled,
                                           bool takes_grad_input) const {
  // Inside an optimizer step, a closure's passes (LBFGS) are its own.
  return phase == Phase::kForward && grad_enabled && takes_grad_input && saw_backward_ &&
         !in_optimizer_;
}

int64_t StepTracker::OnUpdateSkipped() {
  // Confirmed, unlike a fallback advance: an optimizer record that follows
  // belongs to the new step.
  saw_backward_ = false;
  post_backward_ = false;
  fallback_advanced_ = false;
  const int64_t skipped = UndoTentative();
  ++step_;
  return skipped;
}

void StepTracker::OnGradientsKept() {
  // The next micro-batch: no fallback advance. After an update (a C++
  // optimizer that wrote them into the weights) it is the next step.
  if (!updated_since_backward_) saw_backward_ = false;
}

bool StepTracker::OnOptimizerStepEnd() {
  optimizer_since_update_ = true;
  in_optimizer_ = false;
  update_ended_ = true;
  seen_optimizer_ = true;
  tentative_ = 0;
  saw_backward_ = false;
  fallback_advanced_ = false;
  ++step_;
  return true;
}

}  // namespace nanhunt
