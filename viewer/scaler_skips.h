// Which steps a loss scaler skipped, told the same way whoever the scaler
// was: torch.amp.GradScaler (its loss_scale rows say so), or the program's
// own (fairseq's and Megatron's FP16 optimizers, DeepSpeed's fp16 engine,
// a hand-written one), which nanhunt sees as non-finite gradients thrown
// away and the next batch begun without an optimizer step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "viewer/diagnosis.h"
#include "viewer/summary.h"

namespace nanhunt {

struct ScalerSkips {
  bool grad_scaler = false;  // else the program's own scaler
  std::vector<int64_t> steps;  // the steps it skipped, ascending
  int64_t first_step = 0;      // the first step it decided on
  int64_t decided = 0;         // how many steps it decided on
  // "GradScaler", "the program's loss scaler"
  std::string Who() const;
};

// GradScaler's, when the run had one; else the program's (none skipped:
// `decided` is 0 when neither did).
ScalerSkips SkipsOf(const RunSummary& s);

// The share of the steps it decided on that it skipped.
double SkippedShare(const ScalerSkips& k);

// How many steps at its start the scaler skipped while its scale settled,
// when it handled every inf/NaN of the run: each step whose inf/NaN may
// have outlived it is one it skipped, and past those first steps it
// skipped few (as it does when it grows its scale again, every
// growth_interval steps). -1 when the run is not so. The step a run
// stopped in before the scaler decided on it is neither.
int64_t StepsTheScalerHandled(const RunSummary& s, const ScalerSkips& k);

// Evidence of what the scaler did: its scale history (GradScaler), or the
// steps it skipped (the program's).
void AddScalerEvidence(const RunSummary& s, const ScalerSkips& k, Diagnosis& d);

}  // namespace nanhunt
