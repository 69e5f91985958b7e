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

}  // namespace nanhunt
