#include "interpose/torch/fp32_fallback.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "core/op_policy.h"

namespace nanhunt {
namespace {

absl::Mutex g_mu;
// Leaked on purpose: the registrations must live as long as the process.
auto* g_libraries = new std::vector<std::unique_ptr<torch::Library>>();
auto* g_counts = new std::map<std::string, std::atomic<int64_t>>();
auto* g_registered = new std::set<std::string>();
auto* g_learned = new std::vector<std::string>();

// The autocast key nanhunt borrows for models without autocast: one that no
// backend in this process uses (checked before it is taken). Autocast keys
// sit above autograd, so the casts made there are recorded for backward.
std::atomic<bool> g_spare_ready{false};
c10::DispatchKey g_spare_key = c10::DispatchKey::Undefined;
bool g_spare_tried = false;  // under g_mu

bool IsLowPrecision(const at::Tensor& t) {
  return t.defined() &&
         (t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16);
}

c10::IValue ToFp32(const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    return IsLowPrecision(t) ? c10::IValue(t.to(at::kFloat)) : v;
  }
  if (v.isTensorList()) {
    std::vector<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorVector()) {
      out.push_back(IsLowPrecision(t) ? t.to(at::kFloat) : t);
    }
    return c10::IValue(out);
  }
  return v;
}

// A batch norm's running statistics, fp16 or bf16 buffers it updates in
// place: the op updates the fp32 copies it is given, whose values must then
// land in the module's buffers (else the buffers never change: a model
// evaluated with its initial statistics).
struct StatWriteBack {
  at::Tensor buffer;
  at::Tensor updated;
};

std::vector<StatWriteBack> UpcastRunningStats(const c10::OperatorHandle& op,
                                              torch::jit::Stack* stack, size_t first) {
  std::vector<StatWriteBack> write_back;
  if (!UpdatesRunningStats(op.schema().name())) return write_back;
  const auto& args = op.schema().arguments();
  // In evaluation (training=False) the statistics are only read.
  for (size_t i = 0; i < args.size() && first + i < stack->size(); ++i) {
    const c10::IValue& flag = (*stack)[first + i];
    if (args[i].name() == "training" && flag.isBool() && !flag.toBool()) return write_back;
  }
  for (size_t i = 0; i < args.size() && first + i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[first + i];
    if (!IsRunningStatistic(args[i].name()) || !v.isTensor() || !IsLowPrecision(v.toTensor())) {
      continue;
    }
    StatWriteBack w{v.toTensor(), v.toTensor().to(at::kFloat)};
    v = w.updated;
    write_back.push_back(std::move(w));
  }
  return write_back;
}

void WriteBack(const std::vector<StatWriteBack>& write_back) {
  for (const StatWriteBack& w : write_back) w.buffer.copy_(w.updated);
}

void Count(const c10::OperatorHandle& op) {
  absl::ReaderMutexLock lock(&g_mu);
  auto it = g_counts->find(op.operator_name().name);
  if (it != g_counts->end()) it->second.fetch_add(1, std::memory_order_relaxed);
}

// Under autocast: upcast, then run the op with autocast excluded (what
// autocast's own fp32 policy does). Outputs stay fp32.
void Fp32Kernel(const c10::OperatorHandle& op, c10::DispatchKeySet,
                torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  const std::vector<StatWriteBack> write_back = UpcastRunningStats(op, stack, stack->size() - n);
  for (size_t i = stack->size() - n; i < stack->size(); ++i) {
    (*stack)[i] = ToFp32((*stack)[i]);
  }
  Count(op);
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  op.callBoxed(stack);
  WriteBack(write_back);
}

// The one low-precision dtype the op's floating inputs share, when none of
// them is wider: the dtype its outputs would have had.
std::optional<at::ScalarType> SharedLowDtype(const torch::jit::Stack& stack,
                                             size_t first,
                                             std::optional<c10::DeviceType>& device) {
  std::optional<at::ScalarType> low;
  bool wider = false;
  auto visit = [&](const at::Tensor& t) {
    if (!t.defined()) return;
    if (!device) device = t.device().type();
    if (!at::isFloatingType(t.scalar_type())) return;
    if (IsLowPrecision(t)) {
      if (low && *low != t.scalar_type()) wider = true;  // mixed: promotes
      low = t.scalar_type();
    } else if (t.dim() > 0) {
      wider = true;  // an fp32 tensor: the op would promote to fp32 anyway
    }
  };
  for (size_t i = first; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor()) visit(v.toTensor());
    if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) visit(t);
    }
  }
  if (wider) return std::nullopt;
  return low;
}

// Without autocast: compute in fp32, return the dtype the op would have.
// Inside an autocast region, autocast's keys decide (the kernel above).
void Fp32NoAutocastKernel(const c10::OperatorHandle& op, c10::DispatchKeySet,
                          torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  const size_t first = stack->size() - n;
  std::optional<c10::DeviceType> device;
  const std::optional<at::ScalarType> low = SharedLowDtype(*stack, first, device);
  if (!low || (device && at::autocast::is_autocast_enabled(*device))) {
    c10::impl::ExcludeDispatchKeyGuard skip(g_spare_key);
    op.callBoxed(stack);
    return;
  }
  const std::vector<StatWriteBack> write_back = UpcastRunningStats(op, stack, first);
  for (size_t i = first; i < stack->size(); ++i) {
    (*stack)[i] = ToFp32((*stack)[i]);
  }
  Count(op);
  {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    op.callBoxed(stack);
  }
  WriteBack(write_back);
  const size_t returns = op.schema().returns().size();
  for (size_t i = stack->size() - returns; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (v.isTensor() && v.toTensor().defined() &&
        v.toTensor().scalar_type() == at::kFloat) {
      v = v.toTensor().to(*low);
    } else if (v.isTensorList()) {
      std::vector<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorVector()) {
        out.push_back(t.defined() && t.scalar_type() == at::kFloat ? t.to(*low) : t);
      }
      v = c10::IValue(out);
    }
  }
}

// Picks the spare key: an autocast key with no fallback and no kernel of
// anyone else's. Without one, ops switch only under autocast.
void ChooseSpareKeyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_mu) {
  if (g_spare_tried) return;
  g_spare_tried = true;
  auto& dispatcher = c10::Dispatcher::singleton();
  const auto names = dispatcher.getAllOpNames();
  for (c10::DispatchKey key :
       {c10::DispatchKey::AutocastIPU, c10::DispatchKey::AutocastHPU}) {
    if (dispatcher.hasBackendFallbackForDispatchKey(key)) continue;
    bool used = false;
    for (const c10::OperatorName& name : names) {
      auto op = dispatcher.findOp(name);
      if (op && op->hasKernelForDispatchKey(key)) {
        used = true;
        break;
      }
    }
    if (used) continue;
    auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "_", key,
                                                __FILE__, __LINE__);
    lib->fallback(torch::CppFunction::makeFallthrough());
    g_libraries->push_back(std::move(lib));
    g_spare_key = key;
    g_spare_ready.store(true);
    return;
  }
  fprintf(stderr,
          "nanhunt: no free dispatch key for fp32 ops outside autocast; "
          "NANHUNT_FP32_OPS applies inside autocast regions only.\n");
}

bool WritesArguments(const c10::OperatorName& name) {
  auto op = c10::Dispatcher::singleton().findOp(name);
  return !op || op->schema().is_mutable();
}

// Registers the fp32 kernels for `name`, once.
bool RegisterLocked(const c10::OperatorName& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_mu) {
  if (WritesArguments(name) || ConvertsDtype(name.name)) return false;
  const std::string op = name.overload_name.empty()
                             ? name.name
                             : absl::StrCat(name.name, ".", name.overload_name);
  if (!g_registered->insert(op).second) return false;
  ChooseSpareKeyLocked();
  const std::string ns = name.name.substr(0, name.name.find("::"));
  for (c10::DispatchKey key :
       {c10::DispatchKey::AutocastCPU, c10::DispatchKey::AutocastCUDA}) {
    auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, ns, key,
                                                __FILE__, __LINE__);
    lib->impl(op.c_str(), torch::CppFunction::makeFromBoxedFunction<&Fp32Kernel>());
    g_libraries->push_back(std::move(lib));
  }
  if (g_spare_ready.load()) {
    auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, ns,
                                                g_spare_key, __FILE__, __LINE__);
    lib->impl(op.c_str(),
              torch::CppFunction::makeFromBoxedFunction<&Fp32NoAutocastKernel>());
    g_libraries->push_back(std::move(lib));
  }
  (*g_counts)[name.name];
  return true;
}

}  // namespace

absl::Status InstallFp32Fallback(const std::vector<std::string>& patterns) {
  if (patterns.empty()) return absl::OkStatus();
  std::vector<c10::OperatorName> matched;
  std::vector<bool> used(patterns.size(), false);
  std::vector<bool> only_writers(patterns.size(), false);
  std::vector<bool> only_casts(patterns.size(), false);
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    for (size_t i = 0; i < patterns.size(); ++i) {
      if (MatchesOpPattern(name.name, name.overload_name, {patterns[i]})) {
        if (WritesArguments(name)) {
          only_writers[i] = true;
          continue;
        }
        if (ConvertsDtype(name.name)) {
          only_casts[i] = true;
          continue;
        }
        used[i] = true;
        matched.push_back(name);
        break;
      }
    }
  }
  for (size_t i = 0; i < patterns.size(); ++i) {
    if (used[i]) continue;
    if (only_casts[i]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "NANHUNT_FP32_OPS: '", patterns[i],
          "' only names casts, which compute nothing to run in fp32: a value past "
          "fp16's range overflows when it is cast to fp16 whatever runs the cast; "
          "allowed: ops that compute, like aten::bmm (to keep a tensor wide, cast it "
          "to float32 or bfloat16 in the program)"));
    }
    if (only_writers[i]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "NANHUNT_FP32_OPS: '", patterns[i],
          "' only names ops that write their arguments (in-place or out=), "
          "which cannot run in fp32: their result must land in the caller's "
          "tensor; allowed: ops that return new tensors, like aten::bmm"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "NANHUNT_FP32_OPS: '", patterns[i],
        "' matches no operator; allowed: names like aten::bmm or globs "
        "like aten::*softmax* (torch.ops.aten lists them)"));
  }
  absl::MutexLock lock(&g_mu);
  for (const c10::OperatorName& name : matched) RegisterLocked(name);
  return absl::OkStatus();
}

bool ExtendFp32Fallback(const c10::OperatorName& enclosing) {
  absl::MutexLock lock(&g_mu);
  return RegisterLocked(enclosing);
}

bool LearnFp32Op(const c10::OperatorName& op) {
  // A batch norm overflows in the fp16 buffers it writes its statistics
  // back into: fp32 arithmetic would not change what lands there.
  if (UpdatesRunningStats(op.name)) return false;
  absl::MutexLock lock(&g_mu);
  if (!RegisterLocked(op)) return false;
  if (std::find(g_learned->begin(), g_learned->end(), op.name) ==
      g_learned->end()) {
    g_learned->push_back(op.name);
  }
  return true;
}

std::vector<std::string> LearnedFp32Ops() {
  absl::MutexLock lock(&g_mu);
  return *g_learned;
}

void PrepareFp32Fallback() {
  {
    absl::MutexLock lock(&g_mu);
    ChooseSpareKeyLocked();
  }
  EnableFp32OnThisThread();
}

void EnableFp32OnThisThread() {
  if (!g_spare_ready.load(std::memory_order_relaxed)) return;
  // Dispatch-key guards save and restore the whole set (torch 2.x), so a
  // switch made inside an op is undone when the op's caller's guard ends:
  // only a switch made between ops lasts. Checked each time for that.
  if (c10::impl::tls_is_dispatch_key_included(g_spare_key) &&
      !c10::impl::tls_is_dispatch_key_excluded(g_spare_key)) {
    return;
  }
  c10::impl::tls_set_dispatch_key_excluded(g_spare_key, false);
  c10::impl::tls_set_dispatch_key_included(g_spare_key, true);
}

std::string Fp32FallbackCounts() {
  absl::ReaderMutexLock lock(&g_mu);
  std::vector<std::string> parts;
  for (const auto& [name, count] : *g_counts) {
    parts.push_back(absl::StrCat(name, "=", count.load()));
  }
  return absl::StrJoin(parts, ",");
}

}  // namespace nanhunt
