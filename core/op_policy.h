// Which ops' outputs are not worth checking.
#pragma once

#include "absl/strings/string_view.h"

namespace nanhunt {

// Ops whose outputs are uninitialised memory by contract (torch.empty and
// friends, resize_): whatever bits they hold are not a finding.
bool OutputsAreUninitialised(absl::string_view op);

}  // namespace nanhunt
