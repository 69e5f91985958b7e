// A diagnosis class of its own: a batch norm's running statistics, module
// buffers it updates in place, overflowed in fp16. model.half() converts
// them with the weights; the running variance is a mean of squared
// activations, past 65504 once activations pass about 256. The values the
// layer returns stay finite, so training goes on, while evaluation
// normalises by an infinite variance: every output of the layer becomes its
// bias. Running the op in fp32 (NANHUNT_FP32_OPS) cannot help: the
// buffers it writes back into stay fp16.
#pragma once

#include <optional>

#include "viewer/diagnosis.h"

namespace nanhunt {

// The `fp16_running_statistics` diagnosis when the first origin `f`'s
// inf/NaN are in a running statistic it updated in place (the plugin names
// such outputs "(running_var, updated in place)"). Otherwise nullopt.
std::optional<Diagnosis> Fp16RunningStatistics(const RunSummary& s, const FindingRow& f);

}  // namespace nanhunt
