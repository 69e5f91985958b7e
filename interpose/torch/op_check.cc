#include "interpose/torch/op_check.h"

#include <c10/core/impl/LocalDispatchKeySet.h>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "core/cpu_check.h"
#include "core/op_policy.h"
#include "interpose/torch/source_location.h"
#include "interpose/torch/torch_compat.h"

namespace nanhunt {
namespace {

std::string ShapeOf(const at::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]");
}

// Our own tensor work (copies, the fp32 recomputation) must be invisible:
// to our callbacks, to profilers, to autograd and to autocast.
struct QuietScope {
  at::RecordFunctionGuard no_records{false};
  at::NoGradGuard no_grad;
  c10::impl::ExcludeDispatchKeyGuard no_autocast{c10::autocast_dispatch_keyset};
};

absl::Mutex g_registry_mu;
// Leaked on purpose: used by callbacks until the process ends.
auto* g_nonfinite = new absl::flat_hash_set<const void*>();
std::atomic<size_t> g_nonfinite_size{0};

const void* StorageKey(const at::Tensor& t) {
  return t.has_storage() ? t.storage().data() : nullptr;
}

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

const OpTraits& TraitsOf(const at::RecordFunction& fn) {
  // Keyed by the name and overload pointers, which live as long as the
  // operator's schema; per thread, so no lock on the hot path.
  thread_local absl::flat_hash_map<std::pair<const char*, const char*>,
                                   OpTraits>
      cache;
  const auto key = std::make_pair(fn.name(), fn.overload_name());
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  OpTraits traits;
  traits.uninitialised = OutputsAreUninitialised(fn.name());
  if (auto name = fn.operator_name()) {
    traits.handle = c10::Dispatcher::singleton().findOp(*name);
  }
  if (traits.handle) {
    const c10::FunctionSchema& schema = traits.handle->schema();
    const auto& args = schema.arguments();
    for (size_t i = 0; i < args.size(); ++i) {
      const auto& arg = args[i];
      if (arg.alias_info() && arg.alias_info()->isWrite()) {
        traits.writes = true;
        (arg.is_out() ? traits.out_args : traits.written_args)
            .push_back(static_cast<int>(i));
      }
      auto type = arg.type();
      if (auto opt = type->cast<c10::OptionalType>()) type = opt->getElementType();
      if (type->kind() == c10::TypeKind::GeneratorType) traits.random = true;
    }
    traits.view = !traits.writes && !schema.returns().empty();
    for (const auto& ret : schema.returns()) {
      if (!ret.alias_info()) traits.view = false;
    }
  }
  if (PassesInputThrough(fn.name())) traits.view = true;
  return cache.emplace(key, traits).first->second;
}

bool CheckTensor(const at::Tensor& t, const CheckLimits& limits,
                 TensorFacts& facts) {
  if (!t.defined() || t.layout() != at::kStrided || !t.device().is_cpu() ||
      !t.has_storage()) {
    return false;
  }
  const auto format = torch_compat::FormatOf(t.scalar_type());
  if (!format) return false;
  facts.format = *format;
  facts.shape = ShapeOf(t);
  const int64_t n = t.numel();
  if (n == 0) {
    facts.counts = CheckCounts{};
    return true;
  }
  if (t.data_ptr() == nullptr) return false;
  bool dense = t.is_non_overlapping_and_dense();
  for (int64_t s : t.strides()) dense = dense && s >= 0;
  if (dense) {
    // Order does not matter to the check: a dense tensor's elements are the
    // n values from its data pointer on, whatever its strides.
    facts.counts = CheckHostBuffer(*format, t.data_ptr(), n, limits);
  } else {
    QuietScope quiet;
    const at::Tensor c = t.contiguous();
    facts.counts = CheckHostBuffer(*format, c.data_ptr(), n, limits);
  }
  return true;
}

void CheckOutputs(const std::vector<c10::IValue>& outputs,
                  const CheckLimits& limits, std::vector<TensorFacts>& facts,
                  std::vector<at::Tensor>& tensors) {
  for (const c10::IValue& v : outputs) {
    ForEachTensor(v, [&](const at::Tensor& t) {
      TensorFacts f;
      if (CheckTensor(t, limits, f)) {
        facts.push_back(std::move(f));
        tensors.push_back(t);
      }
    });
  }
}

void RememberChecked(const at::Tensor& t, bool nonfinite) {
  const void* key = StorageKey(t);
  if (key == nullptr) return;
  if (!nonfinite && g_nonfinite_size.load(std::memory_order_relaxed) == 0) {
    return;  // the common case: nothing to forget, no lock
  }
  absl::MutexLock lock(&g_registry_mu);
  if (nonfinite) {
    // Bounded: once non-finite values are everywhere, forgetting old
    // storages only makes later inputs look external, never hides one.
    if (g_nonfinite->size() >= (1u << 16)) g_nonfinite->clear();
    g_nonfinite->insert(key);
  } else {
    g_nonfinite->erase(key);
  }
  g_nonfinite_size.store(g_nonfinite->size(), std::memory_order_relaxed);
}

bool KnownNonFinite(const at::Tensor& t) {
  const void* key = StorageKey(t);
  if (key == nullptr) return false;
  absl::MutexLock lock(&g_registry_mu);
  return g_nonfinite->contains(key);
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
      if (!CheckTensor(t, limits, facts)) return;
      f.dtype = std::string(FormatName(facts.format));
      f.shape = facts.shape;
      f.checked = true;
      MergeCounts(f.counts, facts.counts);
      f.max_abs = std::max(f.max_abs, MaxAbs(facts.format, facts.counts));
      if (AnyNonFinite(facts.counts) && KnownNonFinite(t)) f.produced_by_op = true;
    });
    if (f.checked) result.push_back(std::move(f));
  }
  return result;
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

std::vector<InputFacts> TorchOpContext::Inputs() {
  std::vector<InputFacts> result;
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const c10::IValue& v = inputs_[i];
    if (v.isDouble()) {
      // A non-finite Python float or Scalar argument (fill_(nan), full(inf)).
      const double d = v.toDouble();
      InputFacts f;
      f.arg_index = static_cast<int>(i);
      f.dtype = "scalar";
      f.checked = true;
      f.counts.elements = 1;
      f.counts.nan = std::isnan(d);
      f.counts.posinf = std::isinf(d) && d > 0;
      f.counts.neginf = std::isinf(d) && d < 0;
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
    if (before != nullptr) {
      result.push_back(*before);  // overwritten by the op: its old values
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
      TensorFacts facts;
      f.checked = CheckTensor(t, limits_, facts);
      if (f.checked) {
        f.counts = facts.counts;
        f.max_abs = MaxAbs(facts.format, facts.counts);
        f.produced_by_op = AnyNonFinite(f.counts) && KnownNonFinite(t);
      }
      result.push_back(std::move(f));
    });
  }
  return result;
}

void TorchOpContext::Locate() {
  if (located_) return;
  located_ = true;
  SourceLocation loc = CaptureSourceLocation(torch_dir_);
  source_ = std::move(loc.source);
  stack_ = std::move(loc.stack);
}

std::string TorchOpContext::Source() {
  Locate();
  return source_;
}

std::string TorchOpContext::Stack() {
  Locate();
  return stack_;
}

std::optional<double> TorchOpContext::RecomputeFp32MaxAbs() {
  if (!traits_.handle || traits_.writes || traits_.random) return std::nullopt;
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
    double max_abs = -1;
    for (const c10::IValue& v : stack) {
      ForEachTensor(v, [&](const at::Tensor& t) {
        TensorFacts f;
        if (CheckTensor(t, limits_, f)) {
          max_abs = std::max(max_abs, MaxAbs(f.format, f.counts));
        }
      });
    }
    if (max_abs < 0) return std::nullopt;
    return max_abs;
  } catch (const std::exception&) {
    return std::nullopt;  // ops with dtype arguments and the like: skip
  }
}

}  // namespace nanhunt
