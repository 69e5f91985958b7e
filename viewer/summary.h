// What `nanhunt view` says about one or more traces of a run, computed once
// and rendered as text (terminal) or JSON (scripts).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "viewer/trace_reader.h"

namespace nanhunt {

struct PhaseTotals {
  std::string phase;
  int64_t calls = 0, elements = 0, nonfinite_values = 0,
          near_max = 0, underflow = 0;
  int64_t fp16_elements = 0, fp16_underflow = 0;  // OpTotals' fields
};

// Formats whose own range ends near 65504 (float16, float8_e5m2): near-max
// there is news, in wider formats a forecast.
bool IsFp16Range(absl::string_view dtype);

struct RunSummary {
  std::vector<std::string> traces;
  std::vector<std::string> commands;   // distinct commands
  std::vector<std::string> dtypes;     // of the checked outputs
  std::vector<std::string> settings;   // NANHUNT_* not at their defaults
  std::string torch_version;
  std::optional<FindingRow> first_origin;  // first origin or input finding
  std::string first_origin_trace;
  // A forward first origin's own gradient, when it was an origin too: the
  // first backward origin of the same step and trace whose forward op is
  // the first origin's op (LogBackward's 0/0 after a torch.where kept
  // log(0)'s -inf out of the loss).
  std::optional<FindingRow> first_origin_gradient;
  // A forward first origin's next ops: the first two propagated findings
  // after it in its step and thread, in call order, the ops that computed
  // with its inf/NaN first (the mul of p * log(p), which turns log(0)'s
  // -inf into NaN; the sub, then the mul, of p * (log(p) - log(q))).
  std::vector<FindingRow> first_origin_consumers;
  // A first origin whose line was not captured (a backward op's forward
  // line, or any op's on a GPU: the monitor captures it from the finding
  // on): the lines later findings of the same op (and forward op) had, with
  // the torch code each was inside (FindingRow::via), at most three, and
  // the step of the first of them.
  std::vector<std::string> first_origin_later_lines;
  int64_t first_origin_later_lines_step = -1;
  // The torch code (FindingRow::via) all those later findings were inside;
  // empty if they differ.
  std::string first_origin_later_via;
  // The first origin's trace's outputs per step and phase up to its step
  // (Trace::phase_steps): whether the updates grew before it.
  std::vector<PhaseStep> first_origin_phase_steps;
  std::string first_origin_rank;  // under torchrun: the rank it began on
  // Per rank (torchrun): each rank's first non-finite finding, including
  // "received" (arrived through a collective from another rank).
  struct RankFirst {
    std::string rank;
    FindingRow first;
  };
  std::vector<RankFirst> ranks;
  std::optional<FindingRow> first_received;
  // The first propagated finding: where inf/NaN were seen first when no
  // finding says where they began.
  std::optional<FindingRow> first_propagated;
  // The first origin or input finding in an iteration the program gave up
  // (given_up_steps): what cost it that iteration.
  std::optional<FindingRow> first_given_up;
  std::vector<FindingRow> warnings;    // near_max findings, in step order
  std::vector<OpTotals> ops;           // ranked by max |x|, highest first
  std::vector<PhaseTotals> phases;
  std::vector<int64_t> nonfinite_steps;
  // Of those, the steps whose inf/NaN may have outlived them (in a weight,
  // a gradient, a buffer, a tensor still referenced, or a GPU result): all
  // but those a trace says were dropped (Trace::dropped_steps).
  std::vector<int64_t> nonfinite_steps_kept;
  std::vector<LossScaleRow> loss_scale;  // of the first trace that has one
  std::vector<int64_t> skipped_steps;    // steps GradScaler skipped
  // Steps whose program skipped the update itself (its own loss scaler:
  // Trace::program_skipped_steps); they are not in nonfinite_steps_kept.
  std::vector<int64_t> program_skipped_steps;
  // Iterations the program gave up before their backward pass on a
  // non-finite loss (Trace::given_up_steps); not in nonfinite_steps_kept.
  std::vector<int64_t> given_up_steps;
  // Steps a process ended in before their update or skip (a run stopped
  // mid-iteration): no loss scaler decided on them.
  std::vector<int64_t> unfinished_steps;
  // The monitor's live warnings that the training was diverging, of the
  // first trace that has any (Trace::diverging).
  std::vector<StepEvent> diverging;
  // Eps that were 0 in their format (Trace::eps_rounded), of every trace.
  std::vector<StepEvent> eps_rounded;
  // Numbers past their format's range made masks' -inf (Trace::mask_literals),
  // of every trace.
  std::vector<StepEvent> mask_literals;
  // What nanhunt changed in the run (interventions switched on).
  std::vector<std::pair<std::string, int64_t>> fp32_ops;  // op, calls in fp32
  std::vector<std::string> fp32_learned;  // NANHUNT_FP32_OPS=auto
  std::string fp32_policy;                // where auto wrote them
  // Ops whose inf were deliberate masks (masked_fill(-inf) and what carries
  // them): counted in op_stats, never findings.
  std::vector<std::string> mask_ops;
  int64_t bf16_switches = 0;              // autocast regions run in bf16
  // The update wrote fp16 values: the weights are fp16 (model.half()), not
  // fp32 weights under autocast, where NANHUNT_FP32_OPS's ops return fp32.
  bool fp16_updates = false;
  // nanhunt's own host time (meta host_us_per_op, ops_observed; sampled):
  // ops its callbacks saw, over all traces, and their mean cost.
  int64_t ops_observed = 0;
  double host_us_per_op = 0;
  // GPU checks (meta device_checks, device_check_batches, check_ring_waits):
  // enqueued, how many held-back batches carried them (NANHUNT_GPU_BATCH),
  // and how often a full result ring made an op's thread wait.
  int64_t gpu_checks = 0, gpu_check_batches = 0, ring_waits = 0;
  std::vector<SkipRow> nanhunt_skips;     // NANHUNT_SKIP_NONFINITE_STEPS
  // NANHUNT_MODE=sample: how op calls were sampled ("torch", "hash"; empty
  // in check mode), how many were checked, and each escalation with the
  // first thing its window found (an origin or input, else a warning).
  std::string op_sampling;
  int64_t op_calls_checked = 0;
  // Iterations with non-finite gradients that began the next batch without
  // an optimizer step, which sample mode counts and does not judge (meta
  // iterations_unjudged_in_sample_mode): a loss scaler of the program's
  // own may have skipped them.
  int64_t iterations_unjudged_in_sample_mode = 0;
  struct Escalation {
    EscalationRow row;
    std::optional<FindingRow> found;
    // Its window's first origin: `found` itself, or one after the input
    // it found first (an escalation that began within the step whose
    // unchecked op made inf/NaN sees them as an input, then the origin
    // when the overflow recurs).
    std::optional<FindingRow> origin;
  };
  std::vector<Escalation> escalations;  // of the first trace that has any
  // Outputs no check read, per op, phase and reason, over all traces (most
  // outputs first).
  std::vector<UncheckedRow> unchecked;
  int64_t steps = 0, origins = 0, inputs = 0, propagated = 0, received = 0;
  // No process trained: each step is a forward pass (meta
  // forward_passes_as_steps), as in an evaluation or inference script.
  bool forward_passes = false;
  std::vector<std::string> problems;   // "<trace>: <problem>"
};

RunSummary Summarise(const std::vector<Trace>& traces);

// A finding where non-finite values began in this process: an origin, an
// input, or an input that came out of a torch.compile region ("compiled").
bool BeganHere(const FindingRow& f);

// What the run's steps are called after their count: " step(s)", or
// " forward pass(es)" where no process trained (RunSummary::forward_passes).
const char* StepNoun(const RunSummary& s);

// Ascending steps as ranges: "0-6, 11, 16".
std::string StepRanges(const std::vector<int64_t>& steps);

// A max |x| as the viewer prints it: "inf", "72442", "1.1e+07".
std::string FormatAbs(double v);

// Whether origin `f` made its inf/NaN of a mask's deliberate ±inf (core/
// monitor.cc says so in the description of such an input).
bool FromMask(const FindingRow& f);

// Whether origin `f` made its NaN of NaN markers the program placed on
// purpose (torch.where(ok, x, float("nan"))), as core/monitor.cc says in
// the description of such an input.
bool FromNanMarker(const FindingRow& f);

// A finding's op with the one it ran in, for sentences ("aten::bmm in
// aten::matmul"): an inner op alone (aten::sum) does not say which line of
// the model it is.
std::string OpWithinTop(const FindingRow& f);

// " (backward of aten::addmm, called at model.py:12 in forward)": a
// backward op's forward op and, when it was captured, the line that
// called it (SourceIsForwardLine); "" for ops without a forward op.
std::string BackwardOf(const FindingRow& f);

// `v` as a multiple of fp16's 65504: "2.00x", "5.19e+33x" (an fp32 mask
// of torch.finfo(torch.float32).min, not 34 digits).
std::string TimesFp16Max(double v);

// Text for a terminal `width` columns wide; ANSI colour when `color`.
std::string RenderText(const RunSummary& s, int width, bool color);

// JSON with at least {"first_origin": {op, phase, step, dtype, nan, posinf,
// neginf, max_abs, source} | null, "ops": [{op, calls, max_abs, near_max,
// nonfinite}]}. Non-finite numbers are written as null.
std::string RenderJson(const RunSummary& s);

}  // namespace nanhunt
