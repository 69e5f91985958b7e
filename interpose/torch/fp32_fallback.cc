#include "interpose/torch/fp32_fallback.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <atomic>
#include <map>
#include <set>
#include <memory>

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

c10::IValue ToFp32(const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (t.defined() && (t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16)) {
      return t.to(at::kFloat);
    }
    return v;
  }
  if (v.isTensorList()) {
    std::vector<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorVector()) {
      out.push_back(t.defined() && (t.scalar_type() == at::kHalf ||
                                    t.scalar_type() == at::kBFloat16)
                        ? t.to(at::kFloat)
                        : t);
    }
    return c10::IValue(out);
  }
  return v;
}

// The kernel for every switched op: upcast, then run the op with autocast
// excluded (what autocast's own fp32 policy does).
void Fp32Kernel(const c10::OperatorHandle& op, c10::DispatchKeySet,
                torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  for (size_t i = stack->size() - n; i < stack->size(); ++i) {
    (*stack)[i] = ToFp32((*stack)[i]);
  }
  {
    absl::ReaderMutexLock lock(&g_mu);
    auto it = g_counts->find(op.operator_name().name);
    if (it != g_counts->end()) it->second.fetch_add(1, std::memory_order_relaxed);
  }
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  op.callBoxed(stack);
}

// Registers the fp32 kernel for `name` on both autocast keys, once.
bool RegisterLocked(const c10::OperatorName& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_mu) {
  const std::string op = name.overload_name.empty()
                             ? name.name
                             : absl::StrCat(name.name, ".", name.overload_name);
  if (!g_registered->insert(op).second) return false;
  const std::string ns = name.name.substr(0, name.name.find("::"));
  for (c10::DispatchKey key :
       {c10::DispatchKey::AutocastCPU, c10::DispatchKey::AutocastCUDA}) {
    auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, ns, key,
                                                __FILE__, __LINE__);
    lib->impl(op.c_str(), torch::CppFunction::makeFromBoxedFunction<&Fp32Kernel>());
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
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    for (size_t i = 0; i < patterns.size(); ++i) {
      if (MatchesOpPattern(name.name, name.overload_name, {patterns[i]})) {
        used[i] = true;
        matched.push_back(name);
        break;
      }
    }
  }
  for (size_t i = 0; i < patterns.size(); ++i) {
    if (!used[i]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "NANHUNT_FP32_OPS: '", patterns[i],
          "' matches no operator; allowed: names like aten::bmm or globs "
          "like aten::*softmax* (torch.ops.aten lists them)"));
    }
  }
  absl::MutexLock lock(&g_mu);
  for (const c10::OperatorName& name : matched) RegisterLocked(name);
  return absl::OkStatus();
}

bool ExtendFp32Fallback(const c10::OperatorName& enclosing) {
  absl::MutexLock lock(&g_mu);
  return RegisterLocked(enclosing);
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
