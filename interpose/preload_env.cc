#include "interpose/preload_env.h"

#include <stdlib.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace nanhunt {

void RemoveSelfFromPreload() {
  const char* preload = getenv("LD_PRELOAD");
  if (preload == nullptr) return;
  std::vector<std::string> kept;
  // LD_PRELOAD separates entries with spaces or colons.
  for (absl::string_view entry :
       absl::StrSplit(preload, absl::ByAnyChar(" :"), absl::SkipEmpty())) {
    if (!absl::EndsWith(entry, "libnanhunt.so")) kept.emplace_back(entry);
  }
  if (kept.empty()) {
    unsetenv("LD_PRELOAD");
  } else {
    setenv("LD_PRELOAD", absl::StrJoin(kept, ":").c_str(), 1);
  }
}

}  // namespace nanhunt
