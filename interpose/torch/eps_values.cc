#include "interpose/torch/eps_values.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "interpose/torch/tls_address.h"

namespace nanhunt {
namespace {

// The last aten::scalar_tensor of this thread. Its tensor is known by
// address (it is not kept alive), so a later tensor at the same addresses
// must not be taken for it: it counts only within kScalarTensorReach op
// calls (of any thread: ids are global) of the one that made it.
struct LastScalarTensor {
  const void* impl = nullptr;
  const void* data = nullptr;
  double value = 0;
  uint64_t op_id = 0;
};
thread_local LastScalarTensor t_last_scalar_tensor;
constexpr uint64_t kScalarTensorReach = 64;

}  // namespace

std::optional<double> HostScalarValue(const at::Tensor& t) {
  if (!t.defined() || t.numel() != 1 || !t.device().is_cpu() || !t.has_storage() ||
      t.storage().data() == nullptr) {
    return std::nullopt;
  }
  switch (t.scalar_type()) {
    case at::kDouble: return *t.const_data_ptr<double>();
    case at::kFloat: return *t.const_data_ptr<float>();
    case at::kHalf: return static_cast<float>(*t.const_data_ptr<c10::Half>());
    case at::kBFloat16: return static_cast<float>(*t.const_data_ptr<c10::BFloat16>());
    default: return std::nullopt;
  }
}

std::optional<double> EpsValueOf(const c10::IValue& given, uint64_t op_id) {
  if (given.isDouble()) return given.toDouble();
  if (!given.isTensor()) return std::nullopt;
  const at::Tensor& t = given.toTensor();
  if (!t.defined() || t.dim() != 0) return std::nullopt;
  // A Python float (torch wraps it into a host tensor). Another 0-dim
  // tensor is a value of the program's (a loss added), not an eps, unless
  // torch's own code made it as one.
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) return HostScalarValue(t);
  const LastScalarTensor& last = KeepAddress(t_last_scalar_tensor);
  if (last.impl != t.unsafeGetTensorImpl() || last.data != t.const_data_ptr() ||
      op_id - last.op_id > kScalarTensorReach) {
    return std::nullopt;
  }
  return last.value;
}

void NoteScalarTensor(const std::vector<c10::IValue>& inputs,
                      const std::vector<c10::IValue>& outputs, uint64_t op_id) {
  // A double, as an eps is (a symbolic float of a trace has no value).
  if (inputs.empty() || !inputs[0].isDouble() || outputs.empty() || !outputs[0].isTensor()) {
    return;
  }
  const at::Tensor& made = outputs[0].toTensor();
  if (!made.defined()) return;
  LastScalarTensor& last = KeepAddress(t_last_scalar_tensor);
  last = {made.unsafeGetTensorImpl(), made.const_data_ptr(), inputs[0].toDouble(),
          op_id};
}

}  // namespace nanhunt
