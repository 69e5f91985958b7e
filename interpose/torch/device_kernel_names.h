// GPU kernel names (CUPTI) in sample mode: off until the first escalation,
// where they name the kernels of the ops the window finds. Torch-free, so
// that sample_control.cc can ask for them.
#pragma once

namespace nanhunt {

// Subscribes to CUPTI now (or as soon as the GPU library loads), once.
// Defined in device_outputs.cc.
void NameKernelsFromNowOn();

}  // namespace nanhunt
