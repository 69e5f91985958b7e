#include "core/monitor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/op_policy.h"
#include "core/trace_schema.h"
#include "core/trace_writer.h"

namespace nanhunt {
namespace {

double Now() {
  return std::chrono::duration<double>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A backward op called by the user's code within the pass: its line and
// stack are that code's (the stack tells them from a forward op's line,
// which comes without one: SourceIsForwardLine). False for the ops of
// autograd's own nodes.
bool LocateInBackwardCode(OpContext& context, FindingRow& row) {
  OpContext::CallSite site = context.BackwardCallSite();
  if (site.source.empty()) return false;
  row.source = std::move(site.source);
  row.stack = std::move(site.stack);  // holds the source's line at least
  return true;
}

// A near-max finding is repeated only when an op's max |x| grew this much
// since it was last reported: a rising trend shows, a steady one does not.
constexpr double kHeadroomGrowth = 1.25;

// `e` copies values (a cast) into outputs of one value each.
bool CopiesIntoOneValue(const OpEvent& e) {
  if (!CopiesValues(e.op) || e.outputs.empty()) return false;
  for (const TensorFacts& t : e.outputs) {
    if (t.counts.elements != 1) return false;
  }
  return true;
}

// Whether the checked inputs (only the non-finite ones, with
// `nonfinite_only`) are numbers the program wrote, wrapped into one-value
// tensors by torch, and there is at least one.
bool FromPythonNumbers(const std::vector<InputFacts>& inputs, bool nonfinite_only) {
  bool any = false;
  for (const InputFacts& in : inputs) {
    if (!in.checked || (nonfinite_only && !AnyNonFinite(in.counts))) continue;
    if (!in.python_number) return false;
    any = true;
  }
  return any;
}

// The largest finite value of `format`: the pattern below its infinity's
// (or, without infinities, its NaN's).
double LargestFinite(Format format) {
  return DecodeMagnitude(
      format, SmallestPatternAtLeast(format, std::numeric_limits<double>::infinity()) - 1);
}

// The format of `e`'s first output holding -inf, if any.
std::optional<Format> MinusInfFormat(const OpEvent& e) {
  for (const TensorFacts& t : e.outputs) {
    if (t.counts.neginf != 0) return t.format;
  }
  return std::nullopt;
}

// Whether `in` is a number the program wrote past the range of the format
// `e` made -inf in, and -inf is all the non-finite `e` made: `(1.0 - mask)
// * -1e9` over fp16 scores, where -1e9 is fp16's -inf. A mask value meant
// as minus infinity, which it is there. Masks are negative: +inf or NaN
// made of such a number is what the op computed (`x * 1e9`).
bool LiteralPastRange(const InputFacts& in, const OpEvent& e, const CheckCounts& total) {
  if (!in.checked || !(in.python_number || in.dtype == "scalar") || AnyNonFinite(in.counts) ||
      total.posinf != 0 || total.nan != 0) {
    return false;
  }
  const std::optional<Format> format = MinusInfFormat(e);
  return format && in.max_abs > LargestFinite(*format);
}

// `e` only casts a number the program wrote to one value: its non-finite
// inputs are such numbers (the inf of `x != inf`), or its -inf is such a
// number past the format's range (the -1e9 of `(1.0 - mask) * -1e9` cast
// to fp16).
bool CastsPythonNumber(const OpEvent& e, const CheckCounts& total,
                       const std::vector<InputFacts>& inputs) {
  if (!CopiesIntoOneValue(e)) return false;
  return FromPythonNumbers(inputs, /*nonfinite_only=*/true) ||
         std::any_of(inputs.begin(), inputs.end(),
                     [&](const InputFacts& in) { return LiteralPastRange(in, e, total); });
}

// `e` casts a number the program wrote to one finite value near the limit
// (`loss * 2**24`, `h * 30000.0`: torch wraps the Python float into a
// one-value tensor and casts it to the other operand's dtype). The literal
// is in the program's source, large on purpose; what it makes is judged
// where it is used (the mul's output). Asked only of ops near the limit,
// as it reads their inputs.
bool CastsFinitePythonNumber(const OpEvent& e, OpContext& context) {
  if (!CopiesIntoOneValue(e)) return false;
  for (const TensorFacts& t : e.outputs) {
    if (AnyNonFinite(t.counts)) return false;
  }
  return FromPythonNumbers(context.Inputs(), /*nonfinite_only=*/false);
}

// Whole-op totals over all outputs; the format of the first output that was
// not finite (else of the first output) names the op's dtype.
CheckCounts Total(absl::Span<const TensorFacts> outputs, Format& format) {
  CheckCounts total;
  bool picked = false;
  for (const auto& t : outputs) {
    MergeCounts(total, t.counts);
    if (!picked && AnyNonFinite(t.counts)) {
      format = t.format;
      picked = true;
    }
  }
  if (!picked && !outputs.empty()) format = outputs.front().format;
  return total;
}

double TotalMaxAbs(absl::Span<const TensorFacts> outputs) {
  double m = 0;
  for (const auto& t : outputs) m = std::max(m, MaxAbs(t.format, t.counts));
  return m;
}

std::string Describe(absl::Span<const TensorFacts> outputs) {
  std::vector<std::string> parts;
  for (const auto& t : outputs) {
    parts.push_back(DescribeTensor(FormatName(t.format), t.shape, t.counts,
                                   MaxAbs(t.format, t.counts)));
  }
  return absl::StrJoin(parts, "; ");
}

// The one source of a copy that keeps the dtype, which held the inf/NaN
// the copy's output held (OpEvent::copies_unchanged).
bool HeldWhatItCopied(const InputFacts& in) {
  return in.copy_source && in.assumed_finite && AnyNonFinite(in.counts);
}

// A GPU input is not read again by its op's check: described by what the
// checks of the ops that wrote it found (the plugin's registry of storages
// keeps the non-finite ones).
absl::string_view DeviceInputState(const InputFacts& in) {
  if (HeldWhatItCopied(in)) return "not read, but held them: a copy makes no inf/NaN";
  if (in.produced_by_op) return "non-finite when the op that wrote it was checked";
  if (in.deliberate) return "-inf put there by a mask";  // FromMask in viewer/summary.h
  return "taken as finite (no check of what wrote it found inf or NaN)";
}

// " (parameter 2.weight)": the viewer reads it (viewer/diagnosis_loaded_state.h).
std::string ModelTensorNote(const InputFacts& in) {
  return in.model_tensor.empty() ? "" : absl::StrCat(" (", in.model_tensor, ")");
}

std::string Describe(const std::vector<InputFacts>& inputs) {
  std::vector<std::string> parts;
  for (const auto& in : inputs) {
    if (!in.values.empty()) {
      parts.push_back(absl::StrCat("#", in.arg_index, " ", in.values));
      continue;
    }
    const bool counted = HeldWhatItCopied(in) || (in.checked && !in.on_device);
    std::string d =
        counted ? DescribeTensor(in.dtype, absl::StrCat(in.shape, ModelTensorNote(in)),
                                 in.counts, in.max_abs)
        : in.on_device ? absl::StrCat(in.dtype, in.shape)
                       : absl::StrCat(in.dtype, in.shape, " (not checked)");
    if (in.on_device) absl::StrAppend(&d, " on the GPU, ", DeviceInputState(in));
    // The viewer reads these (FromMask, FromNanMarker in viewer/summary.h).
    if (in.deliberate && !in.on_device) {
      absl::StrAppend(&d, in.counts.nan != 0 ? ", NaN put there on purpose (a marker)"
                                             : ", put there by a mask");
    }
    parts.push_back(absl::StrCat("#", in.arg_index, " ", d));
  }
  return absl::StrJoin(parts, "; ");
}

}  // namespace

double MaxAbs(Format format, const CheckCounts& counts) {
  return DecodeMagnitude(format, counts.max_abs_bits);
}

namespace {

// "%.6g", except that a value next to 1 keeps the digits that tell it from
// 1: six digits show 1.0000001, an acos's input past its domain, as "1",
// inside it, and 0.99999994, a sigmoid's output log(1 - p) is still finite
// for, as the same "1".
std::string FormatMagnitude(double v) {
  std::string six = absl::StrFormat("%.6g", v);
  return six == "1" && v != 1 ? absl::StrFormat("%.9g", v) : six;
}

}  // namespace

std::string DescribeTensor(absl::string_view dtype, absl::string_view shape,
                           const CheckCounts& c, double max_abs) {
  std::string s = absl::StrCat(dtype, shape, " max|x|=", FormatMagnitude(max_abs));
  if (c.nan) absl::StrAppend(&s, " nan=", c.nan);
  if (c.posinf) absl::StrAppend(&s, " +inf=", c.posinf);
  if (c.neginf) absl::StrAppend(&s, " -inf=", c.neginf);
  return s;
}

Monitor::Monitor(const Config& config, TraceWriter* writer,
                 std::function<double()> clock)
    : config_(config),
      limits_(config.near_max),
      writer_(writer),
      clock_(clock ? std::move(clock) : std::function<double()>(Now)) {
  step_started_ = clock_();
}

void Monitor::set_notify(std::function<void(const std::string&)> notify) {
  absl::MutexLock lock(&mu_);
  notify_ = std::move(notify);
}

void Monitor::WantForwardLine(const OpEvent& e, const FindingRow& row) {
  if (e.forward_op.empty()) return;
  forward_lines_.Want(e.forward_op, row.step + kForwardLineSteps);
  if (row.source.empty() && e.forward_seq >= 0) {
    forward_line_fills_.Want(
        FindingKey{row.step, row.call_index, row.op, row.forward_op},
        e.forward_seq, e.forward_thread);
  }
}

void Monitor::OnForwardLine(absl::string_view op, int64_t seq, uint64_t thread,
                            absl::string_view line) {
  if (!forward_line_fills_.any()) return;
  absl::MutexLock lock(&mu_);
  WriteForwardLinesLocked(forward_line_fills_.OnLine(steps_.step(), op, seq, thread, line));
}

void Monitor::WriteForwardLinesLocked(std::vector<ForwardLineFills::Fill> fills) {
  for (ForwardLineFills::Fill& fill : fills) {
    FindingKey& key = fill.key;
    if (first_origin_ && first_origin_->source.empty() && first_origin_->step == key.step &&
        first_origin_->call_index == key.call_index && first_origin_->op == key.op) {
      first_origin_->source = fill.source;
      if (notify_) {
        notify_(absl::StrFormat(
            "the forward op of step %d's first non-finite values (%s, backward of %s) was "
            "called at %s: the line of the same call in step %d",
            key.step, key.op, key.forward_op, fill.source, fill.from_step));
      }
    }
    if (writer_) {
      writer_->Add(ForwardLineRow{key.step, key.call_index, std::move(key.op),
                                  std::move(key.forward_op), std::move(fill.source)});
    }
  }
}

int64_t Monitor::step() const {
  absl::MutexLock lock(&mu_);
  return steps_.step();
}

int64_t Monitor::next_step() const {
  absl::MutexLock lock(&mu_);
  return steps_.next_step();
}

void Monitor::OnTopLevelOpStart(Phase phase, bool grad_enabled, bool takes_grad_input,
                                absl::FunctionRef<bool()> nonfinite_gradients_held,
                                absl::string_view op, const void* parameter,
                                int64_t next_node, uint64_t thread) {
  absl::MutexLock lock(&mu_);
  // The same judgement and step as at its end (RecordOp, NoteLateOp), which
  // then finds nothing left to do.
  const double now = clock_();
  JudgeIterationWithoutUpdateLocked(phase, grad_enabled, takes_grad_input,
                                    nonfinite_gradients_held, now);
  // A forward pass begins only here, at the op's start: its end would count
  // it again.
  bool began = steps_.OnOp(phase, grad_enabled, takes_grad_input) ||
               (phase == Phase::kForward &&
                steps_.OnPassStart(op, parameter, grad_enabled, step_nonfinite_ops_ > 0,
                                   next_node, thread));
  // The op that began a step is its first pair; one in a step that made
  // inf/NaN may begin the next.
  if (phase == Phase::kForward && grad_enabled && config_.mode != Mode::kSample &&
      steps_.OnTrainingPass(op, parameter, !began && step_nonfinite_ops_ > 0, next_node,
                            thread)) {
    began = true;
  }
  if (began) {
    WriteStepBegunLocked(now);
    WriteForwardLinesLocked(forward_line_fills_.OnStepBegan(steps_.step(), next_node, thread));
  } else if (phase == Phase::kForward && grad_enabled && takes_grad_input) {
    forward_line_fills_.OnTrainingOp(steps_.step(), next_node, thread);
  }
  StepStateChangedLocked();
}

bool Monitor::WouldGiveUpIteration(absl::string_view op, const void* parameter) const {
  absl::MutexLock lock(&mu_);
  return config_.mode != Mode::kSample && steps_.ReadsAnchorAgain(op, parameter);
}

void Monitor::OnBackwardNode(int64_t seq, uint64_t forward_thread) {
  absl::MutexLock lock(&mu_);
  steps_.OnBackwardNode(seq, forward_thread);
  RenumberLocked();
  StepStateChangedLocked();
}

void Monitor::WriteGivenUpLocked(bool all) {
  for (const int64_t step : steps_.TakeGivenUpIterations(all)) {
    ++given_up_confirmed_;
    if (writer_) {
      writer_->Add(EventRow{clock_(), kGaveUpIteration,
                            absl::StrCat("step ", step, ": ", kGaveUpIterationDetail)});
    }
  }
}

int64_t Monitor::iterations_given_up() const {
  absl::MutexLock lock(&mu_);
  return given_up_confirmed_;
}

bool Monitor::counted_forward_passes() const {
  absl::MutexLock lock(&mu_);
  return steps_.counts_passes();
}

void Monitor::WriteStepBegunLocked(double now) {
  RenumberLocked();
  if (update_ended_at_) {
    WriteStepLocked(steps_.step() - 1, *update_ended_at_, /*ended=*/true);
    update_ended_at_.reset();
  } else {
    WriteStepLocked(steps_.step() - 1, now);
  }
}

int64_t Monitor::findings() const {
  absl::MutexLock lock(&mu_);
  return findings_;
}

std::vector<std::string> Monitor::mask_ops() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> ops(mask_ops_.begin(), mask_ops_.end());
  std::sort(ops.begin(), ops.end());
  return ops;
}

std::optional<FindingRow> Monitor::first_origin() const {
  absl::MutexLock lock(&mu_);
  return first_origin_;
}

std::optional<FindingRow> Monitor::last_origin() const {
  absl::MutexLock lock(&mu_);
  return last_origin_;
}

namespace {

// What remains of a loss-scaling op's counts (OpEvent::loss_scaling): its
// non-finite values, and no magnitudes.
std::vector<TensorFacts> WithoutMagnitudes(absl::Span<const TensorFacts> outputs) {
  std::vector<TensorFacts> kept(outputs.begin(), outputs.end());
  for (TensorFacts& t : kept) {
    t.counts.near_max = t.counts.underflow = t.counts.fp16_overflow = 0;
    if (!AnyNonFinite(t.counts)) t.counts.max_abs_bits = 0;
  }
  return kept;
}

// Whether a finite output of `outputs` came near the limit (or past
// fp16's: an fp32 one).
bool AnyFiniteNearMax(absl::Span<const TensorFacts> outputs) {
  for (const TensorFacts& t : outputs) {
    if (t.counts.near_max > 0) return true;
  }
  return false;
}

// Whether values of `format` overflow near fp16's limit as they run (fp16,
// fp8 e5m2), rather than only would in fp16 (fp32, bf16, fp64, e4m3fn).
bool OverflowsNearFp16Max(Format format) {
  return format == Format::kF16 || format == Format::kF8E5M2;
}

// What a headroom finding is about: the outputs past the near-max
// threshold, of the format that runs the risk where there are several
// (fp16 before fp32: flash attention's fp32 log-sum-exp far past 65504
// beside its fp16 output is a forecast; the fp16 output is the news), and
// their largest |x|.
struct NearMaxOutputs {
  Format format = Format::kF32;
  double max_abs = 0;
};

NearMaxOutputs NearMaxOf(absl::Span<const TensorFacts> outputs) {
  NearMaxOutputs near;
  bool picked = false;
  for (const TensorFacts& t : outputs) {
    if (t.counts.near_max == 0) continue;
    if (!picked || (OverflowsNearFp16Max(t.format) && !OverflowsNearFp16Max(near.format))) {
      near.format = t.format;
      picked = true;
    }
  }
  for (const TensorFacts& t : outputs) {
    if (t.counts.near_max > 0 && OverflowsNearFp16Max(t.format) == OverflowsNearFp16Max(near.format)) {
      near.max_abs = std::max(near.max_abs, MaxAbs(t.format, t.counts));
    }
  }
  return near;
}

}  // namespace

StorageState StorageStateAfter(Verdict verdict, const CheckCounts& counts) {
  if (AnyNonFinite(counts)) {
    return verdict == Verdict::kMasked && counts.nan != 0 ? StorageState::kNanMarkers
           : verdict == Verdict::kMasked                  ? StorageState::kDeliberate
           : verdict == Verdict::kOwnMasked ? StorageState::kOwnMasked
                                            : StorageState::kNonFinite;
  }
  return verdict == Verdict::kMaskConstants ? StorageState::kMaskConstants
                                            : StorageState::kFinite;
}

Verdict Monitor::OnOp(OpEvent e, OpContext& context, std::optional<Deferral>* deferral) {
  std::vector<TensorFacts> without_magnitudes;
  // Near the limit in an op that places or carries masks, given masks (a
  // mask constant, or memory holding masks): the values are mask constants
  // (torch.finfo(dtype).min), large on purpose as a loss scale is. No
  // headroom finding, no warning, out of the op statistics; non-finite
  // values still count. A computed value near the limit among them goes
  // unreported here, not where it was computed (the matmul before the
  // mask). Asked only of ops near the limit, which a healthy run has few of.
  const bool mask_constants = !e.loss_scaling && CarriesMasks(e.op) &&
                              AnyFiniteNearMax(e.outputs) &&
                              context.InputsHoldMasks(e.op);
  // A literal of the program cast near the limit: the same, and no mask.
  const bool literal = !e.loss_scaling && !mask_constants && AnyFiniteNearMax(e.outputs) &&
                       CastsFinitePythonNumber(e, context);
  if (e.loss_scaling || mask_constants || literal) {
    without_magnitudes = WithoutMagnitudes(e.outputs);
    e.outputs = without_magnitudes;
  }
  Format format = Format::kF32;
  const CheckCounts total = Total(e.outputs, format);
  const bool nonfinite = AnyNonFinite(total);
  const double max_abs = TotalMaxAbs(e.outputs);
  bool want_headroom = false, want_underflow = false;
  NearMaxOutputs near;
  if (!nonfinite && total.near_max > 0) near = NearMaxOf(e.outputs);
  {
    absl::MutexLock lock(&mu_);
    const double now = e.top_op.empty() ? clock_() : 0;
    if (e.late_step >= 0) {
      e.late_step = RenumberedLocked(e.late_step, e.late_renumberings);
      drops_.OpJudged(e.late_generation);
      if (drops_.AnyReady(steps_.step())) drops_ready_.store(true, std::memory_order_relaxed);
    }
    if (e.late_step < 0) {
      if (e.phase == Phase::kBackward) unjudged_counted_ = false;
      if (e.top_op.empty()) {
        JudgeIterationWithoutUpdateLocked(e.phase, e.grad_enabled, e.takes_grad_input,
                                          [&] { return context.NonFiniteGradientsHeld(); }, now);
      }
      if (e.top_op.empty() &&
          steps_.OnOp(e.phase, e.grad_enabled, e.takes_grad_input)) {
        WriteStepBegunLocked(now);
      }
      // The first backward op undid the forward passes counted.
      if (e.phase == Phase::kBackward) RenumberLocked();
      e.phase = steps_.Refine(e.phase, e.grad_enabled, e.takes_grad_input);
    }
    // Parameters read without grad after the update (a master-weights copy,
    // an evaluation) train nothing: no step of their own at exit.
    step_trained_ |= (e.takes_grad_input && e.grad_enabled) || e.phase == Phase::kBackward;
    // Results of a step before this one's: the GPU is done with it.
    if (e.late_step >= 0) WriteLateStepsLocked(e.late_step);
    // A non-finite op is counted once judged: a mask is no non-finite op,
    // a deferred one is counted, or not, when its enclosing op ends.
    if (!nonfinite) CountOpLocked(e, max_abs, /*nonfinite=*/false);
    if (nonfinite && e.phase == Phase::kBackward && step_bad_backward_op_.empty() &&
        (e.late_step < 0 || e.late_step == steps_.step())) {
      // Where non-finite gradients were first made, whatever the verdict:
      // a gradient is never a mask. The op the autograd node called (mul),
      // not a helper inside it (the copy_ that made its scalar operand).
      // A GPU result of a step already over made no gradients of this one.
      step_bad_backward_op_ = std::string(e.top_op.empty() ? e.op : e.top_op);
      step_bad_forward_op_ = std::string(e.forward_op);
    }
    StepStateChangedLocked();
    OpState& state = ops_[e.op];
    const int p = static_cast<int>(e.phase);
    if (!nonfinite && total.near_max > 0) {
      double& last = state.near_reported[p][OverflowsNearFp16Max(near.format) ? 0 : 1];
      want_headroom = last == 0 || near.max_abs >= last * kHeadroomGrowth;
      if (want_headroom) last = near.max_abs;
      if (e.contains_warning) want_headroom = false;
    }
    if (!nonfinite && total.underflow > 0 && !state.underflow_reported[p] &&
        total.underflow >=
            config_.underflow_fraction * static_cast<double>(total.elements)) {
      want_underflow = true;
      state.underflow_reported[p] = true;
    }
  }
  if (nonfinite) return ClassifyNonFinite(e, total, format, context, deferral);
  if (want_headroom || want_underflow) {
    FindingRow row;
    {
      absl::MutexLock lock(&mu_);
      if (want_headroom) format = near.format;
      row = MakeFinding(want_headroom ? "near_max" : "underflow", e, total,
                        format);
    }
    row.max_abs = want_headroom ? near.max_abs : max_abs;
    // A backward op's line is the hook's or custom backward's that called
    // it, or else its forward op's (forward_op), when it was captured; the
    // update's is the program's optimizer.step() or scaler.step().
    if (e.phase != Phase::kBackward) {
      row.source = context.Source();
      row.stack = context.Stack();
      row.via = context.Via();
    } else if (!LocateInBackwardCode(context, row)) {
      row.source = std::string(e.forward_source);
      if (want_headroom && !e.scaled_gradients) WantForwardLine(e, row);
    }
    row.outputs = Describe(e.outputs);
    absl::MutexLock lock(&mu_);
    // Live warnings are for formats that really overflow near 65504; for
    // fp32 and bf16 outputs the finding (what *would* overflow) suffices.
    if (want_headroom && notify_ && !e.scaled_gradients && OverflowsNearFp16Max(format)) {
      notify_(absl::StrFormat(
          "warning: %s (%s) reached |x|=%.6g, %.0f%% of fp16's limit 65504, "
          "at step %d%s%s",
          e.op, PhaseName(e.phase), near.max_abs, 100.0 * near.max_abs / kFp16Max,
          row.step, row.source.empty() ? "" : " — ", row.source));
    }
    Emit(std::move(row));
    if (want_headroom) return Verdict::kWarned;
  }
  return mask_constants ? Verdict::kMaskConstants : Verdict::kClean;
}

namespace {

// A value an update wrote, for DivergenceWatch: finite outputs of the
// optimizer phase, not GradScaler's scale (which doubles as it grows) nor
// a mask's.
bool IsUpdateValue(const OpEvent& e, bool nonfinite, bool mask, double max_abs) {
  return e.phase == Phase::kOptimizer && !nonfinite && !mask && std::isfinite(max_abs) &&
         e.op != kScalerUpdate;
}

}  // namespace

void Monitor::CountOpLocked(const OpEvent& e, double max_abs, bool nonfinite, bool mask) {
  LateStep* late = LateStepOf(e);
  StepStats& step_stats = late != nullptr ? late->ops[e.op] : ops_[e.op];
  const int p = static_cast<int>(e.phase);
  const int m = mask ? 1 : 0;
  for (const auto& t : e.outputs) {
    const int f = static_cast<int>(t.format);
    Stats& s = step_stats.stats[m][p][f];
    step_stats.touched[m][p][f] = true;
    s.calls += 1;
    MergeCounts(s.counts, t.counts);
  }
  if (late != nullptr) {
    ++late->ops_count;
    if (nonfinite) {
      ++late->nonfinite_ops;
      drops_.CountNonFinite(e.late_step);
    }
    if (std::isfinite(max_abs)) late->max_abs = std::max(late->max_abs, max_abs);
    if (IsUpdateValue(e, nonfinite, mask, max_abs)) {
      late->update_max_abs = std::max(late->update_max_abs, max_abs);
    }
    return;
  }
  ++call_index_;
  if (nonfinite) {
    // The step's first: its next pass may give it up (step_may_begin_).
    if (++step_nonfinite_ops_ == 1) StepStateChangedLocked();
    drops_.CountNonFinite(steps_.step());
  }
  if (std::isfinite(max_abs)) step_max_abs_ = std::max(step_max_abs_, max_abs);
  if (IsUpdateValue(e, nonfinite, mask, max_abs)) {
    step_update_max_abs_ = std::max(step_update_max_abs_, max_abs);
  }
}

void Monitor::NoteUpdateLocked(int64_t step, double update_max_abs) {
  const std::optional<DivergenceWatch::Growth> growth =
      divergence_.OnUpdate(step, update_max_abs);
  if (!growth) return;
  const std::string what = growth->Describe();
  if (notify_) {
    notify_(absl::StrCat("warning: the training is diverging: ", what,
                         ", tenfold and more within three steps (lower the learning rate, or "
                         "clip gradients, before a value passes the format's range)"));
  }
  if (writer_) writer_->Add(EventRow{clock_(), kDiverging, absl::StrCat("step ", step, ": ", what)});
}

void Monitor::OnEpsRoundedToZero(absl::string_view op, Format format, double eps,
                                 absl::FunctionRef<std::string()> source) {
  {
    absl::MutexLock lock(&mu_);
    if (!eps_rounded_.insert(absl::StrCat(op, "/", FormatName(format))).second) return;
  }
  // The line is read without the lock: it walks the Python stack.
  const std::string where = source();
  absl::MutexLock lock(&mu_);
  if (!writer_) return;
  writer_->Add(EventRow{
      clock_(), kEpsRoundedToZero,
      absl::StrCat("step ", steps_.step(), ": ", op, "'s ", absl::SixDigits(eps), " is 0 in ",
                   FormatName(format), " (its smallest value is ",
                   absl::SixDigits(DecodeMagnitude(format, 1)), ")",
                   where.empty() ? "" : absl::StrCat(", at ", where))});
}

void Monitor::OnMaskLiteralPastRange(absl::string_view op, Format format, double value,
                                     absl::FunctionRef<std::string()> source) {
  const std::string number = absl::StrCat(absl::SixDigits(value));
  {
    absl::MutexLock lock(&mu_);
    if (!mask_literals_.insert(absl::StrCat(number, "/", FormatName(format))).second) return;
  }
  const std::string where = source();  // walks the Python stack: without the lock
  absl::MutexLock lock(&mu_);
  if (!writer_) return;
  writer_->Add(EventRow{
      clock_(), kMaskLiteralPastRange,
      absl::StrCat("step ", steps_.step(), ": ", op, " made -inf of the program's ", number,
                   ", past ", FormatName(format), "'s largest value (",
                   absl::SixDigits(LargestFinite(format)), ")",
                   where.empty() ? "" : absl::StrCat(", at ", where))});
}

void Monitor::NoteMaskLiteral(const OpEvent& e, const CheckCounts& total,
                              const std::vector<InputFacts>& inputs, OpContext& context) {
  for (const InputFacts& in : inputs) {
    if (!LiteralPastRange(in, e, total)) continue;
    OnMaskLiteralPastRange(e.top_op.empty() ? e.op : e.top_op, *MinusInfFormat(e), in.max_abs,
                           [&] { return context.Source(); });
    return;
  }
}

void Monitor::SettleDeferral(const Deferral& d, Settled settled) {
  // Garbage overwritten (a buffer's old bytes) is no value the op computed:
  // neither a finding nor statistics.
  if (settled == Settled::kOverwritten) return;
  OpEvent e;
  e.op = d.op;
  e.top_op = d.top_op;
  e.forward_op = d.forward_op;
  e.phase = d.phase;
  e.thread = d.thread;
  e.outputs = d.outputs;
  absl::MutexLock lock(&mu_);
  CountOpLocked(e, TotalMaxAbs(e.outputs), /*nonfinite=*/settled == Settled::kStands,
                /*mask=*/settled != Settled::kStands);
  if (settled == Settled::kLeftOut) return;  // not the program's mask either
  if (settled == Settled::kMask) {
    mask_ops_.insert(d.op);
    return;
  }
  if (step_findings_ >= config_.max_findings_per_step) return;  // as propagation is
  FindingRow row = d.row;
  row.call_index = call_index_;
  Emit(std::move(row));
}

Monitor::Position Monitor::NoteLateOp(Phase phase, bool grad_enabled,
                                      bool takes_grad_input, bool top_level,
                                      absl::FunctionRef<bool()> nonfinite_gradients_held,
                                      bool result_follows) {
  absl::MutexLock lock(&mu_);
  const int64_t generation = result_follows ? drops_.OpNoted() : 0;
  if (phase == Phase::kBackward) unjudged_counted_ = false;
  if (top_level) {
    JudgeIterationWithoutUpdateLocked(phase, grad_enabled, takes_grad_input,
                                      nonfinite_gradients_held, clock_());
  }
  if (top_level && steps_.OnOp(phase, grad_enabled, takes_grad_input)) {
    WriteStepBegunLocked(clock_());
  }
  // The first backward op undid the forward passes counted.
  if (phase == Phase::kBackward) RenumberLocked();
  StepStateChangedLocked();
  const Phase refined = steps_.Refine(phase, grad_enabled, takes_grad_input);
  step_trained_ |= (takes_grad_input && grad_enabled) || refined == Phase::kBackward;
  return Position{steps_.step(), refined, static_cast<int64_t>(renumberings_.size()),
                  generation};
}

namespace {

// An op of a node's backward formula; an op recomputed in the backward
// (activation checkpointing) is a forward op again.
bool IsGradientFormula(const OpEvent& e) {
  return e.phase == Phase::kBackward && !e.forward_op.empty();
}

// An input holding NaN markers whose counts were read: a GPU input's are
// a placeholder.
bool HostReadMarkers(const InputFacts& in) {
  return in.deliberate && !in.on_device && in.counts.nan != 0;
}

}  // namespace

bool Monitor::IsMasking(const OpEvent& e, const CheckCounts& total,
                        std::vector<InputFacts>& inputs, OpContext& context) {
  if (total.nan != 0) {
    // NaN is a mask only as a marker the program placed: see MarkNanMarkers.
    if (!MarkNanMarkers(e, inputs)) return false;
    // A gradient is no marker: a backward formula that computes with the
    // markers its forward saved (0 x NaN where the loss left them out) made
    // NaN gradients of them.
    if (IsGradientFormula(e)) return false;
    // NaN in, NaN out where they were: any op carries a marker (NaN stays
    // NaN), where few carry a -inf mask (a square makes it +inf). A larger
    // share of NaN than its markers held (a mean, a matmul that mixes them
    // into every entry) is NaN the op made of them, unless the op only
    // moves values (the markers of a batch's absent classes, indexed out).
    // On a GPU no input is read: the ops that carry masks carry them.
    if (total.posinf == 0 && total.neginf == 0) {
      if (NanShareNoLarger(total, inputs) || MovesValues(e.op)) return true;
      if (std::any_of(inputs.begin(), inputs.end(), HostReadMarkers)) return false;
    }
  }
  // A composite op's ±inf are masks still when its nested ops were judged
  // to carry them, or it returns views of a mask it was given: no list of
  // the ops that keep a mask a mask can name every composite of them.
  if (e.composite && !e.contains_finding && context.OutputsHoldMasks()) return true;
  if (!CarriesMasks(e.op)) return false;
  bool any_deliberate = false, any_assumed = false, deliberate_posinf = false;
  for (InputFacts& in : inputs) {
    any_assumed |= in.assumed_finite;
    if (LiteralPastRange(in, e, total)) {
      in.deliberate = any_deliberate = true;
      continue;
    }
    if (!in.checked || !AnyNonFinite(in.counts)) continue;
    if (e.others_unchecked && !in.produced_by_op && in.counts.nan == 0) {
      in.deliberate = true;  // presumed: its maker was not checked
    }
    // A ±inf scalar, or a one-value ±inf tensor no op made
    // (torch.tensor(float("-inf"))), that a fill is given is a mask: by the
    // program, or inside another op by its kernel, a constant (amax's -inf
    // to start from, SDPA's -inf for a boolean mask) or a value it computed
    // (the CPU dot's overflowed fp32 sum, filled into its fp16 result). The
    // op around it is checked at its end, and its output is judged by its
    // own inputs: the dot's overflow is still the dot's origin.
    const bool one_value = in.dtype == "scalar" || (in.shape == "[]" && !in.produced_by_op);
    if (one_value && in.counts.nan == 0 && PlacesScalar(e.op)) in.deliberate = true;
    if (!in.deliberate) return false;
    any_deliberate = true;
    deliberate_posinf |= in.counts.posinf != 0;
  }
  // A product beside an additive -inf mask (baddbmm(mask, q, k^T)): its
  // +inf is the product overflowing, not the mask.
  if (total.posinf != 0 && !deliberate_posinf && OverflowsBesideMasks(e.op)) return false;
  // On a GPU the inputs were not read: ±inf from inputs no check saw is
  // presumed a mask carried along while others go unchecked.
  if (any_deliberate || (e.others_unchecked && any_assumed)) return true;
  // -inf from finite inputs that hold mask constants: a torch.finfo(fp32).min
  // mask cast to fp16 (autocast does it to scaled_dot_product_attention's
  // attn_mask), two finfo.min masks added. Masks are negative: +inf is
  // still what the op computed.
  return total.posinf == 0 && context.InputsHoldMasks(e.op);
}

bool Monitor::NanShareNoLarger(const CheckCounts& total, const std::vector<InputFacts>& inputs) {
  for (const InputFacts& in : inputs) {
    if (!HostReadMarkers(in)) continue;
    if (static_cast<double>(total.nan) * static_cast<double>(in.counts.elements) <=
        static_cast<double>(in.counts.nan) * static_cast<double>(total.elements)) {
      return true;
    }
  }
  return false;
}

bool Monitor::MarkNanMarkers(const OpEvent& e, std::vector<InputFacts>& inputs) {
  bool any = false;
  for (InputFacts& in : inputs) {
    if (!in.checked || in.counts.nan == 0) continue;
    // A NaN literal placed by the program itself, at the top level
    // (torch.where(ok, x, float("nan")), x.masked_fill(m, float("nan"))):
    // a missing value's marker, which torch.nanmean and nansum skip. Inside
    // another op, a NaN its kernel fills may be one it computed; inside an
    // op that places scalars itself (where's Scalar overload makes a
    // scalar_tensor of the number and calls its Tensor one), it computes
    // none: the literal is still the program's.
    const bool one_value = in.dtype == "scalar" || (in.shape == "[]" && !in.produced_by_op);
    const bool programs_own = e.top_op.empty() || PlacesScalar(e.top_op);
    if (one_value && !in.produced_by_op && programs_own && PlacesScalar(e.op)) {
      in.deliberate = true;
    }
    // Else a marker carried (memory the registry knows holds masks).
    any |= in.deliberate;
  }
  return any;
}

bool Monitor::OwnMaskedZeroDivision(const OpEvent& e, const CheckCounts& total,
                                    const std::vector<InputFacts>& inputs) {
  const bool nan_only = total.nan != 0 && total.posinf == 0 && total.neginf == 0;
  OwnZeroDivision own = OwnZeroDivision::kNone;
  // The division itself, or an op of the same formula between it and the
  // mask that carries its values there (sinc's `* pi`, angle's `* i`).
  const bool carried = std::any_of(inputs.begin(), inputs.end(),
                                   [](const InputFacts& in) { return in.own_masked; });
  if (e.phase == Phase::kBackward) {
    own = carried ? FormulasOwnZeroDivision(e.forward_op)
                  : MasksItsZeroDivisionInBackward(e.op, e.forward_op);
  } else if (!e.top_op.empty()) {
    own = carried ? FormulasOwnInForward(e.top_op) : MasksItsZeroDivisionInForward(e.op, e.top_op);
  }
  switch (own) {
    case OwnZeroDivision::kNone:
      return false;
    case OwnZeroDivision::kNanOnly:
      if (!nan_only) return false;
      break;
    case OwnZeroDivision::kNegInfOnly:
      if (total.neginf == 0 || total.nan != 0 || total.posinf != 0) return false;
      break;
    case OwnZeroDivision::kAnyWide:
      if (!nan_only && !std::all_of(e.outputs.begin(), e.outputs.end(), [](const TensorFacts& t) {
            return t.format == Format::kF32 || t.format == Format::kF64;
          })) {
        return false;
      }
      break;
  }
  // A NaN it was given, but from that division, is another op's (a GPU
  // op's inputs are not read).
  return std::none_of(inputs.begin(), inputs.end(), [](const InputFacts& in) {
    return in.checked && AnyNonFinite(in.counts) && !in.own_masked;
  });
}

Verdict Monitor::ClassifyNonFinite(const OpEvent& e, const CheckCounts& total,
                                   Format format, OpContext& context,
                                   std::optional<Deferral>* deferral) {
  Verdict verdict = Verdict::kOrigin;
  // Only the enclosing op can tell what these values are.
  bool for_enclosing_op = false;
  std::vector<InputFacts> inputs;
  if (e.contains_finding) {
    verdict = Verdict::kPropagated;
  } else {
    inputs = context.Inputs();
    if (OwnMaskedZeroDivision(e, total, inputs)) {
      // Not a mask of the program's (mask_ops_): torch's own, masked by the
      // backward formula that made it.
      absl::MutexLock lock(&mu_);
      CountOpLocked(e, TotalMaxAbs(e.outputs), /*nonfinite=*/false, /*mask=*/true);
      return Verdict::kOwnMasked;
    }
    if (IsMasking(e, total, inputs, context)) {
      NoteMaskLiteral(e, total, inputs, context);
      absl::MutexLock lock(&mu_);
      // A mask is not a non-finite step. A cast of a number the program
      // wrote (the inf of `x != inf`, of isfinite, isinf and logsumexp,
      // that torch wraps into a tensor and casts to x's dtype) is no value
      // it computed, and no mask of its: neither counted nor listed.
      if (CastsPythonNumber(e, total, inputs)) return Verdict::kMasked;
      CountOpLocked(e, TotalMaxAbs(e.outputs), /*nonfinite=*/false, /*mask=*/true);
      mask_ops_.insert(std::string(e.op));
      return Verdict::kMasked;
    }
    for (const auto& in : inputs) {
      if (in.unknown_before && !e.top_op.empty()) {
        verdict = Verdict::kPropagated;
        for_enclosing_op = true;
        break;
      }
      if (!in.checked || !AnyNonFinite(in.counts)) continue;
      if (in.deliberate) {
        // A mask's ±inf are known and meant, as finite values are: an op
        // that does not carry masks (not IsMasking above) and makes inf or
        // NaN of them is this op's doing, the origin of real non-finite
        // values: a loss over a masked position, a sum over masked
        // entries, a softmax over a row masked entirely.
        // NaN markers are the program's data: a forward op that mixes them
        // into its result (a linear over a batch with x[i] = nan placed in
        // it) was given them, unless it is a mean or sum that has a twin
        // that skips them (torch.nanmean), or a gradient formula.
        if (in.counts.nan != 0 && !IsGradientFormula(e) &&
            !HasNanSkippingTwin(e.op) && !HasNanSkippingTwin(e.top_op) &&
            verdict != Verdict::kPropagated) {
          verdict = Verdict::kInput;
        }
        continue;
      }
      // A formula's own masked NaN out of its formula: its division made it.
      if (in.produced_by_op || in.own_masked) {
        verdict = Verdict::kPropagated;
      } else if (verdict != Verdict::kPropagated) {
        verdict = Verdict::kInput;
      }
    }
  }
  if (verdict == Verdict::kOrigin && e.copies_unchanged) {
    // See OpEvent::copies_unchanged: what it copied held them.
    std::vector<InputFacts*> sources;
    for (InputFacts& in : inputs) {
      if (in.copy_source && in.assumed_finite) sources.push_back(&in);
    }
    if (!sources.empty()) verdict = Verdict::kInput;
    if (sources.size() == 1) {
      sources[0]->counts = total;
      sources[0]->max_abs = TotalMaxAbs(e.outputs);
    }
  }
  // Inside another op, a non-finite value nobody produced through the
  // dispatcher (a scalar the enclosing kernel computed and then passed to
  // fill_, say) comes from the enclosing op: let that op be judged.
  if (verdict == Verdict::kInput && !e.top_op.empty() && e.enclosing_op_judges) {
    verdict = Verdict::kPropagated;
    for_enclosing_op = true;
  }
  // While others go unchecked, a non-finite input no check saw made may
  // come from an op as well as from the data: not called data.
  if (verdict == Verdict::kInput && e.others_unchecked) {
    verdict = Verdict::kPropagated;
  }
  const char* kind = verdict == Verdict::kOrigin                               ? "origin"
                     : verdict == Verdict::kInput && !e.compiled_region.empty() ? "compiled"
                     : verdict == Verdict::kInput                              ? "input"
                                                                               : "propagated";
  if (for_enclosing_op && deferral != nullptr) {
    Deferral& d = deferral->emplace();
    d.op = std::string(e.op);
    d.top_op = std::string(e.top_op);
    d.forward_op = std::string(e.forward_op);
    d.phase = e.phase;
    d.thread = e.thread;
    d.outputs.assign(e.outputs.begin(), e.outputs.end());
    {
      absl::MutexLock lock(&mu_);
      d.row = MakeFinding(kind, e, total, format);
    }
    d.row.outputs = Describe(e.outputs);
    d.row.inputs = Describe(inputs);
    return Verdict::kDeferred;
  }
  {
    absl::MutexLock lock(&mu_);
    CountOpLocked(e, TotalMaxAbs(e.outputs), /*nonfinite=*/true);
    // Under torch.distributed, non-finite values that no op of this process
    // made, in memory a collective wrote, came from another rank (a
    // gradient all-reduce spreads one rank's NaN to every rank).
    if (verdict == Verdict::kInput) {
      for (const auto& in : inputs) {
        if (in.checked && AnyNonFinite(in.counts) &&
            (in.from_collective ||
             (in.storage != nullptr && collective_storages_.contains(in.storage)))) {
          kind = "received";
        }
      }
    }
    if (verdict == Verdict::kOrigin) {
      if (LateStep* late = LateStepOf(e); late != nullptr) {
        ++late->origins;
      } else {
        ++step_origins_;
      }
    }
    // Origins and inputs are always recorded; propagation is capped per step
    // (its counts stay complete in op_stats).
    if (verdict == Verdict::kPropagated &&
        step_findings_ >= config_.max_findings_per_step) {
      return verdict;
    }
  }
  FindingRow row;
  {
    absl::MutexLock lock(&mu_);
    row = MakeFinding(kind, e, total, format);
  }
  row.outputs = Describe(e.outputs);
  if (!inputs.empty()) row.inputs = Describe(inputs);
  // A GPU origin's inputs were not read: when a region ran before it, its
  // inf may have come out of the region (said, not decided: the registry
  // knows no memory the region wrote).
  if (row.kind == "compiled" ||
      (verdict == Verdict::kOrigin && e.late_step >= 0 && !e.compiled_region.empty())) {
    row.compiled_region = std::string(e.compiled_region);
  }
  if (verdict != Verdict::kPropagated) {
    if (e.phase != Phase::kBackward) {
      row.source = context.Source();
      row.stack = context.Stack();
      row.via = context.Via();
    } else if (!LocateInBackwardCode(context, row)) {
      row.source = std::string(e.forward_source);
      WantForwardLine(e, row);
    }
    if (verdict == Verdict::kOrigin) row.fp32_max_abs = context.RecomputeFp32MaxAbs();
  }
  absl::MutexLock lock(&mu_);
  // Where it began: origins and inputs of this process, not what another
  // rank sent ("received"; that rank's trace has the beginning).
  const bool began_here = verdict != Verdict::kPropagated && row.kind != "received";
  if (began_here) last_origin_ = row;
  if (began_here && !first_origin_) {
    first_origin_ = row;
    if (notify_) {
      // ", in parameter 2.weight": a checkpoint's, said before the data is
      // searched (the viewer's diagnosis says more).
      std::string held_in;
      for (const InputFacts& in : inputs) {
        if (verdict == Verdict::kInput && !in.model_tensor.empty() && AnyNonFinite(in.counts)) {
          held_in = absl::StrCat(absl::StartsWith(in.model_tensor, "copied into ") ? ", " : ", in ",
                                 in.model_tensor);
          break;
        }
      }
      notify_(absl::StrFormat(
          "first non-finite values: %s %s (%s) at step %d%s%s%s%s%s",
          verdict == Verdict::kOrigin ? "origin"
          : row.kind == "compiled"
              ? absl::StrCat("out of torch.compile's ", row.compiled_region, ", seen by")
              : "input of",
          e.op,
          PhaseName(e.phase), row.step,
          e.forward_op.empty() ? "" : absl::StrCat(", backward of ", e.forward_op), held_in,
          row.source.empty() ? "" : " — ", row.source,
          row.via.empty() ? "" : absl::StrCat(", inside ", row.via)));
    }
  }
  Emit(std::move(row));
  return verdict;
}

FindingRow Monitor::MakeFinding(const char* kind, const OpEvent& e,
                                const CheckCounts& total, Format format) const {
  FindingRow row;
  row.kind = kind;
  row.step = e.late_step >= 0 ? e.late_step : steps_.step();
  row.call_index = call_index_;
  row.op = std::string(e.op);
  row.top_op = std::string(e.top_op);
  row.phase = std::string(PhaseName(e.phase));
  row.forward_op = std::string(e.forward_op);
  row.dtype = std::string(FormatName(format));
  row.elements = static_cast<int64_t>(total.elements);
  row.nan = static_cast<int64_t>(total.nan);
  row.posinf = static_cast<int64_t>(total.posinf);
  row.neginf = static_cast<int64_t>(total.neginf);
  row.near_max = static_cast<int64_t>(total.near_max);
  row.underflow = static_cast<int64_t>(total.underflow);
  row.max_abs = TotalMaxAbs(e.outputs);
  row.thread = static_cast<int64_t>(e.thread);
  row.kernels = std::string(e.kernels);
  row.time = clock_();
  return row;
}

void Monitor::Emit(FindingRow row) {
  ++findings_;
  ++step_findings_;
  if (writer_) writer_->Add(std::move(row));
}

void Monitor::NoteCollective(absl::Span<const void* const> storages) {
  any_collective_.store(true, std::memory_order_release);
  absl::MutexLock lock(&mu_);
  // Buckets and parameters are the same memory step after step: a handful.
  if (collective_storages_.size() > 4096) collective_storages_.clear();
  for (const void* s : storages) {
    if (s != nullptr) collective_storages_.insert(s);
  }
}

void Monitor::NoteCopy(absl::Span<const void* const> from,
                       absl::Span<const void* const> to) {
  if (!any_collective_.load(std::memory_order_acquire)) return;
  absl::MutexLock lock(&mu_);
  if (collective_storages_.empty()) return;  // not a distributed run
  bool collective = false;
  for (const void* s : from) collective |= collective_storages_.contains(s);
  for (const void* s : to) {
    if (s == nullptr) continue;
    if (collective) {
      collective_storages_.insert(s);
    } else {
      collective_storages_.erase(s);
    }
  }
}

bool Monitor::IsCollective(const void* storage) const {
  if (!any_collective_.load(std::memory_order_acquire)) return false;
  absl::MutexLock lock(&mu_);
  return storage != nullptr && collective_storages_.contains(storage);
}

void Monitor::ForgetCollective(absl::Span<const void* const> storages) {
  if (!any_collective_.load(std::memory_order_acquire)) return;
  absl::MutexLock lock(&mu_);
  if (collective_storages_.empty()) return;
  for (const void* s : storages) collective_storages_.erase(s);
}

void Monitor::OnOptimizerStepBegin() {
  absl::MutexLock lock(&mu_);
  steps_.OnOptimizerStepBegin();
  RenumberLocked();
  StepStateChangedLocked();
}

void Monitor::OnOptimizerIdentified(uint64_t optimizer, bool replaces_another) {
  absl::MutexLock lock(&mu_);
  if (steps_.OnOptimizerIdentified(optimizer, replaces_another)) {
    // The row written as the step began (in sample mode, at the record's
    // end) is joined by what comes.
    RenumberLocked();
    StepStateChangedLocked();
  }
}

void Monitor::RenumberLocked() {
  // Rows already written under the tentative numbers of micro-batches
  // (the first iteration of gradient accumulation) join their step; GPU
  // results enqueued before and delivered after are renumbered on arrival.
  for (const StepTracker::Renumbering& r : steps_.TakeRenumberings()) {
    renumberings_.push_back(r);
    // Late totals kept under the undone numbers are written first, so that
    // the renumbering moves them too; step `to` is open again.
    WriteLateStepsLocked(r.last + 1, r.first);
    written_through_ = std::min(written_through_, r.to - 1);
    if (writer_) writer_->Add(StepRenumberRow{r.first, r.last, r.to});
  }
}

int64_t Monitor::RenumberedLocked(int64_t step, int64_t renumberings) const {
  for (size_t i = static_cast<size_t>(std::max<int64_t>(renumberings, 0));
       i < renumberings_.size(); ++i) {
    const StepTracker::Renumbering& r = renumberings_[i];
    if (step >= r.first && step <= r.last) step = r.to;
  }
  return step;
}

void Monitor::OnScalerUpdate(double scale, bool skipped) {
  const StepTracker::ScalerStep s = OnScalerUpdateStep();
  RecordLossScale(s.step, scale, skipped);
}

StepTracker::ScalerStep Monitor::OnScalerUpdateStep() {
  absl::MutexLock lock(&mu_);
  const StepTracker::ScalerStep s = steps_.OnScalerUpdate();
  RenumberLocked();
  if (s.advanced) {
    if (update_ended_at_) {
      // No forward pass was seen since the last optimizer record ended its
      // step: that step's row first.
      WriteStepLocked(s.step - 1, *update_ended_at_, /*ended=*/true);
      update_ended_at_.reset();
    }
    WriteStepLocked(s.step, clock_(), /*ended=*/true);
  }
  StepStateChangedLocked();
  return s;
}

void Monitor::RecordLossScale(int64_t step, double scale, bool skipped) {
  if (writer_) writer_->Add(LossScaleRow{step, scale, skipped});
}

std::string Monitor::OnStepSkipped() {
  absl::MutexLock lock(&mu_);
  ++skipped_steps_;
  SkipRow row{steps_.step(), step_bad_backward_op_, step_bad_forward_op_,
              clock_()};
  std::string line = absl::StrCat(
      "skipped the optimizer step at step ", row.step,
      ": non-finite gradients",
      row.first_op.empty()
          ? " (no checked backward op made them)"
          : absl::StrCat(", first made by ", row.first_op,
                         row.forward_op.empty()
                             ? ""
                             : absl::StrCat(" (backward of ", row.forward_op, ")")));
  if (writer_) writer_->Add(std::move(row));
  return line;
}

bool Monitor::JudgesIterationWithoutUpdate(Phase phase, bool grad_enabled,
                                           bool takes_grad_input) const {
  absl::MutexLock lock(&mu_);
  return config_.mode != Mode::kSample &&
         steps_.AtIterationWithoutUpdate(phase, grad_enabled, takes_grad_input);
}

void Monitor::JudgeIterationWithoutUpdateLocked(Phase phase, bool grad_enabled,
                                                bool takes_grad_input,
                                                absl::FunctionRef<bool()> nonfinite_gradients_held,
                                                double now) {
  // Non-finite gradients, then a new iteration without an optimizer step.
  // Nothing of them left: the program threw them away (zeroed or freed)
  // and went on to the next batch, skipping the update. Still held: kept
  // in .grad for the next micro-batch of gradient accumulation, or written
  // into a weight by a hand-written update. In sample mode an unchecked
  // op may have carried them anywhere.
  if (step_bad_backward_op_.empty() ||
      !steps_.AtIterationWithoutUpdate(phase, grad_enabled, takes_grad_input)) {
    return;
  }
  if (config_.mode == Mode::kSample) {
    if (!unjudged_counted_) ++unjudged_in_sample_mode_;  // once per iteration
    unjudged_counted_ = true;
    return;
  }
  if (nonfinite_gradients_held()) {
    steps_.OnGradientsKept();
  } else {
    RecordProgramSkipLocked(now);
  }
}

void Monitor::NoteGradientsReturned() {
  absl::MutexLock lock(&mu_);
  steps_.OnGradientsReturned();
}

void Monitor::RecordProgramSkipLocked(double now) {
  ++program_skips_;
  const int64_t step = steps_.OnUpdateSkipped();
  RenumberLocked();
  if (writer_) {
    writer_->Add(EventRow{
        now, kProgramSkippedUpdate,
        absl::StrCat("step ", step, ": ", kProgramSkippedUpdateDetail,
                     "; the first non-finite gradients came from ", step_bad_backward_op_,
                     step_bad_forward_op_.empty()
                         ? ""
                         : absl::StrCat(" (backward of ", step_bad_forward_op_, ")"))});
  }
  WriteStepLocked(step, now, /*ended=*/true);
}

int64_t Monitor::program_skips() const {
  absl::MutexLock lock(&mu_);
  return program_skips_;
}

int64_t Monitor::iterations_unjudged_in_sample_mode() const {
  absl::MutexLock lock(&mu_);
  return unjudged_in_sample_mode_;
}

int64_t Monitor::skipped_steps() const {
  absl::MutexLock lock(&mu_);
  return skipped_steps_;
}

bool Monitor::StepHasNonFinite() const {
  absl::MutexLock lock(&mu_);
  return step_nonfinite_ops_ > 0;
}

void Monitor::OnOptimizerStepEnd(bool nonfinite_held) {
  absl::MutexLock lock(&mu_);
  // In sample mode unsampled ops may have carried them anywhere: the
  // caller says held, and no verdict waits.
  const bool waits = config_.mode != Mode::kSample &&
                     drops_.UpdateEnded(steps_.step(), step_nonfinite_ops_);
  if (!waits && step_nonfinite_ops_ > 0) {
    update_made_nonfinite_.store(true, std::memory_order_relaxed);
    if (!nonfinite_held) WriteDroppedLocked(steps_.step());
  }
  if (config_.mode == Mode::kSample) {
    // A step an optimizer record (StepTracker::OnOptimizerStepEnd).
    WriteStepLocked(steps_.step(), clock_(), /*ended=*/true);
    steps_.OnOptimizerStepEnd(/*begin_next_now=*/true);
    StepStateChangedLocked();
    return;
  }
  // The step's row waits for the next forward pass: another optimizer record
  // before it is this step's (StepTracker).
  update_ended_at_ = clock_();
  steps_.OnOptimizerStepEnd();
  StepStateChangedLocked();
}

void Monitor::OnOptimizerSkipped() {
  if (config_.mode == Mode::kSample) {
    OnOptimizerStepEnd();
    return;
  }
  absl::MutexLock lock(&mu_);
  // Another optimizer of the iteration (a GAN's generator, skipped while
  // its discriminator stepped) keeps the step; the next forward pass
  // begins the next, and the skipped gradients are not an iteration the
  // program left without an update.
  update_ended_at_ = clock_();
  steps_.OnOptimizerStepEnd();
  StepStateChangedLocked();
}

void Monitor::WriteDroppedLocked(int64_t step) {
  if (step <= last_dropped_step_) return;
  last_dropped_step_ = step;
  if (writer_) {
    writer_->Add(EventRow{clock_(), kNonFiniteDropped,
                          absl::StrCat("step ", step, ": ", kNonFiniteDroppedDetail)});
  }
}

void Monitor::set_nonfinite_held(std::function<bool()> held) {
  absl::MutexLock lock(&mu_);
  nonfinite_held_ = std::move(held);
}

void Monitor::JudgeWaitingDrops() {
  std::vector<DropVerdicts::Waiting> ready;
  std::function<bool()> held;
  {
    absl::MutexLock lock(&mu_);
    drops_ready_.store(false, std::memory_order_relaxed);
    ready = drops_.TakeReady(steps_.step());
    held = nonfinite_held_;
  }
  bool made_any = false;
  for (const DropVerdicts::Waiting& w : ready) made_any |= w.nonfinite_ops > 0;
  if (!made_any) return;
  update_made_nonfinite_.store(true, std::memory_order_relaxed);
  // Asked without the lock: the query takes the registry's. Every ready
  // step is judged by the same answer, given now.
  if (!held || held()) return;
  absl::MutexLock lock(&mu_);
  for (const DropVerdicts::Waiting& w : ready) {
    if (w.nonfinite_ops > 0) WriteDroppedLocked(w.step);
  }
}

template <class Ops>
void Monitor::WriteOpStatsLocked(int64_t step, Ops& ops) {
  for (auto& [name, state] : ops) {
    for (int m = 0; m < 2; ++m) {
      for (int p = 0; p < kPhaseCount; ++p) {
        for (int f = 0; f < kFormatCount; ++f) {
          if (!state.touched[m][p][f]) continue;
          state.touched[m][p][f] = false;
          Stats& s = state.stats[m][p][f];
          if (writer_) {
            OpStatsRow r;
            r.step = step;
            r.op = name;
            r.phase = std::string(PhaseName(static_cast<Phase>(p)));
            r.dtype = std::string(FormatName(static_cast<Format>(f)));
            r.calls = s.calls;
            r.elements = static_cast<int64_t>(s.counts.elements);
            r.nan = static_cast<int64_t>(s.counts.nan);
            r.posinf = static_cast<int64_t>(s.counts.posinf);
            r.neginf = static_cast<int64_t>(s.counts.neginf);
            r.near_max = static_cast<int64_t>(s.counts.near_max);
            r.underflow = static_cast<int64_t>(s.counts.underflow);
            r.fp16_overflow = static_cast<int64_t>(s.counts.fp16_overflow);
            r.max_abs = MaxAbs(static_cast<Format>(f), s.counts);
            r.mask = m == 1;
            writer_->Add(std::move(r));
          }
          s = Stats{};
        }
      }
    }
  }
}

Monitor::LateStep* Monitor::LateStepOf(const OpEvent& e) {
  if (e.late_step < 0 || e.late_step > written_through_) return nullptr;
  return &late_steps_[e.late_step];
}

void Monitor::WriteLateStepsLocked(int64_t before, int64_t from) {
  for (auto it = late_steps_.lower_bound(from);
       it != late_steps_.end() && it->first < before;) {
    WriteOpStatsLocked(it->first, it->second.ops);
    if (writer_) {
      StepRow row;
      row.step = it->first;
      row.ops = it->second.ops_count;
      row.nonfinite_ops = it->second.nonfinite_ops;
      row.origins = it->second.origins;
      row.max_abs = it->second.max_abs;
      row.started = row.ended = std::nan("");  // the step's own row has its times
      writer_->Add(row);
    }
    NoteUpdateLocked(it->first, it->second.update_max_abs);
    it = late_steps_.erase(it);
  }
}

void Monitor::WriteStepLocked(int64_t step, double now, bool ended) {
  WriteOpStatsLocked(step, ops_);
  written_through_ = std::max(written_through_, step);
  if (writer_ && (call_index_ > 0 || ended)) {
    StepRow row;
    row.step = step;
    row.ops = call_index_;
    row.nonfinite_ops = step_nonfinite_ops_;
    row.origins = step_origins_;
    row.max_abs = step_max_abs_;
    row.started = step_started_;
    row.ended = now;
    writer_->Add(row);
  }
  NoteUpdateLocked(step, step_update_max_abs_);
  step_update_max_abs_ = 0;
  call_index_ = 0;
  step_trained_ = false;
  step_nonfinite_ops_ = 0;
  step_origins_ = 0;
  step_findings_ = 0;
  step_max_abs_ = 0;
  step_bad_backward_op_.clear();
  step_bad_forward_op_.clear();
  step_started_ = now;
}

void Monitor::FlushStep() {
  absl::MutexLock lock(&mu_);
  WriteGivenUpLocked(/*all=*/true);  // the last ones, with no iteration after them
  // At exit: what ran after the last step ended is only a step if it
  // trained (a run killed mid-step); its statistics are written either way.
  if (update_ended_at_) {
    // The last optimizer record ended the step; what ran after it (a last
    // scaler update, a checkpoint's copies) is its tail.
    WriteStepLocked(steps_.step(), *update_ended_at_, /*ended=*/true);
    update_ended_at_.reset();
    WriteLateStepsLocked(std::numeric_limits<int64_t>::max());
    return;
  }
  if (!step_trained_) {
    // What ran after the last step trained nothing: no step of its own,
    // but in a process that never trained, where it is the last forward
    // pass.
    if (!steps_.counts_passes()) call_index_ = 0;
  } else if (writer_ && call_index_ > 0 && !steps_.UpdatedAfterLastBackward()) {
    // Its update, or a loss scaler's skip of it, never came: no verdict on
    // its gradients. (A C++ program's last update ends its last step
    // without an op of the next.)
    writer_->Add(EventRow{clock_(), kUnfinishedStep,
                          absl::StrCat("step ", steps_.step(), ": ", kUnfinishedStepDetail)});
  }
  WriteStepLocked(steps_.step(), clock_());
  WriteLateStepsLocked(std::numeric_limits<int64_t>::max());
}

}  // namespace nanhunt
