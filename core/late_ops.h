// Ops whose outputs are checked on the GPU: their results arrive later, on
// the drain thread, in enqueue order (core/check_ring.h). LateOps keeps what
// the monitor needs about each such op until every output's result is in,
// then classifies it as the CPU path does, with what is known by then:
//
// - an input produced by an earlier op is judged by that op's result, which
//   (enqueue order) has been delivered: non-finite if the registry says so;
// - a nested op's origin makes its enclosing op "contains_finding", as the
//   enclosing op's result arrives after its nested ops' results;
// - the source line cannot be read once the op has returned, so it is
//   captured at enqueue only for ops that are "wanted": those already seen
//   near the limit or non-finite. Overflows build up and recur (the demo
//   warns 13 steps before it overflows), so the next one carries its line.
//
// Torch-free: the plugin fills LateOp at enqueue; tests drive it directly.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "core/monitor.h"
#include "core/wanted_ops.h"
#include "core/weak_storage.h"

namespace nanhunt {

// A floating-point input as known at enqueue.
struct LateInput {
  int arg_index = 0;
  absl::string_view dtype;  // torch's static name ("Half"), or "scalar"
  // Its sizes, formatted ("[4, 4]") only when its op is judged non-finite:
  // a foreach op's hundreds of inputs would otherwise cost a string each.
  absl::InlinedVector<int64_t, 6> sizes;
  // A nested tensor's shape (it has no sizes) or a complex one's (which says
  // its counts are of real and imaginary parts), formatted at enqueue.
  std::string formatted_shape;
  const void* storage = nullptr;  // device tensors: judged at delivery
  bool from_collective = false;   // a collective wrote it (at enqueue)
  bool checked_on_host = false;   // host tensors: checked at enqueue
  // A scalar argument that is a mask constant (IsMaskConstant), or a host
  // tensor holding masks: found at enqueue (OpContext::InputsHoldMasks).
  // Device memory: the registry, at delivery.
  bool holds_masks = false;
  // A host tensor torch wrapped a Python number into (InputFacts::
  // python_number): `scores + (1.0 - keep) * -1e9` on a GPU.
  bool python_number = false;
  CheckCounts counts;             // when checked_on_host
  double max_abs = 0;
  bool copy_source = false;  // InputFacts::copy_source
  // What it is to the model (InputFacts::model_tensor), named at enqueue:
  // a host tensor that brought inf/NaN no checked op made, or a GPU one
  // copied into a parameter.
  std::string model_tensor;
  // GPU memory no op nanhunt saw wrote (core/written_memory.h), checked
  // after this op as its first reader: counts and max_abs arrive with the
  // op's results (LateOps::OnInputResult), in `format`.
  bool checked_at_first_read = false;
  Format format = Format::kF32;
};

// An output's memory, as known at enqueue. Device tensors also carry a
// weak reference to their storage and whether they are a single value that
// is no parameter (a loss, a gradient norm, a found-inf flag): once the
// result arrives, the registry can tell whether the memory still holds it.
struct OutputStorage {
  const void* key = nullptr;
  WeakStorage weak;
  bool single_value = false;
};

struct LateOp;

// What a check's result comes back with (cupti/cuda_api.h's context): one
// output of a late op, kept inside the op (LateOp::result_contexts) so that
// enqueueing allocates nothing that the drain thread would free; the
// plugin's reads of single values extend it (kValueRead).
struct ResultContext {
  enum class Kind : uint8_t { kLateOutput, kLateInput, kValueRead };
  Kind kind = Kind::kLateOutput;
  int index = 0;          // of the op's outputs or inputs (or of the values read)
  LateOp* op = nullptr;   // kLateOutput, kLateInput
};

struct LateOp {
  uint64_t id = 0;         // unique per op call
  uint64_t parent_id = 0;  // the enclosing op's id, or 0
  std::string op, overload, top_op, forward_op;
  Phase phase = Phase::kForward;  // refined at enqueue (Monitor::RefinePhase)
  int64_t step = 0;               // at enqueue
  int64_t renumberings = 0;       // Monitor::Position's, at enqueue
  int64_t generation = 0;         // Monitor::Position's, at enqueue
  bool grad_enabled = true, takes_grad_input = false;
  uint64_t thread = 0;
  // Inline for an op's usual one output and two inputs: one allocation an
  // op (the LateOp) instead of five, on the training thread of every GPU op.
  absl::InlinedVector<TensorFacts, 1> outputs;  // format and shape; counts arrive
  // Sizes of the outputs whose shape is left empty above: formatted when
  // the op is classified, on the drain thread rather than the op's.
  absl::InlinedVector<absl::InlinedVector<int64_t, 6>, 1> output_sizes;
  absl::InlinedVector<OutputStorage, 1> output_storages;
  absl::InlinedVector<LateInput, 2> inputs;
  std::string source, stack;  // when wanted
  std::string via;            // with them: OpContext::Via
  // Backward ops: the line their forward op was called from, when it was
  // captured (Monitor::ForwardLineWanted); interned, lives for the process.
  absl::string_view forward_source;
  int64_t forward_seq = -1;  // OpEvent::forward_seq
  uint64_t forward_thread = 0;
  std::string kernels;        // CUPTI: the kernels it launched
  bool loss_scaling = false;  // OpEvent::loss_scaling
  bool scaled_gradients = false;  // OpEvent::scaled_gradients
  bool others_unchecked = false;  // OpEvent::others_unchecked
  bool copies_unchanged = false;  // OpEvent::copies_unchanged
  bool enclosing_op_judges = true;  // OpEvent::enclosing_op_judges
  // OpEvent::compiled_region: interned, lives for the process.
  absl::string_view compiled_region;
  // One per output checked on the device, their addresses handed to the
  // library: filled before the first is taken, never grown after.
  absl::InlinedVector<ResultContext, 1> result_contexts;
  // Results still to come, plus one held by the enqueuing thread until it
  // has enqueued them all (it may be the last to let go). Results of one
  // op may arrive on two threads: whoever brings it to zero classifies.
  // Also the op's lifetime: at zero nothing refers to it any more.
  std::atomic<int> pending{0};

  // A new op's fields, with the memory of its strings and containers kept
  // (LateOpPool): the next op's names and lists fill it without a malloc.
  void Reset();
};

class LateOps {
 public:
  // `state_of` / `remember` read and write the registry of storages: what
  // the last check of each found (shared with the CPU path).
  using Remember = std::function<void(const OutputStorage&, StorageState)>;
  LateOps(Monitor* monitor, std::function<StorageState(const void*)> state_of,
          Remember remember);

  // Whether ops named `op` should capture their source line at enqueue.
  bool Wanted(const std::string& op);

  // Result of output `index` of `op` (called in enqueue order), or, with
  // index -1, the enqueuing thread letting go. When nothing is pending any
  // more, the op is classified; returns its verdict then.
  // The caller lets go of `op` with the call: once nothing is pending it
  // is classified and handed to the release function (set_release).
  std::optional<Verdict> OnResult(LateOp* op, int index, const CheckCounts& counts);
  // Result of the check of input `index` of `op` at its first read
  // (LateInput::checked_at_first_read); otherwise as OnResult.
  std::optional<Verdict> OnInputResult(LateOp* op, int index, const CheckCounts& counts);
  // A result that is not judged (it arrived after monitoring stopped):
  // lets go of `op` like OnResult, without classifying it.
  void LetGo(LateOp* op);

  // Called with an op once nothing refers to it any more, on the thread
  // that let go last: the plugin gives it back to its LateOpPool. Tests
  // own their ops and set none.
  void set_release(std::function<void(LateOp*)> fn) { release_ = std::move(fn); }

  // Called after an op is classified with its verdict (NaN guard, auto
  // fp32); runs on the drain thread.
  void set_on_verdict(std::function<void(const LateOp&, Verdict)> fn) {
    on_verdict_ = std::move(fn);
  }

 private:
  // Every result of `op` is in: its verdict, with the registry and the
  // enclosing ops told.
  Verdict Classify(LateOp* op);

  Monitor* const monitor_;
  const std::function<StorageState(const void*)> state_of_;
  const Remember remember_;
  std::function<void(const LateOp&, Verdict)> on_verdict_;
  std::function<void(LateOp*)> release_;
  mutable absl::Mutex mu_;
  WantedOps wanted_;  // forward ops whose line to capture at enqueue
  // Enclosing ops whose nested ops made a finding (or a warning), until
  // their own result arrives.
  absl::flat_hash_map<uint64_t, bool> parent_finding_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, bool> parent_warning_ ABSL_GUARDED_BY(mu_);
};

}  // namespace nanhunt
