// A diagnosis class of its own: a batch norm's running statistics, module
// buffers it updates in place, overflowed in fp16. model.half() converts
// them with the weights; the running variance is a mean of squared
// activations, past 65504 once activations pass about 256. The values the
// layer returns stay finite, so training goes on, while evaluation
// normalises by an infinite variance: the layer's output for that feature
// becomes its bias. Running the op in fp32 (NANHUNT_FP32_OPS) cannot help: the
// buffers it writes back into stay fp16.
#pragma once

#include <optional>

#include "viewer/diagnosis.h"

namespace nanhunt {

// The `fp16_running_statistics` diagnosis when the first origin `f`'s
// inf/NaN are in a running statistic it updated in place (the plugin names
// such outputs "(running_var, updated in place)"). Otherwise nullopt.
std::optional<Diagnosis> Fp16RunningStatistics(const RunSummary& s, const FindingRow& f);

// The `nonfinite_input` diagnosis, told of the model rather than the data,
// when the first finding `f` is an input one whose inf/NaN were in a batch
// norm's running statistic (the plugin names such inputs "(running_var)"):
// no op of this process made them, so the model came with them (a
// checkpoint saved after they overflowed). Otherwise nullopt.
std::optional<Diagnosis> RunningStatisticsLoaded(const RunSummary& s, const FindingRow& f);

}  // namespace nanhunt
