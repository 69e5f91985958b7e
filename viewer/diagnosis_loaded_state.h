// Non-finite values a training process was handed with its model or its
// optimizer, rather than with a batch: a checkpoint saved after the run
// that wrote it diverged (the run resumed from it fails at its first
// step), or values set outside torch's ops. The plugin names the tensors
// such values came in ("(parameter 2.weight)", "(buffer pos_table)",
// "(Adam state exp_avg_sq of 2.weight)", or for the copy load_state_dict
// makes of a checkpoint saved in another dtype, "(copied into parameter
// 2.weight)"; interpose/torch/model_tensor_names.h); the advice is then
// about the checkpoint, not the dataset.
#pragma once

#include <optional>

#include "viewer/diagnosis.h"

namespace nanhunt {

// The `nonfinite_input` diagnosis, told of the model or the optimizer,
// when the first finding `f` is an input one whose inf/NaN were in a
// parameter, a buffer or an optimizer's state, or that an update read (no
// batch goes into an optimizer step). Otherwise nullopt. Not for sample
// mode: there an unchecked op may have made them.
std::optional<Diagnosis> LoadedStateNonFinite(const RunSummary& s, const FindingRow& f);

}  // namespace nanhunt
