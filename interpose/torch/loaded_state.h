// Tensors that came from a checkpoint holding inf/NaN without any op
// writing them, as step_guard.py reads them: an optimizer's state just
// before its first step, and a model's parameters and buffers right after
// load_state_dict(..., assign=True) made the loaded tensors its own.
// A GPU op's check reads what the op wrote, not what it read: without
// this, the first reader of a loaded inf (Adam's mul_ of exp_avg_sq, the
// first forward pass's matmul) would be called its origin. With it, that
// op's input is known non-finite, and named, as on the CPU path, where
// inputs are read. Torch-free: keyed by the storage's memory, kept until
// an op writes it or the first optimizer step after the read ends.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/check_semantics.h"

namespace nanhunt {

// Whose tensor it is: counted apart in the trace's meta.
enum class LoadedInto { kOptimizer, kModel };

struct LoadedNonFinite {
  CheckCounts counts;  // elements, nan, posinf, neginf
  double max_abs = 0;  // largest non-NaN magnitude, infinity included
  std::string name;    // "Adam state exp_avg_sq of 2.weight", "parameter 2.weight"
  LoadedInto into = LoadedInto::kOptimizer;
};

// Noted by the step guard (nanhunt_loaded_state, nanhunt_loaded_model_tensor),
// under its storage's memory.
void NoteLoadedNonFinite(const void* storage, LoadedNonFinite facts);

// What was noted of `storage` and not written since: a relaxed load and
// nothing more in a run that loaded no such state.
std::optional<LoadedNonFinite> LoadedNonFiniteAt(const void* storage);

// `storage` was written by a checked op: what it holds now is that op's.
void ForgetLoadedNonFiniteAt(const void* storage);

// The step after the read ended: its forward pass and its update read that
// memory, or wrote it.
void ForgetAllLoadedNonFinite();

// Tensors of `into` found holding inf/NaN so far (the trace's meta).
int64_t LoadedNonFiniteNoted(LoadedInto into);

}  // namespace nanhunt
