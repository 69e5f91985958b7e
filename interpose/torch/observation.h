// What nanhunt's RecordFunction callbacks (observers.h) observe right now:
// every op call, or op calls as torch samples them. Torch-free, for the
// code that decides (sample_control.h).
#pragma once

#include <cstdint>

namespace nanhunt {

// true: every op call, backward node and user scope is observed (check
// mode, escalations, fully checked steps, interventions that act on every
// op). false: user scopes always, and op calls as torch samples them.
// Thread-safe; a no-op when nothing changes.
void ObserveEveryOp(bool every);
bool ObservingEveryOp();

// The share of op calls torch samples while not observing every op (0:
// none), from the next ReseedSampling or ObserveEveryOp(false) on: both come
// at every step's end, where the share changes.
void SetSampledShare(double share);

// Reseeds the calling thread's sampling with `seed` and makes every thread
// draw its next sampled call anew (called at each step, on the step's thread).
void ReseedSampling(uint64_t seed);

}  // namespace nanhunt
