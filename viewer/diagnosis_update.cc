#include "viewer/diagnosis_update.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace nanhunt {
namespace {

// The ops with which torch.optim's adaptive optimizers divide by their
// second moment: the for-loop, foreach and fused implementations.
bool DividesTheUpdate(absl::string_view op) {
  for (const char* d : {"aten::addcdiv_", "aten::addcdiv", "aten::div", "aten::div_",
                        "aten::_foreach_addcdiv_", "aten::_foreach_addcdiv",
                        "aten::_foreach_div_", "aten::_foreach_div", "aten::_fused_adam_",
                        "aten::_fused_adamw_", "aten::_fused_adagrad_"}) {
    if (op == d) return true;
  }
  return false;
}

bool TakesANorm(absl::string_view op) {
  for (const char* n : {"aten::linalg_vector_norm", "aten::_foreach_norm", "aten::norm",
                        "aten::frobenius_norm", "aten::linalg_norm"}) {
    if (op == n) return true;
  }
  return false;
}

}  // namespace

std::optional<Diagnosis> Fp16GradientNorm(const RunSummary& s, const FindingRow& f) {
  if (f.kind != "origin" || f.phase == "forward" || f.dtype != "float16" ||
      !(TakesANorm(f.op) || TakesANorm(f.top_op)) || f.nan != 0) {
    return std::nullopt;
  }
  Diagnosis d;
  d.kind = "fp16_gradient_norm";
  d.op = f.top_op.empty() ? f.op : f.top_op;
  d.title = absl::StrCat("The gradient norm overflowed fp16 (step ", f.step,
                         "): clipping by it scales every gradient to 0");
  d.evidence.push_back(absl::StrCat(
      "step ", f.step, ": ", OpInTopOp(f), " (", f.phase,
      ") turned finite float16 gradients into an infinite norm",
      f.fp32_max_abs ? absl::StrFormat(" (recomputed in fp32 it is %.6g)", *f.fp32_max_abs) : "",
      f.source.empty() ? "" : ", at " + f.source));
  d.evidence.push_back(
      "a norm sums squares: gradients of fp16 weights (model.half()) overflow it once their "
      "norm passes 65504, though each is far below; torch.nn.utils.clip_grad_norm_ then "
      "multiplies every gradient by max_norm / (inf + 1e-6) = 0, so the weights stop "
      "changing while the loss stays finite (with error_if_nonfinite=False, its default)");
  if (!f.inputs.empty()) d.evidence.push_back(absl::StrCat("its inputs: ", f.inputs));
  d.fixes.push_back(
      "keep the weights, and so the gradients, in fp32 and get fp16 from "
      "torch.autocast(dtype=torch.float16) with a GradScaler (scaler.unscale_(opt) before "
      "clip_grad_norm_) instead of model.half()");
  d.fixes.push_back(
      "or, keeping an fp16 model, take the norm in fp32: norm = torch.stack([p.grad.float()."
      "norm() for p in params]).norm(), then p.grad.mul_(min(1.0, max_norm / (norm.item() + "
      "1e-6))) for each p");
  d.fixes.push_back(
      "meanwhile, clip_grad_norm_(..., error_if_nonfinite=True) raises at such a step instead "
      "of zeroing the gradients silently");
  (void)s;
  return d;
}

std::optional<Diagnosis> Fp16OptimizerState(const RunSummary& s, const FindingRow& f) {
  if (f.kind != "origin" || f.phase != "optimizer" || f.dtype != "float16" ||
      !(DividesTheUpdate(f.op) || DividesTheUpdate(f.top_op))) {
    return std::nullopt;
  }
  Diagnosis d;
  d.kind = "fp16_optimizer_state";
  d.op = f.top_op.empty() ? f.op : f.top_op;
  d.title = absl::StrCat("The optimizer's update made inf/NaN: its state is in fp16 (",
                         d.op, " at step ", f.step, ")");
  d.evidence.push_back(absl::StrCat(
      "step ", f.step, ": ", f.op, " (optimizer) turned finite float16 values into "
      "inf/NaN (nan=", f.nan, " +inf=", f.posinf, " -inf=", f.neginf, " of ", f.elements,
      "); the forward and backward passes before it were finite"));
  d.evidence.push_back(
      "the optimizer keeps its state in the weights' dtype, fp16, and divides by "
      "sqrt(exp_avg_sq) + eps (Adam, AdamW; Adagrad and RMSprop alike): eps = 1e-8 "
      "rounds to 0 in fp16 and squared gradients below 6e-8 flush to 0, so wherever "
      "a gradient was small or zero (an unused embedding row) the divisor is 0; "
      "squared gradients past 65504 (a gradient past 256) overflow it to inf");
  if (!f.inputs.empty()) d.evidence.push_back(absl::StrCat("its inputs: ", f.inputs));
  d.fixes.push_back(
      "keep the weights in fp32 and get fp16 from torch.autocast(dtype=torch.float16) "
      "with a GradScaler, instead of model.half(): the optimizer state is then fp32");
  d.fixes.push_back(
      "or, keeping an fp16 model, give the optimizer fp32 master copies of the "
      "weights (as fairseq's FP16Optimizer and apex's O2 do), or model.bfloat16(), "
      "whose range holds eps and small squared gradients");
  d.fixes.push_back(
      "or, as a stopgap, an eps that fp16 can hold: torch.optim.Adam(..., eps=1e-4)");
  (void)s;
  return d;
}

}  // namespace nanhunt
