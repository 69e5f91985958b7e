// Which RecordFunction callbacks nanhunt has switched on: every op, or, in
// NANHUNT_MODE=sample between escalations, torch's own sampling.
//
// A callback that sees every op call costs each call a RecordFunction even
// when it returns at once, and, when it asks for inputs and outputs, their
// boxing: about 3% of a small model's CPU step before any check runs. torch
// has a path that costs an unsampled call nothing: a callback with a
// sampling probability is left out of the call's callbacks by a per-thread
// countdown, and with no callback left the dispatcher makes no
// RecordFunction at all. Sample mode uses it: optimizer records
// (USER_SCOPE) are observed always, op calls (FUNCTION) through a sampled
// callback. The countdown is drawn from a per-thread generator that nanhunt
// reseeds at every step from (seed, step), so two ranks or two runs running
// the same code sample the same calls.
#pragma once

#include <ATen/record_function.h>

#include <cstdint>

#include "interpose/torch/observation.h"

namespace nanhunt {

using ObserverStart = std::unique_ptr<at::ObserverContext> (*)(const at::RecordFunction&);
using ObserverEnd = void (*)(const at::RecordFunction&, at::ObserverContext*);

// Registers the callbacks, every-op observation on. `sampled_share` > 0
// prepares the sampled pair (sample mode), switched on by ObserveEveryOp(false).
void InstallObservers(ObserverStart start, ObserverEnd end, bool sample_mode,
                      double sampled_share);

}  // namespace nanhunt
