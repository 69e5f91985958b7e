// NANHUNT_FP32_OPS: run chosen ops in fp32 under autocast, without code
// change, by registering kernels for the autocast dispatch keys.
#pragma once

#include <string>
#include <vector>

#include <ATen/core/operator_name.h>

#include "absl/status/status.h"

namespace nanhunt {

// Registers, for every operator whose name matches `patterns`, a kernel on
// AutocastCPU and AutocastCUDA that casts fp16/bf16 tensor arguments to fp32
// and runs the op below autocast: outputs are fp32, as for autocast's own
// fp32 ops, and autograd sees the casts, so gradients are right. torch warns
// once per op that an autocast kernel was overridden; the new kernel wins.
// An error names the pattern that matched no operator. Call once, after
// libtorch registered its operators.
absl::Status InstallFp32Fallback(const std::vector<std::string>& patterns);

// Autocast casts at the outermost op it knows (matmul), and runs the ops
// inside it (bmm) with autocast excluded, where no autocast kernel is
// reached. So when a listed op turns out to run inside such an op, the
// enclosing op is switched too, from its next call on. Returns true the
// first time for `enclosing`. Thread-safe.
bool ExtendFp32Fallback(const c10::OperatorName& enclosing);

// "aten::bmm=120,aten::_softmax=40": how often each switched op ran in fp32.
std::string Fp32FallbackCounts();

}  // namespace nanhunt
