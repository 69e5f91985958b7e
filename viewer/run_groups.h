// Which traces in a folder make up one run, so that `nanhunt view DIR`
// shows the newest run whole.
//
// A run is the traces that share a run id (`nanhunt run` gives every
// process it starts one id) together with the traces of the processes they
// started. Under a plain LD_PRELOAD each process gets an id of its own, yet
// its children are part of the same run: torchrun's ranks, DataLoader
// workers that load torch, and torch.compile's probe that dlopens a freshly
// built kernel in a new Python (which loads libtorch, and so nanhunt). Such
// a helper starts after the training process; grouped by id alone it would
// be "the newest run", an empty trace in place of the training's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace nanhunt {

// What a trace says about the process that wrote it (its meta table).
struct TraceIdentity {
  std::string file;
  std::string run_id;  // meta run_id, else taken from the file name
  std::string host;
  int64_t pid = 0, ppid = 0;  // 0: unknown
  int64_t started = 0;        // seconds since the epoch; 0: unknown
  int64_t ended = 0;          // 0: unknown, or still running
};

// Groups the traces into runs (by run id, and joining a child's run to its
// parent's: same host, the parent's pid is the child's ppid, and the child
// started while the parent ran) and returns the files of the run that
// started last, sorted. Ties go to the greater run id.
std::vector<std::string> NewestRun(const std::vector<TraceIdentity>& traces);

}  // namespace nanhunt
