// Reads nanhunt traces (SQLite files written by core/trace_writer) for the
// viewer. A trace that is truncated, corrupt, locked or still being written
// is read as far as it can be: every table is read on its own, and what
// failed is listed in `problems` instead of failing the whole read.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/trace_rows.h"

namespace nanhunt {

// One op's outputs over the whole trace, per phase.
struct OpTotals {
  std::string op, phase;
  int64_t calls = 0, elements = 0, nan = 0, posinf = 0, neginf = 0,
          near_max = 0, underflow = 0, fp16_overflow = 0;
  // Of its outputs in formats that flush below fp16's smallest normal
  // (float16, float8_e5m2): underflow is harm there, a forecast elsewhere.
  int64_t fp16_elements = 0, fp16_underflow = 0;
  double max_abs = 0;  // +inf when an output was infinite
  // max |x| in each quarter of the run's steps (+inf: non-finite): the
  // trend; 0 where the op did not run.
  double quarters[4] = {0, 0, 0, 0};
  // The op's calls whose ±inf were deliberate masks (op_stats.mask), kept
  // apart from its calls that compute.
  bool mask = false;
  int64_t nonfinite() const { return nan + posinf + neginf; }
};

// One op's outputs in one step (all dtypes), for charts and comparisons.
struct OpStep {
  int64_t step = 0;
  std::string op, phase, dtype;
  double max_abs = 0;
  int64_t nonfinite = 0, underflow = 0, elements = 0;
  bool mask = false;  // its mask calls (OpTotals::mask)
};

// One phase's outputs in one step: the largest finite |x| (0 when none)
// and how many were inf/NaN, over every op but masks. How the values grew
// up to an origin: the updates' step by step tells a diverging training
// from a batch that jumped.
struct PhaseStep {
  int64_t step = 0;
  std::string phase;
  double max_abs = 0;
  int64_t nonfinite = 0;
};

// An events row about one step: "step 3: the updates grew ...".
struct StepEvent {
  int64_t step = 0;
  std::string detail;  // after "step N: "
};

struct Trace {
  std::string path;
  std::map<std::string, std::string> meta;
  std::vector<FindingRow> findings;  // ordered by step, call index
  std::vector<OpTotals> ops;
  std::vector<std::string> dtypes;  // of all checked outputs
  std::vector<StepRow> steps;
  std::vector<LossScaleRow> loss_scale;  // GradScaler updates, in order
  std::vector<SkipRow> skips;  // optimizer steps nanhunt skipped (schema 3)
  std::vector<EscalationRow> escalations;  // sample mode (schema 5)
  std::vector<UncheckedRow> unchecked;     // outputs no check read (schema 6)
  // Steps whose inf/NaN were all freed with their temporaries by the end of
  // their optimizer step (events kNonFiniteDropped).
  std::vector<int64_t> dropped_steps;
  // Iterations whose program skipped the update itself, each a step
  // (events kProgramSkippedUpdate).
  std::vector<int64_t> program_skipped_steps;
  // Iterations the program gave up before their backward pass, on a
  // non-finite loss, each a step (events kGaveUpIteration).
  std::vector<int64_t> given_up_steps;
  // The step the process ended in mid-iteration (events kUnfinishedStep).
  std::vector<int64_t> unfinished_steps;
  // The monitor's live warnings that the training was diverging (events
  // kDiverging, core/divergence_watch.h), in order.
  std::vector<StepEvent> diverging;
  // Eps the process used that were 0 in their format (events
  // kEpsRoundedToZero, Monitor::OnEpsRoundedToZero), in order.
  std::vector<StepEvent> eps_rounded;
  // Numbers the program wrote past the range of the format a mask op made
  // -inf of them in (events kMaskLiteralPastRange), in order.
  std::vector<StepEvent> mask_literals;
  std::vector<OpStep> op_steps;  // with ReadTrace(..., with_series = true)
  // Per step and phase, ordered by step, up to the step of the trace's
  // first origin (none without one: a healthy trace is not scanned again).
  std::vector<PhaseStep> phase_steps;
  std::vector<std::string> problems;  // what could not be read, and why
};

// Reads one trace. Fails only when the file cannot be opened as SQLite at
// all; anything less yields a Trace with `problems` filled in.
// `with_series`: also read per-step, per-op rows (report, compare).
// `progress_ms` >= 0: when reading takes longer and stderr is a terminal,
// a progress line shows there (and is cleared at the end).
absl::StatusOr<Trace> ReadTrace(const std::string& path, bool with_series = false,
                                int progress_ms = -1);

// The trace files among `paths` (files, or folders whose *.sqlite files are
// taken). Folders holding several runs keep only the newest run (with the
// processes it started: viewer/run_groups.h) unless `all_runs`. Errors name
// the path.
absl::StatusOr<std::vector<std::string>> FindTraceFiles(
    const std::vector<std::string>& paths, bool all_runs);

}  // namespace nanhunt
