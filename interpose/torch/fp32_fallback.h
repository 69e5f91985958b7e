// NANHUNT_FP32_OPS: run chosen ops in fp32 without code change, by
// registering kernels for dispatch keys that sit above autograd.
#pragma once

#include <string>
#include <vector>

#include <ATen/core/operator_name.h>

#include "absl/status/status.h"

namespace nanhunt {

// Registers, for every operator whose name matches `patterns`:
// - under autocast (AutocastCPU, AutocastCUDA): a kernel that casts fp16/bf16
//   tensor arguments to fp32 and runs the op below autocast. Outputs are
//   fp32, as for autocast's own fp32 ops; autograd sees the casts, so
//   gradients are right. torch warns once per op that an autocast kernel
//   was overridden; the new kernel wins.
// - without autocast (a model made .half()): a kernel on a spare autocast
//   key that nanhunt switches on for each thread (EnableFp32OnThisThread):
//   it computes in fp32 and casts the outputs back to the low-precision
//   dtype the op would have returned.
// Ops that write their arguments (add_, out=) are never switched: their
// result must land in the caller's fp16 tensor. An error names the pattern
// that matched no operator, or a name that only matches such ops. Call
// after libtorch registered its operators.
absl::Status InstallFp32Fallback(const std::vector<std::string>& patterns);

// Autocast casts at the outermost op it knows (matmul), and runs the ops
// inside it (bmm) with autocast excluded, where no autocast kernel is
// reached. So when a listed op turns out to run inside such an op, the
// enclosing op is switched too, from its next call on. Returns true the
// first time for `enclosing`. Thread-safe.
bool ExtendFp32Fallback(const c10::OperatorName& enclosing);

// NANHUNT_FP32_OPS=auto: switches `op` from its next call on and adds it to
// the learned list. Returns true the first time (false also for ops that
// write their arguments, for casts, and for batch norm, whose fp16 buffers
// would overflow all the same). Thread-safe.
bool LearnFp32Op(const c10::OperatorName& op);
// The ops learned so far, in the order learned ("aten::bmm").
std::vector<std::string> LearnedFp32Ops();

// Takes the spare key and switches it on for the calling thread. Call at
// start-up, between ops (a switch made inside an op does not outlast it),
// when fp32 ops are configured; their threads inherit it (autograd's too).
void PrepareFp32Fallback();

// Lets this thread's ops reach the fp32 kernels when autocast is off, for
// threads that started without it. Call at the start of top-level ops only
// (never inside an op, where the key may be excluded on purpose); best
// effort, as the switch may be undone when the op returns to a caller's
// guard. A no-op until the key is taken.
void EnableFp32OnThisThread();

// "aten::bmm=120,aten::_softmax=40": how often each switched op ran in fp32.
std::string Fp32FallbackCounts();

}  // namespace nanhunt
