// What went wrong in a run, classified the way someone who has debugged
// many fp16 runs would: one class, the evidence for it, and the fixes that
// usually apply, most direct first. Computed from a RunSummary alone, so it
// is the same in the terminal, the JSON and the HTML report.
#pragma once

#include <string>
#include <vector>

#include "viewer/summary.h"

namespace nanhunt {

struct Diagnosis {
  // forward_overflow, backward_overflow, invalid_math, nonfinite_input,
  // unchecked_maker (sample mode: an input whose maker went unchecked),
  // unknown_origin (only carried inf/NaN, which no checked op made and
  // each step did not drop), mask_made_nonfinite, nan_marker_reached,
  // skipped_steps, underflow, fp16_optimizer_state, fp16_gradient_norm,
  // fp16_running_statistics, diverged (the updates grew step after step
  // until something overflowed), healthy (and received, for a rank that
  // only got inf/NaN from others).
  std::string kind;
  std::string title;                  // one line for a newcomer
  std::string op;                     // the op it is about, if any
  std::vector<std::string> evidence;  // facts from the trace
  std::vector<std::string> fixes;     // what to try, most direct first
};

Diagnosis Diagnose(const RunSummary& s);

// "aten::bmm in aten::matmul": a finding's op and the op it ran inside, as
// the evidence names them.
std::string OpInTopOp(const FindingRow& f);

// Shares of steps skipped and of backward values below fp16's smallest
// normal at which a run counts as stalled rather than healthy.
inline constexpr double kSkippedStepsShare = 0.2;
inline constexpr double kGradientUnderflowShare = 0.05;

}  // namespace nanhunt
