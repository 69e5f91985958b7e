#include "viewer/diagnosis_loaded_state.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace nanhunt {
namespace {

struct NamedInput {
  std::string name;  // "parameter 2.weight"
  bool optimizer_state = false;
  // Copied into it by the op (load_state_dict's copy_ of a checkpoint
  // saved in another dtype): "(copied into parameter 2.weight)".
  bool copied = false;
  bool nan = false, inf = false;
};

// The named tensors among `inputs` ("#1 float32[1, 16] (parameter
// 2.weight) max|x|=0.24 nan=1; ...") that held inf or NaN.
std::vector<NamedInput> NonFiniteNamedInputs(absl::string_view inputs) {
  std::vector<NamedInput> named;
  for (absl::string_view part : absl::StrSplit(inputs, "; ")) {
    NamedInput in;
    in.nan = absl::StrContains(part, " nan=");
    in.inf = absl::StrContains(part, "inf=");
    if (!in.nan && !in.inf) continue;
    for (absl::string_view label : absl::StrSplit(part, " (")) {
      const size_t end = label.find(')');
      if (end == absl::string_view::npos) continue;
      absl::string_view name = label.substr(0, end);
      in.copied = absl::ConsumePrefix(&name, "copied into ");
      const bool model = absl::StartsWith(name, "parameter") || absl::StartsWith(name, "buffer ");
      in.optimizer_state = absl::StrContains(name, " state ");
      if (model || in.optimizer_state) {
        in.name = std::string(name);
        named.push_back(in);
        break;
      }
    }
  }
  return named;
}

std::string WhatItHeld(const std::vector<NamedInput>& named) {
  bool nan = false, inf = false;
  for (const NamedInput& in : named) {
    nan |= in.nan;
    inf |= in.inf;
  }
  return nan && inf ? "inf and NaN" : nan ? "NaN" : "inf";
}

std::string Names(const std::vector<NamedInput>& named) {
  std::vector<std::string> names;
  for (size_t i = 0; i < named.size() && i < 3; ++i) {
    // Without Python (a LibTorch program) a parameter has no name.
    names.push_back(named[i].name == "parameter" ? "a parameter (a leaf that requires grad)"
                                                 : named[i].name);
  }
  std::string out = absl::StrJoin(names, ", ");
  if (named.size() > 3) absl::StrAppend(&out, " and ", named.size() - 3, " more");
  return out;
}

constexpr char kEarlierCheckpoint[] =
    "resume from an earlier checkpoint, one saved before that run's first non-finite step "
    "(nanhunt view on its trace names the step)";
constexpr char kFreshOptimizer[] =
    "keep the model and start the optimizer afresh (leave out optimizer.load_state_dict): "
    "Adam's moments rebuild within a few hundred steps, best under a learning-rate warmup";
constexpr char kGuardSaving[] =
    "guard saving: save only when every parameter is finite (all(p.isfinite().all() for p in "
    "model.parameters())), so that a diverged run never replaces a good checkpoint";

}  // namespace

std::optional<Diagnosis> LoadedStateNonFinite(const RunSummary& s, const FindingRow& f) {
  if (f.kind != "input" || !s.op_sampling.empty()) return std::nullopt;
  const std::vector<NamedInput> named = NonFiniteNamedInputs(f.inputs);
  if (named.empty() && f.phase != "optimizer") return std::nullopt;
  bool optimizer_state = false;
  for (const NamedInput& in : named) optimizer_state |= in.optimizer_state;
  const std::string where = absl::StrCat(OpInTopOp(f), " (", f.phase, ")");
  const std::string at = f.source.empty() ? "" : ", at " + f.source;
  Diagnosis d;
  d.kind = "nonfinite_input";
  d.op = f.top_op.empty() ? f.op : f.top_op;
  if (named.empty()) {
    // An update read them: its state, its parameters, or gradients written
    // outside torch's ops. Never a batch.
    d.title = "Non-finite values came into the optimizer step, not from an op";
    d.evidence.push_back(absl::StrCat("step ", f.step, ": ", where,
                                      " was given inf/NaN that no op of this run had made", at));
    d.evidence.push_back(absl::StrCat("its inputs: ", f.inputs));
    d.evidence.push_back(
        "an update reads the optimizer's state (momentum, Adam's exp_avg and exp_avg_sq), the "
        "parameters and their gradients, no batch: they came with a checkpoint "
        "(optimizer.load_state_dict), or were written outside torch's ops");
    d.fixes.push_back(
        "find them right after loading: [(k, tuple(v.shape)) for st in optimizer.state.values() "
        "for k, v in st.items() if torch.is_tensor(v) and not v.isfinite().all()]");
    d.fixes.push_back(kEarlierCheckpoint);
    d.fixes.push_back(absl::StrCat("or ", kFreshOptimizer));
    return d;
  }
  const std::string names = Names(named);
  // Names go in the evidence: a model's paths are too long for a title.
  bool buffers = false, parameters = false, copied = true;
  for (const NamedInput& in : named) {
    buffers |= absl::StartsWith(in.name, "buffer ");
    parameters |= absl::StartsWith(in.name, "parameter");
    copied &= in.copied;
  }
  const std::string holder = optimizer_state           ? "The optimizer's state"
                             : buffers && parameters ? "The model's parameters and buffers"
                             : buffers               ? "The model's buffers"
                                                     : "The model's parameters";
  if (copied && !optimizer_state) {
    d.title = absl::StrCat(holder, " were loaded with ", WhatItHeld(named),
                           "; the data is not to blame");
    d.evidence.push_back(absl::StrCat("step ", f.step, ": ", where, " copied inf/NaN into ",
                                      names, " from a tensor no op of this run had made", at));
  } else {
    d.title = absl::StrCat(holder, " brought ", WhatItHeld(named), ", not the data");
    d.evidence.push_back(absl::StrCat("step ", f.step, ": ", where, " read ", names,
                                      ", whose inf/NaN no op of this run had made", at));
  }
  d.evidence.push_back(absl::StrCat("its inputs: ", f.inputs));
  d.evidence.push_back(absl::StrCat(
      "the ", optimizer_state ? "optimizer" : "model",
      " came with them: a checkpoint saved after the run that wrote it had diverged (",
      optimizer_state ? "optimizer.load_state_dict" : "model.load_state_dict",
      "), or values set outside torch's ops (numpy, a tensor's .data); the batch is not "
      "to blame"));
  d.fixes.push_back(
      optimizer_state ? kFreshOptimizer
      : copied        ? "find them in the checkpoint: [k for k, v in torch.load(path).items() if "
                        "torch.is_tensor(v) and v.is_floating_point() and not "
                        "v.isfinite().all()] (its state_dict, or the entry that holds it)"
                      : "find them all right after loading: [n for n, t in "
                        "(*model.named_parameters(), *model.named_buffers()) if "
                        "t.is_floating_point() and not t.isfinite().all()]");
  d.fixes.push_back(kEarlierCheckpoint);
  d.fixes.push_back(kGuardSaving);
  return d;
}

}  // namespace nanhunt
