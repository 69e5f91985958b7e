// Decides which training step an op belongs to, and refines its phase.
//
// torch.optim wraps each step in a USER_SCOPE record ("Optimizer.step#..."):
// when the process shows one, a step ends with it, and the next begins at
// the next forward pass's first op (one on a tensor that requires grad, as
// for the fallback below). Optimizer records with no forward pass between
// them are one step: several optimizers stepped together (dense and sparse
// parameters, one optimizer per module) and an optimizer per parameter
// stepped inside the backward pass (post-accumulate-grad hooks) count one
// step an iteration, as the program's own loop does. So are a GAN's
// discriminator and generator updates, each after its own forward pass:
// the generator's optimizer, which did not step in the step before, undoes
// the advance its forward pass made (OnOptimizerIdentified).
// The ops between an optimizer record and the next forward pass (zero_grad,
// GradScaler's update, the next batch's preparation) are the step's tail.
// The caller tells a top-level op's start to OnOp too (Monitor::
// OnTopLevelOpStart), so that a step begins before the ops inside the op
// that begins it, which end before it does.
//
// A process that never shows an optimizer record (a C++ LibTorch program,
// a hand-written update) gets a fallback: the first forward op after
// backward ops that runs with grad mode on and takes a tensor that requires
// grad (a parameter: the next forward pass, not a factory op of
// GradScaler's or data preparation) starts a new step. Such an
// advance without an update since the backward pass (no op with grad mode
// off) is tentative: it may be the next micro-batch of gradient
// accumulation. Tentative advances are undone when the iteration turns out
// to go on: at the next advance after an update, at the first optimizer
// record (which also undoes an advance within its own iteration), at an
// update the program or GradScaler skipped. Once an iteration has been seen
// to end that way, the program is known to update after its backward
// passes: a forward pass after one without an update since is the next
// micro-batch, no advance at all. So Python scripts and C++ programs count
// from 0 either way, one step per update; only the first iteration's
// micro-batches have had tentative step numbers.
//
// A process that has not trained yet (no backward op, no optimizer record:
// an evaluation or inference script) counts its forward passes as steps.
// Each top-level op that reads a parameter (one that requires grad) is a
// pair of op and parameter. A forward pass reads each pair once, so a pair
// read again in the same pass began the next one (the model's first layer,
// the next batch), and from then on each call of that pair begins the next
// pass (OnPassStart). Ops that set a model up (moves, casts, initialisers:
// SetsUpParameters in core/op_policy.h) count no pair: .to() to where the
// model is and the .half() after it read each parameter twice. Once the
// process trains, these advances are undone: a validation before the first
// training step stays in step 0, as it was before passes were counted. A
// pass with grad mode on that made inf/NaN keeps its step: an iteration
// given up (below) before the first backward pass (BeginTraining).
//
// A training loop may give up an iteration before its backward pass, on
// a non-finite loss (`if not torch.isfinite(loss): continue`): the next
// batch's forward pass then reads the step's first (op, parameter) pair
// again, with no backward op since the step began. When the step has made
// inf/NaN by then, that read begins the next step (OnTrainingPass), so
// that step numbers keep counting the program's iterations. Two forward
// passes into one loss (two views of a batch, a siamese pair) and a layer
// applied twice in a pass (an RNN cell) read the pair again too: their
// backward pass reaches an autograd node made before the read (its
// sequence number is lower), which undoes the advance (OnBackwardNode).
//
// Ops that run after backward with grad mode off (C++ optimizers, gradient
// clipping, GradScaler's unscale, hand-written updates) are the update, not
// a forward pass: they get the optimizer phase. Once an optimizer record has
// ended the update, an op with grad mode off that takes a parameter is a
// forward pass again: torch.compile runs its graphs with grad mode off, and
// an evaluation runs under no_grad. Not thread-safe: the caller serialises.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "core/phase.h"

namespace nanhunt {

class StepTracker {
 public:
  int64_t step() const { return step_; }

  // A top-level op ran in `phase` with grad mode `grad_enabled`;
  // `takes_grad_input`: one of its inputs requires grad. Returns true when
  // it began a new step.
  bool OnOp(Phase phase, bool grad_enabled, bool takes_grad_input);

  // The phase to record for an op the caller saw as `phase`. A nested op
  // passes its top-level op's `takes_grad_input`: it ends before that op
  // does, so before OnOp has seen it.
  Phase Refine(Phase phase, bool grad_enabled, bool takes_grad_input) const;
  // An optimizer step record began. Returns true when the step number
  // changed (the fallback's advance was undone).
  bool OnOptimizerStepBegin();
  // An optimizer step record ended: the step is over, and the next begins
  // at the next forward pass (OnOp returns true there), unless another
  // optimizer record comes first, which belongs to this step. With
  // `begin_next_now` the next step begins here instead: sample mode, whose
  // unsampled ops cannot show where the next forward pass begins, counts a
  // step an optimizer record, unless the next is another optimizer's of
  // the same iteration (OnOptimizerIdentified).
  void OnOptimizerStepEnd(bool begin_next_now = false);
  // Optimizer `optimizer` steps (an identity: that of the first parameter
  // it updates), inside its record, or GradScaler skipped its step. When the step began right after the last step's update (at the
  // next forward pass; in sample mode, which cannot see one, at the
  // record's end: OnOptimizerStepEnd with `begin_next_now`), and this
  // optimizer did not step in that step, it is another optimizer of the
  // same iteration, and the advance is undone (TakeRenumberings): a GAN's
  // generator after its discriminator, each after its own forward pass;
  // in sample mode also dense and sparse parameters, one optimizer per
  // parameter stepped in backward, Muon beside AdamW. One step an
  // iteration, as the program's loop counts them, in every mode. With
  // `replaces_another` (at its first step it updated parameters another
  // optimizer updated before, the new optimizer of a fine-tuning's next
  // phase; or every optimizer that stepped before it was gone, the next
  // model of a sweep) it is the next iteration's, as the same optimizer
  // would be. Returns true when it undid.
  bool OnOptimizerIdentified(uint64_t optimizer, bool replaces_another = false);
  // OnOp's first part: when an optimizer record ended the step and this
  // op begins a forward pass, it begins the next step (returns true).
  bool BeginStepAfterUpdate(Phase phase, bool grad_enabled, bool takes_grad_input);
  // A top-level forward op may begin a step: an optimizer record ended one,
  // or, in a program without them, a backward pass came since the last
  // began, or the process has not trained yet (a forward pass may begin).
  bool step_may_begin() const {
    return step_ended_ || (saw_backward_ && !seen_optimizer_) || !trained_;
  }
  // Before the process has trained: a top-level forward op `op` that reads
  // the parameter whose memory is `parameter` (see the header) began a
  // forward pass. Returns true when that began a new step. With
  // `grad_enabled`, `nonfinite_so_far` (the open step, the pass before
  // this op, has made inf/NaN), `next_node` and `thread` as for
  // OnTrainingPass: a pass with grad mode on that made inf/NaN and ended
  // here may be an iteration the program gave up (BeginTraining).
  bool OnPassStart(absl::string_view op, const void* parameter, bool grad_enabled = false,
                   bool nonfinite_so_far = false, int64_t next_node = -1, uint64_t thread = 0);
  // Whether OnPassStart of `op` on `parameter` would begin a pass.
  bool BeginsPass(absl::string_view op, const void* parameter) const;
  // Once the process trains: a top-level forward op `op`, with grad mode
  // on, read the parameter whose memory is `parameter` (its first input
  // that requires grad); `nonfinite_so_far`: the open step has made
  // inf/NaN; `next_node` and `thread`: the sequence number the next
  // autograd node of this thread will get (at::sequence_number::peek) and
  // the thread's id. Returns true when that began a new step: the step's
  // first pair read again before any backward op of the step, after inf/NaN
  // (the program gave the iteration up; see the header).
  bool OnTrainingPass(absl::string_view op, const void* parameter, bool nonfinite_so_far,
                      int64_t next_node, uint64_t thread);
  // Whether OnTrainingPass may begin a step once the open step makes
  // inf/NaN: the process trains, the step's first pair is known, and no
  // backward op or optimizer record came since it began.
  bool may_give_up_iteration() const {
    // Not before the program has shown how its iterations end (an update or
    // a skip): its first ones may be micro-batches, with tentative numbers.
    return trained_ && anchor_step_ == step_ && backward_step_ != step_ && !in_optimizer_ &&
           !step_ended_ && (seen_optimizer_ || seen_update_) && tentative_ == 0;
  }
  // The open step's first pair is not known yet (OnTrainingPass learns it
  // at the step's first forward op with grad mode on that reads one).
  bool wants_anchor() const {
    return trained_ && anchor_step_ != step_ && !post_backward_ && !in_optimizer_;
  }
  // Whether OnTrainingPass of `op` on `parameter` would begin a step, had
  // the open step made inf/NaN; before the process trains, whether
  // OnPassStart would end a pass, which may turn out an iteration given up.
  bool ReadsAnchorAgain(absl::string_view op, const void* parameter) const {
    if (!trained_) return BeginsPass(op, parameter);
    return may_give_up_iteration() && step_anchor_ && step_anchor_->second == parameter &&
           step_anchor_->first == op;
  }
  // Steps OnTrainingPass began and no backward node has undone yet.
  bool has_given_up_iterations() const { return !given_up_.empty(); }
  // A backward node ran, made by forward op number `seq` of thread
  // `forward_thread` (RecordFunction's seqNr and forwardThreadId): the
  // advances of OnTrainingPass made after that op were passes of the same
  // iteration, undone (TakeRenumberings).
  void OnBackwardNode(int64_t seq, uint64_t forward_thread);
  // The steps the program gave up (OnTrainingPass) that nothing can undo
  // any more: another iteration began since (or, with `all`, the process
  // ends). Reading clears them.
  std::vector<int64_t> TakeGivenUpIterations(bool all = false);

  // Whether a backward op or an optimizer record was seen.
  bool trained() const { return trained_; }
  // The process has not trained, and counts its forward passes as steps.
  bool counts_passes() const { return !trained_ && pass_anchor_.has_value(); }
  // The step the next forward pass belongs to.
  int64_t next_step() const { return step_ended_ ? step_ + 1 : step_; }
  // An optimizer record ended the step, and no forward pass began since.
  bool step_ended() const { return step_ended_; }

  // GradScaler updated its scale (`_amp_update_scale_`), which ends an
  // iteration whether or not the optimizer ran: a skipped step has no
  // optimizer record. Returns the step the update belongs to, and whether
  // this call advanced the step (it did when the optimizer was skipped).
  struct ScalerStep {
    int64_t step;
    bool advanced;
  };
  ScalerStep OnScalerUpdate();

  // Whether a top-level op would begin the next iteration while the last
  // one's backward pass had no optimizer step (nor scaler update) after it:
  // a forward op with grad on a parameter, after backward ops. Between
  // micro-batches of gradient accumulation, or after an iteration whose
  // program skipped its update (its own loss scaler found non-finite
  // gradients: fairseq's and Megatron's FP16 optimizers, DeepSpeed's).
  bool AtIterationWithoutUpdate(Phase phase, bool grad_enabled, bool takes_grad_input) const;
  // The program skipped the last iteration's update (the caller saw its
  // non-finite gradients freed or overwritten): that iteration is a step.
  // Returns its number.
  int64_t OnUpdateSkipped();
  // At such an op, non-finite gradients of the last backward pass are still
  // held: without an update since (ops with grad mode off), they are kept
  // for the next micro-batch of gradient accumulation, and the fallback
  // does not begin a step.
  void OnGradientsKept();
  // The program's backward passes return their gradients rather than add
  // them into .grad (torch.func.grad, a JAX-style loop): no micro-batch
  // keeps them, and each pass is an iteration of its own, even one whose
  // non-finite gradients a hand-written update wrote into the weights.
  void OnGradientsReturned() { gradients_returned_ = true; }

  // A program without optimizer records (C++) ran its update (ops with grad
  // mode off) after its last backward pass: the iteration is over, though
  // no op has begun the next one yet.
  bool UpdatedAfterLastBackward() const {
    return !seen_optimizer_ && saw_backward_ && updated_since_backward_;
  }

  // Steps `first` through `last` were tentative numbers, undone: they
  // belong to step `to`. What the calls since the last read undid, in the
  // order to apply them (each to the numbers the one before left); reading
  // clears it. The caller renumbers what it recorded under them.
  struct Renumbering {
    int64_t first, last, to;
  };
  std::vector<Renumbering> TakeRenumberings();

 private:
  // OnOp's part after BeginStepAfterUpdate.
  bool FollowOp(Phase phase, bool grad_enabled, bool takes_grad_input);
  // Undoes the last `count` advances; returns the step they return to.
  int64_t Undo(int64_t count);
  // Undo's renumbering, which leaves the count of tentative advances.
  void UndoSteps(int64_t count);
  // A step began that OnTrainingPass did not begin: the iterations given
  // up before it are confirmed.
  void ConfirmGivenUp();
  // Undoes the tentative advances; returns the step they return to.
  int64_t UndoTentative();
  // The process trains: it counts no more forward passes, and the passes
  // it counted join the step of the pass after them, except those that
  // made inf/NaN with grad mode on: iterations given up, each a step, as
  // OnTrainingPass would have made them, which OnBackwardNode undoes when
  // the backward pass reaches them (T5's encoder, a first view). Returns
  // true when that renumbered steps.
  bool BeginTraining();

  int64_t step_ = 0;
  bool seen_optimizer_ = false;
  bool saw_backward_ = false;       // since the last fallback advance
  bool fallback_advanced_ = false;  // the last advance came from the fallback
  bool post_backward_ = false;      // backward ran; no forward pass since
  bool update_ended_ = false;       // an optimizer record ended since backward
  bool updated_since_backward_ = false;  // an op with grad mode off since
  bool gradients_returned_ = false;      // OnGradientsReturned
  int64_t tentative_ = 0;  // fallback advances without an update before them
  bool seen_update_ = false;  // an iteration ended with an update or a skip
  std::vector<Renumbering> renumberings_;  // not taken yet
  bool in_optimizer_ = false;  // between an optimizer record's begin and end
  bool optimizer_since_update_ = false;  // an optimizer step ended since the
                                         // last scaler update
  bool step_ended_ = false;  // by an optimizer record; no forward op since
  bool trained_ = false;     // a backward op or an optimizer record was seen
  using OpOnParameter = std::pair<std::string, const void*>;
  // Until the process trains: the pass each pair was last read in, the pair
  // that begins a pass, and the last pair read.
  absl::flat_hash_map<OpOnParameter, int64_t> pass_of_pair_;
  std::optional<OpOnParameter> pass_anchor_, last_pair_;
  int64_t passes_ = 0;  // advances made counting forward passes
  bool pass_with_grad_ = false;  // the open pass ran an op with grad mode on
  // Passes that made inf/NaN with grad mode on: the pass, and the thread
  // and next autograd node number where the pass after it began.
  struct PassEnd {
    int64_t pass;
    int64_t next_node;
    uint64_t thread;
  };
  std::vector<PassEnd> nonfinite_passes_;
  // Once training: the step whose first pair step_anchor_ is, the step of
  // the last backward op, and the iterations given up (OnTrainingPass): the
  // step each was, and the thread and first autograd node number of the
  // pass that began after it.
  std::optional<OpOnParameter> step_anchor_;
  int64_t anchor_step_ = -1, backward_step_ = -1;
  struct GivenUp {
    int64_t step;
    int64_t next_node;
    uint64_t thread;
  };
  std::vector<GivenUp> given_up_;
  std::vector<int64_t> given_up_confirmed_;
  // OnOptimizerIdentified: the optimizers identified in step
  // optimizers_step_, and the last step that began right after an update
  // (an optimizer record's end, or the first forward op after it).
  std::vector<uint64_t> optimizers_in_step_;
  int64_t optimizers_step_ = -1;
  int64_t began_after_update_ = -1;
};

}  // namespace nanhunt
