// The trace's SQLite schema, shared by the writer and the viewer. Documented
// in the README ("Trace schema"); bump kTraceSchemaVersion on any change.
#pragma once

namespace nanhunt {

inline constexpr int kTraceSchemaVersion = 9;

inline constexpr const char kTraceSchema[] = R"sql(
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS op_stats(
  step INTEGER, op TEXT, phase TEXT, dtype TEXT, calls INTEGER,
  elements INTEGER, nan INTEGER, posinf INTEGER, neginf INTEGER,
  near_max INTEGER, underflow INTEGER, fp16_overflow INTEGER, max_abs REAL,
  mask INTEGER);
CREATE TABLE IF NOT EXISTS findings(
  id INTEGER PRIMARY KEY, kind TEXT, step INTEGER, call_index INTEGER,
  op TEXT, top_op TEXT, phase TEXT, forward_op TEXT, dtype TEXT,
  elements INTEGER, nan INTEGER, posinf INTEGER, neginf INTEGER,
  near_max INTEGER, underflow INTEGER, max_abs REAL, fp32_max_abs REAL,
  inputs TEXT, outputs TEXT, source TEXT, stack TEXT, thread INTEGER,
  time REAL, kernels TEXT, compiled_region TEXT, via TEXT);
CREATE TABLE IF NOT EXISTS steps(
  step INTEGER, ops INTEGER, nonfinite_ops INTEGER, origins INTEGER,
  max_abs REAL, started REAL, ended REAL);
CREATE TABLE IF NOT EXISTS events(time REAL, kind TEXT, detail TEXT);
CREATE TABLE IF NOT EXISTS loss_scale(step INTEGER, scale REAL, skipped INTEGER);
CREATE TABLE IF NOT EXISTS skipped_steps(
  step INTEGER, first_op TEXT, forward_op TEXT, time REAL);
CREATE TABLE IF NOT EXISTS escalations(
  step INTEGER, until_step INTEGER, why TEXT, time REAL);
CREATE TABLE IF NOT EXISTS unchecked_outputs(
  op TEXT, phase TEXT, reason TEXT, outputs INTEGER, first_step INTEGER,
  last_step INTEGER);
)sql";

// An events row for a step whose inf/NaN were all gone by its optimizer
// step's end (Monitor::OnOptimizerStepEnd); its detail starts "step N: ".
inline constexpr const char kNonFiniteDropped[] = "nonfinite_dropped";
inline constexpr const char kNonFiniteDroppedDetail[] =
    "every tensor holding the step's inf/NaN was freed by the end of its "
    "optimizer step: no weight, gradient or buffer held them";

// An events row for an iteration whose program skipped the update itself
// (Monitor::program_skips); its detail starts "step N: ".
inline constexpr const char kProgramSkippedUpdate[] = "program_skipped_update";
inline constexpr const char kProgramSkippedUpdateDetail[] =
    "non-finite gradients, then the next iteration without an optimizer "
    "step; no gradient, weight or buffer kept them: the program skipped "
    "the update (its own loss scaler)";

// An events row for an iteration the program gave up before its backward
// pass (Monitor::iterations_given_up); its detail starts "step N: ".
inline constexpr const char kGaveUpIteration[] = "iteration_given_up";
inline constexpr const char kGaveUpIterationDetail[] =
    "the forward pass made inf/NaN, then the next batch began without a "
    "backward pass: the program gave the iteration up (on a non-finite "
    "loss)";

// An events row for a step the process ended in, after it trained and
// before its optimizer step ended it (a run that stopped mid-iteration);
// its detail starts "step N: ".
inline constexpr const char kUnfinishedStep[] = "unfinished_step";
inline constexpr const char kUnfinishedStepDetail[] =
    "the process ended in this step, before an optimizer step or a loss "
    "scaler's skip ended it";

// An events row for a step whose update passed DivergenceWatch's bars
// (core/divergence_watch.h): its detail is "step N: " and the growth, "the
// updates grew from max|x| 0.82 at step 0 to 4782.83 at step 3".
inline constexpr const char kDiverging[] = "diverging";

// An events row for an eps that is 0 in the format it was used in
// (Monitor::OnEpsRoundedToZero): "step N: aten::clamp_min's 1e-12 is 0 in
// float16 (its smallest value is 5.96046e-08), at model.py:12 in forward".
inline constexpr const char kEpsRoundedToZero[] = "eps_rounded_to_zero";

// An events row for a number the program wrote past the range of the format
// a mask op made -inf of it in (Monitor::OnMaskLiteralPastRange): "step N:
// aten::mul made -inf of the program's 1e+09, past float16's largest value
// (65504), at model.py:8 in forward".
inline constexpr const char kMaskLiteralPastRange[] = "mask_literal_past_range";

}  // namespace nanhunt
