#include "viewer/diagnosis_growth.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/divergence_watch.h"

namespace nanhunt {
namespace {

// The bars for diverging are the monitor's (core/divergence_watch.h);
// within this factor of their smallest, the updates stayed put.
constexpr double kStableGrowth = 10;
constexpr size_t kShownSteps = 5;

// The steps worth showing of a growth: the first, each that passed ten
// times the last one shown, and the last; at most kShownSteps, keeping the
// latest.
std::vector<const PhaseStep*> Milestones(const std::vector<const PhaseStep*>& updates) {
  std::vector<const PhaseStep*> shown = {updates.front()};
  for (const PhaseStep* u : updates) {
    if (u->max_abs >= 10 * shown.back()->max_abs) shown.push_back(u);
  }
  if (shown.back() != updates.back()) shown.push_back(updates.back());
  if (shown.size() > kShownSteps) {
    shown.erase(shown.begin() + 1, shown.end() - (kShownSteps - 1));
  }
  return shown;
}

// Evidence for the monitor's live warnings before step `before`: the
// first and the latest.
void AddLiveWarnings(const RunSummary& s, int64_t before, Diagnosis& d) {
  std::vector<const StepEvent*> warned;
  for (const StepEvent& e : s.diverging) {
    if (e.step < before) warned.push_back(&e);
  }
  if (warned.empty()) return;
  if (warned.size() > 2) warned.erase(warned.begin() + 1, warned.end() - 1);
  std::vector<std::string> lines;
  for (const StepEvent* e : warned) {
    lines.push_back(absl::StrCat("at step ", e->step, " (", e->detail, ")"));
  }
  const int64_t ahead = before - warned.front()->step;
  d.evidence.push_back(absl::StrCat("nanhunt warned live that the training was diverging ",
                                    absl::StrJoin(lines, ", and "), ", ", ahead,
                                    ahead == 1 ? " step" : " steps",
                                    " before the first inf/NaN"));
}

}  // namespace

std::optional<UpdateGrowth> UpdatesBefore(const RunSummary& s, const FindingRow& f) {
  std::vector<const PhaseStep*> updates;
  for (const PhaseStep& p : s.first_origin_phase_steps) {
    if (p.phase == "optimizer" && p.step < f.step && p.nonfinite == 0 && p.max_abs > 0) {
      updates.push_back(&p);
    }
  }
  if (updates.size() < 3) return std::nullopt;
  double smallest = updates.front()->max_abs;
  for (const PhaseStep* u : updates) smallest = std::min(smallest, u->max_abs);
  const PhaseStep& last = *updates.back();
  // The largest value up to kRecentSteps updates before the last.
  double before_recent = 0;
  for (const PhaseStep* u : updates) {
    if (u->step <= last.step - kRecentSteps) before_recent = std::max(before_recent, u->max_abs);
  }
  UpdateGrowth g;
  if (PassesDivergenceBars(last.max_abs, smallest, before_recent)) {
    g.diverged = true;
    std::vector<std::string> points;
    for (const PhaseStep* u : Milestones(updates)) {
      points.push_back(absl::StrCat(FormatAbs(u->max_abs), " at step ", u->step));
    }
    g.evidence = absl::StrCat(
        "the updates grew step after step before it: the optimizer's outputs (the weights "
        "and its state) reached max|x| ", absl::StrJoin(points, ", "),
        ". The training diverged, each update larger than the last; no single batch jumped");
    g.fix =
        "lower the learning rate (or warm it up over the first steps) and clip gradients "
        "before the update, torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0) before "
        "opt.step(): a diverging run outgrows any format, a wider one only later";
    return g;
  }
  double largest = 0;
  for (const PhaseStep* u : updates) largest = std::max(largest, u->max_abs);
  if (f.phase != "forward" || largest > kStableGrowth * smallest) return std::nullopt;
  g.evidence = absl::StrCat(
      "the updates did not grow before it: the optimizer's outputs stayed between max|x| ",
      FormatAbs(smallest), " and ", FormatAbs(largest), " over steps ", updates.front()->step,
      "-", last.step, ", so the values grew within step ", f.step,
      ", from what it was given (its batch) or computed");
  g.fix = absl::StrCat(
      "look at the batch of step ", f.step,
      " (scaled or unnormalised by mistake, a corrupt sample): the weights had not grown; "
      "WOULD OVERFLOW and the ops table give each op's max|x| by step");
  return g;
}

std::optional<Diagnosis> Diverged(const RunSummary& s, const FindingRow& f) {
  if (f.kind != "origin") return std::nullopt;
  const std::optional<UpdateGrowth> growth = UpdatesBefore(s, f);
  if (!growth || !growth->diverged) return std::nullopt;
  Diagnosis d;
  d.kind = "diverged";
  d.op = f.op;
  d.title = absl::StrCat("Training diverged: updates grew until ", f.op,
                         " made inf/NaN at step ", f.step);
  d.evidence.push_back(absl::StrCat(
      "step ", f.step, ": ", OpInTopOp(f), BackwardOf(f), " turned finite inputs into ",
      f.dtype, " inf/NaN", f.source.empty() ? "" : ", at " + f.source));
  d.evidence.push_back(growth->evidence);
  if (!f.inputs.empty()) d.evidence.push_back(absl::StrCat("its inputs: ", f.inputs));
  AddLiveWarnings(s, f.step, d);
  d.fixes.push_back(growth->fix);
  d.fixes.push_back(
      "log the norm clip_grad_norm_ returns (the gradients' norm before clipping) each "
      "step: it climbs for several steps before a NaN, which tells a learning rate too high "
      "from a bad batch");
  return d;
}

std::optional<Diagnosis> Diverging(const RunSummary& s) {
  if (s.diverging.empty()) return std::nullopt;
  const StepEvent& first = s.diverging.front();
  const StepEvent& last = s.diverging.back();
  Diagnosis d;
  d.kind = "diverging";
  // Reached without a first origin, or with one whose inf/NaN were all
  // in gradients a loss scaler skipped.
  d.title = absl::StrCat("Diverging: the updates grow tenfold within three steps (from step ",
                         first.step, ")",
                         s.first_origin ? "; every inf/NaN so far was in skipped gradients"
                                        : "; no inf/NaN yet");
  d.evidence.push_back(absl::StrCat("step ", first.step, ": ", first.detail));
  if (&last != &first) d.evidence.push_back(absl::StrCat("step ", last.step, ": ", last.detail));
  d.evidence.push_back(
      "each update larger than the last by orders of magnitude: a learning rate too high for "
      "these gradients; run on, some value passes the format's range and the loss is NaN");
  d.fixes.push_back(
      "lower the learning rate (or warm it up over the first steps) and clip gradients "
      "before the update, torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0) before "
      "opt.step()");
  return d;
}

}  // namespace nanhunt
