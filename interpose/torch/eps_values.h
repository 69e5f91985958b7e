// The value an op's eps argument holds (core/op_policy.h's EpsArgument),
// to tell when it is 0 in the op's format (Monitor::OnEpsRoundedToZero).
//
// A Python float arrives as a double or a wrapped number, read in place.
// torch's own C++ passes some as a 0-dim tensor instead: F.cosine_similarity
// clamps each norm with clamp_min_(norm, at::scalar_tensor(eps, ...)), on
// the norm's device. Its value is the one the aten::scalar_tensor call
// that made it was given, on the same thread, just before: a device
// tensor is never copied back (that would sync the stream), and a 0-dim
// tensor of the program's (a loss it adds) is no eps.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <ATen/core/ivalue.h>

namespace nanhunt {

// A one-element host tensor's value, read in place (item() would be an op
// of its own, seen by the callbacks); nullopt for other tensors, for
// integers, and where there is no memory to read (a fake tensor's).
std::optional<double> HostScalarValue(const at::Tensor& t);

// `given`, the eps argument of op call `op_id`; nullopt when it holds no
// floating-point number that can be read without a device copy.
std::optional<double> EpsValueOf(const c10::IValue& given, uint64_t op_id);

// Op call `op_id`, an aten::scalar_tensor(value, ...), returned `outputs`:
// what EpsValueOf reads for its tensor in the calls that follow it.
void NoteScalarTensor(const std::vector<c10::IValue>& inputs,
                      const std::vector<c10::IValue>& outputs, uint64_t op_id);

}  // namespace nanhunt
