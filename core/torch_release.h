// Which torch release a process runs, read from the files beside its
// libtorch without loading or linking torch, and whether the plugin was
// built against the same one. A plugin built against another torch's
// headers reads that torch's objects with the wrong layout: the preload
// library refuses to start it rather than risk the training.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace nanhunt {

// The version of the torch whose libraries are in `lib_dir` ("2.15.0+cu132"):
// from `__version__` in ../version.py (a Python wheel) or ../build-version
// (the LibTorch archive); "" when neither says.
std::string TorchReleaseBeside(absl::string_view lib_dir);

// Whether two torch versions are one release: the same major and minor
// version ("2.15.0" and "2.15.1+cu132" are; "2.15.0" and "2.14.1" are not).
// Patch releases keep the C++ interface; minor releases change it. False
// when either does not start with MAJOR.MINOR.
bool SameTorchRelease(absl::string_view a, absl::string_view b);

}  // namespace nanhunt
