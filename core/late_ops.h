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
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "core/monitor.h"
#include "core/weak_storage.h"

namespace nanhunt {

// A floating-point input as known at enqueue.
struct LateInput {
  int arg_index = 0;
  absl::string_view dtype;  // torch's static name ("Half"), or "scalar"
  // Its sizes, formatted ("[4, 4]") only when its op is judged non-finite:
  // a foreach op's hundreds of inputs would otherwise cost a string each.
  absl::InlinedVector<int64_t, 6> sizes;
  std::string nested_shape;  // a nested tensor's, which has no sizes
  const void* storage = nullptr;  // device tensors: judged at delivery
  bool from_collective = false;   // a collective wrote it (at enqueue)
  bool checked_on_host = false;   // host tensors: checked at enqueue
  // A scalar argument that is a mask constant (IsMaskConstant), or a host
  // tensor holding masks: found at enqueue (OpContext::InputsHoldMasks).
  // Device memory: the registry, at delivery.
  bool holds_masks = false;
  CheckCounts counts;             // when checked_on_host
  double max_abs = 0;
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
  std::string kernels;        // CUPTI: the kernels it launched
  bool loss_scaling = false;  // OpEvent::loss_scaling
  bool scaled_gradients = false;  // OpEvent::scaled_gradients
  bool others_unchecked = false;  // OpEvent::others_unchecked
  // Results still to come, plus one held by the enqueuing thread until it
  // has enqueued them all (it may be the last to let go). Results of one
  // op may arrive on two threads: whoever brings it to zero classifies.
  std::atomic<int> pending{0};
};

class LateOps {
 public:
  // `state_of` / `remember` read and write the registry of storages: what
  // the last check of each found (shared with the CPU path).
  using Remember = std::function<void(const OutputStorage&, StorageState)>;
  LateOps(Monitor* monitor, std::function<StorageState(const void*)> state_of,
          Remember remember);

  // Whether ops named `op` should capture their source line at enqueue.
  bool Wanted(const std::string& op) const;

  // Result of output `index` of `op` (called in enqueue order), or, with
  // index -1, the enqueuing thread letting go. When nothing is pending any
  // more, the op is classified; returns its verdict then.
  std::optional<Verdict> OnResult(const std::shared_ptr<LateOp>& op, int index,
                                  const CheckCounts& counts);

  // Called after an op is classified with its verdict (NaN guard, auto
  // fp32); runs on the drain thread.
  void set_on_verdict(std::function<void(const LateOp&, Verdict)> fn) {
    on_verdict_ = std::move(fn);
  }

 private:
  Monitor* const monitor_;
  const std::function<StorageState(const void*)> state_of_;
  const Remember remember_;
  std::function<void(const LateOp&, Verdict)> on_verdict_;
  mutable absl::Mutex mu_;
  absl::flat_hash_set<std::string> wanted_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> any_wanted_{false};  // wanted_ is not empty
  // Enclosing ops whose nested ops made a finding (or a warning), until
  // their own result arrives.
  absl::flat_hash_map<uint64_t, bool> parent_finding_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, bool> parent_warning_ ABSL_GUARDED_BY(mu_);
};

}  // namespace nanhunt
