// The records a trace holds, one struct per table (trace_schema.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace nanhunt {

// Aggregate of one op's outputs in one step, phase and dtype.
struct OpStatsRow {
  int64_t step = 0;
  std::string op, phase, dtype;
  int64_t calls = 0, elements = 0, nan = 0, posinf = 0, neginf = 0,
          near_max = 0, underflow = 0, fp16_overflow = 0;
  double max_abs = 0;  // largest non-NaN |x|; +inf when one was infinite
  // The op's calls whose ±inf were masks put there on purpose, in a row of
  // their own: merged with the calls that compute, a masked_fill's -inf
  // would hide an autocast cast's overflow in the same op's row.
  bool mask = false;
};

// Something worth a look: where non-finite values began (origin), arrived
// from outside (input), spread (propagated), or came close (near_max,
// underflow).
struct FindingRow {
  std::string kind;
  int64_t step = 0, call_index = 0;
  std::string op, top_op, phase, forward_op, dtype;
  int64_t elements = 0, nan = 0, posinf = 0, neginf = 0, near_max = 0,
          underflow = 0;
  double max_abs = 0;
  std::optional<double> fp32_max_abs;  // the op recomputed in fp32
  std::string inputs, outputs;
  // The user's line and up to 8 frames of stack, innermost first. A
  // backward op's line is its forward op's, which comes without a stack,
  // or the hook's or custom backward's that called it in the pass, with
  // its stack (Monitor: LocateInBackwardCode; SourceIsForwardLine tells
  // them apart).
  std::string source, stack;
  // The torch code between the op and that line that made the call, a
  // distribution's method or nn.MultiheadAttention's ("Normal.log_prob
  // (torch/distributions/normal.py:87)").
  std::string via;
  std::string kernels;  // GPU kernels the op launched (CUPTI), "name<<<grid>>>; ..."
  // A "compiled" finding's torch.compile region (OpEvent::compiled_region),
  // and the line it was called from when known.
  std::string compiled_region;
  int64_t thread = 0;
  double time = 0;
};

// Whether `f`'s source is the line its backward op's forward op was called
// from, rather than where code called the op itself.
inline bool SourceIsForwardLine(const FindingRow& f) {
  return !f.forward_op.empty() && !f.source.empty() && f.stack.empty();
}

// One training step.
struct StepRow {
  int64_t step = 0, ops = 0, nonfinite_ops = 0, origins = 0;
  double max_abs = 0, started = 0, ended = 0;
};

// GradScaler's scale after one update, and whether that step was skipped.
struct LossScaleRow {
  int64_t step = 0;
  double scale = 0;
  bool skipped = false;
};

// An optimizer step nanhunt skipped (NANHUNT_SKIP_NONFINITE_STEPS): its
// gradients were not finite. `first_op` is the backward op that first made
// non-finite values in that step (`forward_op` the forward op it belongs
// to); empty when no checked op did (the gradients came in from outside).
struct SkipRow {
  int64_t step = 0;
  std::string first_op, forward_op;
  double time = 0;
};

// NANHUNT_MODE=sample switched to checking every op from `step` through
// `until_step`, because of `why` (non-finite gradients, a GradScaler skip,
// a sampled op's finding).
struct EscalationRow {
  int64_t step = 0, until_step = 0;
  std::string why;
  double time = 0;
};

// Op outputs no check read (core/unchecked_outputs.h): `outputs` of `op`
// in `phase`, between `first_step` and `last_step`, for `reason`
// ("graph_capture", "not_enqueued", "released_before_check",
// "gpu_path_off", "unreadable", "copied_from_gpu_async").
struct UncheckedRow {
  std::string op, phase, reason;
  int64_t outputs = 0, first_step = 0, last_step = 0;
};

// Steps `first` through `last` turned out to be micro-batches of step `to`
// (core/step_tracker.h: the fallback's tentative advances, undone): the
// rows already written with those numbers are renumbered. Written as an
// UPDATE, in order with the rows before it.
struct StepRenumberRow {
  int64_t first = 0, last = 0, to = 0;
};

// The line a backward finding's forward op was called from, found a step
// or more after the finding was written (core/forward_line_fills.h): fills
// the source of the row with that step, call index, op and forward op that
// has none yet. Written as an UPDATE, in order with the rows before it.
struct ForwardLineRow {
  int64_t step = 0, call_index = 0;
  std::string op, forward_op, source;
};

// Something that happened to the run itself (config change, warning).
struct EventRow {
  double time = 0;
  std::string kind, detail;
};

}  // namespace nanhunt
