// What a module calls its tensors while load_state_dict copies a
// checkpoint into them, as step_guard.py's load_state_dict wrapper tells
// the plugin just before (CUDA tensors only). On a GPU a copy's values are
// known only once its check comes back, after the op, so a copy into a
// parameter could not be named as on the CPU path, by Python's walk over
// the program's modules, when it brings inf/NaN: that walk would have to
// run for every such copy. With this, a checkpoint loaded straight onto
// the GPU is "(copied into parameter 2.weight)", for nothing.
// Torch-free: keyed by the storage's memory, forgotten when the load ends.
#pragma once

#include <optional>
#include <string>

namespace nanhunt {

// `storage` is the module's tensor `name` ("parameter 2.weight").
void NoteLoadingInto(const void* storage, std::string name);

// What the load under way calls `storage`: a relaxed load and nothing
// more while no load is under way.
std::optional<std::string> LoadingNameOf(const void* storage);

// The load ended (or failed).
void ForgetLoadingNames();

}  // namespace nanhunt
