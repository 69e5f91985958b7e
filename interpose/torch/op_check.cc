#include "interpose/torch/op_check.h"

#include <ATen/Parallel.h>
#include <ATen/SparseCsrTensorImpl.h>
#include <ATen/SparseTensorImpl.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "core/cpu_check.h"
#include "core/op_policy.h"
#include "interpose/torch/eps_values.h"
#include "interpose/torch/model_tensor_names.h"
#include "interpose/torch/sample_control.h"
#include "interpose/torch/session.h"
#include "interpose/torch/source_location.h"
#include "interpose/torch/tls_address.h"
#include "interpose/torch/torch_compat.h"

namespace nanhunt {
namespace {

// Our own tensor work (copies, the fp32 recomputation) must be invisible:
// to our callbacks, to profilers, to autograd and to autocast.
struct QuietScope {
  at::RecordFunctionGuard no_records{false};
  at::NoGradGuard no_grad;
  c10::impl::ExcludeDispatchKeyGuard no_autocast{c10::autocast_dispatch_keyset};
};

// A nested tensor (torch.nested; what nn.TransformerEncoder's fast path
// makes of a padded batch in eval mode) has no sizes or strides of its own:
// they throw. Its values are its components', each an ordinary view.
std::vector<at::Tensor> ComponentsOf(const at::Tensor& nested) {
  QuietScope quiet;
  return nested.unbind();
}

// "[3, 3..5, 16] (nested)": how many components, then each dimension's
// size, or its range where the components differ (torch.Size([3, j1, 16])
// for a jagged one).
std::string NestedShapeOf(const std::vector<at::Tensor>& components) {
  std::vector<std::string> dims = {absl::StrCat(components.size())};
  if (!components.empty()) {
    for (int64_t d = 0; d < components[0].dim(); ++d) {
      int64_t low = components[0].size(d), high = low;
      for (const at::Tensor& c : components) {
        low = std::min(low, c.size(d));
        high = std::max(high, c.size(d));
      }
      dims.push_back(low == high ? absl::StrCat(low) : absl::StrCat(low, "..", high));
    }
  }
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "] (nested)");
}

absl::Mutex g_registry_mu;
// What the registry knows of a storage: its state and, for a host op's
// output, the storage itself, held weakly: whether it is still alive
// (NonFiniteStillHeld). Results that arrive later know only the memory.
struct RegisteredStorage {
  StorageState state = StorageState::kFinite;
  c10::weak_intrusive_ptr<c10::StorageImpl> storage{c10::intrusive_ptr<c10::StorageImpl>()};
  bool known = false;  // `storage` was given
  // One value that is no parameter: a loss, a gradient norm, a found_inf
  // flag. A program that skips an update keeps its verdict in one.
  bool single_value = false;
};
// Leaked on purpose: used by callbacks until the process ends.
// Storages whose last check found inf/NaN: kNonFinite, or kDeliberate
// when they were a mask's ±inf (kNanMarkers, kOwnMasked: see StorageState).
// Finite ones are not kept.
auto* g_nonfinite = new absl::flat_hash_map<const void*, RegisteredStorage>();
std::atomic<size_t> g_nonfinite_size{0};

}  // namespace

namespace {

// A sparse tensor's values (COO: a row per stored index; CSR and the other
// compressed layouts: an element or block per stored index) are a dense
// tensor of their own: what the check reads and the storage it tracks.
// Only a tensor with memory of its own is its TensorImpl: a wrapper of a
// sparse tensor (functionalization, vmap, a subclass) says sparse too.
bool IsSparse(const at::Tensor& t) {
  return t.defined() && (t.is_sparse() || t.unsafeGetTensorImpl()->is_sparse_compressed()) &&
         !WithoutOwnMemory(t);
}

at::Tensor StoredValues(const at::Tensor& sparse) {
  // Read from the TensorImpl: _values() and values() are ops, which our
  // callbacks would see.
  if (sparse.is_sparse()) {
    return static_cast<at::SparseTensorImpl*>(sparse.unsafeGetTensorImpl())->values();
  }
  return static_cast<at::SparseCsrTensorImpl*>(sparse.unsafeGetTensorImpl())->values();
}

}  // namespace

const void* StorageKey(const at::Tensor& t) {
  if (C10_LIKELY(t.has_storage())) return t.storage().data();
  if (!IsSparse(t)) return nullptr;
  const at::Tensor values = StoredValues(t);
  return values.has_storage() ? values.storage().data() : nullptr;
}

namespace {

void ForEachTensor(const c10::IValue& v,
                   const std::function<void(const at::Tensor&)>& fn) {
  if (v.isTensor()) {
    fn(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorVector()) fn(t);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (e.isTensor()) fn(e.toTensor());
    }
  } else if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements()) ForEachTensor(e, fn);
  }
}

}  // namespace

LossScaleStorages& LossScales() {
  static auto* scales = new LossScaleStorages;  // leaked, like the session
  return *scales;
}

bool ScaledGradients(Phase phase) {
  return phase == Phase::kBackward && !LossScales().empty();
}

bool TouchesLossScale(const std::vector<c10::IValue>& inputs,
                      const std::vector<c10::IValue>& outputs) {
  LossScaleStorages& scales = LossScales();
  if (scales.empty()) return false;
  bool found = false;
  auto look = [&](const at::Tensor& t) {
    found = found || (t.defined() && scales.Contains(StorageKey(t)));
  };
  for (const c10::IValue& v : inputs) ForEachTensor(v, look);
  for (const c10::IValue& v : outputs) ForEachTensor(v, look);
  return found;
}

namespace {

// The last few tensors this thread checked at the end of an op, so that
// the same memory in the same state is not scanned twice: the output of
// linear is the output of the addmm inside it, and the parameter an
// optimizer's add_ is about to overwrite was checked as an output just
// before.
//
// When may a result be reused? Version counters only move when an in-place
// op passes the autograd layer; kernels write below it without a bump
// (randn's normal_ on a fresh tensor). So results are remembered only at
// the end of ops (never from a pre-check of memory about to change), and
// reused only where no kernel can have written since: at the end of a
// composite op, whose writes are all nested, checked ops; or before a
// top-level in-place op, when every earlier op has ended. The newest
// result for a data pointer wins. The storage is held weakly: a freed
// storage never matches.
struct CachedCheck {
  uint64_t mark = 0;  // CacheMark() when remembered
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  int64_t numel = 0;
  at::ScalarType dtype = at::kFloat;
  int64_t version = 0;  // the version counter is 32 bits in older torch
  CheckCounts counts;
};
// Keyed by data pointer, so the newest result for a piece of memory
// replaces older ones. Bounded: an optimizer touches a few tensors per
// parameter, and a forgotten result only costs a scan.
constexpr size_t kMaxCachedChecks = 4096;
thread_local absl::flat_hash_map<const void*, CachedCheck> t_cache;
thread_local uint64_t t_mark = 0;

const CheckCounts* FindCached(const at::Tensor& t, uint64_t after) {
  if (t.is_inference()) return nullptr;  // no version counter
  auto it = t_cache.find(t.data_ptr());
  if (it == t_cache.end()) return nullptr;
  const CachedCheck& e = it->second;
  if (e.mark <= after || e.numel != t.numel() || e.dtype != t.scalar_type() ||
      e.version != t._version() ||
      e.storage.lock().get() != t.storage().unsafeGetStorageImpl()) {
    return nullptr;
  }
  return &e.counts;
}

void RememberCounts(const at::Tensor& t, const CheckCounts& counts) {
  if (t.is_inference()) return;
  if (t_cache.size() >= kMaxCachedChecks) t_cache.clear();
  t_cache.insert_or_assign(
      t.data_ptr(), CachedCheck{++t_mark, t.storage().getWeakStorageImpl(),
                                t.numel(), t.scalar_type(), t._version(),
                                counts});
}

std::atomic<int64_t> g_scanned{0};
std::atomic<int64_t> g_reused{0};
std::atomic<int64_t> g_unchecked{0};
std::atomic<unsigned> g_unchecked_devices{0};

// Large tensors are scanned by torch's own intra-op threads, which sit idle
// between ops: the scan then costs the training thread a fraction.
constexpr int64_t kParallelGrain = 1 << 16;

CheckCounts ScanDense(Format format, const void* data, int64_t n,
                      const CheckLimits& limits) {
  if (n < 2 * kParallelGrain || at::get_num_threads() < 2 ||
      at::in_parallel_region()) {
    return CheckHostBuffer(format, data, n, limits);
  }
  const int64_t chunks = (n + kParallelGrain - 1) / kParallelGrain;
  std::vector<CheckCounts> parts(static_cast<size_t>(chunks));
  const size_t width = FormatWidth(format);
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t start = i * kParallelGrain;
      parts[static_cast<size_t>(i)] = CheckHostBuffer(
          format, static_cast<const char*>(data) + start * width,
          std::min(kParallelGrain, n - start), limits);
    }
  });
  CheckCounts total;
  for (const CheckCounts& p : parts) MergeCounts(total, p);
  return total;
}

}  // namespace

uint64_t CacheMark() { return t_mark; }

ScanTotals GetScanTotals() {
  return {g_scanned.load(), g_reused.load(), g_unchecked.load(),
          g_unchecked_devices.load() != 0};
}

bool SameFloatingDtype(const std::vector<c10::IValue>& inputs,
                       const std::vector<c10::IValue>& outputs) {
  std::optional<at::ScalarType> seen;
  bool same = true;
  auto visit = [&](const at::Tensor& t) {
    if (!t.defined() || !t.is_floating_point()) return;
    if (!seen) seen = t.scalar_type();
    same = same && *seen == t.scalar_type();
  };
  for (const c10::IValue& v : inputs) ForEachTensor(v, visit);
  for (const c10::IValue& v : outputs) ForEachTensor(v, visit);
  return same && seen.has_value();
}

bool HasNonFiniteScalar(const std::vector<c10::IValue>& inputs) {
  for (const c10::IValue& v : inputs) {
    if (v.isDouble() && !std::isfinite(v.toDouble())) return true;
  }
  return false;
}

bool IsMaskConstantArg(absl::string_view op, const c10::IValue& v) {
  if (v.isDouble()) return IsMaskConstant(op, v.toDouble());
  if (!v.isTensor()) return false;
  const std::optional<double> value = HostScalarValue(v.toTensor());
  return value && IsMaskConstant(op, *value);
}

bool HasMaskConstantScalar(absl::string_view op, const std::vector<c10::IValue>& inputs) {
  for (const c10::IValue& v : inputs) {
    if (v.isDouble() && IsMaskConstant(op, v.toDouble())) return true;
  }
  return false;
}

namespace {

// NANHUNT_FP32_OPS as it is now (a reload may change it): whether it names
// the op of `fn`.
bool Fp32Listed(const at::RecordFunction& fn) {
  Session* s = Session::Get();
  if (s == nullptr) return false;
  absl::MutexLock lock(&s->live().mu);
  return !s->live().fp32_ops.empty() &&
         MatchesOpPattern(fn.name(), torch_compat::OverloadName(fn), s->live().fp32_ops);
}

// Per thread, so no lock on the hot path. Keyed by the name and overload
// pointers, which live as long as the operator's schema. `all` holds
// nodes, so that the traits an op's frame keeps from its start stay where
// they are while its nested ops add theirs; never cleared, for the same
// reason. `recent`, direct-mapped by the name's address, answers most
// lookups for a fraction of a hash map's find: a step repeats a few dozen
// ops (bench/op_cost.py).
struct TraitsCache {
  struct Recent {
    const char* name = nullptr;
    const char* overload = nullptr;
    OpTraits* traits = nullptr;
  };
  static constexpr size_t kRecent = 256;
  std::array<Recent, kRecent> recent;
  absl::node_hash_map<std::pair<const char*, const char*>, OpTraits> all;

  static size_t Slot(const char* name) {
    const auto p = reinterpret_cast<uintptr_t>(name);
    return ((p >> 4) ^ (p >> 12)) & (kRecent - 1);
  }
};

thread_local TraitsCache t_traits;

}  // namespace

const OpTraits& TraitsOf(const at::RecordFunction& fn) {
  TraitsCache& cache = KeepAddress(t_traits);
  const uint64_t generation =
      Session::Get() != nullptr
          ? Session::Get()->live().generation.load(std::memory_order_relaxed)
          : 0;
  const char* name = fn.name();
  const char* overload = torch_compat::OverloadName(fn);
  TraitsCache::Recent& recent = cache.recent[TraitsCache::Slot(name)];
  OpTraits* found = nullptr;
  if (recent.name == name && recent.overload == overload) {
    found = recent.traits;
  } else if (auto it = cache.all.find(std::make_pair(name, overload)); it != cache.all.end()) {
    found = &it->second;
    recent = {name, overload, found};
  }
  if (found != nullptr) {
    // A config reload may have changed which ops are listed.
    if (found->generation != generation) {
      found->fp32_listed = Fp32Listed(fn);
      found->generation = generation;
    }
    return *found;
  }
  OpTraits traits;
  traits.generation = generation;
  traits.uninitialised = OutputsAreUninitialised(fn.name());
  traits.workspace_output = WorkspaceOutput(fn.name());
  traits.copies_values = CopiesValues(fn.name());
  traits.fills_with_scalar = FillsWithScalar(fn.name());
  traits.eps_arg = EpsArgument(fn.name());
  traits.makes_scalar_tensor = strcmp(fn.name(), "aten::scalar_tensor") == 0;
  traits.returns_nested_write = ReturnsNestedWrite(fn.name());
  traits.casts_result_buffer_first = CastsResultBufferFirst(fn.name());
  traits.casts = strcmp(fn.name(), "aten::to") == 0 || strcmp(fn.name(), "aten::_to_copy") == 0;
  traits.writes_whole_tensor = WritesWholeTensor(fn.name());
  traits.overwrites_written = traits.fills_with_scalar || traits.writes_whole_tensor;
  traits.scaler_update = strcmp(fn.name(), kScalerUpdate) == 0;
  traits.scales_loss = ScalesLoss(fn.name());
  traits.collective = strncmp(fn.name(), "c10d::", 6) == 0;
  traits.reads_on_host = strcmp(fn.name(), "aten::_local_scalar_dense") == 0 ||
                         strcmp(fn.name(), "aten::copy_") == 0;
  traits.fp32_listed = Fp32Listed(fn);
  if (auto op_name = fn.operator_name()) {
    traits.handle = c10::Dispatcher::singleton().findOp(*op_name);
  }
  if (traits.handle) {
    traits.composite = traits.handle->hasKernelForDispatchKey(
        c10::DispatchKey::CompositeImplicitAutograd);
    traits.composed_of_nested_ops =
        traits.composite ||
        absl::StartsWith(fn.name(), "aten::_foreach_");
    const c10::FunctionSchema& schema = traits.handle->schema();
    const auto& args = schema.arguments();
    if (!schema.is_vararg() && !schema.is_varret()) {
      traits.arguments = static_cast<int>(args.size());
      traits.returns = static_cast<int>(schema.returns().size());
    }
    // as_strided_, squeeze_, transpose_...: they change a tensor's sizes,
    // not its values, so they are views (max and median squeeze_ their
    // result buffer before writing it: checking that read garbage).
    const bool changes_only_metadata = traits.handle->hasTag(at::Tag::inplace_view);
    for (size_t i = 0; i < args.size(); ++i) {
      const auto& arg = args[i];
      // A composite batch_norm writes its running statistics through the
      // kernel inside it, which is checked.
      const bool writes_unannotated = !traits.composite &&
                                      UpdatesRunningStats(fn.name()) &&
                                      IsRunningStatistic(arg.name());
      traits.updates_running_stats |= writes_unannotated;
      if ((arg.alias_info() && arg.alias_info()->isWrite() && !changes_only_metadata) ||
          writes_unannotated) {
        traits.writes = true;
        (arg.is_out() ? traits.out_args : traits.written_args)
            .push_back(static_cast<int>(i));
      }
      auto type = arg.type();
      if (auto opt = type->cast<c10::OptionalType>()) type = opt->getElementType();
      if (type->kind() == c10::TypeKind::GeneratorType) traits.random = true;
      if (arg.name() == "non_blocking") traits.non_blocking_arg = static_cast<int>(i);
    }
    traits.view = !traits.writes && !schema.returns().empty();
    for (const auto& ret : schema.returns()) {
      if (!ret.alias_info()) traits.view = false;
    }
    // Written but not returned (native_batch_norm's running statistics,
    // _native_batch_norm_legit's): what it returns does not show them.
    for (int i : traits.written_args) {
      const auto& written = args[static_cast<size_t>(i)].alias_info();
      bool returned = false;
      for (const auto& ret : schema.returns()) {
        returned |= written && ret.alias_info() &&
                    ret.alias_info()->beforeSets() == written->beforeSets();
      }
      if (!returned) traits.written_not_returned.push_back(i);
    }
  }
  if (PassesInputThrough(fn.name())) traits.view = true;
  OpTraits& made = cache.all.emplace(std::make_pair(name, overload), traits).first->second;
  recent = {name, overload, &made};
  return made;
}

UncheckedOutputs& UncheckedOps() {
  static auto* ops = new UncheckedOutputs;  // leaked, like the session
  return *ops;
}

void CountUnchecked(const OutputOwner& owner, UncheckedReason why, bool on_device) {
  int64_t step = owner.step;
  if (step < 0) {
    Session* session = Session::Get();
    step = session != nullptr ? session->monitor().step() : 0;
  }
  UncheckedOps().Add(owner.op, owner.phase, why, step);
  if (why == UncheckedReason::kGraphCapture) return;
  g_unchecked.fetch_add(1, std::memory_order_relaxed);
  if (on_device) g_unchecked_devices.fetch_or(1u, std::memory_order_relaxed);
}

c10::ArrayRef<const c10::IValue> OwnArguments(const at::RecordFunction& fn,
                                              const OpTraits& traits) {
  const c10::ArrayRef<const c10::IValue> recorded = fn.inputs();
  if (traits.arguments < 0 || recorded.size() <= static_cast<size_t>(traits.arguments)) {
    return recorded;
  }
  return recorded.slice(recorded.size() - traits.arguments);
}

const std::vector<c10::IValue>& OwnReturns(const at::RecordFunction& fn, const OpTraits& traits,
                                           std::vector<c10::IValue>& storage) {
  const std::vector<c10::IValue>& recorded = fn.outputs();
  if (traits.returns < 0 || recorded.size() <= static_cast<size_t>(traits.returns)) {
    return recorded;
  }
  storage.assign(recorded.end() - traits.returns, recorded.end());
  return storage;
}

bool CopiedFromGpuLater(const std::vector<c10::IValue>& inputs, const OpTraits& traits) {
  const int i = traits.non_blocking_arg;
  if (i < 0 || static_cast<size_t>(i) >= inputs.size() || !inputs[i].isBool() ||
      !inputs[i].toBool()) {
    return false;
  }
  for (const c10::IValue& v : inputs) {
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().is_cuda()) return true;
  }
  return false;
}

bool WithoutOwnMemory(const at::Tensor& t) {
  return t.key_set().has_any(c10::DispatchKeySet(
      {c10::DispatchKey::Python, c10::DispatchKey::Functionalize,
       c10::DispatchKey::PythonTLSSnapshot, c10::DispatchKey::FuncTorchBatched,
       c10::DispatchKey::FuncTorchGradWrapper}));
}

std::optional<Format> FormatOfValues(at::ScalarType dtype) {
  if (const auto format = torch_compat::FormatOf(dtype)) return format;
  if (c10::isComplexType(dtype)) return torch_compat::FormatOf(c10::toRealValueType(dtype));
  return std::nullopt;
}

namespace {

absl::string_view ComplexName(at::ScalarType dtype) {
  switch (dtype) {
    case at::kComplexHalf: return "complex32";
    case at::kComplexFloat: return "complex64";
    default: return "complex128";
  }
}

absl::string_view SparseLayoutName(c10::Layout layout) {
  switch (layout) {
    case c10::kSparseCsr: return "sparse CSR";
    case c10::kSparseCsc: return "sparse CSC";
    case c10::kSparseBsr: return "sparse BSR";
    case c10::kSparseBsc: return "sparse BSC";
    default: return "sparse";
  }
}

// " (sparse, 16 values stored)", " (complex64: 264 real and imaginary
// parts)": what a tensor's counts are of. Out of line: rare.
ABSL_ATTRIBUTE_NOINLINE void AppendWhatIsStored(const at::Tensor& t, std::string& shape) {
  if (IsSparse(t)) {
    absl::StrAppend(&shape, " (", SparseLayoutName(t.layout()), ", ",
                    StoredValues(t).numel(), " values stored)");
  } else if (t.is_complex()) {
    absl::StrAppend(&shape, " (", ComplexName(t.scalar_type()), ": ", 2 * t.numel(),
                    " real and imaginary parts)");
  }
}

}  // namespace

std::string ShapeOf(const at::Tensor& t) {
  if (t.is_nested()) return NestedShapeOf(ComponentsOf(t));
  std::string shape = absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]");
  if (C10_UNLIKELY(t.layout() != c10::kStrided || t.is_complex())) AppendWhatIsStored(t, shape);
  return shape;
}

namespace {

bool InHostMemory(const at::Tensor& t) {
  return t.layout() == at::kStrided && t.device().is_cpu() && t.has_storage();
}

}  // namespace

bool CountIfUnreadable(const at::Tensor& t, const OutputOwner& owner) {
  // Floating-point values the check cannot see (CUDA without the GPU path,
  // mkldnn, sparse on a GPU...): counted, so that no report claims "all
  // finite" about values nobody looked at. Meta tensors hold no values to see: they are
  // how torch.compile and FakeTensorMode work out shapes while tracing.
  if (!owner.outputs_are_nested_ops && t.defined() && FormatOfValues(t.scalar_type()) &&
      !WithoutOwnMemory(t) && !InHostMemory(t) && !t.is_meta()) {
    CountUnchecked(owner, UncheckedReason::kUnreadable, t.is_cuda());
    return true;
  }
  return false;
}

bool CheckTensor(const at::Tensor& t, const CheckLimits& limits,
                 TensorFacts& facts, CacheUse cache, uint64_t reuse_after) {
  if (!t.defined()) return false;
  if (C10_UNLIKELY(t.layout() != c10::kStrided) && IsSparse(t)) {
    // Its values are a dense tensor of their own. Not cached: sparse ops
    // may give a tensor new values, or write them below the autograd layer.
    if (!CheckTensor(StoredValues(t), limits, facts)) return false;
    facts.shape = ShapeOf(t);
    return true;
  }
  const auto format = FormatOfValues(t.scalar_type());
  if (!format || WithoutOwnMemory(t) || !InHostMemory(t)) return false;
  facts.format = *format;
  if (t.is_nested()) {
    const std::vector<at::Tensor> components = ComponentsOf(t);
    facts.shape = NestedShapeOf(components);
    facts.counts = CheckCounts{};
    for (const at::Tensor& c : components) {
      TensorFacts part;
      if (!CheckTensor(c, limits, part)) return false;
      MergeCounts(facts.counts, part.counts);
    }
    return true;
  }
  facts.shape = ShapeOf(t);
  // A complex tensor is checked as its real and imaginary parts, as
  // torch.view_as_real shows them: two side by side per element.
  const int64_t n = t.is_complex() ? 2 * t.numel() : t.numel();
  if (n == 0) {
    facts.counts = CheckCounts{};
    return true;
  }
  if (t.data_ptr() == nullptr) return false;
  bool dense = t.is_non_overlapping_and_dense();
  for (int64_t s : t.strides()) dense = dense && s >= 0;
  const bool reuse = cache == CacheUse::kReuse || cache == CacheUse::kReuseOrRemember;
  const bool remember =
      cache == CacheUse::kRemember || cache == CacheUse::kReuseOrRemember;
  if (dense) {
    if (const CheckCounts* cached = reuse ? FindCached(t, reuse_after) : nullptr) {
      facts.counts = *cached;
      g_reused.fetch_add(n, std::memory_order_relaxed);
      return true;
    }
    g_scanned.fetch_add(n, std::memory_order_relaxed);
    // Order does not matter to the check: a dense tensor's elements are the
    // n values from its data pointer on, whatever its strides.
    facts.counts = ScanDense(*format, t.data_ptr(), n, limits);
    if (remember) RememberCounts(t, facts.counts);
  } else {
    QuietScope quiet;
    g_scanned.fetch_add(n, std::memory_order_relaxed);
    const at::Tensor c = t.contiguous();
    facts.counts = ScanDense(*format, c.data_ptr(), n, limits);
  }
  return true;
}

std::string WrittenNotReturnedName(const std::vector<c10::IValue>& inputs,
                                   const OpTraits& traits, const at::Tensor& t) {
  if (!traits.handle || !t.defined()) return "";
  for (int i : traits.written_not_returned) {
    const auto index = static_cast<size_t>(i);
    if (index < inputs.size() && inputs[index].isTensor() &&
        inputs[index].toTensor().is_same(t)) {
      return traits.handle->schema().arguments()[index].name();
    }
  }
  return "";
}

void NameWrittenNotReturned(const std::vector<c10::IValue>& inputs, const OpTraits& traits,
                            const std::vector<at::Tensor>& tensors,
                            std::vector<TensorFacts>& facts) {
  for (size_t k = 0; k < tensors.size() && k < facts.size(); ++k) {
    const std::string name = WrittenNotReturnedName(inputs, traits, tensors[k]);
    if (!name.empty()) absl::StrAppend(&facts[k].shape, " (", name, ", updated in place)");
  }
}

bool CheckOutputs(const std::vector<c10::IValue>& outputs, const OutputOwner& owner,
                  const CheckLimits& limits, CacheUse cache,
                  uint64_t reuse_after, std::vector<TensorFacts>& facts,
                  std::vector<at::Tensor>& tensors) {
  bool all_read = true;
  for (const c10::IValue& v : outputs) {
    ForEachTensor(v, [&](const at::Tensor& t) {
      TensorFacts f;
      if (CheckTensor(t, limits, f, cache, reuse_after)) {
        facts.push_back(std::move(f));
        tensors.push_back(t);
      } else if (CountIfUnreadable(t, owner)) {
        all_read = false;
      }
    });
  }
  return all_read;
}

namespace {

using WeakStorageImpl = c10::weak_intrusive_ptr<c10::StorageImpl>;

// A loss, a gradient norm, a found-inf flag: a verdict on gradients rather
// than one of them (RegisteredStorage::single_value).
bool IsOneValueNoParameter(const at::Tensor& t) {
  return t.storage().nbytes() <= static_cast<size_t>(t.element_size()) &&
         !(t.requires_grad() && t.is_leaf());
}

// What the registry keeps of a storage besides its state: a weak
// reference (unknown: none) and whether it is one value that is no
// parameter. Made only for non-finite results, under the registry's lock.
struct StorageIdentity {
  const at::Tensor* tensor = nullptr;     // the CPU path's, alive now
  const OutputStorage* late = nullptr;    // a GPU op's, made at enqueue
};

void Remember(const void* key, StorageState state, StorageIdentity identity) {
  if (key == nullptr) return;
  if (state == StorageState::kFinite &&
      g_nonfinite_size.load(std::memory_order_relaxed) == 0) {
    return;  // the common case: nothing to forget, no lock
  }
  absl::MutexLock lock(&g_registry_mu);
  if (state != StorageState::kFinite) {
    // Bounded: once non-finite values are everywhere, forgetting old
    // storages only makes later inputs look external, never hides one.
    // Masks go last: a mask buffer made once and read every step would
    // otherwise come back as "non-finite data" after the purge.
    if (g_nonfinite->size() >= (1u << 16)) {
      absl::erase_if(*g_nonfinite, [](const auto& entry) {
        return entry.second.state == StorageState::kNonFinite;
      });
      if (g_nonfinite->size() >= (1u << 15)) g_nonfinite->clear();
    }
    RegisteredStorage& entry = (*g_nonfinite)[key];
    entry.state = state;
    const at::Tensor* t = identity.tensor;
    if (t != nullptr && t->has_storage()) {
      entry.known = true;
      entry.storage = t->storage().getWeakStorageImpl();
      entry.single_value = IsOneValueNoParameter(*t);
    } else if (identity.late != nullptr && identity.late->weak.impl() != nullptr) {
      // The storage may be gone by now (a temporary of the backward pass):
      // the reference says so, and the entry goes at the next look.
      entry.known = true;
      entry.storage = WeakStorageImpl::reclaim_copy(
          static_cast<c10::StorageImpl*>(identity.late->weak.impl()));
      entry.single_value = identity.late->single_value;
    } else {
      entry.known = false;
      entry.storage = WeakStorageImpl(c10::intrusive_ptr<c10::StorageImpl>());
      entry.single_value = false;
    }
  } else {
    g_nonfinite->erase(key);
  }
  g_nonfinite_size.store(g_nonfinite->size(), std::memory_order_relaxed);
}

}  // namespace

void RememberChecked(const at::Tensor& t, StorageState state) {
  if (IsSparse(t)) {
    const at::Tensor values = StoredValues(t);
    Remember(StorageKey(values), state, StorageIdentity{&values, nullptr});
    return;
  }
  Remember(StorageKey(t), state, StorageIdentity{&t, nullptr});
}

void RememberLateOutput(const OutputStorage& output, StorageState state) {
  Remember(output.key, state, StorageIdentity{nullptr, &output});
}

OutputStorage DescribeOutputStorage(const at::Tensor& t) {
  OutputStorage out;
  out.key = StorageKey(t);
  if (!t.has_storage()) return out;
  out.weak = WeakStorageOf(t.storage());
  out.single_value = IsOneValueNoParameter(t);
  return out;
}

WeakStorage WeakStorageOf(const c10::Storage& storage) {
  // One owning weak pointer, handed to core/ and given back at release.
  return WeakStorage(storage.getWeakStorageImpl().release(), [](void* impl) {
    WeakStorageImpl::reclaim(static_cast<c10::StorageImpl*>(impl));
  });
}

bool StorageAlive(void* impl) {
  return c10::raw::weak_intrusive_ptr::use_count(static_cast<c10::StorageImpl*>(impl)) > 0;
}

bool NonFiniteStillHeld(bool counting_single_values) {
  if (g_nonfinite_size.load(std::memory_order_relaxed) == 0) return false;
  absl::MutexLock lock(&g_registry_mu);
  bool held = false;
  // Freed storages are forgotten on the way: their memory holds nothing
  // of theirs any more.
  absl::erase_if(*g_nonfinite, [&](const auto& entry) {
    const RegisteredStorage& r = entry.second;
    const bool counts = r.state == StorageState::kNonFinite &&
                        (counting_single_values || !r.single_value);
    if (!r.known) {
      held |= counts;  // cannot tell: held
      return false;
    }
    const c10::intrusive_ptr<c10::StorageImpl> alive = r.storage.lock();
    if (alive && alive->data() == entry.first) {
      held |= counts;
      return false;
    }
    return true;
  });
  g_nonfinite_size.store(g_nonfinite->size(), std::memory_order_relaxed);
  return held;
}

StorageState StorageStateOf(const void* key) {
  if (key == nullptr || g_nonfinite_size.load(std::memory_order_relaxed) == 0) {
    return StorageState::kFinite;
  }
  absl::MutexLock lock(&g_registry_mu);
  auto it = g_nonfinite->find(key);
  return it == g_nonfinite->end() ? StorageState::kFinite : it->second.state;
}

bool KnownNonFinite(const at::Tensor& t) {
  return StorageStateOf(StorageKey(t)) == StorageState::kNonFinite;
}

bool KnownDeliberate(const at::Tensor& t) {
  const StorageState state = StorageStateOf(StorageKey(t));
  return state == StorageState::kDeliberate || state == StorageState::kNanMarkers;
}

bool KnownOwnMasked(const at::Tensor& t) {
  return StorageStateOf(StorageKey(t)) == StorageState::kOwnMasked;
}

std::optional<ScalerUpdate> ReadScalerUpdate(const std::vector<c10::IValue>& inputs) {
  if (inputs.size() < 3 || !inputs[0].isTensor() || !inputs[2].isTensor()) {
    return std::nullopt;
  }
  const at::Tensor& scale = inputs[0].toTensor();  // updated in place
  const at::Tensor& found_inf = inputs[2].toTensor();
  if (!scale.defined() || !found_inf.defined() || !scale.device().is_cpu() ||
      !found_inf.device().is_cpu() || scale.numel() != 1 || found_inf.numel() != 1) {
    return std::nullopt;
  }
  QuietScope quiet;
  return ScalerUpdate{scale.item<double>(), found_inf.item<double>() != 0};
}

std::vector<InputFacts> UnknownWrittenArgs(const OpTraits& traits) {
  std::vector<InputFacts> result;
  for (int index : traits.written_args) {
    InputFacts f;
    f.arg_index = index;
    f.dtype = "?";
    f.unknown_before = true;
    result.push_back(f);
  }
  return result;
}

std::vector<InputFacts> CheckWrittenArgs(c10::ArrayRef<const c10::IValue> inputs,
                                         const OpTraits& traits,
                                         const CheckLimits& limits) {
  std::vector<InputFacts> result;
  for (int index : traits.written_args) {
    if (index >= static_cast<int>(inputs.size())) continue;
    InputFacts f;
    f.arg_index = index;
    ForEachTensor(inputs[index], [&](const at::Tensor& t) {
      TensorFacts facts;
      if (!CheckTensor(t, limits, facts, CacheUse::kReuse)) return;
      f.dtype = std::string(FormatName(facts.format));
      f.shape = facts.shape;
      if (traits.updates_running_stats) {  // the viewer reads this (diagnosis_buffers.cc)
        absl::StrAppend(&f.shape, " (", traits.handle->schema().arguments()[index].name(), ")");
      }
      f.checked = true;
      MergeCounts(f.counts, facts.counts);
      f.max_abs = std::max(f.max_abs, MaxAbs(facts.format, facts.counts));
      if (AnyNonFinite(facts.counts) && KnownNonFinite(t)) f.produced_by_op = true;
      // Masks, or NaN markers (Monitor::MarkNanMarkers) carried.
      if (AnyNonFinite(facts.counts) && KnownDeliberate(t)) f.deliberate = true;
      if (AnyNonFinite(facts.counts) && KnownOwnMasked(t)) f.own_masked = true;
    });
    if (f.checked) result.push_back(std::move(f));
  }
  return result;
}

namespace {

// Whether argument `i` is one the op writes whole (copy_'s, fill_'s self):
// its old values are no input of the op.
bool OverwritesWhole(const OpTraits& traits, size_t i) {
  return traits.overwrites_written &&
         std::find(traits.written_args.begin(), traits.written_args.end(),
                   static_cast<int>(i)) != traits.written_args.end();
}

}  // namespace

void ForgetWholeStorages(const std::vector<c10::IValue>& outputs) {
  if (g_nonfinite_size.load(std::memory_order_relaxed) == 0) return;
  for (const c10::IValue& v : outputs) {
    ForEachTensor(v, [&](const at::Tensor& t) {
      auto forget_whole = [](const at::Tensor& dense) {
        if (!dense.defined() || !dense.has_storage()) return;
        const size_t bytes = static_cast<size_t>(dense.numel()) * dense.element_size();
        if (dense.storage_offset() == 0 && bytes == dense.storage().nbytes()) {
          RememberChecked(dense, StorageState::kFinite);
        }
      };
      if (IsSparse(t)) {
        forget_whole(StoredValues(t));
      } else {
        forget_whole(t);
      }
    });
  }
}

void CarryNonFinite(const std::vector<c10::IValue>& inputs,
                    const std::vector<c10::IValue>& outputs, const OpTraits& traits) {
  if (g_nonfinite_size.load(std::memory_order_relaxed) == 0) return;
  StorageState carried = StorageState::kFinite;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (OverwritesWhole(traits, i)) continue;
    ForEachTensor(inputs[i], [&](const at::Tensor& t) {
      if (!t.defined() || carried == StorageState::kNonFinite) return;
      const StorageState state = StorageStateOf(StorageKey(t));
      if (state != StorageState::kFinite) carried = state;
    });
  }
  if (carried == StorageState::kFinite) {
    ForgetWholeStorages(outputs);
    return;
  }
  for (const c10::IValue& v : outputs) {
    ForEachTensor(v, [&](const at::Tensor& t) {
      if (t.defined()) RememberChecked(t, carried);
    });
  }
}

namespace {

// What `t`, given inf/NaN no checked op made, is to the model (see
// NameModelTensor). Without Python to look, a leaf that requires grad (or
// a view of one) is what an optimizer trains: a parameter.
std::string ModelTensorLabel(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return "";
  std::optional<std::string> name;
  {
    QuietScope quiet;  // should the walk run an op (a __del__), it goes unseen
    name = NameModelTensor(t.storage().data());
  }
  if (name) return *name;  // Python looked: a tensor of no module is none of the model's
  at::Tensor base = t;  // linear's weight comes as weight.t(), a view
  while (base.is_view()) base = base._base();
  return base.requires_grad() && base.is_leaf() ? "parameter" : "";
}

// Inf/NaN that no checked op made, nor a mask: worth naming their tensor.
bool BroughtUnmade(const InputFacts& f) {
  return AnyNonFinite(f.counts) && !f.produced_by_op && !f.deliberate;
}

// Says what `t` is to the model when it brought such values: a
// checkpoint's, not a batch's.
void LabelModelTensor(const at::Tensor& t, InputFacts& f,
                      const at::Tensor* destination = nullptr) {
  if (BroughtUnmade(f)) f.model_tensor = ModelTensorName(t, destination);
}

// LabelModelTensor for an argument the op wrote, whose facts from before
// are merged over a list (_foreach_mul_'s exp_avg_sqs): the first tensor
// that holds inf/NaN now names it.
void LabelWrittenArg(const c10::IValue& v, const CheckLimits& limits, InputFacts& f) {
  if (!BroughtUnmade(f)) return;
  if (v.isTensor()) {
    f.model_tensor = ModelTensorName(v.toTensor(), nullptr);
    return;
  }
  bool named = false;
  ForEachTensor(v, [&](const at::Tensor& t) {
    TensorFacts facts;
    if (named || !CheckTensor(t, limits, facts) || !AnyNonFinite(facts.counts)) return;
    f.model_tensor = ModelTensorName(t, nullptr);
    named = true;
  });
}

}  // namespace

std::string ModelTensorName(const at::Tensor& t, const at::Tensor* destination) {
  std::string name = ModelTensorLabel(t);
  if (!name.empty() || destination == nullptr) return name;
  const std::string into = ModelTensorLabel(*destination);
  return into.empty() ? "" : "copied into " + into;
}

const at::Tensor* WholeWriteDestination(const std::vector<c10::IValue>& inputs,
                                        const OpTraits& traits) {
  if (!traits.writes_whole_tensor || traits.written_args.empty()) return nullptr;
  const size_t index = static_cast<size_t>(traits.written_args[0]);
  return index < inputs.size() && inputs[index].isTensor() ? &inputs[index].toTensor() : nullptr;
}

TorchOpContext::TorchOpContext(const std::vector<c10::IValue>& inputs,
                               const std::vector<InputFacts>& written_before,
                               const std::vector<at::Tensor>& outputs,
                               const OpTraits& traits,
                               const CheckLimits& limits,
                               const std::string& torch_dir)
    : inputs_(inputs),
      written_before_(written_before),
      outputs_(outputs),
      traits_(traits),
      limits_(limits),
      torch_dir_(torch_dir) {}

namespace {

// An integer tensor in host memory, as int64 values (its first `at_most`);
// empty for any other (reading a GPU tensor's values would wait for the
// GPU). `count` is how many it holds.
std::vector<int64_t> HostIntegers(const c10::IValue& v, int64_t at_most, int64_t& count) {
  if (v.isIntList()) {
    const auto list = v.toIntVector();
    count = static_cast<int64_t>(list.size());
    return {list.begin(), list.begin() + std::min(count, at_most)};
  }
  if (!v.isTensor()) return {};
  const at::Tensor& t = v.toTensor();
  if (!t.defined() || !t.device().is_cpu() || t.is_floating_point() || t.is_complex() ||
      t.scalar_type() == at::kBool || WithoutOwnMemory(t) || t.layout() != at::kStrided) {
    return {};
  }
  QuietScope quiet;  // its own ops are no op of the program
  count = t.numel();
  const at::Tensor shown =
      t.reshape(-1).narrow(0, 0, std::min(count, at_most)).to(at::kLong).contiguous();
  const int64_t* data = shown.data_ptr<int64_t>();
  return {data, data + shown.numel()};
}

// What an argument's values say that its dtype and shape do not, for the
// few whose values explain a loss's inf or NaN; empty for any other:
// - *lengths (CTC's), as a list: "input_lengths=[50, 48, 50]";
// - a loss's target beside its ignore_index (nll_loss's), counted:
//   "target Long[8]: 8 of 8 are ignore_index (-100)".
std::string ArgumentValues(const OpTraits& traits, const std::vector<c10::IValue>& inputs,
                           size_t index) {
  constexpr int64_t kMaxShown = 64, kMaxCounted = 1 << 20;
  if (!traits.handle) return "";
  const auto& args = traits.handle->schema().arguments();
  if (index >= args.size() || index >= inputs.size()) return "";
  const std::string& name = args[index].name();
  int64_t count = 0;
  if (absl::EndsWith(name, "lengths")) {
    const std::vector<int64_t> values = HostIntegers(inputs[index], kMaxShown, count);
    if (values.empty()) return "";
    return absl::StrCat(name, "=[", absl::StrJoin(values, ", "),
                        count > kMaxShown ? absl::StrCat(", ... (", count, ")") : "", "]");
  }
  if (name != "target" || !inputs[index].isTensor()) return "";
  for (size_t j = 0; j < args.size() && j < inputs.size(); ++j) {
    if (args[j].name() != "ignore_index" || !inputs[j].isInt()) continue;
    const at::Tensor& t = inputs[index].toTensor();
    if (!t.defined() || t.numel() > kMaxCounted) return "";  // before copying any
    const int64_t ignored = inputs[j].toInt();
    const std::vector<int64_t> values = HostIntegers(inputs[index], kMaxCounted, count);
    if (values.empty()) return "";
    const auto n = std::count(values.begin(), values.end(), ignored);
    return absl::StrCat("target ", c10::toString(t.scalar_type()), ShapeOf(t), ": ", n, " of ",
                        count, count == 1 ? " is" : " are", " ignore_index (", ignored, ")");
  }
  return "";
}

}  // namespace

std::vector<InputFacts> TorchOpContext::Inputs() {
  std::vector<InputFacts> result;
  const at::Tensor* destination = WholeWriteDestination(inputs_, traits_);
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const c10::IValue& v = inputs_[i];
    if (v.isDouble()) {
      // A non-finite Python float or Scalar argument (fill_(nan), full(inf)).
      const double d = v.toDouble();
      InputFacts f;
      f.arg_index = static_cast<int>(i);
      f.dtype = "scalar";
      f.checked = true;
      f.counts = CountScalar(d);
      f.max_abs = std::isnan(d) ? 0 : std::fabs(d);
      if (AnyNonFinite(f.counts)) result.push_back(f);
      continue;
    }
    if (std::find(traits_.out_args.begin(), traits_.out_args.end(),
                  static_cast<int>(i)) != traits_.out_args.end()) {
      continue;  // out=: its old values do not flow into the result
    }
    const InputFacts* before = nullptr;
    for (const InputFacts& w : written_before_) {
      if (w.arg_index == static_cast<int>(i)) before = &w;
    }
    if (before == nullptr && OverwritesWhole(traits_, i)) {
      continue;  // fill_'s or copy_'s self holds its result now, and none of its past
    }
    if (std::string values = ArgumentValues(traits_, inputs_, i); !values.empty()) {
      InputFacts f;
      f.arg_index = static_cast<int>(i);
      f.dtype = "values";
      f.values = std::move(values);
      result.push_back(std::move(f));
      continue;
    }
    if (before != nullptr) {
      result.push_back(*before);  // overwritten by the op: its old values
      // Written in place, it is the same storage: an optimizer's state. A
      // batch norm's running statistics are named by their argument.
      if (!traits_.updates_running_stats && name_model_tensors_) {
        LabelWrittenArg(v, limits_, result.back());
      }
      continue;
    }
    ForEachTensor(v, [&](const at::Tensor& t) {
      InputFacts f;
      f.arg_index = static_cast<int>(i);
      const auto format =
          t.defined() ? torch_compat::FormatOf(t.scalar_type()) : std::nullopt;
      f.dtype = !t.defined() ? "undefined"
                : format     ? std::string(FormatName(*format))
                             : std::string(c10::toString(t.scalar_type()));
      f.shape = t.defined() ? ShapeOf(t) : "";
      f.storage = t.defined() ? StorageKey(t) : nullptr;
      TensorFacts facts;
      f.checked = CheckTensor(t, limits_, facts);
      if (f.checked) {
        f.counts = facts.counts;
        f.max_abs = MaxAbs(facts.format, facts.counts);
        f.produced_by_op = AnyNonFinite(f.counts) && KnownNonFinite(t);
        // A Python number the program wrote, wrapped into a tensor by torch
        // (the inf of `x.abs() != inf` inside isfinite and isinf, cast to
        // x's dtype): meant, like a mask's.
        f.python_number = t.unsafeGetTensorImpl()->is_wrapped_number();
        // Masks, or NaN markers (Monitor::MarkNanMarkers) carried.
        f.deliberate = AnyNonFinite(f.counts) &&
                       (KnownDeliberate(t) || (f.counts.nan == 0 && f.python_number));
        f.own_masked = AnyNonFinite(f.counts) && KnownOwnMasked(t);
        if (name_model_tensors_) LabelModelTensor(t, f, destination);
      }
      result.push_back(std::move(f));
    });
  }
  return result;
}

bool HoldsMasksNow(const at::Tensor& t, const CheckLimits& limits) {
  // A one-value host tensor is judged by its value (IsMaskConstantArg):
  // a Python number torch wrapped is often at a freed tensor's address.
  if (!t.defined() || (t.numel() == 1 && t.device().is_cpu())) return false;
  const StorageState state = StorageStateOf(StorageKey(t));
  if (!HoldsMasks(state)) return false;
  // Memory is known by its address, which outlives the tensor: a freed
  // mask's address reused by a tensor no checked op wrote (an array from
  // numpy) must not pass for a mask. What is there now must still look
  // like one: mask constants are at fp16's limit or past it.
  TensorFacts facts;
  if (!CheckTensor(t, limits, facts)) return false;
  return state == StorageState::kMaskConstants
             ? MaxAbs(facts.format, facts.counts) >= kFp16Max
             : AnyNonFinite(facts.counts) && facts.counts.nan == 0;
}

bool TorchOpContext::InputsHoldMasks(absl::string_view op) {
  for (size_t i = 0; i < inputs_.size(); ++i) {
    if (OverwritesWhole(traits_, i)) continue;  // its old values are no input
    const c10::IValue& v = inputs_[i];
    if (IsMaskConstantArg(op, v)) return true;
    bool held = false;
    ForEachTensor(v, [&](const at::Tensor& t) { held = held || HoldsMasksNow(t, limits_); });
    if (held) return true;
  }
  return false;
}

bool TorchOpContext::OutputsHoldMasks() {
  // An op that writes a tensor it was given (clamp_) leaves the registry's
  // word on that memory stale until the op is judged.
  if (!traits_.written_args.empty() || !traits_.out_args.empty()) return false;
  bool any = false;
  for (const at::Tensor& t : outputs_) {
    TensorFacts facts;
    if (!CheckTensor(t, limits_, facts) || !AnyNonFinite(facts.counts)) continue;
    if (StorageStateOf(StorageKey(t)) != StorageState::kDeliberate || facts.counts.nan != 0) {
      return false;
    }
    any = true;
  }
  return any;
}

bool TorchOpContext::NonFiniteGradientsHeld() {
  return NonFiniteStillHeld(/*counting_single_values=*/false);
}

void TorchOpContext::Locate() {
  if (located_) return;
  located_ = true;
  SourceLocation loc = CaptureSourceLocation(torch_dir_);
  source_ = std::move(loc.source);
  stack_ = std::move(loc.stack);
  via_ = std::move(loc.via);
}

std::string TorchOpContext::Source() {
  Locate();
  return source_;
}

std::string TorchOpContext::Stack() {
  Locate();
  return stack_;
}

std::string TorchOpContext::Via() {
  Locate();
  return via_;
}

OpContext::CallSite TorchOpContext::BackwardCallSite() {
  SourceLocation loc = CaptureBackwardCallSite(torch_dir_);
  return {std::move(loc.source), std::move(loc.stack)};
}

namespace {

// Ops whose every output value is the input value at the same position:
// computed in fp32, a cast to fp16 gives back its input.
bool KeepsValues(const c10::OperatorHandle& op) {
  const std::string& name = op.operator_name().name;
  return name == "aten::_to_copy" || name == "aten::to" ||
         name == "aten::clone" || name == "aten::contiguous";
}

// Formats whose range is fp16's or narrower: a "recomputation in fp32"
// that still ends there (the op's dtype argument asked for it) says nothing.
bool IsNarrow(Format f) {
  return f == Format::kF16 || f == Format::kF8E4M3FN || f == Format::kF8E5M2;
}

// The largest magnitude among the tensors of `values` in wider formats;
// infinity when one of them holds inf or NaN (the op is not finite in fp32
// either).
std::optional<double> WideMaxAbs(const std::vector<c10::IValue>& values,
                                 const CheckLimits& limits) {
  double max_abs = -1;
  for (const c10::IValue& v : values) {
    ForEachTensor(v, [&](const at::Tensor& t) {
      TensorFacts f;
      if (CheckTensor(t, limits, f) && !IsNarrow(f.format)) {
        max_abs = std::max(max_abs, AnyNonFinite(f.counts)
                                        ? std::numeric_limits<double>::infinity()
                                        : MaxAbs(f.format, f.counts));
      }
    });
  }
  if (max_abs < 0) return std::nullopt;
  return max_abs;
}

}  // namespace

std::optional<double> TorchOpContext::RecomputeFp32MaxAbs() {
  if (!traits_.handle || traits_.writes || traits_.random) return std::nullopt;
  // Outputs in fp32 or fp64 already: the op run again in fp32 would only
  // repeat itself. (bf16 outputs are recomputed: fp32 keeps more digits.)
  bool any_narrow_or_bf16 = outputs_.empty();
  for (const at::Tensor& t : outputs_) {
    const auto format = t.defined() ? torch_compat::FormatOf(t.scalar_type()) : std::nullopt;
    any_narrow_or_bf16 |= format && (IsNarrow(*format) || *format == Format::kBF16);
  }
  if (!any_narrow_or_bf16) return std::nullopt;
  if (KeepsValues(*traits_.handle)) return WideMaxAbs(inputs_, limits_);
  try {
    QuietScope quiet;
    torch::jit::Stack stack;
    stack.reserve(inputs_.size());
    for (const c10::IValue& v : inputs_) {
      if (v.isTensor() && v.toTensor().defined() &&
          v.toTensor().is_floating_point() && v.toTensor().device().is_cpu() &&
          v.toTensor().scalar_type() != at::kDouble) {
        stack.emplace_back(v.toTensor().to(at::kFloat));
      } else {
        stack.push_back(v);
      }
    }
    traits_.handle->callBoxed(&stack);
    return WideMaxAbs(stack, limits_);
  } catch (const std::exception&) {
    return std::nullopt;  // ops with dtype arguments and the like: skip
  }
}

}  // namespace nanhunt
