// GPU kernel names (CUPTI) with NANHUNT_KERNEL_NAMES=auto: off until the
// first result near fp16's limit or non-finite, or sample mode's first
// escalation; the findings after it name their kernels. Torch-free, so that
// sample_control.cc can ask for them.
#pragma once

namespace nanhunt {

// Subscribes to CUPTI now (or as soon as the GPU library loads), once.
// Defined in device_outputs.cc.
void NameKernelsFromNowOn();

}  // namespace nanhunt
