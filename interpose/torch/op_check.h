// Turning torch tensors into the facts core/ reasons about: the check of an
// op's outputs, its inputs when the outputs were not finite, and the fp32
// recomputation of an origin. Used on the op's own thread, inside the
// RecordFunction end callback, while the op's arguments are alive.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>

#include <optional>
#include <string>
#include <vector>

#include "core/late_ops.h"
#include "core/loss_scale_storages.h"
#include "core/monitor.h"
#include "core/unchecked_outputs.h"

namespace nanhunt {

// What the schema says about an op, cached per thread.
struct OpTraits {
  bool writes = false;  // in-place or out=: writes one of its arguments
  std::vector<int> written_args;  // in-place args (self of add_): positions
  std::vector<int> out_args;      // out= args: overwritten, not inputs
  // Of written_args, those no return aliases (batch norm's running
  // statistics): checked beside the outputs.
  std::vector<int> written_not_returned;
  // Writes a batch norm's running statistics (core/op_policy.h): module
  // buffers, never a buffer its enclosing op just made, so their values
  // before it are read even when it is nested.
  bool updates_running_stats = false;
  bool view = false;    // returns aliases of its inputs without writing
  bool random = false;  // takes a Generator: recomputing it would draw again
  bool uninitialised = false;  // outputs hold garbage by contract (empty)
  int workspace_output = -1;   // an output that is no values (_ctc_loss's log_alpha)
  bool copies_values = false;  // outputs are input values (core/op_policy)
  bool fills_with_scalar = false;  // zeros, ones, fill_, full
  int eps_arg = -1;  // an argument that holds an eps (core/op_policy.h's EpsArgument)
  bool makes_scalar_tensor = false;  // aten::scalar_tensor: maybe an eps (eps_values.h)
  bool returns_nested_write = false;  // _to_copy, clone, zeros... (core/op_policy)
  bool casts_result_buffer_first = false;  // mean (core/op_policy)
  bool casts = false;                      // to, _to_copy
  bool writes_whole_tensor = false;   // copy_, fill_...: judged by such an op inside one
  // What it writes holds none of its past (copy_, fill_, zero_): the old
  // values of its written arguments are no input.
  bool overwrites_written = false;
  int non_blocking_arg = -1;  // its `non_blocking` argument (copy_, _to_copy), or -1
  // CompositeImplicitAutograd (linear, matmul): all its work is nested ops,
  // each checked on its own, so its outputs are their outputs.
  bool composite = false;
  // Reuses results of its nested ops for its outputs: composite ops, and
  // foreach ops, whose CPU implementation is a loop of per-tensor ops.
  bool composed_of_nested_ops = false;
  bool fp32_listed = false;  // named by NANHUNT_FP32_OPS
  bool scaler_update = false;  // GradScaler's update (core/op_policy.h's kScalerUpdate)
  bool scales_loss = false;    // GradScaler's unscale or update: the update's phase
  bool collective = false;     // c10d::: what lands in its tensors is other ranks'
  bool reads_on_host = false;  // _local_scalar_dense, copy_: may wait for a GPU (ReadsDeviceOnHost)
  uint64_t generation = 0;     // of the live settings fp32_listed was read from
  std::optional<c10::OperatorHandle> handle;
  // Its schema's argument and return counts; -1 without a schema or for a
  // vararg one (OwnArguments, OwnReturns).
  int arguments = -1;
  int returns = -1;
};
// The traits of `fn`'s op. The reference stays valid for the thread's life
// (an op's frame keeps it from its start to its end).
const OpTraits& TraitsOf(const at::RecordFunction& fn);

// What RecordFunction recorded of the op's own arguments, and of its own
// returns. A boxed call records its whole stack, before the call and after
// it (Dispatcher::callBoxed), and torch.func's transforms call an op boxed
// on a stack that still holds the wrapped arguments beneath the unwrapped
// ones: the op's own are the stack's last. Without trimming, a wrapper is
// read as an argument (an origin's input "#0 (not checked)"), an argument
// index points at the wrong value, and what is left below the returns is
// checked as an output. `storage` holds trimmed returns.
c10::ArrayRef<const c10::IValue> OwnArguments(const at::RecordFunction& fn,
                                              const OpTraits& traits);
const std::vector<c10::IValue>& OwnReturns(const at::RecordFunction& fn, const OpTraits& traits,
                                           std::vector<c10::IValue>& storage);

// How a check may use this thread's cache of recent results (op_check.cc).
enum class CacheUse {
  kNone,            // scan, remember nothing
  kRemember,        // scan, and remember the result for later reuse
  kReuse,           // reuse a result for the same memory in the same state
  kReuseOrRemember  // both
};

// A copy from a GPU into host memory with non_blocking=True (copy_,
// _to_copy): its host outputs' values land when the GPU runs the copy,
// after the op has returned.
bool CopiedFromGpuLater(const std::vector<c10::IValue>& inputs, const OpTraits& traits);

// Tensors without real memory behind them: torch.compile's fake tensors
// while it traces, functionalization wrappers, torch.func's vmap and grad
// wrappers, tensor subclasses. Their data pointer throws; the real
// computation is checked where it runs.
bool WithoutOwnMemory(const at::Tensor& t);

// "[4, 16]"; a nested tensor's "[3, 3..5, 16] (nested)" (its components'
// count, then each dimension's size or range); a sparse tensor's
// "[100, 8] (sparse, 16 values stored)" and a complex one's
// "[4, 33] (complex64: 264 real and imaginary parts)" (what its counts are
// of).
std::string ShapeOf(const at::Tensor& t);

// The check's format of a dtype's values: a complex dtype's real and
// imaginary parts' (complex32: fp16), or FormatOf's.
std::optional<Format> FormatOfValues(at::ScalarType dtype);

// Checks a floating-point or complex tensor in host memory (a sparse one's stored
// values). False for tensors the check skips (other devices and layouts,
// integer dtypes); counting those
// that are outputs is the caller's business (CountIfUnreadable).
// With kReuse, only results remembered after `reuse_after` (a CacheMark)
// are reused.
bool CheckTensor(const at::Tensor& t, const CheckLimits& limits,
                 TensorFacts& facts, CacheUse cache = CacheUse::kNone,
                 uint64_t reuse_after = 0);

// Increases with every result this thread remembers: an op that takes the
// mark at its start can tell results of its own nested ops from older ones.
uint64_t CacheMark();

// The op whose outputs are checked: what an output no check read is filed
// under (core/unchecked_outputs.h), so that the trace names the ops.
struct OutputOwner {
  absl::string_view op;
  Phase phase = Phase::kForward;
  int64_t step = -1;  // -1: the monitor's step when it is counted
  // A composite op (OpTraits::composite): its outputs are its nested ops',
  // which counted those they could not read.
  bool outputs_are_nested_ops = false;
};

// Values scanned and values whose result was reused, over the process (for
// the trace's metadata: what the check cost).
struct ScanTotals {
  int64_t scanned = 0, reused = 0;
  int64_t unchecked = 0;        // floating outputs the check could not see
  bool unchecked_on_device = false;  // some of them on a GPU
};
ScanTotals GetScanTotals();
// A floating output of `owner` no check read, and why: filed under its op
// (UncheckedOps) and, except when it was captured into a CUDA graph
// (EnqueueTotals::in_capture counts those), counted in ScanTotals so that
// no report reads "all finite".
void CountUnchecked(const OutputOwner& owner, UncheckedReason why, bool on_device);
// Every op's unchecked outputs, for the trace at exit.
UncheckedOutputs& UncheckedOps();
// Counts `t`, an op's output that CheckTensor refused, when it holds
// floating-point values that the check could not read (on a GPU without
// the GPU path, sparse); tensors without values or memory of their own
// (meta and fake tensors while torch.compile traces) are not counted. An input is never
// counted: the op's inputs on a GPU are read from earlier ops' results.
// Whether it counted `t`.
bool CountIfUnreadable(const at::Tensor& t, const OutputOwner& owner);

// True when every floating-point tensor among `inputs` and `outputs` has the
// same dtype (a copy that converts nothing).
bool SameFloatingDtype(const std::vector<c10::IValue>& inputs,
                       const std::vector<c10::IValue>& outputs);

// True when a Python float or Scalar argument is NaN or infinite.
bool HasNonFiniteScalar(const std::vector<c10::IValue>& inputs);

// Whether argument `v` of `op` is a mask constant (IsMaskConstant in
// core/op_policy.h) given as it is: a Python float or Scalar, or a
// one-value host tensor (a Python number torch wrapped, torch.tensor(x)).
// Memory that holds them is the registry's to say (kMaskConstants).
bool IsMaskConstantArg(absl::string_view op, const c10::IValue& v);
// A Python float or Scalar argument of `op` is one (a fill's, which is not
// checked otherwise).
bool HasMaskConstantScalar(absl::string_view op, const std::vector<c10::IValue>& inputs);
// Whether host tensor `t` holds masks: its memory is known to (the
// registry says mask constants or deliberate ±inf), and its values still
// look so (near the limit, or ±inf) rather than a reused address's.
bool HoldsMasksNow(const at::Tensor& t, const CheckLimits& limits);
// Forgets what the registry knew of the memory of `outputs` that cover
// their storage whole, written by an op left unchecked (a fill, a copy of
// finite values): a fresh tensor at a freed mask's address is no mask.
void ForgetWholeStorages(const std::vector<c10::IValue>& outputs);

// Output `t`'s name when it is an argument the op of `traits` writes
// without returning it (batch norm's "running_var"), else empty: such
// outputs are otherwise told apart by position only.
std::string WrittenNotReturnedName(const std::vector<c10::IValue>& inputs,
                                   const OpTraits& traits, const at::Tensor& t);
// Names them in `facts`' shapes: "[32] (running_var, updated in place)".
void NameWrittenNotReturned(const std::vector<c10::IValue>& inputs, const OpTraits& traits,
                            const std::vector<at::Tensor>& tensors,
                            std::vector<TensorFacts>& facts);

// Checks every tensor among `outputs` of `owner`; appends facts and the
// tensors. Whether every output that holds floating-point values was read.
bool CheckOutputs(const std::vector<c10::IValue>& outputs, const OutputOwner& owner,
                  const CheckLimits& limits, CacheUse cache,
                  uint64_t reuse_after, std::vector<TensorFacts>& facts,
                  std::vector<at::Tensor>& tensors);

// What `t`, which brought inf/NaN no checked op made, is to the model:
// "parameter 2.weight", "Adam state exp_avg_sq of 2.weight" (see
// model_tensor_names.h); without Python to ask, "parameter" for a leaf
// that requires grad or a view of one. A tensor of no module that a copy
// writes into one (`destination`: load_state_dict's copy_ of a checkpoint
// saved in another dtype, or kept on the host) is "copied into parameter
// 2.weight". "" when it is none of these (a batch).
std::string ModelTensorName(const at::Tensor& t, const at::Tensor* destination);
// The tensor a whole-tensor write (copy_'s self) writes, or nullptr.
const at::Tensor* WholeWriteDestination(const std::vector<c10::IValue>& inputs,
                                        const OpTraits& traits);

// Storages whose last check found non-finite values, so that a non-finite
// input can be told apart: produced by an earlier op, or arrived from
// outside (a data batch). Thread-safe.
void RememberChecked(const at::Tensor& t, StorageState state);
bool KnownNonFinite(const at::Tensor& t);
bool KnownDeliberate(const at::Tensor& t);  // a mask's ±inf
bool KnownOwnMasked(const at::Tensor& t);   // a backward formula's, masked by it
// The same for results that arrive after the op (GPU outputs), by storage
// (StorageKey) and the weak reference taken at enqueue.
const void* StorageKey(const at::Tensor& t);
OutputStorage DescribeOutputStorage(const at::Tensor& t);
// A weak reference to `storage` for torch-free code, and whether the
// storage of one (its impl()) still owns memory.
WeakStorage WeakStorageOf(const c10::Storage& storage);
bool StorageAlive(void* impl);
void RememberLateOutput(const OutputStorage& output, StorageState state);
StorageState StorageStateOf(const void* key);
// Whether a storage known to hold inf/NaN (not a mask's) may still be
// alive: true for one alive, or only known by its memory.
// A step whose inf/NaN all went with the temporaries that held them
// changed no weight, gradient or buffer with them. Without
// `counting_single_values`, a storage of one value that is no parameter
// (a loss, a gradient norm: a verdict on gradients, not one of them) does
// not count.
bool NonFiniteStillHeld(bool counting_single_values = true);

// GradScaler's scales (core/loss_scale_storages.h), and whether an op's
// inputs or outputs include one: such an op is OpEvent::loss_scaling.
LossScaleStorages& LossScales();
bool TouchesLossScale(const std::vector<c10::IValue>& inputs,
                      const std::vector<c10::IValue>& outputs);
// An op in `phase` computes gradients a GradScaler scales
// (OpEvent::scaled_gradients): a backward op once a loss scale is known.
// NANHUNT_FP32_OPS=auto learns nothing from them: their overflow is the
// scaler's to handle, and running the op in fp32 would buy nothing.
bool ScaledGradients(Phase phase);

// For ops that are not checked because they only copy values: their
// outputs are known non-finite when an input was. Cheap while nothing is
// known non-finite.
// An argument the op overwrites whole (copy_'s self) carries nothing.
void CarryNonFinite(const std::vector<c10::IValue>& inputs,
                    const std::vector<c10::IValue>& outputs, const OpTraits& traits);

// Checks the arguments an in-place or out= op is about to overwrite, before
// it runs: afterwards their old values are gone, and whether they were
// finite decides between origin and propagation.
// For top-level ops only (every earlier op has finished and been checked,
// so remembered results are current): inside another op, the kernel may
// have written the memory since; those ops get UnknownWrittenArgs instead.
std::vector<InputFacts> CheckWrittenArgs(c10::ArrayRef<const c10::IValue> inputs,
                                         const OpTraits& traits,
                                         const CheckLimits& limits);
std::vector<InputFacts> UnknownWrittenArgs(const OpTraits& traits);

// GradScaler's update (`_amp_update_scale_(scale, growth_tracker,
// found_inf, ...)`): the new scale and whether non-finite gradients were
// found. Host tensors only: reading device tensors would sync the stream
// (the plugin reads those through the check ring, ReadValuesOnDevice).
struct ScalerUpdate {
  double scale;
  bool found_inf;
};
std::optional<ScalerUpdate> ReadScalerUpdate(const std::vector<c10::IValue>& inputs);

// The OpContext of one finished op.
class TorchOpContext final : public OpContext {
 public:
  // `written_before`: CheckWrittenArgs of the op, taken at its start.
  TorchOpContext(const std::vector<c10::IValue>& inputs,
                 const std::vector<InputFacts>& written_before,
                 const std::vector<at::Tensor>& outputs, const OpTraits& traits,
                 const CheckLimits& limits, const std::string& torch_dir);
  std::vector<InputFacts> Inputs() override;
  // An op nested in one that judges its inputs again at its end: its own
  // inputs need no model names (each lookup walks Python's objects, about
  // 50 ms, and a run has 16), for a finding of its own would be the
  // enclosing op's, which names what it was given.
  void LeaveModelTensorsUnnamed() { name_model_tensors_ = false; }
  std::string Source() override;
  std::string Stack() override;
  std::string Via() override;
  CallSite BackwardCallSite() override;
  std::optional<double> RecomputeFp32MaxAbs() override;
  bool InputsHoldMasks(absl::string_view op) override;
  bool OutputsHoldMasks() override;
  bool NonFiniteGradientsHeld() override;

 private:
  void Locate();

  const std::vector<c10::IValue>& inputs_;
  const std::vector<InputFacts>& written_before_;
  const std::vector<at::Tensor>& outputs_;
  const OpTraits& traits_;
  const CheckLimits& limits_;
  const std::string& torch_dir_;
  bool located_ = false;
  bool name_model_tensors_ = true;
  std::string source_, stack_, via_;
};

}  // namespace nanhunt
