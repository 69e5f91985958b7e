// A diagnosis class of its own: the optimizer's update made inf/NaN from
// finite gradients, in fp16. Adam (also AdamW, Adagrad, RMSprop) divides by
// the square root of a running average of squared gradients plus eps; with
// the weights, and so the optimizer state, in fp16 (model.half() without
// fp32 master weights), eps = 1e-8 rounds to 0 and squared gradients below
// 6e-8 flush to 0: the divisor is 0 (and squared gradients past 65504
// overflow the state). Loss scaling, the advice for an
// overflow in the backward pass, cannot help (GradScaler refuses fp16
// gradients to unscale).
#pragma once

#include <optional>

#include "viewer/diagnosis.h"

namespace nanhunt {

// The `fp16_optimizer_state` diagnosis when the first origin `f` is such a
// division in the optimizer phase with fp16 outputs. Otherwise nullopt.
std::optional<Diagnosis> Fp16OptimizerState(const RunSummary& s, const FindingRow& f);

// The `fp16_gradient_norm` diagnosis when the first origin `f` is a norm of
// fp16 gradients (clip_grad_norm_'s _foreach_norm and the norm of the
// norms, or the program's own) that overflowed while each gradient was
// finite: clip_grad_norm_ then multiplies every gradient by
// max_norm / (inf + 1e-6) = 0, and training stops moving without a NaN in
// the loss. Loss scaling and "clip gradients", the advice for a gradient
// overflow, are no help: the clipping is what overflowed. Otherwise nullopt.
std::optional<Diagnosis> Fp16GradientNorm(const RunSummary& s, const FindingRow& f);

}  // namespace nanhunt
