// The torch-free heart of nanhunt: given the checked outputs of each op, it
// keeps per-step statistics, decides what is a finding (origin, input,
// propagated, near_max, underflow), tracks steps, and hands rows to the
// trace writer.
//
// The torch plugin (interpose/torch) gathers facts about tensors and calls
// OnOp; everything decided here is unit-tested without torch.
//
// Thread-safe: ops arrive from every thread (autograd workers, DataLoader
// pin-memory threads); one mutex serialises the bookkeeping, which is a few
// hash lookups per op.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/check_limits.h"
#include "core/config.h"
#include "core/divergence_watch.h"
#include "core/drop_verdicts.h"
#include "core/forward_line_fills.h"
#include "core/phase.h"
#include "core/step_tracker.h"
#include "core/trace_rows.h"
#include "core/wanted_ops.h"

namespace nanhunt {

class TraceWriter;

// A checked floating-point tensor (output or input of an op).
struct TensorFacts {
  Format format = Format::kF32;
  std::string shape;  // "[8, 64, 64]"
  CheckCounts counts;
};

// An input of an op whose outputs were not finite.
struct InputFacts {
  int arg_index = 0;
  std::string dtype;  // torch's name, also for inputs the check skips
  std::string shape;
  bool checked = false;  // a floating tensor in host memory, or a scalar
  CheckCounts counts;    // when checked
  double max_abs = 0;    // when checked
  // The input was already known non-finite from an earlier op's output.
  bool produced_by_op = false;
  // Overwritten by the op, and its values before were not checked (an
  // in-place op inside another op): the enclosing op must judge.
  bool unknown_before = false;
  const void* storage = nullptr;  // its memory, when known
  // Known at the op's start to hold what a collective wrote (ops judged
  // after the fact, when the memory may have been reused since).
  bool from_collective = false;
  // Its non-finite values are ±inf a mask put there on purpose (see
  // PlacesScalar in core/op_policy.h), or NaN the program placed as a
  // marker (Monitor::MarkNanMarkers), not a problem by themselves.
  bool deliberate = false;
  // Its non-finite values are a backward formula's own, made of a zero it
  // divided by and masked before the formula returns (StorageState::
  // kOwnMasked): sinc's 0 / 0 before its torch.where.
  bool own_masked = false;
  // A Python number torch wrapped into a tensor (the inf of `x != inf`):
  // a literal of the program, which no op computed.
  bool python_number = false;
  // On a GPU, not read: what a copy that keeps the dtype copies (copy_'s
  // source, cat's inputs; OpEvent::copies_unchanged). The only source of a
  // copy whose output held inf/NaN is given the output's counts: it must
  // have held them.
  bool copy_source = false;
  // What it is to the model, when it brought inf/NaN no op made:
  // "parameter 2.weight", "buffer pos_table", "Adam state exp_avg_sq of
  // 2.weight" (a checkpoint that diverged). Empty when not known.
  std::string model_tensor;
  // On a GPU, not read: no check of the op that wrote it found anything
  // (or none was made), so it is taken as finite.
  bool assumed_finite = false;
  // An argument shown by what its values say, where they explain a loss's
  // inf or NaN: CTC's lengths ("input_lengths=[50, 48]"), a target beside
  // its ignore_index ("target Long[8]: 8 of 8 are ignore_index (-100)").
  // Empty for every other argument.
  std::string values;
  // On a GPU, not read by this op's check: what is known of its values is
  // what the check of the op that wrote it found (the flags above), and
  // no max |x| (described so, not as max|x|=0).
  bool on_device = false;
};

// What the registry of storages (kept by the plugin) knows of a tensor's
// memory after the last op that wrote it was judged. kMaskConstants:
// finite, with mask constants among its values (IsMaskConstant in
// core/op_policy.h: torch.finfo(dtype).min), large on purpose. kOwnMasked:
// inf/NaN of a backward formula's division by 0, which the formula masks
// before it returns (Verdict::kOwnMasked). kDeliberate: a mask's ±inf;
// kNanMarkers: NaN the program placed as markers (Monitor::MarkNanMarkers),
// told apart so that a GPU op, whose inputs are not read, knows them.
enum class StorageState {
  kFinite, kNonFinite, kDeliberate, kMaskConstants, kOwnMasked, kNanMarkers
};

// Memory in `state` holds masks: mask constants or deliberate ±inf.
inline bool HoldsMasks(StorageState state) {
  return state == StorageState::kMaskConstants || state == StorageState::kDeliberate;
}

// What the monitor may ask about an op whose outputs were not finite (or
// came near the limit). Called at most once per method per op, only when
// needed, on the op's thread while the op's tensors are alive.
class OpContext {
 public:
  virtual ~OpContext() = default;
  virtual std::vector<InputFacts> Inputs() = 0;
  // "file.py:123 in forward" of the user's code, and a few frames of stack.
  virtual std::string Source() = 0;
  virtual std::string Stack() = 0;
  // The torch code that made the call for that line, where the line shows
  // no such op ("Normal.log_prob (torch/distributions/normal.py:87)";
  // source_location.h), if one did.
  virtual std::string Via() { return ""; }
  // Backward ops: the user's code that called the op within the backward
  // pass (a gradient hook, a custom autograd.Function's backward), as
  // Source() and Stack() would say it; empty for the ops of autograd's own
  // nodes, whose line is their forward op's (OpEvent::forward_source).
  struct CallSite {
    std::string source, stack;
  };
  virtual CallSite BackwardCallSite() { return {}; }
  // Max |x| of the op's outputs when recomputed from fp32 copies of its
  // inputs; nullopt when that is not possible or not safe (in-place ops,
  // random ops, ops without a schema).
  virtual std::optional<double> RecomputeFp32MaxAbs() = 0;
  // Whether an input of `op` holds masks: a scalar argument that is a
  // mask constant (IsMaskConstant), or memory the registry says holds mask
  // constants or deliberate ±inf (a finfo.min mask with -inf added in).
  virtual bool InputsHoldMasks(absl::string_view op) = 0;
  // Whether every non-finite output (and there is one) is in memory the
  // registry says holds deliberate ±inf: what a composite op's nested ops
  // left as masks, or a view of a mask it was given.
  virtual bool OutputsHoldMasks() = 0;
  // Whether inf/NaN made in the run may still be held in anything but a
  // single value that is no parameter (a loss, a gradient norm): a
  // gradient, a weight, a buffer, any tensor still referenced. True when
  // it cannot tell (sample mode: unchecked ops may have carried them
  // anywhere; GPU results known only by their memory).
  virtual bool NonFiniteGradientsHeld() = 0;
};

// One finished op.
struct OpEvent {
  absl::string_view op;          // innermost, e.g. "aten::bmm"
  absl::string_view top_op;      // outermost enclosing op, or empty
  Phase phase = Phase::kForward;
  bool grad_enabled = true;      // grad mode when the op ran
  // An input requires grad (a parameter); a nested op's: its top-level
  // op's, when that started without grad (StepTracker::Refine).
  bool takes_grad_input = false;
  absl::string_view forward_op;  // backward ops: the forward op of the node
  // Backward ops: the line the forward op was called from, when captured
  // (ForwardLineWanted); their findings' source.
  absl::string_view forward_source;
  // Backward ops: the node's sequence number and forward thread (-1: not
  // known), to find its forward op's call in a later step when
  // forward_source is empty (core/forward_line_fills.h).
  int64_t forward_seq = -1;
  uint64_t forward_thread = 0;
  absl::Span<const TensorFacts> outputs;
  // Some op around this one judges what it returns at its end. Not when
  // each is a record named by a string (an autograd.Function's apply, a
  // torch.compile region: no outputs to judge) or passes its input through
  // (aten::to, which returns its _to_copy's result): non-finite values this
  // op was given that no op made are then its own input finding, not left
  // to an enclosing op that never judges them (they were "propagated" from
  // nobody: data cast with .float() was a healthy run).
  bool enclosing_op_judges = true;
  // A torch.compile region (the name of its record, "Torch-Compiled Region:
  // 0/0", or its backward's, "CompiledFunctionBackward") that ran on this
  // thread since the last optimizer step, with the line it was called from
  // when known (", called at train.py:11 in <module>"). Its fused kernels
  // write tensors no check reads: non-finite values no op made came out of
  // it (made there, or given to it), not in with the data: a "compiled"
  // finding, not an "input" one. A GPU origin, whose inputs no check read,
  // keeps the region in its row too.
  absl::string_view compiled_region;
  // An op nested inside this one was already an origin or an input finding:
  // this op's non-finite outputs come from there.
  bool contains_finding = false;
  // A nested op already reported these outputs coming near the limit: the
  // enclosing op (matmul around bmm) does not report them again.
  bool contains_warning = false;
  // CompositeImplicitAutograd (hstack, broadcast_tensors, fliplr): its
  // values are its nested ops', or views of its inputs (OutputsHoldMasks).
  bool composite = false;
  uint64_t thread = 0;
  // Ops checked on the GPU are classified after the fact (core/late_ops.h):
  // the step and phase they ran in, read when they were enqueued. They do
  // not move the step tracker, and their statistics join the step that is
  // open when they arrive (at most the ring's lag later).
  int64_t late_step = -1;
  // How many step renumberings the monitor had made when the op was
  // enqueued (Position::renumberings): those made since apply to late_step.
  int64_t late_renumberings = 0;
  // The update generation it was noted in (Position::generation).
  int64_t late_generation = 0;
  absl::string_view kernels;  // GPU kernels it launched, when known
  // The op reads or writes GradScaler's loss scale (the scaled loss, its
  // gradient, the scale's own update): its values exceed fp16's range on
  // purpose, in fp32, so their size is no headroom finding, does not warn
  // and stays out of the op statistics; non-finite values still count.
  bool loss_scaling = false;
  // A backward op while a GradScaler scales the loss: its gradients come
  // near fp16's limit on purpose (the scaler grows its scale until they
  // overflow, then skips that step and halves it). Its near-max values are
  // still recorded, without a live warning.
  bool scaled_gradients = false;
  // Only a share of ops is checked now (sample mode, outside full and
  // escalated steps): non-finite values this op was given may come from an
  // op nobody checked. ±inf carried by an op that carries masks is then
  // presumed a mask (a real overflow reaches the loss, where the sentinel
  // escalates and the origin is found with every op checked), and NaN is
  // never called input data.
  bool others_unchecked = false;
  // It copies values and keeps their dtype (a GPU copy_, cat, embedding):
  // it cannot make inf or NaN, so non-finite outputs from inputs its check
  // did not read (on a GPU, taken as finite) were in those inputs: values
  // that came from outside the checked ops (a checkpoint loaded straight
  // onto the GPU), not this op's making. The CPU path does not judge such
  // copies at all (it reads their inputs when they are used).
  bool copies_unchanged = false;
};

// kWarned: finite, but a near-max finding was recorded for it.
// kMasked: its only inf came from deliberate masks (no finding; its outputs
// are deliberate in turn).
// kMaskConstants: finite, and its large values are mask constants it
// placed or carried (no warning; its outputs hold mask constants in turn).
// kDeferred: a nested op's non-finite outputs that only the op around it
// can explain (see Deferral); nothing recorded yet.
// kOwnMasked: inf/NaN a backward formula made of a zero it divided by, or
// carried from there, and masks itself before it returns (no finding, not
// the program's mask; see MasksItsZeroDivisionInBackward).
enum class Verdict {
  kClean, kWarned, kOrigin, kInput, kPropagated, kMasked, kMaskConstants, kDeferred, kOwnMasked
};

// A nested op whose non-finite outputs its own inputs cannot explain: an
// input it overwrote was not checked before (CPU baddbmm's addmm_ into a
// copy of the additive mask), or non-finite values no op made (memory the
// enclosing op's kernel filled, or left unwritten). Recorded when the
// enclosing op ends (Monitor::SettleDeferral), by what became of them: a
// mask the enclosing op carried, garbage overwritten by then, or non-finite
// values that stand.
struct Deferral {
  std::string op, top_op, forward_op;
  Phase phase = Phase::kForward;
  uint64_t thread = 0;
  std::vector<TensorFacts> outputs;
  FindingRow row;  // the "propagated" finding it is if it stands
};
enum class Settled {
  kStands,       // still non-finite, the enclosing op no mask: propagated
  kMask,         // the enclosing op's verdict was kMasked: a mask carried
  kOverwritten,  // finite by the enclosing op's end: garbage, not data
  // Non-finite still, but the enclosing op's outputs are finite: it left
  // them out itself (torch.logdet places a NaN for a negative determinant
  // and its torch.where keeps it out where the determinant is positive).
  // Torch's own, as kOwnMasked is: neither a finding nor a non-finite step.
  kLeftOut,
};

// What the registry remembers of an output of an op judged `verdict`, by
// what the check counted in that output.
StorageState StorageStateAfter(Verdict verdict, const CheckCounts& counts);

// Verdicts that are no news: nothing to escalate, warn about or name
// kernels for.
inline bool IsQuiet(Verdict v) {
  return v == Verdict::kClean || v == Verdict::kMasked || v == Verdict::kMaskConstants ||
         v == Verdict::kDeferred || v == Verdict::kOwnMasked;
}

// Verdicts of an op whose outputs were all finite.
inline bool ReturnsFinite(Verdict v) {
  return v == Verdict::kClean || v == Verdict::kWarned || v == Verdict::kMaskConstants;
}

class Monitor {
 public:
  // `writer` may be null (tests); it must outlive the monitor.
  // `clock` returns seconds since the epoch; injectable for tests.
  Monitor(const Config& config, TraceWriter* writer,
          std::function<double()> clock = nullptr);

  const CheckLimits& limits() const { return limits_; }

  // Records one op. Returns what its outputs were. The event's phase may be
  // refined (see StepTracker): findings carry the refined one. With
  // `deferral` given, a nested op that only its enclosing op can explain is
  // kDeferred, written there, and recorded by SettleDeferral when the
  // enclosing op ends; without (GPU results, judged in enqueue order after
  // the enclosing op is gone), it is kPropagated.
  Verdict OnOp(OpEvent event, OpContext& context, std::optional<Deferral>* deferral = nullptr);
  // Records a deferred op as it turned out.
  void SettleDeferral(const Deferral& deferral, Settled settled);

  // An op whose outputs go to the GPU check (classified later through
  // core/late_ops.h) ran now: moves the step tracker as OnOp would, and
  // returns the step and refined phase to classify it with. A top-level op
  // that begins an iteration after one with non-finite gradients and no
  // update is judged as OnOp judges it (program_skips), by
  // `nonfinite_gradients_held` (OpContext::NonFiniteGradientsHeld).
  struct Position {
    int64_t step;
    Phase phase;
    int64_t renumberings;  // OpEvent::late_renumberings
    int64_t generation;    // OpEvent::late_generation
  };
  // `result_follows`: the op's result will be given to OnOp (a composite
  // op's is its nested ops'); a step's verdict on whether its inf/NaN were
  // dropped waits for it (OnOptimizerStepEnd).
  Position NoteLateOp(Phase phase, bool grad_enabled, bool takes_grad_input,
                      bool top_level, absl::FunctionRef<bool()> nonfinite_gradients_held,
                      bool result_follows = true);
  // Whether a top-level op would begin an iteration after one whose
  // backward pass had no update, and be asked whether the program skipped
  // it (not in sample mode). On a GPU the backward pass's results must be
  // in by then: the plugin delivers them first (when the program has read
  // a GPU value since, as a loss scaler that decides to skip must).
  bool JudgesIterationWithoutUpdate(Phase phase, bool grad_enabled, bool takes_grad_input) const;
  // A backward op returned gradients to the program rather than into .grad
  // (torch.func.grad's): StepTracker::OnGradientsReturned.
  void NoteGradientsReturned();

  // A collective (c10d::allreduce_, broadcast_...) ran on these storages:
  // non-finite values found there later, made by no op of this process,
  // were received from another rank ("received" findings).
  void NoteCollective(absl::Span<const void* const> storages);
  // A copy from memory a collective wrote carries that along (DDP copies
  // all-reduced buckets into the gradients).
  void NoteCopy(absl::Span<const void* const> from, absl::Span<const void* const> to);
  // An op of this process wrote these storages: whatever a collective put
  // there is gone (and the memory may be a new tensor at a reused address).
  void ForgetCollective(absl::Span<const void* const> storages);
  bool IsCollective(const void* storage) const;

  // `op` was given an eps (EpsArgument, core/op_policy.h) that is 0 in its
  // output's `format` (RoundsToZero): F.normalize's clamp_min(1e-12) in a
  // model.half() run. The first time for each op and format, an events row
  // (kEpsRoundedToZero) with the line `source()` gives.
  void OnEpsRoundedToZero(absl::string_view op, Format format, double eps,
                          absl::FunctionRef<std::string()> source);

  // `op` made a mask's -inf of a number the program wrote past `format`'s
  // range (LiteralPastRange in monitor.cc: `(1.0 - mask) * -1e9` over fp16
  // scores). The first time for each number and format, an events row
  // (kMaskLiteralPastRange) with the line `source()` gives (`value`, the
  // number's magnitude: its sign is not read): a row masked
  // entirely is NaN after a softmax, where a mask fp16 holds
  // (torch.finfo(dtype).min) would have left it finite.
  void OnMaskLiteralPastRange(absl::string_view op, Format format, double value,
                              absl::FunctionRef<std::string()> source);

  // Step boundaries (see StepTracker).
  void OnOptimizerStepBegin();
  // Optimizer `optimizer` steps (or GradScaler skipped it): another
  // optimizer of the iteration keeps the step the last one's update ended
  // (StepTracker::OnOptimizerIdentified, which says what
  // `replaces_another` means).
  void OnOptimizerIdentified(uint64_t optimizer, bool replaces_another);
  // `nonfinite_held`: whether a storage that holds inf/NaN made in the run
  // may still be alive as the optimizer step ends. When none is and the
  // step made some, they went with the temporaries that held them (a
  // softmax's NaN over padding, zeroed right after): an event
  // kNonFiniteDropped says so for the step. While results of GPU ops noted
  // before are still to come (not in sample mode), the verdict waits for
  // them instead, and is asked of the query set_nonfinite_held gave once
  // they are in (JudgeWaitingDrops): later than on the CPU, so a tensor
  // freed in between counts as dropped.
  void OnOptimizerStepEnd(bool nonfinite_held = true);
  // GradScaler skipped an optimizer's step (its gradients were not finite;
  // the step guard saw no record): its update is over as a record's end
  // would say, with no verdict on the step's inf/NaN, which the skip kept
  // out of the weights. In sample mode, OnOptimizerStepEnd.
  void OnOptimizerSkipped();
  // Whether a step's verdict no longer waits for any GPU result: the
  // caller then calls JudgeWaitingDrops, after it has told the registry
  // what the last result found. One load, no lock.
  bool drops_ready() const { return drops_ready_.load(std::memory_order_relaxed); }
  // Whether a step that ran an optimizer step had made inf/NaN: from then
  // on the plugin delivers a GPU step's results before its optimizer step
  // ends, so that its verdict is given then, as on the CPU (one wait a
  // step, in runs that make inf/NaN and update on them).
  bool update_made_nonfinite() const {
    return update_made_nonfinite_.load(std::memory_order_relaxed);
  }
  void JudgeWaitingDrops() ABSL_LOCKS_EXCLUDED(mu_);
  // What OnOptimizerStepEnd's `nonfinite_held` says, asked when it is
  // wanted (any thread; without the monitor's lock).
  void set_nonfinite_held(std::function<bool()> held);
  // Whether a checked op of the open step had inf/NaN outputs.
  bool StepHasNonFinite() const;

  int64_t step() const;
  // Whether a forward op named `op` should capture the line it is called
  // from, for the findings of its backward ops (OpEvent::forward_source):
  // for kForwardLineSteps steps after one of them came near the limit
  // (not a GradScaler's scaled gradients, there on purpose) or made
  // inf/NaN from finite values. A backward op runs after its forward op's
  // line is gone, so the finding that opens the window has none; overflows
  // recur, and the ones after it do. Asked at every forward op that makes
  // an autograd node: one load while no window is open (the name is not
  // even measured).
  bool ForwardLineWanted(const char* op) {
    return forward_lines_.AnyOpen() && forward_lines_.Wanted(op, [this] { return step(); });
  }
  static constexpr int64_t kForwardLineSteps = 20;
  // A forward op `op` that made node `seq` on `thread` was called from
  // `line` (captured as ForwardLineWanted asked): the findings of a step
  // before whose forward op was the same call get that line
  // (core/forward_line_fills.h). One load while none waits.
  void OnForwardLine(absl::string_view op, int64_t seq, uint64_t thread, absl::string_view line);
  // What names the maker of each node number (the plugin's ring of forward
  // ops), to find a forward op's call again by its name's count.
  void set_named_nodes(ForwardLineFills::NamedNodes named_nodes) {
    forward_line_fills_.set_named_nodes(std::move(named_nodes));
  }
  // A top-level op may begin a step (StepTracker::step_may_begin): the
  // caller then tells the start of each top-level forward op on a tensor
  // that requires grad, which judges and begins it there, as OnOp would at
  // its end, so that the ops inside it (which end first: the addmm in the
  // first layer's linear) are in the step it begins. One load, no lock.
  bool step_may_begin() const { return step_may_begin_.load(std::memory_order_relaxed); }
  // StepTracker::step_ended, lock-free.
  bool step_ended() const { return step_ended_.load(std::memory_order_relaxed); }
  // Before the process trains, `op` and `parameter` (the memory of its
  // first input that requires grad) tell where a forward pass begins
  // (StepTracker::OnPassStart); once it trains, with `next_node` and
  // `thread` (at::sequence_number::peek, the thread's RecordFunction id),
  // where the program gave an iteration up (StepTracker::OnTrainingPass).
  void OnTopLevelOpStart(Phase phase, bool grad_enabled, bool takes_grad_input,
                         absl::FunctionRef<bool()> nonfinite_gradients_held,
                         absl::string_view op = "", const void* parameter = nullptr,
                         int64_t next_node = -1, uint64_t thread = 0);
  // Whether the open step may be an iteration the program gives up
  // (StepTracker::may_give_up_iteration, or any forward pass before the
  // process trains): a GPU program's results are then delivered before its
  // next pass is judged (WouldGiveUpIteration). One load, no lock.
  bool may_give_up_iteration() const {
    return may_give_up_iteration_.load(std::memory_order_relaxed);
  }
  // Whether top-level op `op` reading `parameter` would give the open
  // step up, should the step have made inf/NaN.
  bool WouldGiveUpIteration(absl::string_view op, const void* parameter) const;
  // Iterations given up, not undone yet: each backward node is told to
  // OnBackwardNode. One load, no lock.
  bool watches_backward_nodes() const {
    return watches_backward_nodes_.load(std::memory_order_relaxed);
  }
  // A backward node of forward op number `seq` of thread `forward_thread`
  // ran (StepTracker::OnBackwardNode).
  void OnBackwardNode(int64_t seq, uint64_t forward_thread);
  // Iterations the program gave up before their backward pass, on a
  // non-finite loss (StepTracker::OnTrainingPass): each a step of its own,
  // with an events row kGaveUpIteration.
  int64_t iterations_given_up() const;
  // The process never trained and counted its forward passes as steps (an
  // evaluation or inference script).
  bool counted_forward_passes() const;
  // The step the next forward pass belongs to: past an optimizer record's
  // end, the next one (sampling and the budget plan for it there).
  int64_t next_step() const;

  // GradScaler updated its scale to `scale`; `skipped`: it found non-finite
  // gradients, so the optimizer step was skipped.
  void OnScalerUpdate(double scale, bool skipped);
  // The same in two parts, for a scaler on a GPU whose values arrive later:
  // the step bookkeeping when the update runs (in order with the ops), then
  // the loss-scale row, for the step the first part returned.
  StepTracker::ScalerStep OnScalerUpdateStep();
  void RecordLossScale(int64_t step, double scale, bool skipped);

  // The optimizer update of the current step does not happen
  // (NANHUNT_SKIP_NONFINITE_STEPS found non-finite gradients): records the
  // skip with the backward op that first made non-finite values this step,
  // and returns a line for the user.
  std::string OnStepSkipped();
  int64_t skipped_steps() const;
  // In sample mode: iterations whose backward pass made non-finite
  // gradients (as far as the checked ops show) and that began the next
  // batch without an optimizer step. A loss scaler of the program's own
  // skips so; sample mode cannot tell that from accumulation (an op nobody
  // checked may hold them), so they are counted, not judged (the view
  // cautions).
  int64_t iterations_unjudged_in_sample_mode() const;
  // Iterations whose program skipped the update itself (its own loss
  // scaler): non-finite gradients, then the next batch without an
  // optimizer step, and none of them kept. Each is a step of its own, with
  // an events row kProgramSkippedUpdate.
  int64_t program_skips() const;

  // Writes the current step's statistics (at exit; steps also flush
  // themselves when they end). A step that trained and had not ended is
  // an events row kUnfinishedStep.
  void FlushStep();

  // The first origin (or input finding) seen, if any, and the latest.
  std::optional<FindingRow> first_origin() const;
  std::optional<FindingRow> last_origin() const;
  int64_t findings() const;

  // Ops whose inf were only deliberate masks (Verdict::kMasked), sorted:
  // their op_stats count those ±inf, the viewer tells them apart.
  std::vector<std::string> mask_ops() const;

  // Sets a callback for lines meant for the user's stderr (warnings, the
  // first origin). Default: none.
  void set_notify(std::function<void(const std::string&)> notify);

 private:
  struct Stats {
    int64_t calls = 0;
    CheckCounts counts;
  };
  // One op name's statistics in a step, across phases and formats; [1]:
  // its calls whose ±inf were masks (OpStatsRow::mask), [0]: the others.
  struct StepStats {
    Stats stats[2][kPhaseCount][kFormatCount];
    bool touched[2][kPhaseCount][kFormatCount] = {};
  };
  // One op name's state: this step's statistics, and what was reported.
  struct OpState : StepStats {
    // max |x| last reported, by phase and by whether the format overflows
    // near 65504 (fp16, fp8 e5m2) or only would in fp16 (fp32, bf16): an
    // op's fp32 statistic far past 65504 must not hide its fp16 output's
    // warnings, nor the other way round.
    double near_reported[kPhaseCount][2] = {};
    bool underflow_reported[kPhaseCount] = {};
  };
  // What GPU results of a step whose rows were written already added to
  // it: the host runs ahead of the GPU, and a step ends at its last op's
  // launch, not its result. Written as more op_stats and steps rows of
  // that step, which the trace's readers sum.
  struct LateStep {
    absl::flat_hash_map<std::string, StepStats> ops;
    int64_t ops_count = 0, nonfinite_ops = 0, origins = 0;
    double max_abs = 0;
    double update_max_abs = 0;  // of its finite optimizer-phase outputs
  };

  // The late step whose totals a GPU result `e` adds to, or null when its
  // step is still open (or `e` is no GPU result): the current step's.
  LateStep* LateStepOf(const OpEvent& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the rows of the late steps from `from` up to before `before`,
  // and forgets them.
  void WriteLateStepsLocked(int64_t before,
                            int64_t from = std::numeric_limits<int64_t>::min())
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An op_stats row for each touched phase and format of `ops`, untouched
  // after.
  template <class Ops>
  void WriteOpStatsLocked(int64_t step, Ops& ops) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // After any call that may change steps_ or step_bad_backward_op_: keeps
  // step_may_begin_. An iteration without an optimizer step is judged at a
  // forward op only when its backward pass made inf/NaN, so only then
  // (and where a step waits to begin) do the op starts take the lock.
  // So, too, once a training step has made inf/NaN before its backward
  // pass (it may be given up), and at a step's first pass (its first pair).
  void StepStateChangedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const bool watch_passes = config_.mode != Mode::kSample;
    // Before it trains, each forward pass may be an iteration given up.
    const bool may_give_up =
        watch_passes && (steps_.may_give_up_iteration() || !steps_.trained());
    step_may_begin_.store(steps_.step_may_begin() ||
                              (!step_bad_backward_op_.empty() &&
                               steps_.AtIterationWithoutUpdate(Phase::kForward, true, true)) ||
                              (watch_passes && steps_.wants_anchor()) ||
                              (may_give_up && step_nonfinite_ops_ > 0),
                          std::memory_order_relaxed);
    may_give_up_iteration_.store(may_give_up, std::memory_order_relaxed);
    step_ended_.store(steps_.step_ended(), std::memory_order_relaxed);
    watches_backward_nodes_.store(steps_.has_given_up_iterations(), std::memory_order_relaxed);
    WriteGivenUpLocked(/*all=*/false);
  }
  // Events rows for the iterations given up that the tracker confirmed.
  void WriteGivenUpLocked(bool all) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OnOp began a step: the last one's row, ended at its last optimizer
  // record when one ended it.
  void WriteStepBegunLocked(double now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Has the trace renumber the rows of steps the tracker just undid.
  void RenumberLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A late result's step, `step` when it was enqueued after `renumberings`
  // of them, in today's numbers.
  int64_t RenumberedLocked(int64_t step, int64_t renumberings) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes `step`'s statistics and its steps row, and starts a new step.
  // The row is left out for a step with no checked op unless `ended` (an
  // optimizer step or a GradScaler skip ended it: in sample mode a step may
  // pass without any op checked, and is still a step).
  void WriteStepLocked(int64_t step, double now, bool ended = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // When top-level op `e` begins an iteration after one that made
  // non-finite gradients and had no optimizer step: whether its program
  // skipped the update (see program_skips) or kept them (accumulation).
  void JudgeIterationWithoutUpdateLocked(Phase phase, bool grad_enabled, bool takes_grad_input,
                                         absl::FunctionRef<bool()> nonfinite_gradients_held,
                                         double now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordProgramSkipLocked(double now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The events row kNonFiniteDropped for `step`, once.
  void WriteDroppedLocked(int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds `e`'s outputs (largest magnitude `max_abs`) to its op's statistics
  // (to its mask row when `mask`) and to the step's totals (counted an op
  // with non-finite outputs when `nonfinite`).
  void CountOpLocked(const OpEvent& e, double max_abs, bool nonfinite, bool mask = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  FindingRow MakeFinding(const char* kind, const OpEvent& e,
                         const CheckCounts& total, Format format) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Emit(FindingRow row) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Non-finite outputs that are only masks carried along: inf from
  // deliberate ±inf inputs through an op that carries masks (NaN only
  // beside NaN markers: MarkNanMarkers), or -inf made of mask constants (a
  // finfo.min mask cast to fp16). Marks the deliberate scalar inputs it
  // finds.
  // Whether an input of `e` holds NaN the program placed as a marker of
  // its own: a NaN literal a top-level op places (PlacesScalar), or memory
  // known to hold masks. Marks those inputs deliberate.
  static bool MarkNanMarkers(const OpEvent& e, std::vector<InputFacts>& inputs);
  // Whether the share of NaN among the outputs' values (`total`) is no
  // larger than among those of an input holding NaN markers.
  static bool NanShareNoLarger(const CheckCounts& total, const std::vector<InputFacts>& inputs);
  static bool IsMasking(const OpEvent& e, const CheckCounts& total,
                        std::vector<InputFacts>& inputs, OpContext& context);
  // Tells OnMaskLiteralPastRange of the number past its format's range
  // that `e`, judged a mask, made -inf of, if any.
  void NoteMaskLiteral(const OpEvent& e, const CheckCounts& total,
                       const std::vector<InputFacts>& inputs, OpContext& context);
  // What a backward formula's division made at a zero (a norm's, sinc's),
  // which it masks itself (MasksItsZeroDivisionInBackward), of inputs that
  // were finite; or what an op of that formula made of it on its way to the
  // mask.
  static bool OwnMaskedZeroDivision(const OpEvent& e, const CheckCounts& total,
                                    const std::vector<InputFacts>& inputs);
  Verdict ClassifyNonFinite(const OpEvent& e, const CheckCounts& total,
                            Format format, OpContext& context,
                            std::optional<Deferral>* deferral) ABSL_LOCKS_EXCLUDED(mu_);

  const Config config_;
  const CheckLimits limits_;
  TraceWriter* const writer_;
  const std::function<double()> clock_;

  mutable absl::Mutex mu_;
  StepTracker steps_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, OpState> ops_ ABSL_GUARDED_BY(mu_);
  int64_t call_index_ ABSL_GUARDED_BY(mu_) = 0;  // within the step
  int64_t written_through_ ABSL_GUARDED_BY(mu_) = -1;  // last step written
  absl::btree_map<int64_t, LateStep> late_steps_ ABSL_GUARDED_BY(mu_);
  // Steps the tracker undid, in order (the first iteration's micro-batches).
  std::vector<StepTracker::Renumbering> renumberings_ ABSL_GUARDED_BY(mu_);
  int64_t step_nonfinite_ops_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t step_origins_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t step_findings_ ABSL_GUARDED_BY(mu_) = 0;
  double step_max_abs_ ABSL_GUARDED_BY(mu_) = 0;
  // The largest finite |x| the step's update wrote (optimizer-phase
  // outputs, GradScaler's scale aside), for divergence_.
  double step_update_max_abs_ ABSL_GUARDED_BY(mu_) = 0;
  DivergenceWatch divergence_ ABSL_GUARDED_BY(mu_);
  // Feeds `step`'s update to divergence_: a live warning and an events row
  // (kDiverging) when the training is diverging.
  void NoteUpdateLocked(int64_t step, double update_max_abs) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The first backward op with non-finite outputs in this step, and its
  // forward op: where non-finite gradients came from.
  std::string step_bad_backward_op_ ABSL_GUARDED_BY(mu_);
  std::string step_bad_forward_op_ ABSL_GUARDED_BY(mu_);
  int64_t skipped_steps_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t program_skips_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t unjudged_in_sample_mode_ ABSL_GUARDED_BY(mu_) = 0;
  bool unjudged_counted_ ABSL_GUARDED_BY(mu_) = false;  // since the last backward op
  // Memory that torch.distributed collectives (c10d::*) wrote into.
  absl::flat_hash_set<const void*> collective_storages_ ABSL_GUARDED_BY(mu_);
  // Set at the first collective: until then (any run that is not
  // distributed) the lookups on every op's tensors take no lock.
  std::atomic<bool> any_collective_{false};
  WantedOps forward_lines_;  // ForwardLineWanted
  ForwardLineFills forward_line_fills_;  // OnForwardLine
  // Opens (or extends) the window of e.forward_op's line from `row`'s step,
  // and when `row` has no line, waits for its forward op's call in a later
  // step to fill it.
  void WantForwardLine(const OpEvent& e, const FindingRow& row);
  // Fills the rows of `fills` and says live when the first origin's is one.
  void WriteForwardLinesLocked(std::vector<ForwardLineFills::Fill> fills)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  double step_started_ ABSL_GUARDED_BY(mu_) = 0;
  // When the last optimizer record of the step ended, while the next step
  // waits for its first forward op; the step's end time.
  std::optional<double> update_ended_at_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> step_may_begin_{true};  // steps_.step_may_begin(), kept by
                                             // StepStateChangedLocked
  std::atomic<bool> step_ended_{false};  // also
  std::atomic<bool> may_give_up_iteration_{false}, watches_backward_nodes_{false};  // also
  int64_t given_up_confirmed_ ABSL_GUARDED_BY(mu_) = 0;  // events rows written
  // Verdicts waiting for GPU results, and the last step kNonFiniteDropped
  // was written for (once a step, though a step of several optimizer
  // records has its verdict at each).
  DropVerdicts drops_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> drops_ready_{false};
  std::atomic<bool> update_made_nonfinite_{false};
  int64_t last_dropped_step_ ABSL_GUARDED_BY(mu_) = -1;
  std::function<bool()> nonfinite_held_ ABSL_GUARDED_BY(mu_);
  // The step ran forward ops on parameters or backward ops: training, not
  // the bookkeeping after the last step (logging, saving).
  bool step_trained_ ABSL_GUARDED_BY(mu_) = false;
  int64_t findings_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_set<std::string> mask_ops_ ABSL_GUARDED_BY(mu_);
  // "op/format" pairs OnEpsRoundedToZero has told of.
  absl::flat_hash_set<std::string> eps_rounded_ ABSL_GUARDED_BY(mu_);
  // "number/format" pairs OnMaskLiteralPastRange has told of.
  absl::flat_hash_set<std::string> mask_literals_ ABSL_GUARDED_BY(mu_);
  std::optional<FindingRow> first_origin_ ABSL_GUARDED_BY(mu_);
  std::optional<FindingRow> last_origin_ ABSL_GUARDED_BY(mu_);
  std::function<void(const std::string&)> notify_ ABSL_GUARDED_BY(mu_);
};

// Largest magnitude in `counts` as a value.
double MaxAbs(Format format, const CheckCounts& counts);

// "float16[4, 8] max|x|=300 (finite)"-style one-line description.
std::string DescribeTensor(absl::string_view dtype, absl::string_view shape,
                           const CheckCounts& counts, double max_abs);

}  // namespace nanhunt
