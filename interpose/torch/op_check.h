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

#include "core/monitor.h"

namespace nanhunt {

// What the schema says about an op, cached per thread.
struct OpTraits {
  bool writes = false;  // in-place or out=: writes one of its arguments
  std::vector<int> written_args;  // in-place args (self of add_): positions
  std::vector<int> out_args;      // out= args: overwritten, not inputs
  bool view = false;    // returns aliases of its inputs without writing
  bool random = false;  // takes a Generator: recomputing it would draw again
  bool uninitialised = false;  // outputs hold garbage by contract (empty)
  std::optional<c10::OperatorHandle> handle;
};
const OpTraits& TraitsOf(const at::RecordFunction& fn);

// Checks a floating-point tensor in host memory. False for tensors the
// check skips (other devices, layouts, integer dtypes).
bool CheckTensor(const at::Tensor& t, const CheckLimits& limits,
                 TensorFacts& facts);

// Checks every tensor among `outputs`; appends facts and the tensors.
void CheckOutputs(const std::vector<c10::IValue>& outputs,
                  const CheckLimits& limits, std::vector<TensorFacts>& facts,
                  std::vector<at::Tensor>& tensors);

// Storages whose last check found non-finite values, so that a non-finite
// input can be told apart: produced by an earlier op, or arrived from
// outside (a data batch). Thread-safe.
void RememberChecked(const at::Tensor& t, bool nonfinite);
bool KnownNonFinite(const at::Tensor& t);

// Checks the arguments an in-place or out= op is about to overwrite, before
// it runs: afterwards their old values are gone, and whether they were
// finite decides between origin and propagation.
std::vector<InputFacts> CheckWrittenArgs(c10::ArrayRef<const c10::IValue> inputs,
                                         const OpTraits& traits,
                                         const CheckLimits& limits);

// The OpContext of one finished op.
class TorchOpContext final : public OpContext {
 public:
  // `written_before`: CheckWrittenArgs of the op, taken at its start.
  TorchOpContext(const std::vector<c10::IValue>& inputs,
                 const std::vector<InputFacts>& written_before,
                 const std::vector<at::Tensor>& outputs, const OpTraits& traits,
                 const CheckLimits& limits, const std::string& torch_dir);
  std::vector<InputFacts> Inputs() override;
  std::string Source() override;
  std::string Stack() override;
  std::optional<double> RecomputeFp32MaxAbs() override;

 private:
  void Locate();

  const std::vector<c10::IValue>& inputs_;
  const std::vector<InputFacts>& written_before_;
  const std::vector<at::Tensor>& outputs_;
  const OpTraits& traits_;
  const CheckLimits& limits_;
  const std::string& torch_dir_;
  bool located_ = false;
  std::string source_, stack_;
};

}  // namespace nanhunt
