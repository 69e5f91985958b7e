// NANHUNT_MODE=sample as the plugin drives it: which op calls are checked,
// what torch is asked to observe after each step, escalation to every op
// when something is seen, and NANHUNT_BUDGET's accounting of what the
// checks cost. Torch-free: the observers themselves are observers.h's.
#pragma once

#include <cstdint>
#include <string>

#include "core/op_policy.h"  // kScalerUpdate

namespace nanhunt {

class Session;

// Something was seen at `step` (-1: the current step): every op is
// checked for the next NANHUNT_ESCALATE_STEPS steps. No-op outside sample
// mode.
void EscalateSampling(Session& session, const std::string& why, int64_t step = -1);

// At a step's end: move the share of ops checked toward the budget, then
// set what torch observes in the next step.
void SpendBudget(Session& session);
void UpdateObservation(Session& session);

// Whether this op call is checked.
bool Sampled(Session& session, const char* name);

// Whether ops of the current step go unchecked (sample mode, outside full
// and escalated steps): OpEvent::others_unchecked.
bool OthersUnchecked(Session& session);

// NANHUNT_BUDGET: started once at start when configured; the plugin adds
// the time its callbacks took (SelfTime::NowNs, a steady clock) while it is on.
void StartBudget(double budget);
bool BudgetOn();
void AddCheckTime(int64_t ns);

// For the trace's metadata: op calls seen (hash sampling) and checked, and
// whether torch sampled the calls at some point.
struct SampleTotals {
  int64_t calls_seen = 0, calls_checked = 0;
  bool torch_sampled = false;
};
SampleTotals GetSampleTotals();

}  // namespace nanhunt
