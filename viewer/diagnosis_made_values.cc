#include "viewer/diagnosis_made_values.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace nanhunt {
namespace {

bool Named(std::initializer_list<absl::string_view> ops, absl::string_view op) {
  for (absl::string_view o : ops) {
    if (o == op) return true;
  }
  return false;
}

// Sequences whose ends and step are the program's numbers.
bool MakesSequence(absl::string_view op) {
  return Named({"aten::arange", "aten::range", "aten::linspace", "aten::logspace"}, op);
}

// Sequences of whole numbers: positions, indices, counts.
bool CountsWholeNumbers(absl::string_view op) {
  return op == "aten::arange" || op == "aten::range";
}

// Random draws whose parameters are the program's numbers (the tensor an
// in-place draw fills holds nothing it reads).
bool DrawsValues(absl::string_view op) {
  return Named({"aten::normal", "aten::normal_", "aten::cauchy_", "aten::log_normal_",
                "aten::exponential_", "aten::geometric_", "aten::uniform_", "aten::random_"},
               op);
}

}  // namespace

bool MakesValuesFromNumbers(absl::string_view op) { return MakesSequence(op) || DrawsValues(op); }

std::optional<Diagnosis> MadeFromNumbers(const RunSummary& s, const FindingRow& f) {
  if (f.kind != "origin" || f.dtype != "float16" || f.posinf + f.neginf == 0 ||
      !MakesValuesFromNumbers(f.op)) {
    return std::nullopt;
  }
  const bool sequence = MakesSequence(f.op);
  const std::string at = f.source.empty() ? "" : ", at " + f.source;
  Diagnosis d;
  d.kind = "forward_overflow";
  d.op = f.op;
  d.title = absl::StrCat("Forward overflow: ", f.op, " was asked for float16 values past 65504 at "
                         "step ", f.step);
  d.evidence.push_back(absl::StrCat(
      "step ", f.step, ": ", f.op, " made a float16 ", sequence ? "sequence" : "random draw",
      " of ", f.elements, " values from the program's numbers, ",
      f.posinf > 0 ? absl::StrCat("+inf=", f.posinf) : "",
      f.posinf > 0 && f.neginf > 0 ? " " : "",
      f.neginf > 0 ? absl::StrCat("-inf=", f.neginf) : "",
      " of them past 65504 (from 65520 on, a value rounds to inf in float16)", at));
  d.evidence.push_back(
      "no tensor's values went into it: its numbers and its dtype are the code's, so no op "
      "grew past the range, and neither NANHUNT_FP32_OPS nor autocast changes a dtype the code "
      "asks for");
  if (sequence && s.fp16_updates) {
    d.evidence.push_back(
        "the weights are float16 (model.half()), and so are its buffers: a dtype taken from "
        "one (torch.arange(n, dtype=self.inv_freq.dtype), as rotary embeddings grow their "
        "tables) is float16");
  }
  if (CountsWholeNumbers(f.op)) {
    d.evidence.push_back(
        "float16 counts whole numbers exactly only up to 2048: the values it made past 2048 "
        "were rounded too (to multiples of 2 from 2048, of 32 from 32768), so positions or "
        "indices counted in float16 are wrong long before they are inf");
  }
  if (sequence) {
    d.fixes.push_back(absl::StrCat(
        "make it in float32 (", f.op == "aten::arange" ? "torch.arange(n, dtype=torch.float32)"
                                                       : "dtype=torch.float32",
        "), compute what it feeds in float32, and cast to float16 only values that fit",
        at,
        CountsWholeNumbers(f.op)
            ? ": a rotary table's positions, angles, cos and sin in float32, then .to(dtype); "
              "not bfloat16, which has float32's range but counts whole numbers exactly only "
              "up to 256"
            : ""));
  } else {
    d.fixes.push_back(absl::StrCat(
        "draw in float32 and cast to float16 only values that fit, scaled down or clamped", at,
        ": a heavy-tailed draw (cauchy_, log_normal_) passes 65504 at some sample whatever its "
        "scale"));
    d.fixes.push_back(s.fp16_updates
                          ? "or train in bf16 (float32's range): model.bfloat16() instead of "
                            "model.half()"
                          : "or draw in bfloat16 (float32's range)");
  }
  return d;
}

}  // namespace nanhunt
