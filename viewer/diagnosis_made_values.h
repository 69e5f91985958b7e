// A forward overflow of its own kind: an op that makes values from the
// program's numbers rather than from tensors (torch.arange(n,
// dtype=torch.float16), logspace, a random draw), asked for float16 and
// given numbers past its range. Rotary position tables grown with
// torch.arange(n, dtype=self.inv_freq.dtype) count positions in fp16 once
// model.half() made that buffer float16: position 65520 is +inf, and cos
// and sin of it NaN. No op runs in fp32 for NANHUNT_FP32_OPS and no
// autocast switch changes a dtype the code asks for, so the generic
// forward-overflow fixes (and "as activations grew") do not apply.
#pragma once

#include <optional>

#include "viewer/diagnosis.h"

namespace nanhunt {

// Whether `op` makes its values from the program's numbers: a sequence
// (arange, linspace, ...) or a random draw (normal_, cauchy_, ...).
bool MakesValuesFromNumbers(absl::string_view op);

// The `forward_overflow` diagnosis told of the op's numbers when the first
// origin `f` is such an op's float16 +-inf. Otherwise nullopt.
std::optional<Diagnosis> MadeFromNumbers(const RunSummary& s, const FindingRow& f);

}  // namespace nanhunt
