#include "viewer/diagnosis_buffers.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace nanhunt {
namespace {

// The running statistics among `tensors` (outputs: "float16[32]
// (running_var, updated in place) max|x|=inf +inf=32; ..."; inputs: "#4
// float16[32] (running_var) max|x|=inf +inf=32; ...") that hold inf or NaN.
std::vector<std::string> NonFiniteStatistics(absl::string_view tensors, absl::string_view label) {
  std::vector<std::string> names;
  for (absl::string_view part : absl::StrSplit(tensors, "; ")) {
    if (!absl::StrContains(part, "inf=") && !absl::StrContains(part, "nan=")) continue;
    for (const char* name : {"running_mean", "running_var"}) {
      if (absl::StrContains(part, absl::StrCat("(", name, label, ")"))) names.push_back(name);
    }
  }
  return names;
}

constexpr char kRepair[] =
    "to repair the model: reset_running_stats() on each batch norm layer, then a few forward "
    "passes in train mode under torch.no_grad() to estimate them again";

}  // namespace

std::optional<Diagnosis> Fp16RunningStatistics(const RunSummary& s, const FindingRow& f) {
  const std::vector<std::string> names = NonFiniteStatistics(f.outputs, ", updated in place");
  if (f.kind != "origin" || names.empty()) return std::nullopt;
  const std::string which = absl::StrJoin(names, " and ");
  Diagnosis d;
  d.kind = "fp16_running_statistics";
  d.op = f.top_op.empty() ? f.op : f.top_op;
  d.title = absl::StrCat("Batch norm's ", which, " overflowed in ", f.dtype, " (step ", f.step,
                         "): evaluation will be wrong");
  d.evidence.push_back(absl::StrCat(
      "step ", f.step, ": ", OpInTopOp(f), " updated its ", which, " in place to inf/NaN",
      f.source.empty() ? "" : ", at " + f.source,
      "; the values it returned were finite, so the loss gave no sign"));
  d.evidence.push_back(absl::StrCat(
      "the running statistics are the module's buffers, ", f.dtype,
      " because the model was converted (model.half(), .to(torch.float16)); the running "
      "variance averages squared activations, past 65504 once they pass about 256"));
  d.evidence.push_back(
      "in evaluation (model.eval()) the layer divides by sqrt(running_var): an infinite "
      "variance makes its output for that feature the bias (the feature drops out), a NaN "
      "one makes it NaN");
  d.fixes.push_back(
      "keep the batch norm layers in fp32 after converting the model: for m in "
      "model.modules(): if isinstance(m, torch.nn.modules.batchnorm._BatchNorm): m.float() "
      "(fp16 activations go in and come out; the statistics are kept in fp32)");
  d.fixes.push_back(
      "or train under torch.autocast(dtype=torch.float16) with fp32 weights instead of "
      "model.half(): the buffers then stay fp32");
  d.fixes.push_back(kRepair);
  (void)s;
  return d;
}

std::optional<Diagnosis> RunningStatisticsLoaded(const RunSummary& s, const FindingRow& f) {
  const std::vector<std::string> names = NonFiniteStatistics(f.inputs, "");
  if (f.kind != "input" || names.empty()) return std::nullopt;
  const std::string which = absl::StrJoin(names, " and ");
  Diagnosis d;
  d.kind = "nonfinite_input";
  d.op = f.top_op.empty() ? f.op : f.top_op;
  d.title = absl::StrCat("Non-finite values came in with the model: batch norm's ", which,
                         " held inf/NaN");
  d.evidence.push_back(absl::StrCat(
      "step ", f.step, ": ", OpInTopOp(f), " (", f.phase, ") read its ", which,
      ", which no op of this run had made non-finite",
      f.source.empty() ? "" : ", at " + f.source));
  d.evidence.push_back(absl::StrCat("its inputs: ", f.inputs));
  d.evidence.push_back(
      "the model came with them: a checkpoint saved after they overflowed (an fp16 model's "
      "running variance passes 65504 once activations pass about 256); in evaluation an "
      "infinite variance makes the layer's output for that feature its bias, a NaN one "
      "makes it NaN");
  d.fixes.push_back(kRepair);
  d.fixes.push_back(
      "and train with the batch norm layers in fp32 (m.float() after model.half()), or under "
      "torch.autocast with fp32 weights, so that it does not happen again");
  (void)s;
  return d;
}

}  // namespace nanhunt
