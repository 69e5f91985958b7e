// How the values grew up to the first origin. A training that diverges (a
// learning rate too high for its gradients, no warmup) writes larger
// weights, and larger optimizer state, at each update, until a forward
// value passes the format's range; a batch that exploded (scaled or
// unnormalised by mistake) does it within one step while the updates stay
// where they were. The fixes differ (lower the learning rate or clip,
// against fix the data), and the optimizer phase's max |x| per step
// (RunSummary::first_origin_phase_steps) tells the two apart.
#pragma once

#include <optional>
#include <string>

#include "viewer/diagnosis.h"

namespace nanhunt {

struct UpdateGrowth {
  // The updates' outputs grew at least a hundredfold, tenfold in their last
  // three steps: the training diverged. Otherwise they stayed within ten
  // times their smallest: the weights did not grow.
  bool diverged = false;
  std::string evidence;  // the steps and values that say so
  std::string fix;       // what to change first
};

// The growth of the updates before first origin `f`, when its trace has an
// optimizer phase over at least three steps before it and they either
// diverged or stayed put; nullopt when they say neither (or there were
// none: a hand-written update outside torch.optim).
std::optional<UpdateGrowth> UpdatesBefore(const RunSummary& s, const FindingRow& f);

// The `diverged` diagnosis when the updates before first origin `f` (an op
// that made inf/NaN of finite inputs) diverged: whichever op overflowed
// first, fp32 or bf16 for it would only postpone the NaN. Otherwise
// nullopt.
std::optional<Diagnosis> Diverged(const RunSummary& s, const FindingRow& f);

// The `diverging` diagnosis of a run the monitor warned live was diverging
// (RunSummary::diverging), for a run otherwise healthy: no inf/NaN yet (or
// the run stopped before them), or only in gradients a loss scaler
// skipped. Otherwise nullopt.
std::optional<Diagnosis> Diverging(const RunSummary& s);

}  // namespace nanhunt
