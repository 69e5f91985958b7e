// Optimizer state that came from a checkpoint holding inf/NaN, as the step
// guard (step_guard.py) reads it just before its optimizer's first step.
// A GPU op's check reads what the op wrote, not what it read: without
// this, the update that first reads a loaded inf (Adam's mul_ of
// exp_avg_sq) would be called its origin. With it, the update's input is
// known non-finite, and named, as on the CPU path, where inputs are read.
// Torch-free: keyed by the storage's memory, kept until the step ends.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/check_semantics.h"

namespace nanhunt {

struct LoadedNonFinite {
  CheckCounts counts;  // elements, nan, posinf, neginf
  double max_abs = 0;  // largest non-NaN magnitude, infinity included
  std::string name;    // "Adam state exp_avg_sq of 2.weight"
};

// Noted by the step guard (nanhunt_loaded_state), under its storage's memory.
void NoteLoadedNonFinite(const void* storage, LoadedNonFinite facts);

// What was noted of `storage` and not written since: a relaxed load and
// nothing more in a run that loaded no such state.
std::optional<LoadedNonFinite> LoadedNonFiniteAt(const void* storage);

// `storage` was written by a checked op: what it holds now is that op's.
void ForgetLoadedNonFiniteAt(const void* storage);

// The step that read the state ended: its update wrote that memory, or
// left it alone.
void ForgetAllLoadedNonFinite();

// Loaded-state tensors found holding inf/NaN so far (the trace's meta).
int64_t LoadedNonFiniteNoted();

}  // namespace nanhunt
