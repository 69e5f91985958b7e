// `nanhunt run -- CMD...`: runs CMD with libnanhunt.so preloaded.
#pragma once

#include <string>
#include <vector>

namespace nanhunt {

struct RunOptions {
  std::string out_dir;  // empty: NANHUNT_OUT or the default
  std::vector<std::string> command;
};

// Starts the command with the preload library and a fresh run id, forwards
// signals sent to nanhunt, waits, prints the summary of the run's traces to
// stderr, and returns the exit code to exit with: the child's, or 128+N when
// signal N ended it.
int RunCommand(const RunOptions& options);

}  // namespace nanhunt
