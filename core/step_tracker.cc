#include "core/step_tracker.h"

#include <algorithm>

#include "core/op_policy.h"

namespace nanhunt {

bool StepTracker::OnOp(Phase phase, bool grad_enabled, bool takes_grad_input) {
  const bool began = BeginStepAfterUpdate(phase, grad_enabled, takes_grad_input);
  return FollowOp(phase, grad_enabled, takes_grad_input) || began;
}

bool StepTracker::BeginStepAfterUpdate(Phase phase, bool grad_enabled,
                                       bool takes_grad_input) {
  // As the fallback tells a forward pass: an op on a tensor that requires
  // grad, with grad mode on, or reading parameters without (an evaluation,
  // torch.compile's graph). Backward ops (an optimizer stepped in a
  // gradient hook), the update's own ops and those on gradients or data
  // (GradScaler unscaling for the next optimizer, the next batch's
  // preparation) are still the step that ended.
  if (!step_ended_ || phase != Phase::kForward || !takes_grad_input ||
      !(grad_enabled || update_ended_)) {
    return false;
  }
  step_ended_ = false;
  ConfirmGivenUp();
  ++step_;
  began_after_update_ = step_;
  return true;
}

bool StepTracker::OnTrainingPass(absl::string_view op, const void* parameter,
                                 bool nonfinite_so_far, int64_t next_node, uint64_t thread) {
  // More iterations given up in a row than any RNN has time steps: the
  // oldest are confirmed, not kept for a backward pass to undo.
  constexpr size_t kMaxGivenUp = 4096;
  if (!trained_ || SetsUpParameters(op)) return false;
  if (anchor_step_ != step_) {
    if (!wants_anchor()) return false;
    // Without a parameter's memory (sample mode), a step has no first pair.
    if (parameter == nullptr) {
      step_anchor_.reset();
    } else {
      step_anchor_.emplace(std::string(op), parameter);
    }
    anchor_step_ = step_;
    return false;
  }
  if (!nonfinite_so_far || !ReadsAnchorAgain(op, parameter)) return false;
  if (given_up_.size() >= kMaxGivenUp) {
    given_up_confirmed_.push_back(given_up_.front().step);
    given_up_.erase(given_up_.begin());
  }
  given_up_.push_back(GivenUp{step_, next_node, thread});
  ++step_;
  anchor_step_ = step_;
  return true;
}

void StepTracker::OnBackwardNode(int64_t seq, uint64_t forward_thread) {
  // AccumulateGrad's number is the largest uint64 (-1 here): it was made
  // by no forward op.
  if (seq >= 0) {
    int64_t undo = 0;
    // Nodes run from the last made to the first: the pass that began at a
    // given-up advance reached a node older than it, so they were one.
    while (!given_up_.empty()) {
      const GivenUp& g = given_up_.back();
      if (g.thread != forward_thread || seq >= g.next_node || g.step + 1 + undo != step_) break;
      ++undo;
      given_up_.pop_back();
    }
    UndoSteps(undo);
  }
  backward_step_ = step_;
}

void StepTracker::ConfirmGivenUp() {
  for (const GivenUp& g : given_up_) given_up_confirmed_.push_back(g.step);
  given_up_.clear();
}

std::vector<int64_t> StepTracker::TakeGivenUpIterations(bool all) {
  if (all) ConfirmGivenUp();
  std::vector<int64_t> steps;
  steps.swap(given_up_confirmed_);
  return steps;
}

bool StepTracker::OnPassStart(absl::string_view op, const void* parameter, bool grad_enabled,
                              bool nonfinite_so_far, int64_t next_node, uint64_t thread) {
  // Pairs remembered: more than a model has, should a program never repeat.
  constexpr size_t kMaxPairs = 1 << 16;
  // Passes given up before the first training step: more than any program
  // tries before it trains.
  constexpr size_t kMaxNonFinitePasses = 4096;
  if (trained_ || parameter == nullptr || SetsUpParameters(op)) return false;
  const bool pass_with_grad = pass_with_grad_;
  pass_with_grad_ |= grad_enabled;
  OpOnParameter pair(std::string(op), parameter);
  // The same pair twice in a row is one use (one projection of both q and
  // k: x @ w, then y @ w).
  if (last_pair_ == pair) return false;
  last_pair_ = pair;
  if (pass_anchor_ != pair) {
    auto it = pass_of_pair_.find(pair);
    if (it == pass_of_pair_.end()) {
      if (pass_of_pair_.size() < kMaxPairs) pass_of_pair_.emplace(std::move(pair), passes_);
      return false;
    }
    if (it->second != passes_) {
      it->second = passes_;
      return false;
    }
    // Read twice in this pass: the next began, here.
    it->second = passes_ + 1;
    pass_anchor_ = std::move(pair);
  }
  if (pass_with_grad && nonfinite_so_far && nonfinite_passes_.size() < kMaxNonFinitePasses) {
    nonfinite_passes_.push_back(PassEnd{passes_, next_node, thread});
  }
  pass_with_grad_ = grad_enabled;  // this op is the next pass's
  ++passes_;
  ++step_;
  return true;
}

bool StepTracker::BeginsPass(absl::string_view op, const void* parameter) const {
  if (trained_ || parameter == nullptr || SetsUpParameters(op)) return false;
  const OpOnParameter pair(std::string(op), parameter);
  if (last_pair_ == pair) return false;
  if (pass_anchor_ == pair) return true;
  const auto it = pass_of_pair_.find(pair);
  return it != pass_of_pair_.end() && it->second == passes_;
}

bool StepTracker::BeginTraining() {
  if (trained_) return false;
  trained_ = true;
  pass_anchor_.reset();
  last_pair_.reset();
  pass_of_pair_ = {};
  const int64_t passes = passes_;
  passes_ = 0;
  std::vector<PassEnd> given_up;
  given_up.swap(nonfinite_passes_);
  // Step j is made of the passes after the j-th pass given up, through the
  // (j+1)-th (or the last pass): each pass's new number is how many passes
  // given up came before it, never more than its own, so each range below
  // moves only passes numbered above j, and in order.
  bool renumbered = false;
  int64_t first_pass = 0;
  for (size_t j = 0; j <= given_up.size(); ++j) {
    const int64_t step = static_cast<int64_t>(j);
    const int64_t last_pass = j < given_up.size() ? given_up[j].pass : passes;
    if (const int64_t first = std::max(first_pass, step + 1); first <= last_pass) {
      renumberings_.push_back(Renumbering{first, last_pass, step});
      renumbered = true;
    }
    if (j < given_up.size()) {
      given_up_.push_back(GivenUp{step, given_up[j].next_node, given_up[j].thread});
    }
    first_pass = last_pass + 1;
  }
  step_ -= passes - static_cast<int64_t>(given_up.size());
  return renumbered;
}

bool StepTracker::FollowOp(Phase phase, bool grad_enabled, bool takes_grad_input) {
  if (phase == Phase::kBackward) {
    // The first backward op: the forward passes counted so far were the
    // first iteration's (T5's shared embedding read twice), evaluations
    // before training, or iterations given up.
    BeginTraining();
    saw_backward_ = true;
    post_backward_ = true;
    backward_step_ = step_;
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
    if (!updated_since_backward_ && seen_update_) {
      // The program ends its iterations with an update, and this backward
      // pass had none: the next micro-batch of gradient accumulation.
      return false;
    }
    fallback_advanced_ = true;
    if (updated_since_backward_) {
      // An update ended the iteration: the advances since the last one
      // were micro-batches of it.
      seen_update_ = true;
      UndoTentative();
    } else {
      ++tentative_;
    }
    ConfirmGivenUp();
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
  // Forward passes counted before it (an update with no backward pass seen:
  // gradients set by hand) were its iteration's.
  const bool renumbered = BeginTraining();
  if (!first) return false;
  // The micro-batches of gradient accumulation before it, and the ops
  // between backward and this optimizer step (gradient clipping,
  // unscaling), belong to the step the optimizer is about to finish.
  int64_t undo = tentative_;
  if (fallback_advanced_ && undo == 0) undo = 1;
  fallback_advanced_ = false;
  Undo(undo);
  return undo > 0 || renumbered;
}

int64_t StepTracker::Undo(int64_t count) {
  tentative_ = 0;
  UndoSteps(count);
  return step_;
}

void StepTracker::UndoSteps(int64_t count) {
  if (count <= 0) return;
  renumberings_.push_back(Renumbering{step_ - count + 1, step_, step_ - count});
  step_ -= count;
  // What was learnt of the undone steps is the step's they joined: its
  // backward pass ran, and the pair that began them began no step.
  backward_step_ = std::min(backward_step_, step_);
  if (anchor_step_ > step_) anchor_step_ = -1;
}

int64_t StepTracker::UndoTentative() { return Undo(tentative_); }

std::vector<StepTracker::Renumbering> StepTracker::TakeRenumberings() {
  std::vector<Renumbering> r;
  r.swap(renumberings_);
  return r;
}

StepTracker::ScalerStep StepTracker::OnScalerUpdate() {
  BeginTraining();
  ConfirmGivenUp();  // the iteration after them is over
  fallback_advanced_ = false;
  if (optimizer_since_update_) {
    optimizer_since_update_ = false;
    return {step_ended_ ? step_ : step_ - 1, false};
  }
  // The optimizer was skipped (non-finite gradients): the update ends the
  // iteration, after the step an optimizer record ended, if no forward pass
  // began one since.
  if (step_ended_) {
    step_ended_ = false;
    ++step_;
  }
  seen_update_ = true;
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
  seen_update_ = true;
  saw_backward_ = false;
  post_backward_ = false;
  fallback_advanced_ = false;
  ConfirmGivenUp();
  const int64_t skipped = UndoTentative();
  ++step_;
  return skipped;
}

void StepTracker::OnGradientsKept() {
  // The next micro-batch: no fallback advance. After an update (a C++
  // optimizer that wrote them into the weights) it is the next step.
  if (!updated_since_backward_ && !gradients_returned_) saw_backward_ = false;
}

void StepTracker::OnOptimizerStepEnd(bool begin_next_now) {
  optimizer_since_update_ = true;
  in_optimizer_ = false;
  update_ended_ = true;
  seen_optimizer_ = true;
  tentative_ = 0;
  saw_backward_ = false;
  fallback_advanced_ = false;
  if (begin_next_now) {
    step_ended_ = false;
    ConfirmGivenUp();
    ++step_;
    began_after_update_ = step_;
  } else {
    step_ended_ = true;
  }
}

bool StepTracker::OnOptimizerIdentified(uint64_t optimizer, bool replaces_another) {
  // Optimizers an iteration: more than any program steps.
  constexpr size_t kMaxOptimizers = 1 << 12;
  const auto stepped = [&] {
    return std::find(optimizers_in_step_.begin(), optimizers_in_step_.end(), optimizer) !=
           optimizers_in_step_.end();
  };
  bool undone = false;
  if (optimizers_step_ != step_) {
    // The first optimizer of this step: does the step go on the last one's
    // iteration? Only when it began right after that step's update, and
    // this optimizer did not step there. One that replaces the others (a
    // new optimizer for a fine-tuning's next phase, the next model of a
    // sweep) begins a step of its own, as the same one would.
    const bool right_after = began_after_update_ == step_ && optimizers_step_ == step_ - 1;
    if (right_after && !stepped() && !replaces_another) {
      UndoSteps(1);
      undone = true;
    } else {
      optimizers_in_step_.clear();
      optimizers_step_ = step_;
    }
  }
  if (!stepped() && optimizers_in_step_.size() < kMaxOptimizers) {
    optimizers_in_step_.push_back(optimizer);
  }
  return undone;
}

}  // namespace nanhunt
