#include "interpose/torch/device_outputs.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>

#include "absl/cleanup/cleanup.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/cpu_check.h"
#include "core/op_policy.h"
#include "core/self_time.h"
#include "core/written_memory.h"
#include "cupti/cuda_api.h"
#include "interpose/torch/cuda_library.h"
#include "interpose/torch/enqueue_checks.h"
#include "interpose/torch/loaded_state.h"
#include "interpose/torch/loading_names.h"
#include "interpose/torch/sample_control.h"
#include "interpose/torch/session.h"
#include "interpose/torch/torch_compat.h"

namespace nanhunt {
namespace {

// Loaded at the first GPU output: libnanhunt_cuda.so next to this plugin.
CudaLibrary& Library(Session& session) {
  static CudaLibrary& lib = [&]() -> CudaLibrary& {
    CudaLibrary& loaded = LoadCudaLibrary(session, &StorageStateOf, &RememberLateOutput);
    if (loaded.unavailable.empty()) {
      StartHoldingChecks(session, loaded);
      // A step's verdict on its inf/NaN, once its GPU results are in; none
      // at exit, when the program's tensors are going anyway.
      session.monitor().set_nonfinite_held(
          [] { return DrainingAtExit() || NonFiniteStillHeld(); });
    }
    return loaded;
  }();
  return lib;
}

// What a GPU op that begins an iteration is judged by
// (OpContext::NonFiniteGradientsHeld): inf/NaN still held anywhere but in
// one value that is no parameter.
bool GradientsStillHeld() { return NonFiniteStillHeld(/*counting_single_values=*/false); }

bool IsCheckableOnDevice(const at::Tensor& t) {
  // A nested tensor has no sizes or strides to give the check kernel.
  return t.defined() && t.is_cuda() && t.layout() == at::kStrided && !t.is_nested() &&
         t.has_storage() && FormatOfValues(t.scalar_type()) && !WithoutOwnMemory(t);
}

std::atomic<int64_t> g_first_reads{0};  // checks of inputs at their first read

// GPU memory whose values nanhunt knows (core/written_memory.h): what ops
// it saw wrote, and what it checked at a first read. Leaked, as the
// late results are: the drain thread may outlive static destructors.
WrittenMemory& Written() {
  static WrittenMemory* const written = new WrittenMemory(&StorageAlive);
  return *written;
}

WrittenMemory::Memory MemoryOf(const void* key, const at::Tensor& t) {
  return {key, t.storage().unsafeGetStorageImpl()};
}

// Whether a check of `t` reads all its storage holds: only then is the
// storage known after it (a check of one slice says nothing of the rest).
bool CoversItsStorage(const at::Tensor& t) {
  return t.storage_offset() == 0 && t.is_non_overlapping_and_dense() &&
         static_cast<size_t>(t.numel()) * t.element_size() == t.storage().nbytes();
}

// A GPU output of the op being enqueued.
struct DeviceOutput {
  const at::Tensor* tensor;  // in the op's outputs
  int index;                 // in LateOp::outputs
  const void* storage;       // StorageKey
};

// A GPU input of the op being enqueued.
struct InputRead {
  const at::Tensor* tensor;  // in the op's inputs
  int index;                 // in LateOp::inputs
};

// Of `maybe_unknown`, the op's GPU inputs, those in memory nanhunt does not
// know that the op did not write: marked in `op` and added to
// `first_reads`, to be checked with its outputs (once for a tensor read
// twice, x * x). Then notes known the op's outputs, and the first reads
// that cover their storage. One lock for the reads, one for the writes.
void NoteFirstReads(LateOp& op, absl::Span<const InputRead> maybe_unknown,
                    absl::Span<const DeviceOutput> outputs,
                    absl::InlinedVector<InputRead, 2>& first_reads) {
  absl::InlinedVector<WrittenMemory::Memory, 4> reads;
  absl::InlinedVector<const InputRead*, 4> asked;
  for (const InputRead& read : maybe_unknown) {
    const void* key = op.inputs[read.index].storage;
    bool written_here = false;
    for (const DeviceOutput& out : outputs) written_here |= out.storage == key;
    if (key == nullptr || written_here) continue;
    reads.push_back(MemoryOf(key, *read.tensor));
    asked.push_back(&read);
  }
  absl::InlinedVector<bool, 4> known(reads.size(), false);
  if (!reads.empty()) Written().Known(reads, absl::MakeSpan(known));
  absl::InlinedVector<WrittenMemory::Memory, 4> noted;
  absl::InlinedVector<const at::Tensor*, 4> noted_tensors;
  for (size_t i = 0; i < reads.size(); ++i) {
    const at::Tensor& t = *asked[i]->tensor;
    if (known[i] || !IsCheckableOnDevice(t)) continue;
    bool again = false;
    for (const InputRead& r : first_reads) again |= r.tensor->is_same(t);
    if (again) continue;
    LateInput& in = op.inputs[asked[i]->index];
    in.checked_at_first_read = true;
    in.format = *FormatOfValues(t.scalar_type());
    first_reads.push_back(*asked[i]);
    g_first_reads.fetch_add(1, std::memory_order_relaxed);
    if (CoversItsStorage(t)) {
      noted.push_back(reads[i]);
      noted_tensors.push_back(&t);
    }
  }
  for (const DeviceOutput& out : outputs) {
    noted.push_back(MemoryOf(out.storage, *out.tensor));
    noted_tensors.push_back(out.tensor);
  }
  Written().NoteKnown(noted, [&](size_t i) { return WeakStorageOf(noted_tensors[i]->storage()); });
}

// What load_state_dict, while one is under way, calls `t`
// (loading_names.h): nullopt otherwise, for a relaxed load.
std::optional<std::string> LoadingNameOfTensor(const at::Tensor& t) {
  return t.has_storage() ? LoadingNameOf(t.storage().data()) : std::nullopt;
}

// `fn` gets references into `values` (a tensor list's elements read in
// place, not copied out): they live as long as `values` does.
template <class Fn>
void ForEachTensorIn(const std::vector<c10::IValue>& values, Fn fn) {
  for (size_t i = 0; i < values.size(); ++i) {
    const c10::IValue& v = values[i];
    if (v.isTensor()) {
      fn(static_cast<int>(i), v.toTensor());
    } else if (v.isTensorList()) {
      for (const c10::IValue& e : v.toListRef()) fn(static_cast<int>(i), e.toTensor());
    }
  }
}

NanhuntDeviceTensor Describe(const at::Tensor& t, Format format) {
  NanhuntDeviceTensor d{};
  d.format = static_cast<int>(format);
  d.data = t.data_ptr();
  // A complex tensor is described as torch.view_as_real shows it: its real
  // and imaginary parts, a last dimension of 2 (one more dimension: a
  // strided one with 8 already is refused by the library, and counted).
  const int parts = t.is_complex() ? 2 : 1;
  d.count = parts * t.numel();
  bool dense = t.is_non_overlapping_and_dense();
  for (int64_t s : t.strides()) dense = dense && s >= 0;
  d.dense = dense ? 1 : 0;
  d.dims = static_cast<int>(t.dim());
  for (int i = 0; i < d.dims && i < 8; ++i) {
    d.sizes[i] = t.size(i);
    d.strides[i] = parts * t.stride(i);
  }
  if (parts == 2) {
    if (d.dims < 8) {
      d.sizes[d.dims] = 2;
      d.strides[d.dims] = 1;
    }
    ++d.dims;
  }
  return d;
}

}  // namespace

bool CheckOnDevice(const DeviceOpCall& call, const std::vector<c10::IValue>& inputs,
                   const std::vector<c10::IValue>& outputs, const OpTraits& traits,
                   Session& session, const std::string& torch_dir) {
  bool any = false;
  ForEachTensorIn(outputs, [&](int, const at::Tensor& t) {
    any = any || IsCheckableOnDevice(t);
  });
  if (!any) return false;
  SelfTimer timer(SelfTime::kGpuOp);
  // A composite op's outputs are its nested ops' outputs, checked there.
  // At the top it still moves the step tracker, as on the CPU path (the
  // first linear of a forward pass begins an iteration).
  if (traits.composite) {
    if (call.top_level) {
      session.monitor().NoteLateOp(call.phase, call.grad_enabled, call.takes_grad_input,
                                   /*top_level=*/true, GradientsStillHeld,
                                   /*result_follows=*/false);
    }
    return true;
  }
  CudaLibrary& lib = Library(session);
  if (KernelNamesWanted() &&
      !lib.names_tried.load(std::memory_order_relaxed) && lib.unavailable.empty()) {
    StartKernelNames(lib, session);  // sample mode escalated: from now on
  }
  if (!lib.unavailable.empty()) {
    ForEachTensorIn(outputs, [&](int, const at::Tensor& t) {
      if (IsCheckableOnDevice(t)) {
        CountUnchecked(OutputOwner{call.name, call.phase}, UncheckedReason::kGpuPathOff,
                       /*on_device=*/true);
      }
    });
    return true;
  }
  LateOp* op = NewLateOp();  // the last to let go gives it back (LateOps::OnResult)
  op->pending = 1;           // this call's hold
  // Thrown out of before the end (torch threw; the boundary catches it):
  // let go unjudged, so that the op goes back once its results are in.
  auto let_go = absl::MakeCleanup([op] { LateResults()->LetGo(op); });
  op->id = call.id;
  op->parent_id = call.parent_id;
  op->op = call.name;
  op->overload = call.overload;
  op->top_op = call.top_op;
  op->forward_op = call.forward_op;
  op->forward_source = call.forward_source;
  op->forward_seq = call.forward_seq;
  op->forward_thread = call.forward_thread;
  op->enclosing_op_judges = call.enclosing_op_judges;
  op->compiled_region = call.compiled_region;
  op->grad_enabled = call.grad_enabled;
  op->takes_grad_input = call.takes_grad_input;
  op->thread = call.thread;
  op->loss_scaling = TouchesLossScale(inputs, outputs);
  op->others_unchecked = OthersUnchecked(session);
  op->copies_unchanged = traits.copies_values && SameFloatingDtype(inputs, outputs);
  const Monitor::Position position = session.monitor().NoteLateOp(
      call.phase, call.grad_enabled, call.takes_grad_input, call.top_level, GradientsStillHeld);
  op->step = position.step;
  op->renumberings = position.renumberings;
  op->generation = position.generation;
  op->phase = position.phase;
  op->scaled_gradients = ScaledGradients(op->phase);
  const CheckLimits& limits = session.monitor().limits();
  op->inputs.reserve(inputs.size());  // one per argument, but for tensor lists
  for (size_t i = 0; i < inputs.size(); ++i) {
    // A non-finite scalar argument (masked_fill(mask, -inf), full(inf)), or
    // a mask constant (full(..., torch.finfo(dtype).min)): known now, as on
    // the CPU path.
    if (!inputs[i].isDouble()) continue;
    const double value = inputs[i].toDouble();
    const bool mask_constant = IsMaskConstant(call.name, value);
    if (std::isfinite(value) && !mask_constant) continue;
    LateInput& in = op->inputs.emplace_back();
    in.arg_index = static_cast<int>(i);
    in.dtype = "scalar";
    in.checked_on_host = true;
    in.counts = CountScalar(value);
    in.max_abs = std::isnan(value) ? 0 : std::fabs(value);
    in.holds_masks = mask_constant;
  }
  // A copy into the model (load_state_dict's copy_ of a checkpoint loaded
  // straight onto the GPU): its source is named by where it goes, without
  // Python's walk (too slow for every such copy), and its line is kept.
  const at::Tensor* destination = WholeWriteDestination(inputs, traits);
  const std::optional<std::string> loading_into =
      destination != nullptr ? LoadingNameOfTensor(*destination) : std::nullopt;
  // Outside a load_state_dict nanhunt was told of, a leaf that requires
  // grad is a parameter.
  const std::string into_model =
      !op->copies_unchanged || destination == nullptr ? ""
      : loading_into                                  ? *loading_into
      : destination->requires_grad() && destination->is_leaf() ? "parameter"
                                                               : "";
  // Every op is checked (not sample mode): GPU inputs whose memory no op
  // nanhunt saw wrote are checked where they are first read.
  const bool first_reads_wanted = session.sampler() == nullptr;
  absl::InlinedVector<InputRead, 4> maybe_unknown;  // asked below
  // Filled in place: every GPU op's inputs, on the training thread.
  ForEachTensorIn(inputs, [&](int index, const at::Tensor& t) {
    if (!t.defined() || !FormatOfValues(t.scalar_type())) return;
    LateInput& in = op->inputs.emplace_back();
    in.arg_index = index;
    in.dtype = c10::toString(t.scalar_type());  // a static name
    if (t.is_nested() || t.is_complex()) {
      in.formatted_shape = ShapeOf(t);
    } else {
      in.sizes.assign(t.sizes().begin(), t.sizes().end());
    }
    if (t.is_cuda()) {
      in.storage = StorageKey(t);
      in.from_collective = session.monitor().IsCollective(in.storage);
      if (op->copies_unchanged && (destination == nullptr || index != traits.written_args[0])) {
        in.copy_source = true;
        if (!into_model.empty()) in.model_tensor = "copied into " + into_model;
      }
      // Optimizer state a checkpoint brought with inf/NaN, read by the step
      // guard before its optimizer's first step (loaded_state.h): known,
      // and named, as a host input is.
      if (std::optional<LoadedNonFinite> loaded = LoadedNonFiniteAt(in.storage)) {
        in.checked_on_host = true;
        in.counts = loaded->counts;
        in.max_abs = loaded->max_abs;
        in.model_tensor = std::move(loaded->name);
      } else if (first_reads_wanted && t.has_storage()) {
        maybe_unknown.push_back({&t, static_cast<int>(op->inputs.size()) - 1});
      }
    } else {
      // A host tensor fed to a GPU op (a batch being uploaded, a scalar):
      // checked now, as it may change before the result arrives.
      TensorFacts facts;
      if (CheckTensor(t, limits, facts)) {
        in.checked_on_host = true;
        in.counts = facts.counts;
        in.max_abs = MaxAbs(facts.format, facts.counts);
        in.python_number = t.unsafeGetTensorImpl()->is_wrapped_number();
        // `scores * torch.finfo(dtype).min` wraps the number into a tensor.
        in.holds_masks = IsMaskConstantArg(call.name, c10::IValue(t)) ||
                         HoldsMasksNow(t, limits);
        // A checkpoint loaded on the host, copied into the model's GPU
        // parameters (load_state_dict): named now, while Python can tell.
        // Under load_state_dict, the name it gave the destination: no walk.
        if (AnyNonFinite(in.counts) && !in.holds_masks && !KnownNonFinite(t)) {
          in.model_tensor = loading_into ? "copied into " + *loading_into
                                         : ModelTensorName(t, destination);
        }
      }
    }
  });
  op->kernels = DeviceKernelsSince(call.kernel_mark);
  if (!into_model.empty() || (op->phase == Phase::kForward && LateResults()->Wanted(op->op))) {
    // Seen near the limit or non-finite before: the line is worth its cost.
    std::vector<InputFacts> none;
    std::vector<at::Tensor> no_outputs;
    TorchOpContext context(inputs, none, no_outputs, traits, limits, torch_dir);
    op->source = context.Source();
    op->stack = context.Stack();
    op->via = context.Via();
  }
  // Outputs: host ones are checked now; device ones are enqueued. The op
  // is complete once every enqueued result is in (pending counts them).
  // An op has one output, or a few; a foreach op one per parameter.
  absl::InlinedVector<DeviceOutput, 4> device_outputs;
  op->outputs.reserve(outputs.size());
  op->output_sizes.reserve(outputs.size());
  op->output_storages.reserve(outputs.size());
  ForEachTensorIn(outputs, [&](int, const at::Tensor& t) {
    const auto format = t.defined() ? FormatOfValues(t.scalar_type()) : std::nullopt;
    if (!format) return;
    if (IsCheckableOnDevice(t)) {
      // Filled in place, as the inputs are; a complex one's shape now, as it
      // says what the counts are of (rare enough to format here).
      TensorFacts& facts = op->outputs.emplace_back();
      facts.format = *format;
      if (t.is_complex()) facts.shape = ShapeOf(t);
      if (!traits.written_not_returned.empty()) {  // batch norm's running statistics
        const std::string name = WrittenNotReturnedName(inputs, traits, t);
        if (!name.empty()) facts.shape = absl::StrCat(ShapeOf(t), " (", name, ", updated in place)");
      }
      op->output_sizes.emplace_back().assign(t.sizes().begin(), t.sizes().end());  // formatted later
      const OutputStorage& storage = op->output_storages.emplace_back(DescribeOutputStorage(t));
      device_outputs.push_back({&t, static_cast<int>(op->outputs.size()) - 1, storage.key});
      return;
    }
    TensorFacts facts;
    if (!CheckTensor(t, limits, facts)) {
      CountIfUnreadable(t, OwnerOf(*op));
      return;
    }
    op->outputs.push_back(std::move(facts));
    op->output_sizes.emplace_back();
    op->output_storages.emplace_back();
  });
  // Inputs in memory no op nanhunt saw wrote, read here first: checked
  // after the op, beside its outputs (it did not write them), so that
  // inf/NaN they hold are its input rather than its making. Memory it
  // writes is read by its outputs' checks: known from now on.
  absl::InlinedVector<InputRead, 2> first_reads;
  if (first_reads_wanted) NoteFirstReads(*op, maybe_unknown, device_outputs, first_reads);
  // Written by this op now: what they hold is this op's, not the checkpoint's.
  for (const DeviceOutput& out : device_outputs) ForgetLoadedNonFiniteAt(out.storage);
  if (!traits.collective) {
    // Written by this op now: no longer what a collective left there.
    absl::InlinedVector<const void*, 4> written;
    for (const DeviceOutput& out : device_outputs) written.push_back(out.storage);
    session.monitor().ForgetCollective(written);
  }
  const size_t n_checks = device_outputs.size() + first_reads.size();
  op->pending = static_cast<int>(n_checks) + 1;  // +1: this call
  // All made before the first address is taken: the list never grows after.
  op->result_contexts.resize(n_checks);
  std::vector<OutputCheck> checks;
  checks.reserve(n_checks);
  for (size_t k = 0; k < n_checks; ++k) {
    // The outputs first, then the inputs read here first.
    const bool output = k < device_outputs.size();
    const InputRead* read = output ? nullptr : &first_reads[k - device_outputs.size()];
    const at::Tensor& tensor = output ? *device_outputs[k].tensor : *read->tensor;
    ResultContext& context = op->result_contexts[k];
    context.op = op;
    context.kind = output ? ResultContext::Kind::kLateOutput : ResultContext::Kind::kLateInput;
    context.index = output ? device_outputs[k].index : read->index;
    OutputCheck check;
    check.tensor = tensor;
    check.described = Describe(tensor, output ? op->outputs[context.index].format
                                              : op->inputs[context.index].format);
    check.result = &context;
    checks.push_back(std::move(check));
  }
  EnqueueOrHold(lib, checks);
  for (OutputCheck& check : checks) {
    if (check.enqueued) continue;  // held ones were taken: enqueued with their batch
    const int index = check.result->index;
    if (check.result->kind == ResultContext::Kind::kLateInput) {
      // Not read after all (a capture): judged by its writers, as an
      // input never read. Its memory was noted known all the same, so
      // later reads of it are not checked either.
      op->inputs[index].checked_at_first_read = false;
      g_first_reads.fetch_sub(1, std::memory_order_relaxed);
    } else {
      // Not checked, and said so: never read as finite.
      CountNotEnqueued(OwnerOf(*op), check.error);
      // Zero elements: counted as a call, not as values found finite.
      op->outputs[index].counts = CheckCounts{};
    }
    op->pending.fetch_sub(1, std::memory_order_acq_rel);
  }
  std::move(let_go).Cancel();
  LateResults()->OnResult(op, -1, CheckCounts{});  // let go (see LateOp::pending)
  return true;
}

bool ReadValuesOnDevice(const std::vector<at::Tensor>& tensors, Session& session,
                        std::function<void(const std::vector<double>&)> then) {
  auto read = std::make_shared<ValueRead>();
  std::vector<NanhuntDeviceTensor> described;
  for (const at::Tensor& t : tensors) {
    const auto format = t.defined() ? torch_compat::FormatOf(t.scalar_type()) : std::nullopt;
    if (!format || !IsCheckableOnDevice(t) || t.numel() != 1) return false;
    read->formats.push_back(*format);
    described.push_back(Describe(t, *format));
  }
  const CudaLibrary& lib = Library(session);
  if (!lib.unavailable.empty()) return false;
  EnqueueEverythingHeld();  // results in order: the reads come after what is held
  read->then = std::move(then);
  read->values.assign(tensors.size(), 0.0);
  // One more than the reads until all are enqueued: a failed enqueue, or
  // a result that arrives before the last enqueue, must not complete it.
  read->pending.store(static_cast<int>(tensors.size()) + 1);
  for (size_t i = 0; i < tensors.size(); ++i) {
    std::string error;
    auto* pending = new ValueReadContext(read, static_cast<int>(i));
    void* context = AsContext(pending);
    if (!EnqueueOnStream(lib, tensors[i].device(), &described[i], &context, 1, &error)) {
      delete pending;
      return false;  // the reads already enqueued arrive and stay incomplete
    }
  }
  if (read->pending.fetch_sub(1, std::memory_order_acq_rel) == 1) read->then(read->values);
  return true;
}

void DrainDeviceChecks() {
  static std::atomic<bool> drained{false};
  if (LateResults() == nullptr || drained.exchange(true)) return;
  Session* session = Session::Get();
  if (session == nullptr) return;
  const CudaLibrary& lib = Library(*session);
  if (!lib.unavailable.empty()) return;
  // From Python's atexit while ops are still monitored; from the session's
  // finish (a LibTorch program, SIGTERM) after monitoring stopped: the
  // results held back or in flight are judged either way.
  DeliverWhileDrainingAtExit(true);
  StopHoldingChecks();
  lib.drain();
  DeliverWhileDrainingAtExit(false);
}

namespace {
std::atomic<bool> g_device_read{false};  // since the last iteration's first op
}  // namespace

bool ReadsDeviceOnHost(const at::RecordFunction& fn, const std::vector<c10::IValue>& inputs) {
  const char* name = fn.name();
  auto on_gpu = [&](size_t i) {
    return i < inputs.size() && inputs[i].isTensor() && inputs[i].toTensor().defined() &&
           inputs[i].toTensor().is_cuda();
  };
  if (strcmp(name, "aten::_local_scalar_dense") == 0) return on_gpu(0);
  // copy_(self, src, non_blocking): into host memory from a GPU, blocking.
  if (strcmp(name, "aten::copy_") == 0) {
    return inputs.size() >= 3 && inputs[0].isTensor() && inputs[0].toTensor().defined() &&
           inputs[0].toTensor().is_cpu() && on_gpu(1) && inputs[2].isBool() &&
           !inputs[2].toBool();
  }
  return false;
}

namespace {
// Whether this thread's current stream (on its current GPU) is capturing a
// CUDA graph: no waiting for the device then, which a capture forbids.
bool CurrentStreamCaptures(const CudaLibrary& lib) {
  if (lib.stream_takes_checks == nullptr || !c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) {
    return true;  // cannot tell: no wait
  }
  const c10::impl::DeviceGuardImplInterface* impl =
      c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  void* stream = nullptr;
  std::string why;
  if (!torch_compat::CurrentStreamHandle(impl->getDevice(), &stream, &why)) return true;
  char text[256] = {};
  return lib.stream_takes_checks(impl->getDevice().index(), stream, text, sizeof(text)) != 1;
}

// Waits for every check enqueued so far, held ones included, and delivers
// their results; not while this thread's stream captures a graph.
void DeliverEverythingEnqueued(Session& session) {
  const CudaLibrary& lib = Library(session);
  if (!lib.unavailable.empty() || CurrentStreamCaptures(lib)) return;
  EnqueueEverythingHeld();
  lib.drain();
}
}  // namespace

void NoteHostReadOfDevice() { g_device_read.store(true, std::memory_order_relaxed); }

bool DeviceReadSinceIterationBegan() { return g_device_read.load(std::memory_order_relaxed); }

void DeliverResultsBeforeIterationVerdict(const DeviceOpCall& call, Session& session,
                                          const char* op, const void* parameter) {
  if (!g_device_read.load(std::memory_order_relaxed)) return;  // every op: one load
  // Only an op that may begin an iteration (StepTracker::AtIterationWithoutUpdate).
  if (call.phase != Phase::kForward || !call.grad_enabled || !call.takes_grad_input) return;
  g_device_read.store(false, std::memory_order_relaxed);
  if (LateResults() == nullptr) return;
  Monitor& monitor = session.monitor();
  if (!monitor.JudgesIterationWithoutUpdate(call.phase, call.grad_enabled,
                                            call.takes_grad_input) &&
      !(monitor.may_give_up_iteration() && monitor.WouldGiveUpIteration(op, parameter))) {
    return;
  }
  DeliverEverythingEnqueued(session);
}

void DeliverResultsBeforeUpdateVerdict(Session& session) {
  if (LateResults() == nullptr || session.sampler() != nullptr ||
      !session.monitor().update_made_nonfinite()) {
    return;
  }
  DeliverEverythingEnqueued(session);
}

DeviceTotals GetDeviceTotals() {
  DeviceTotals totals;
  static_cast<EnqueueTotals&>(totals) = GetEnqueueTotals();
  totals.first_reads = g_first_reads.load(std::memory_order_relaxed);
  if (LateResults() != nullptr) {
    Session* session = Session::Get();
    if (session != nullptr) {
      CudaLibrary& lib = Library(*session);
      totals.unavailable = lib.unavailable;
      {
        absl::MutexLock lock(&lib.names_mu);
        totals.kernel_names_off = lib.kernel_names_off;
      }
      if (lib.unavailable.empty()) totals.waits = lib.waits();
      if (lib.kernel_launches != nullptr) totals.kernel_launches = lib.kernel_launches();
    }
  }
  return totals;
}

}  // namespace nanhunt

// Registered with Python's atexit at the first GPU output.
extern "C" __attribute__((visibility("default"))) void nanhunt_drain_device_checks() {
  nanhunt::DrainDeviceChecks();
}
