// Whether libtorch is mapped into this process, without linking it.
#pragma once

#include <string>

namespace nanhunt {

// True when a libtorch_cpu shared object is loaded (any path or version).
bool TorchIsLoaded();

// The directory libtorch_cpu was loaded from, or "" when it is not loaded.
std::string TorchLibraryDir();

}  // namespace nanhunt
