#include "viewer/diagnosis.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/check_limits.h"
#include "viewer/diagnosis_buffers.h"
#include "viewer/diagnosis_growth.h"
#include "viewer/diagnosis_loaded_state.h"
#include "viewer/diagnosis_made_values.h"
#include "viewer/diagnosis_math.h"
#include "viewer/diagnosis_update.h"
#include "viewer/scaler_skips.h"

namespace nanhunt {
namespace {

bool IsMatmul(absl::string_view op) {
  for (const char* m : {"aten::bmm", "aten::mm", "aten::matmul", "aten::baddbmm",
                        "aten::addmm", "aten::linear", "aten::einsum"}) {
    if (op == m) return true;
  }
  return false;
}

// Coalescing a sparse gradient (SparseAdam, Adagrad, clip_grad_norm_ do)
// sums the rows of indices that came more than once: a token repeated
// across a batch adds up its gradients in the weights' dtype.
bool IsSparseCoalesce(absl::string_view op) {
  return op == "aten::_coalesce" || op == "aten::coalesce";
}

bool IsReduction(absl::string_view op) {
  for (const char* r : {"aten::exp", "aten::sum", "aten::pow", "aten::log",
                        "aten::mean", "aten::mse_loss", "aten::var", "aten::norm",
                        "aten::linalg_vector_norm", "aten::square"}) {
    if (op == r) return true;
  }
  return false;
}

// Ops that square their input (or raise it to a power): an fp16 value past
// 256 squares past 65504.
bool Squares(absl::string_view op) {
  for (const char* r : {"aten::pow", "aten::square", "aten::norm", "aten::linalg_vector_norm",
                        "aten::var", "aten::mse_loss"}) {
    if (op == r) return true;
  }
  return false;
}

// The op a user can switch: the outermost one autocast sees (matmul, not
// the bmm inside it).
std::string Switchable(const FindingRow& f) {
  return f.top_op.empty() ? f.op : f.top_op;
}

std::string Percent(double share) { return absl::StrFormat("%.0f%%", 100 * share); }

const PhaseTotals* Phase(const RunSummary& s, absl::string_view name) {
  for (const PhaseTotals& p : s.phases) {
    if (p.phase == name) return &p;
  }
  return nullptr;
}

// The warnings about origin `f`'s op before it overflowed: fp16 values of
// the same op and phase nearing 65504 (a wider format's values past the
// threshold are a forecast about other tensors: the fp32 loss scale an fp16
// gradient's cast was warned about at 25613% of 65504).
void AddWarningTrend(const RunSummary& s, const FindingRow& f, Diagnosis& d) {
  int64_t first_step = -1, last_step = -1;
  double first = 0, last = 0;
  for (const FindingRow& w : s.warnings) {
    if ((w.op != f.op && w.top_op != f.op) || w.phase != f.phase ||
        !IsFp16Range(w.dtype) || w.step > f.step) {
      continue;
    }
    if (first_step < 0) {
      first_step = w.step;
      first = w.max_abs;
    }
    last_step = w.step;
    last = w.max_abs;
  }
  if (first_step < 0) return;
  d.evidence.push_back(
      first_step == last_step
          ? absl::StrFormat("it was warned about at step %d: |x| reached %.0f%% of 65504 "
                            "before it overflowed",
                            first_step, 100 * first / kFp16Max)
          : absl::StrFormat("it was warned about from step %d on: |x| rose from %.0f%% "
                            "to %.0f%% of 65504 before it overflowed",
                            first_step, 100 * first / kFp16Max, 100 * last / kFp16Max));
}

Diagnosis NonFiniteInput(const RunSummary& s, const FindingRow& f) {
  Diagnosis d;
  d.kind = "nonfinite_input";
  d.title = "Non-finite values came in with the data, not from an op";
  d.op = f.op;
  d.evidence.push_back(absl::StrCat(
      "step ", f.step, ": ", f.op, " (", f.phase, ") was given inf/NaN that no "
      "checked op had produced", f.source.empty() ? "" : ", at " + f.source));
  if (!f.inputs.empty()) d.evidence.push_back("its inputs: " + f.inputs);
  if (FromNanMarker(f)) {
    // x[i] = float("nan"): the program's own NaN, a missing value's marker
    // (or a fault planted on purpose), that an op which skips none spread.
    d.evidence.push_back(absl::StrCat(
        "the NaN was placed by the program itself (x[i] = float(\"nan\"), torch.where(ok, x, "
        "float(\"nan\")), masked_fill(m, float(\"nan\"))), and ", f.op,
        " spread it: it skips no NaN"));
    d.fixes.push_back(absl::StrCat(
        "if the NaN marks missing values, keep them out of ", f.op,
        ": torch.nan_to_num(x, nan=0.0) with a mask beside it, or select the known entries "
        "first"));
  }
  d.fixes.push_back(absl::StrCat(
      "find the record: the batch of step ", f.step,
      " holds inf/NaN; check the dataset and its preprocessing (division by "
      "zero, log of 0, a corrupt file)"));
  d.fixes.push_back(
      "guard the input pipeline: assert torch.isfinite(batch).all(), or drop "
      "such records when loading");
  d.fixes.push_back(
      "NANHUNT_ON_NONFINITE=raise with NANHUNT_SNAPSHOT_DIR stops at that batch "
      "and saves it");
  return d;
}

// Non-finite values no checked op made, first seen after a torch.compile
// region ran in the iteration: its fused kernels made them, or it was
// given them. Not the data's fault by default, nor any op's nanhunt saw.
Diagnosis CompiledRegionMade(const FindingRow& f) {
  Diagnosis d;
  d.kind = "compiled_region";
  d.title = "Non-finite values came out of a torch.compile region";
  d.op = f.op;
  d.evidence.push_back(absl::StrCat(
      "step ", f.step, ": ", f.op, " (", f.phase, ")",
      f.source.empty() ? "" : ", at " + f.source,
      ", was the first checked op given inf/NaN; no checked op had made them, and ",
      f.compiled_region, " had run before it"));
  if (!f.inputs.empty()) d.evidence.push_back("its inputs: " + f.inputs);
  d.evidence.push_back(
      "a compiled region runs fused kernels, not ops nanhunt checks one by one: it made "
      "them, or was given them (a batch holding inf/NaN goes into a compiled model first)");
  d.fixes.push_back(
      "rerun with TORCHDYNAMO_DISABLE=1 (torch's switch, no code change): the region runs op "
      "by op and nanhunt names the op that made them, with its line (a fused kernel keeps "
      "fp16 intermediates in fp32, so the eager numbers differ a little)");
  d.fixes.push_back(
      "or keep the rest compiled and the suspect function eager: decorate it with "
      "@torch.compiler.disable");
  return d;
}

Diagnosis DiagnoseRun(const RunSummary& s);

// Whether an op of the program's masks (mask_ops) carried NaN: markers the
// program placed, not only ±inf masks.
bool PlacedNanMarkers(const RunSummary& s) {
  return std::any_of(s.ops.begin(), s.ops.end(), [&](const OpTotals& o) {
    return o.mask && o.nan > 0 &&
           std::find(s.mask_ops.begin(), s.mask_ops.end(), o.op) != s.mask_ops.end();
  });
}

// Only carried inf/NaN (propagated findings), none that a checked op made
// of finite inputs or read from the data: a constant torch's own kernel
// handed to an op inside it, or memory no check saw written. Not "every
// checked output was finite"; healthy only if every step dropped them.
Diagnosis CarriedOnly(const RunSummary& s, const FindingRow& f) {
  Diagnosis d;
  d.op = f.op;
  const size_t n = s.nonfinite_steps.size();
  const std::string steps = absl::StrCat(n, n == 1 ? " step" : " steps");
  if (AllDroppedWithinSteps(s)) {
    d.kind = "healthy";
    d.title = absl::StrCat("Healthy: inf/NaN in ", steps,
                           ", dropped before any weight; no checked op made them");
  } else {
    d.kind = "unknown_origin";
    d.title = absl::StrCat("Non-finite values that no checked op made, in ", steps);
  }
  d.evidence.push_back(absl::StrCat(
      "first seen at step ", f.step, ": ", OpWithinTop(f), " (", f.phase, ") was given them",
      f.source.empty() ? "" : ", at " + f.source));
  if (!f.inputs.empty()) d.evidence.push_back("its inputs: " + f.inputs);
  d.evidence.push_back(
      "no checked op made them of finite values, and no input held them before an op read "
      "it: torch handed them to an op inside another (a constant of its kernel), or memory no "
      "check saw written held them");
  d.fixes.push_back(absl::StrCat(
      d.kind == "healthy" ? "nothing harms training; to see where they come from: " : "",
      "NANHUNT_ON_NONFINITE=raise with NANHUNT_SNAPSHOT_DIR stops at the first and saves the "
      "inputs of the op that was given them"));
  return d;
}

// Sample mode checks a share of op calls: inf/NaN handed to a checked op
// that no checked op made were as likely made by one it did not check (in
// the backward pass, in an update) as by the data. When an escalation
// after it caught an origin, that is the diagnosis; else, say so.
Diagnosis UncheckedMaker(const RunSummary& s, const FindingRow& f) {
  const std::string seen = absl::StrCat(
      "step ", f.step, ": ", f.op, " (", f.phase, ") was given inf/NaN that no checked op had "
      "produced", f.source.empty() ? "" : ", at " + f.source);
  for (const RunSummary::Escalation& e : s.escalations) {
    if (!e.origin || e.origin->step < f.step) continue;
    RunSummary caught = s;
    caught.first_origin = e.origin;
    Diagnosis d = DiagnoseRun(caught);
    d.evidence.push_back(absl::StrCat(
        "sample mode saw inf/NaN first at ", seen, "; the op that made them went unchecked, "
        "and the escalation to every op caught this origin at step ", e.origin->step));
    return d;
  }
  Diagnosis d;
  d.kind = "unchecked_maker";
  d.title = "Non-finite values from an op that sample mode did not check";
  d.op = f.op;
  d.evidence.push_back(seen);
  if (!f.inputs.empty()) d.evidence.push_back("its inputs: " + f.inputs);
  d.evidence.push_back(absl::StrCat(
      "sample mode checked ", s.op_calls_checked,
      " op calls: the op that made them was most likely one it did not check (the backward "
      "pass, an update), or the batch held them"));
  d.fixes.push_back(absl::StrCat(
      "rerun with every op checked (NANHUNT_MODE=check, the default), from a checkpoint before "
      "step ", f.step, ": the op that made them is then named, with its line"));
  d.fixes.push_back(
      "or let it recur: sample mode then checks every op for NANHUNT_ESCALATE_STEPS steps and "
      "names the origin");
  d.fixes.push_back(
      "if the batch may hold them: assert torch.isfinite(batch).all() in the input pipeline");
  return d;
}

bool IsCast(absl::string_view op) {
  for (const char* c : {"aten::_to_copy", "aten::to", "aten::copy_", "aten::type_as",
                        "aten::half"}) {
    if (op == c) return true;
  }
  return false;
}

// The program's own cast to fp16 (x.half(), x.to(torch.float16)) of values
// already past its range: no op to run in fp32, the tensor itself must stay
// wider or smaller. (A cast autocast makes sits inside the op it serves,
// which is then the one to switch.)
Diagnosis CastOverflow(const RunSummary& s, const FindingRow& f) {
  Diagnosis d;
  d.kind = "forward_overflow";
  d.op = Switchable(f);
  d.title = absl::StrCat("Forward overflow: values past fp16's 65504 cast to ",
                         f.dtype, " at step ", f.step);
  d.evidence.push_back(absl::StrCat(
      "step ", f.step, ": ", OpWithinTop(f),
      " cast finite values to ", f.dtype, " inf/NaN",
      f.fp32_max_abs && std::isfinite(*f.fp32_max_abs)
          ? absl::StrFormat(" (they were up to %.6g, %s the limit)",
                            *f.fp32_max_abs, TimesFp16Max(*f.fp32_max_abs))
          : "",
      f.source.empty() ? "" : ", at " + f.source));
  // The wider op that made them: the largest fp32/bf16 warning up to then.
  const FindingRow* maker = nullptr;
  for (const FindingRow& w : s.warnings) {
    if (w.step > f.step || IsCast(w.op) || w.dtype == "float16") continue;
    if (maker == nullptr || w.max_abs > maker->max_abs) maker = &w;
  }
  if (maker != nullptr) {
    d.evidence.push_back(absl::StrCat(
        "they were made by ", maker->op, " (", maker->phase, ", ", maker->dtype, ", up to ",
        FormatAbs(maker->max_abs), " at step ", maker->step, ")",
        maker->source.empty() ? "" : ", at " + maker->source));
  }
  AddWarningTrend(s, f, d);
  d.fixes.push_back(absl::StrCat(
      "keep this tensor in float32, or cast it to bfloat16 (float32's range) "
      "instead of float16",
      f.source.empty() ? "" : ", at " + f.source));
  d.fixes.push_back(absl::StrCat(
      "or bring the values into fp16's range where they are made",
      maker != nullptr ? " (" + maker->op + ")" : "",
      ": normalise or scale them down before the cast"));
  return d;
}

Diagnosis ForwardOverflow(const RunSummary& s, const FindingRow& f) {
  if (IsCast(f.op) && (f.top_op.empty() || IsCast(f.top_op))) return CastOverflow(s, f);
  Diagnosis d;
  d.kind = "forward_overflow";
  const std::string op = Switchable(f);
  d.op = op;
  d.title = absl::StrCat("Forward overflow: ", op,
                         " produced values past fp16's 65504 at step ", f.step);
  if (f.fp32_max_abs && std::isfinite(*f.fp32_max_abs) && *f.fp32_max_abs <= kFp16Max) {
    // Its result fits: what passed fp16's range (or fell below its
    // precision) was a value it computes on the way.
    d.title = absl::StrCat("Forward overflow inside ", op, " at step ", f.step,
                           ": its result fits fp16 (fp32 gives at most ",
                           FormatAbs(*f.fp32_max_abs), "), a value it computes on the way "
                           "does not");
  }
  std::string reached;
  if (f.fp32_max_abs && std::isfinite(*f.fp32_max_abs)) {
    reached = absl::StrFormat(" (recomputed in fp32 they reach %.6g, %s the limit)",
                              *f.fp32_max_abs, TimesFp16Max(*f.fp32_max_abs));
  }
  d.evidence.push_back(absl::StrCat(
      "step ", f.step, ": ", OpWithinTop(f),
      " turned finite inputs into ", f.dtype, " inf/NaN", reached,
      f.source.empty() ? "" : ", at " + f.source));
  AddWarningTrend(s, f, d);
  if (AllDroppedWithinSteps(s) && Fp16RangeOverflow(f)) {
    d.evidence.push_back(
        "no weight, gradient or buffer held inf/NaN by the end of its step, so the loss "
        "stayed finite: the ops after it computed finite values from them (an rsqrt of "
        "inf is 0, a sigmoid of it 1, x / inf 0) or selected them away, and training "
        "went on silently with wrong values where they overflowed");
  }
  if (s.steps > 0) {
    d.evidence.push_back(absl::StrFormat(
        "it happened %s: %d of %d steps ran before it",
        f.step < s.steps / 4 + 1 ? "early" : "mid-run, as activations grew", f.step,
        s.steps));
  }
  if (s.fp16_updates && Fp16RangeOverflow(f)) {
    // A listed op of a model.half() model returns fp16 again: its own
    // result past 65504 overflows there whatever computes it.
    d.fixes.push_back(absl::StrFormat(
        "in code, compute %s and the ops that use its result in fp32 (.float() before it, "
        ".half() once the values are small again): the weights are fp16 (model.half()), "
        "where NANHUNT_FP32_OPS=%s returns fp16 again and its values, up to %.6g, do not "
        "fit; fp32 weights under autocast keep a listed op's result fp32",
        op, op, *f.fp32_max_abs));
  } else {
    d.fixes.push_back(absl::StrCat(
        "run ", op, " in fp32: NANHUNT_FP32_OPS=", op,
        " now, without code change; in code, compute it under "
        "torch.autocast(..., enabled=False) with .float() inputs"));
  }
  if (IsMatmul(f.op) || IsMatmul(op)) {
    d.fixes.push_back(
        "scale before the matmul, not after: (q * d**-0.5) @ k.transpose(-1, "
        "-2), or F.scaled_dot_product_attention, which does");
  }
  if (Squares(f.op) || Squares(op)) {
    d.fixes.push_back(
        "square in fp32: x.float().pow(2).mean(), as LLaMA's RMSNorm does (fp16 squares "
        "pass 65504 from |x| = 256 on), or torch.linalg.vector_norm and F.rms_norm, "
        "which accumulate in fp32");
  } else if (const std::string exp_fix = ExponentialFix(f); !exp_fix.empty()) {
    d.fixes.push_back(exp_fix);
  } else if (IsReduction(f.op) || IsReduction(op)) {
    d.fixes.push_back(
        "use a library function that subtracts the max or accumulates in fp32 "
        "(torch.logsumexp, F.cross_entropy, F.log_softmax) instead of exp/sum "
        "by hand");
  }
  d.fixes.push_back(
      s.fp16_updates
          ? "or train in bf16 (fp32's range): model.bfloat16() instead of model.half() "
            "(GPUs from Ampere on); NANHUNT_AUTOCAST_DTYPE switches autocast only"
          : "or run autocast in bf16 (fp32's range): NANHUNT_AUTOCAST_DTYPE=bf16 "
            "now; torch.autocast(..., dtype=torch.bfloat16) in code (GPUs from "
            "Ampere on)");
  d.fixes.push_back(
      "if the inputs themselves grow (raw counts, unnormalised features), "
      "normalise them");
  return d;
}

Diagnosis BackwardOverflow(const RunSummary& s, const FindingRow& f) {
  Diagnosis d;
  d.kind = "backward_overflow";
  d.op = f.op;
  d.title = absl::StrCat("NaN mid-training: gradients overflowed in ", f.op,
                         " (", f.phase, ") at step ", f.step);
  // Called by a gradient hook or a custom backward: that line is the one
  // to change.
  const bool called_at = !f.source.empty() && !SourceIsForwardLine(f);
  d.evidence.push_back(absl::StrCat(
      "step ", f.step, ": ", f.op,
      BackwardOf(f), " turned finite values into ", f.dtype, " inf/NaN",
      called_at ? absl::StrCat(f.phase == "backward" ? ", called in the backward pass at "
                                                     : ", called at ",
                               f.source)
                : "",
      "; the forward pass was finite"));
  AddWarningTrend(s, f, d);
  AddScalerEvidence(s, SkipsOf(s), d);
  if (IsSparseCoalesce(f.op)) {
    d.evidence.push_back(absl::StrCat(
        "a sparse gradient was coalesced: the gradients of an index that came more than "
        "once (a frequent token) were summed in ", f.dtype));
    d.fixes.push_back(absl::StrCat(
        "keep the sparse parameters (nn.Embedding(..., sparse=True)) in fp32 rather than ",
        f.dtype, ": autocast computes in fp16 from fp32 weights, whose sparse gradients "
        "are then summed in fp32"));
  }
  d.fixes.push_back(
      s.fp16_updates
          ? "skip the steps whose gradients are not finite: NANHUNT_SKIP_NONFINITE_STEPS=1 "
            "now; torch.amp.GradScaler, which skips them in code, refuses the fp16 "
            "gradients of a model.half() model (\"Attempting to unscale FP16 gradients\"): "
            "keep fp32 weights under autocast to use it"
          : "use loss scaling with skipping: torch.amp.GradScaler, or "
            "NANHUNT_SKIP_NONFINITE_STEPS=1 now, so a bad step is skipped instead "
            "of writing NaN into the weights");
  if (absl::StrContains(f.forward_op, "::")) {
    d.fixes.push_back(absl::StrCat("run ", f.forward_op,
                                   " in fp32 (its backward then runs in fp32): "
                                   "NANHUNT_FP32_OPS=", f.forward_op));
  } else if (!f.forward_op.empty() && !absl::StartsWith(f.forward_op, "CompiledFunction")) {
    // A custom autograd.Function: no operator NANHUNT_FP32_OPS could run.
    d.fixes.push_back(absl::StrCat(
        "run ", f.forward_op, " in fp32: decorate its forward with "
        "@torch.amp.custom_fwd(device_type=..., cast_inputs=torch.float32) and its backward "
        "with @torch.amp.custom_bwd(device_type=...), or compute its backward from "
        "grad.float()"));
  }
  d.fixes.push_back(absl::StrCat(
      s.fp16_updates ? "or train in bf16: model.bfloat16() instead of model.half()"
                     : "or bf16 autocast (NANHUNT_AUTOCAST_DTYPE=bf16)",
      "; and clip gradients (torch.nn.utils.clip_grad_norm_) or lower the learning rate if "
      "gradients keep growing"));
  return d;
}

// Sample mode counts, and does not judge, iterations whose non-finite
// gradients were followed by the next batch without an optimizer step: a
// loss scaler of the program's own skipping. Without a GradScaler to say
// so, the overflows such a scaler threw away look like findings here.
void AddSampleModeCaution(const RunSummary& s, Diagnosis& d) {
  if (s.iterations_unjudged_in_sample_mode == 0 || d.kind == "healthy" ||
      !s.skipped_steps.empty() || !s.loss_scale.empty()) {
    return;
  }
  const int64_t n = s.iterations_unjudged_in_sample_mode;
  d.evidence.push_back(absl::StrCat(
      "sample mode: ", n, n == 1 ? " time" : " times",
      ", non-finite gradients were followed by the next batch without an optimizer step. "
      "That is what a loss scaler of the program's own does when it skips an update "
      "(fairseq's and Megatron's FP16 optimizers, DeepSpeed's fp16 engine), and sample "
      "mode does not follow such skips: the overflows it threw away count as findings "
      "here"));
  d.fixes.insert(d.fixes.begin(),
                 "if the program scales its loss itself, run with every op checked "
                 "(NANHUNT_MODE=check, the default): its skips are then told apart, and a "
                 "run whose every overflow it skipped is healthy");
}

// A GPU origin after a torch.compile region: its check read its outputs,
// not its inputs, and nothing read what the region's fused kernels wrote.
void AddCompiledRegionCaution(const RunSummary& s, Diagnosis& d) {
  if (!s.first_origin || s.first_origin->kind != "origin" ||
      s.first_origin->compiled_region.empty() || d.kind == "healthy") {
    return;
  }
  d.evidence.push_back(absl::StrCat(
      s.first_origin->compiled_region, " ran before it in the iteration; on a GPU nanhunt "
      "reads an op's outputs, not its inputs, and no check reads what a compiled region's "
      "fused kernels write: if the region's outputs held inf/NaN already, this op only "
      "passed them on"));
  d.fixes.insert(d.fixes.begin(),
                 "rerun with TORCHDYNAMO_DISABLE=1 (torch's switch, no code change) to tell: "
                 "the region then runs op by op and nanhunt checks each of its ops");
}

}  // namespace

// Iterations the program gave up on a non-finite loss (its own
// `if not torch.isfinite(loss): continue`) made no gradient and no update:
// worth knowing before reading the origin as the run's end.
void AddGivenUpEvidence(const RunSummary& s, Diagnosis& d) {
  if (s.given_up_steps.empty() || d.kind == "healthy") return;
  const size_t n = s.given_up_steps.size();
  d.evidence.push_back(absl::StrCat(
      "the program gave up ", n, n == 1 ? " iteration" : " iterations",
      " on a non-finite loss (steps ", StepRanges(s.given_up_steps),
      "): each forward pass made inf/NaN and the next batch began without a backward "
      "pass: no gradient or update came of them"));
}

Diagnosis Diagnose(const RunSummary& s) {
  Diagnosis d = DiagnoseRun(s);
  if (d.kind == "healthy" && s.first_given_up) {
    // Every inf/NaN but those of the iterations given up was handled (a
    // GradScaler's skips): those cost the program its iterations.
    RunSummary given_up = s;
    given_up.first_origin = s.first_given_up;
    d = DiagnoseRun(given_up);
  }
  AddSampleModeCaution(s, d);
  AddCompiledRegionCaution(s, d);
  AddGivenUpEvidence(s, d);
  return d;
}

namespace {

Diagnosis DiagnoseRun(const RunSummary& s) {
  if (s.first_origin) {
    const FindingRow& f = *s.first_origin;
    if (f.kind == "input") {
      if (auto loaded = RunningStatisticsLoaded(s, f)) return *loaded;
      if (auto loaded = LoadedStateNonFinite(s, f)) return *loaded;
      return s.op_sampling.empty() ? NonFiniteInput(s, f) : UncheckedMaker(s, f);
    }
    if (f.kind == "compiled") return CompiledRegionMade(f);
    // Steps a loss scaler skipped are no steps that dropped what they made,
    // nor are iterations given up on a non-finite loss: what made it is
    // what cost the program those iterations.
    if (s.program_skipped_steps.empty() && s.given_up_steps.empty()) {
      if (auto dropped = DroppedWithinSteps(s, f)) return *dropped;
    }
    // Whatever op overflowed first in a diverging run, more range for it
    // only postpones the NaN.
    if (auto diverged = Diverged(s, f)) return *diverged;
    // A matmul beside a mask (baddbmm) that made +inf overflowed: its
    // fp32 recomputation is not finite either, for the mask's -inf.
    const bool overflowed_beside_mask = FromMask(f) && IsMatmul(f.op) && f.posinf > 0;
    if (!overflowed_beside_mask) {
      if (auto marker = NanMarkerReached(f)) return *marker;
      if (auto mask = MaskMadeNonFinite(s, f)) return *mask;
      if (auto math = InvalidMath(s, f)) return *math;
    }
    if (auto state = Fp16OptimizerState(s, f)) return *state;
    if (auto norm = Fp16GradientNorm(s, f)) return *norm;
    if (auto stats = Fp16RunningStatistics(s, f)) return *stats;
    if (auto made = MadeFromNumbers(s, f)) return *made;
    if (f.phase == "forward") return ForwardOverflow(s, f);
  }
  if (!s.first_origin && s.first_received) {
    const FindingRow& f = *s.first_received;
    Diagnosis d;
    d.kind = "received";
    d.op = f.op;
    d.title = "Non-finite values came from another rank, through a collective";
    d.evidence.push_back(absl::StrCat(
        "step ", f.step, ": ", f.op, " (", f.phase, ") read inf/NaN that a "
        "collective (c10d) wrote and no op of this process made"));
    d.fixes.push_back(
        "open the traces of all ranks together (nanhunt view on the folder): "
        "the rank where it began has the origin");
    return d;
  }
  // A loss scaler (GradScaler, or the program's own) keeps backward
  // overflows out of the weights, at the price of the steps it skips: past
  // a share of them, training stalls. Unless they were the first steps,
  // while its scale settled, and it skipped every step with inf/NaN: what a
  // loss scaler is for.
  const ScalerSkips skips = SkipsOf(s);
  const int64_t settling = StepsTheScalerHandled(s, skips);
  const double skipped = SkippedShare(skips);
  if (skips.decided > 0 && skipped >= kSkippedStepsShare && settling < 0) {
    Diagnosis d;
    d.kind = "skipped_steps";
    d.title = absl::StrCat("Stalled training: ", skips.Who(), " skipped ", Percent(skipped),
                           " of the steps");
    AddScalerEvidence(s, skips, d);
    d.evidence.push_back(
        "a skipped step changes no weight: the loss plateaus while the "
        "scaler keeps finding inf/NaN gradients");
    if (s.first_origin) {
      // The scaled gradients overflow first there; the forward op of that
      // backward op is the one to give more range.
      const FindingRow& f = *s.first_origin;
      d.op = f.forward_op.empty() ? Switchable(f) : f.forward_op;
      d.evidence.push_back(absl::StrCat(
          "the scaled gradients first overflowed in ", f.op, BackwardOf(f),
          " (", f.phase, ") at step ", f.step));
    } else if (!s.ops.empty()) {
      d.evidence.push_back(absl::StrFormat(
          "closest to the limit: %s (%s) at |x| = %.6g", s.ops.front().op,
          s.ops.front().phase, s.ops.front().max_abs));
      d.op = s.ops.front().op;
    }
    d.fixes.push_back(absl::StrCat(
        "give the op whose gradients overflow more range (each skipped step's "
        "origin is in the trace): NANHUNT_FP32_OPS=", d.op.empty() ? "<op>" : d.op,
        " or bf16"));
    d.fixes.push_back(
        "a scale that only falls means the gradients overflow at any scale: "
        "lower the learning rate or clip gradients");
    return d;
  }
  if (s.first_origin && settling < 0) return BackwardOverflow(s, *s.first_origin);
  if (auto diverging = Diverging(s)) return *diverging;
  // Underflow harms where values are fp16 (they flush to zero); fp32 and
  // bf16 hold them, and theirs is a forecast for a switch to fp16.
  const PhaseTotals* backward = Phase(s, "backward");
  if (backward != nullptr && backward->fp16_elements > 0) {
    const double share = static_cast<double>(backward->fp16_underflow) /
                         static_cast<double>(backward->fp16_elements);
    if (share >= kGradientUnderflowShare) {
      Diagnosis d;
      d.kind = "underflow";
      d.title = absl::StrCat("Gradients underflow: ", Percent(share),
                             " of fp16 backward values are below its smallest "
                             "normal (6.1e-5)");
      d.evidence.push_back(absl::StrCat(
          backward->fp16_underflow, " of ", backward->fp16_elements,
          " fp16 values in the backward pass are so small that fp16 flushes them "
          "toward zero: updates vanish and the loss plateaus"));
      AddScalerEvidence(s, skips, d);
      // GradScaler refuses a model.half() model's fp16 gradients.
      d.fixes.push_back(
          skips.decided > 0
              ? "the scaler's scale is too small for these gradients: raise "
                "init_scale or growth_factor"
          : s.fp16_updates
              ? "scale the loss by hand, (loss * 1024).backward(), and divide the "
                "gradients by 1024 before the update: torch.amp.GradScaler refuses the "
                "fp16 gradients of a model.half() model (\"Attempting to unscale FP16 "
                "gradients\"); or keep fp32 weights under autocast, with a GradScaler"
              : "scale the loss: torch.amp.GradScaler multiplies it (by 65536 "
                "to start) so small gradients stay representable");
      d.fixes.push_back(s.fp16_updates
                            ? "or train in bf16, whose range goes down to 1e-38: "
                              "model.bfloat16() instead of model.half()"
                            : "or bf16 autocast (NANHUNT_AUTOCAST_DTYPE=bf16), whose range "
                              "goes down to 1e-38");
      return d;
    }
  }
  // Sample mode sees carried values whose maker went unchecked.
  if (!s.first_origin && s.first_propagated && settling < 0) {
    return s.op_sampling.empty() ? CarriedOnly(s, *s.first_propagated)
                                 : UncheckedMaker(s, *s.first_propagated);
  }
  Diagnosis d;
  d.kind = "healthy";
  d.title = "Healthy: no non-finite values, nothing close to fp16's limit";
  if (settling >= 0) {
    d.title = absl::StrCat("Healthy: every inf/NaN was in gradients ", skips.Who(), " skipped");
    AddScalerEvidence(s, skips, d);
    if (settling > 0) {
      d.evidence.push_back(absl::StrCat(
          "its first ", settling, " step", settling == 1 ? " was" : "s were",
          " skipped while its scale settled (it starts high and halves it at "
          "each overflow), as a dynamic loss scaler does"));
    }
    if (s.first_origin) {
      const FindingRow& f = *s.first_origin;
      d.evidence.push_back(absl::StrCat("the first overflow: ", f.op, " (", f.phase,
                                        ") at step ", f.step));
    }
  }
  // Warnings that are news: fp16 values nearing 65504. Wider formats' are a
  // forecast (the view's WOULD OVERFLOW IN FP16); under a loss scaler the
  // gradients are scaled up to the limit on purpose: it grows its scale
  // until they overflow, then skips that step and halves it.
  const FindingRow* nearing = nullptr;
  const FindingRow* scaled = nullptr;
  const FindingRow* wider = nullptr;  // the largest
  for (const FindingRow& w : s.warnings) {
    const bool scaled_gradient = w.phase == "backward" && skips.decided > 0;
    if (!IsFp16Range(w.dtype)) {
      // A wider format's scaled gradient is as large as the scale made it:
      // no forecast of the model's values.
      if (!scaled_gradient && (wider == nullptr || w.max_abs > wider->max_abs)) wider = &w;
      continue;
    }
    (scaled_gradient ? scaled : nearing) = &w;
  }
  if (nearing != nullptr) {
    const FindingRow& w = *nearing;
    if (settling < 0) {
      d.title = "Healthy so far: no non-finite values, but values are nearing "
                "fp16's limit";
    }
    d.op = w.op;
    d.evidence.push_back(absl::StrFormat(
        "%s (%s) reached |x| = %.6g, %.0f%% of 65504, at step %d", OpWithinTop(w), w.phase,
        w.max_abs, 100 * w.max_abs / kFp16Max, w.step));
    d.fixes.push_back(absl::StrCat(
        "if it keeps growing it will overflow: NANHUNT_FP32_OPS=auto switches "
        "such ops to fp32 before they do"));
  } else if (settling < 0) {
    d.evidence.push_back(absl::StrCat(
        "every checked output", s.steps == 0 ? "" : absl::StrCat(" of ", s.steps, StepNoun(s)),
        " was finite",
        s.mask_ops.empty() ? ""
                           : absl::StrCat(", apart from deliberate ",
                                          PlacedNanMarkers(s) ? "masks and NaN markers (" : "±inf masks (",
                                          absl::StrJoin(s.mask_ops, ", "), ")")));
  }
  if (scaled != nullptr) {
    d.evidence.push_back(absl::StrFormat(
        "the scaled gradients came to |x| = %.6g, %.0f%% of 65504 (%s, step %d): "
        "%s's doing, it grows the scale until they overflow",
        scaled->max_abs, 100 * scaled->max_abs / kFp16Max, OpWithinTop(*scaled), scaled->step,
        skips.Who()));
  }
  if (wider != nullptr) {
    d.evidence.push_back(absl::StrFormat(
        "%s values of %s (%s) reached |x| = %.6g at step %d: past fp16's near-max "
        "threshold, safe as they run",
        wider->dtype, OpWithinTop(*wider), wider->phase, wider->max_abs, wider->step));
  }
  if (backward != nullptr && backward->fp16_elements == 0 && backward->elements > 0 &&
      static_cast<double>(backward->underflow) >=
          kGradientUnderflowShare * static_cast<double>(backward->elements)) {
    d.evidence.push_back(absl::StrCat(
        Percent(static_cast<double>(backward->underflow) /
                static_cast<double>(backward->elements)),
        " of backward values are below fp16's smallest normal (6.1e-5): held as "
        "they run (no fp16), they would flush to zero in fp16 without "
        "torch.amp.GradScaler"));
  }
  return d;
}

}  // namespace

std::string OpInTopOp(const FindingRow& f) {
  return f.top_op.empty() ? f.op : absl::StrCat(f.op, " in ", f.top_op);
}

}  // namespace nanhunt
