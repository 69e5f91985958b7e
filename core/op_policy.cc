#include "core/op_policy.h"

#include "absl/strings/match.h"

namespace nanhunt {

bool OutputsAreUninitialised(absl::string_view op) {
  for (absl::string_view prefix :
       {"aten::empty", "aten::new_empty", "aten::_empty", "aten::resize_"}) {
    if (absl::StartsWith(op, prefix)) return true;
  }
  return false;
}

bool PassesInputThrough(absl::string_view op) {
  for (absl::string_view name :
       {"aten::_unsafe_view", "aten::lift_fresh", "aten::_reshape_alias",
        "aten::alias", "aten::detach", "aten::lift"}) {
    if (op == name) return true;
  }
  return false;
}

bool IsBookkeepingRecord(absl::string_view name) {
  return absl::StartsWith(name, "autograd::") ||
         absl::StartsWith(name, "profiler::");
}

}  // namespace nanhunt
