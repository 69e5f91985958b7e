#include "viewer/diagnosis_buffers.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace nanhunt {
namespace {

// The running statistics among `outputs` ("float16[32] (running_var,
// updated in place) max|x|=inf +inf=32; ...") that hold inf or NaN.
std::vector<std::string> NonFiniteStatistics(absl::string_view outputs) {
  std::vector<std::string> names;
  for (absl::string_view part : absl::StrSplit(outputs, "; ")) {
    if (!absl::StrContains(part, "inf=") && !absl::StrContains(part, "nan=")) continue;
    for (const char* name : {"running_mean", "running_var"}) {
      if (absl::StrContains(part, absl::StrCat("(", name, ", updated in place)"))) {
        names.push_back(name);
      }
    }
  }
  return names;
}

}  // namespace

std::optional<Diagnosis> Fp16RunningStatistics(const RunSummary& s, const FindingRow& f) {
  const std::vector<std::string> names = NonFiniteStatistics(f.outputs);
  if (f.kind != "origin" || names.empty()) return std::nullopt;
  const std::string which = absl::StrJoin(names, " and ");
  Diagnosis d;
  d.kind = "fp16_running_statistics";
  d.op = f.top_op.empty() ? f.op : f.top_op;
  d.title = absl::StrCat("Batch norm's ", which, " overflowed in ", f.dtype, " (step ", f.step,
                         "): evaluation will be wrong");
  d.evidence.push_back(absl::StrCat(
      "step ", f.step, ": ", f.op, f.top_op.empty() ? "" : absl::StrCat(" in ", f.top_op),
      " updated its ", which, " in place to inf/NaN", f.source.empty() ? "" : ", at " + f.source,
      "; the values it returned were finite, so the loss gave no sign"));
  d.evidence.push_back(absl::StrCat(
      "the running statistics are the module's buffers, ", f.dtype,
      " because the model was converted (model.half(), .to(torch.float16)); the running "
      "variance averages squared activations, past 65504 once they pass about 256"));
  d.evidence.push_back(
      "in evaluation (model.eval()) the layer divides by sqrt(running_var): an infinite "
      "variance makes every output of the layer its bias, a NaN one makes them NaN");
  d.fixes.push_back(
      "keep the batch norm layers in fp32 after converting the model: for m in "
      "model.modules(): if isinstance(m, torch.nn.modules.batchnorm._BatchNorm): m.float() "
      "(fp16 activations go in and come out; the statistics are kept in fp32)");
  d.fixes.push_back(
      "or train under torch.autocast(dtype=torch.float16) with fp32 weights instead of "
      "model.half(): the buffers then stay fp32");
  d.fixes.push_back(
      "to repair a model already trained: reset_running_stats() on each batch norm layer, "
      "then a few forward passes in train mode under torch.no_grad() to estimate them again");
  (void)s;
  return d;
}

}  // namespace nanhunt
