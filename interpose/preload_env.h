// Edits of the process environment made by the preload library.
#pragma once

namespace nanhunt {

// Removes libnanhunt.so from LD_PRELOAD in this process's environment, so
// that programs it starts are not monitored (NANHUNT_FOLLOW_CHILDREN=0).
// Must run before the host reads its environment (the preload constructor).
void RemoveSelfFromPreload();

}  // namespace nanhunt
