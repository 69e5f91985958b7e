#include "core/late_ops.h"

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace nanhunt {
namespace {

constexpr uint64_t kMaxParents = 4096;

// The OpContext of an op classified after the fact.
class LateContext final : public OpContext {
 public:
  LateContext(const LateOp& op, const std::function<StorageState(const void*)>& state_of)
      : op_(op), state_of_(state_of) {}
  std::vector<InputFacts> Inputs() override {
    std::vector<InputFacts> facts;
    for (const LateInput& in : op_.inputs) {
      InputFacts f;
      f.arg_index = in.arg_index;
      f.dtype = std::string(in.dtype);
      f.shape = !in.formatted_shape.empty()
                    ? in.formatted_shape
                    : absl::StrCat("[", absl::StrJoin(in.sizes, ", "), "]");
      f.checked = true;
      f.from_collective = in.from_collective;
      f.copy_source = in.copy_source;
      f.model_tensor = in.model_tensor;
      f.python_number = in.python_number;
      // A check at its first read that did not happen (its memory went
      // first) counted nothing: the input is then as if never checked.
      if (in.checked_on_host || (in.checked_at_first_read && in.counts.elements > 0)) {
        f.counts = in.counts;
        f.max_abs = in.max_abs;
      } else if (in.storage != nullptr) {
        f.on_device = true;
        // Made by an earlier op whose result said so (the counts are a
        // placeholder: inf/NaN, or a mask's -inf).
        switch (state_of_(in.storage)) {
          case StorageState::kNonFinite:
            f.counts.nan = 1;
            f.produced_by_op = true;
            break;
          case StorageState::kDeliberate:
            f.counts.neginf = 1;
            f.deliberate = true;
            break;
          case StorageState::kNanMarkers:
            f.counts.nan = 1;
            f.deliberate = true;
            break;
          case StorageState::kOwnMasked:
            f.counts.nan = 1;
            f.own_masked = true;
            break;
          case StorageState::kFinite:
          case StorageState::kMaskConstants:  // finite, as its writer's check found
            f.assumed_finite = true;
            break;
        }
      }
      // Otherwise: made by an earlier op found finite, or written by no op
      // nanhunt saw and not checked at its first read (sample mode checks
      // no first reads): taken as finite.
      facts.push_back(std::move(f));
    }
    return facts;
  }
  std::string Source() override { return op_.source; }
  std::string Stack() override { return op_.stack; }
  std::string Via() override { return op_.via; }
  // The inputs may have changed since: no recomputation after the fact.
  std::optional<double> RecomputeFp32MaxAbs() override { return std::nullopt; }
  // Composite ops are not judged on a GPU (their outputs are their nested
  // ops').
  bool OutputsHoldMasks() override { return false; }
  // Late ops do not move the step tracker: never asked.
  bool NonFiniteGradientsHeld() override { return true; }
  // Scalars and host tensors as found at enqueue; device memory as the
  // results delivered before this one (enqueue order) left it.
  bool InputsHoldMasks(absl::string_view) override {
    for (const LateInput& in : op_.inputs) {
      if (in.holds_masks) return true;
      if (in.storage != nullptr && HoldsMasks(state_of_(in.storage))) return true;
    }
    return false;
  }

 private:
  const LateOp& op_;
  const std::function<StorageState(const void*)>& state_of_;
};

}  // namespace

LateOps::LateOps(Monitor* monitor,
                 std::function<StorageState(const void*)> state_of,
                 Remember remember)
    : monitor_(monitor),
      state_of_(std::move(state_of)),
      remember_(std::move(remember)) {}

bool LateOps::Wanted(const std::string& op) {
  // Asked at every GPU op: a healthy run wants no line, and takes no lock.
  return wanted_.Wanted(op);
}

void LateOp::Reset() {
  // Every field a new op's, but for the memory of the strings and lists,
  // moved out and back: a field added later is reset without being named.
  std::string names[] = {std::move(op), std::move(overload), std::move(top_op),
                         std::move(forward_op), std::move(source), std::move(stack),
                         std::move(kernels)};
  auto kept_outputs = std::move(outputs);
  auto kept_sizes = std::move(output_sizes);
  auto kept_storages = std::move(output_storages);
  auto kept_inputs = std::move(inputs);
  auto kept_contexts = std::move(result_contexts);
  this->~LateOp();
  new (this) LateOp();
  for (std::string& name : names) name.clear();
  op = std::move(names[0]);
  overload = std::move(names[1]);
  top_op = std::move(names[2]);
  forward_op = std::move(names[3]);
  source = std::move(names[4]);
  stack = std::move(names[5]);
  kernels = std::move(names[6]);
  // erase, not clear: absl's clear() gives the heap memory back.
  kept_outputs.erase(kept_outputs.begin(), kept_outputs.end());
  kept_sizes.erase(kept_sizes.begin(), kept_sizes.end());
  kept_storages.erase(kept_storages.begin(), kept_storages.end());
  kept_inputs.erase(kept_inputs.begin(), kept_inputs.end());
  kept_contexts.erase(kept_contexts.begin(), kept_contexts.end());
  outputs = std::move(kept_outputs);
  output_sizes = std::move(kept_sizes);
  output_storages = std::move(kept_storages);
  inputs = std::move(kept_inputs);
  result_contexts = std::move(kept_contexts);
}

void LateOps::LetGo(LateOp* op) {
  if (op->pending.fetch_sub(1, std::memory_order_acq_rel) > 1) return;
  if (release_) release_(op);
}

std::optional<Verdict> LateOps::OnResult(LateOp* op, int index, const CheckCounts& counts) {
  if (index >= 0) op->outputs[static_cast<size_t>(index)].counts = counts;
  if (op->pending.fetch_sub(1, std::memory_order_acq_rel) > 1) return std::nullopt;
  // Given back even if classifying threw (the drain thread catches it).
  auto release = absl::MakeCleanup([&] {
    if (release_) release_(op);
  });
  return Classify(op);
}

std::optional<Verdict> LateOps::OnInputResult(LateOp* op, int index, const CheckCounts& counts) {
  LateInput& in = op->inputs[static_cast<size_t>(index)];
  in.counts = counts;
  in.max_abs = MaxAbs(in.format, counts);
  return OnResult(op, -1, CheckCounts{});
}

Verdict LateOps::Classify(LateOp* op) {
  OpEvent event;
  event.op = op->op;
  event.top_op = op->top_op;
  event.forward_op = op->forward_op;
  event.forward_source = op->forward_source;
  event.forward_seq = op->forward_seq;
  event.forward_thread = op->forward_thread;
  event.phase = op->phase;
  event.grad_enabled = op->grad_enabled;
  event.takes_grad_input = op->takes_grad_input;
  event.thread = op->thread;
  event.late_step = op->step;
  event.late_renumberings = op->renumberings;
  event.late_generation = op->generation;
  event.kernels = op->kernels;
  event.loss_scaling = op->loss_scaling;
  event.scaled_gradients = op->scaled_gradients;
  event.others_unchecked = op->others_unchecked;
  event.copies_unchanged = op->copies_unchanged;
  event.enclosing_op_judges = op->enclosing_op_judges;
  event.compiled_region = op->compiled_region;
  // Every result is in: this thread alone holds the op now.
  for (size_t i = 0; i < op->outputs.size() && i < op->output_sizes.size(); ++i) {
    if (op->outputs[i].shape.empty()) {
      op->outputs[i].shape = absl::StrCat("[", absl::StrJoin(op->output_sizes[i], ", "), "]");
    }
  }
  event.outputs = op->outputs;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = parent_finding_.find(op->id); it != parent_finding_.end()) {
      event.contains_finding = it->second;
      parent_finding_.erase(it);
    }
    if (auto it = parent_warning_.find(op->id); it != parent_warning_.end()) {
      event.contains_warning = it->second;
      parent_warning_.erase(it);
    }
  }
  LateContext context(*op, state_of_);
  const Verdict verdict = monitor_->OnOp(event, context);
  bool any_nonfinite = false;
  for (size_t i = 0; i < op->outputs.size(); ++i) {
    const bool bad = AnyNonFinite(op->outputs[i].counts);
    any_nonfinite |= bad && verdict != Verdict::kMasked && verdict != Verdict::kOwnMasked;
    if (op->output_storages[i].key != nullptr) {
      remember_(op->output_storages[i], StorageStateAfter(verdict, op->outputs[i].counts));
    }
  }
  // A step's verdict on whether its inf/NaN were dropped may have waited
  // for this result: asked now that the registry knows what it found.
  if (monitor_->drops_ready()) monitor_->JudgeWaitingDrops();
  {
    absl::MutexLock lock(&mu_);
    const bool finding = verdict == Verdict::kOrigin || verdict == Verdict::kInput ||
                         event.contains_finding;
    // Enclosing ops that are never checked on the device (composites, ops
    // without floating outputs) leave entries behind: forget old ones.
    if (parent_finding_.size() > kMaxParents) {
      absl::erase_if(parent_finding_, [&](const auto& e) { return e.first + kMaxParents < op->id; });
      absl::erase_if(parent_warning_, [&](const auto& e) { return e.first + kMaxParents < op->id; });
    }
    if (op->parent_id != 0) {
      parent_finding_[op->parent_id] |= finding;
      parent_warning_[op->parent_id] |= verdict == Verdict::kWarned ||
                                        event.contains_warning;
    }
    // Capture the line next time: this op came near the limit, or made
    // non-finite values without a line to show for it.
    if ((verdict == Verdict::kWarned || verdict == Verdict::kOrigin ||
         any_nonfinite) &&
        op->source.empty() && op->phase == Phase::kForward) {
      wanted_.Want(op->op);
    }
  }
  if (on_verdict_) on_verdict_(*op, verdict);
  return verdict;
}

}  // namespace nanhunt
