// The NaN guard's snapshot: the offending op's arguments, saved so that
// `nanhunt replay` (and torch.load) can reproduce the overflow.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/trace_rows.h"

namespace nanhunt {

// Writes <dir>/nanhunt-snapshot-<pid>-step<step>.pt, created with mode 0600
// in a directory made with mode 0700 (snapshots hold training data). The
// file is what torch.save writes: a dict with "op", "overload", "arg_names",
// "kwarg_only", "args" (tensors as they entered the op), "finding" (the
// finding's fields as strings), "python" (the interpreter, for replay).
absl::StatusOr<std::string> SaveSnapshot(
    const std::string& dir, const std::optional<c10::OperatorHandle>& op,
    const std::vector<c10::IValue>& args, const FindingRow& finding);

}  // namespace nanhunt
