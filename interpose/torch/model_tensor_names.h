// What a tensor the program gave an op is to its model: "parameter
// encoder.layers.3.linear1.weight", "buffer pos_table", "Adam state
// exp_avg_sq of 2.weight". Asked only of inf/NaN no checked op made, so
// that a checkpoint's diverged weights are not taken for a bad batch.
#pragma once

#include <optional>
#include <string>

namespace nanhunt {

// The name of the parameter, buffer or optimizer state whose storage
// begins at `storage_data` (at::Storage::data()), found among the
// nn.Modules and optimizers the Python process holds: "" when it is none
// of theirs (a batch), or when the run has had its share of lookups (each
// walks Python's objects: about 50 ms with 300,000 of them; the first
// findings are the ones read). nullopt when there is no Python to ask (a
// C++ LibTorch program) or the lookup failed.
std::optional<std::string> NameModelTensor(const void* storage_data);

// How many lookups the run asked for (those past its share included): the
// trace's meta model_tensor_lookups.
int ModelTensorLookups();

}  // namespace nanhunt
