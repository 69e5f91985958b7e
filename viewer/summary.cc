#include "viewer/summary.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/check_limits.h"
#include "core/config.h"
#include "viewer/diagnosis.h"
#include "viewer/diagnosis_made_values.h"
#include "viewer/json_writer.h"
#include "viewer/scaler_skips.h"

namespace nanhunt {
namespace {

// Earlier step first, then earlier in the step, then earlier in time.
bool Before(const FindingRow& a, const FindingRow& b) {
  if (a.step != b.step) return a.step < b.step;
  return a.time < b.time;
}

// For a first origin without a line: the lines that later findings of the
// same op (in the same phase, of the same forward op) had. The monitor
// captures a line from an op's first finding on: a backward op's forward
// line, and on a GPU any op's (its result comes after the op returned,
// when no line can be read). A backward op's come from origins and
// warnings; a forward op's from its propagations too, as the values its
// first NaN spread come back to it at the next steps. Several lines: the
// op is called from several places.
void FillLaterLines(const std::vector<Trace>& traces, RunSummary& s) {
  if (!s.first_origin) return;
  const FindingRow& first = *s.first_origin;
  if (!first.source.empty()) return;
  const bool backward = first.phase == "backward";
  if (backward && first.forward_op.empty()) return;
  for (const Trace& t : traces) {
    if (t.path != s.first_origin_trace) continue;
    for (const FindingRow& f : t.findings) {
      if ((backward && f.kind == "propagated") || f.source.empty() || f.op != first.op ||
          f.phase != first.phase || f.forward_op != first.forward_op ||
          Before(f, first)) {
        continue;
      }
      const std::string line = f.via.empty() ? f.source : absl::StrCat(f.source, ", inside ", f.via);
      auto& lines = s.first_origin_later_lines;
      // The torch code the op was inside, where every later line says one.
      if (lines.empty()) {
        s.first_origin_later_lines_step = f.step;
        s.first_origin_later_via = f.via;
      } else if (f.via != s.first_origin_later_via) {
        s.first_origin_later_via.clear();
      }
      if (lines.size() < 3 && std::find(lines.begin(), lines.end(), line) == lines.end()) {
        lines.push_back(line);
      }
    }
  }
}

// Calls `visit(first, f)` for each finding `f` of the first origin's
// trace, when that origin `first` is an op's in the forward pass.
template <typename Visit>
void ForEachBesideForwardOrigin(const std::vector<Trace>& traces, const RunSummary& s,
                                Visit visit) {
  if (!s.first_origin || s.first_origin->phase != "forward" ||
      s.first_origin->kind != "origin") {
    return;
  }
  for (const Trace& t : traces) {
    if (t.path != s.first_origin_trace) continue;
    for (const FindingRow& f : t.findings) visit(*s.first_origin, f);
  }
}

// RunSummary::first_origin_consumers.
void FillFirstOriginConsumers(const std::vector<Trace>& traces, RunSummary& s) {
  std::vector<FindingRow>& next = s.first_origin_consumers;
  ForEachBesideForwardOrigin(traces, s, [&](const FindingRow& first, const FindingRow& f) {
    if (f.kind == "propagated" && f.phase == "forward" && f.step == first.step &&
        f.thread == first.thread && f.call_index > first.call_index) {
      next.push_back(f);
    }
  });
  std::sort(next.begin(), next.end(), [](const FindingRow& a, const FindingRow& b) {
    return a.call_index < b.call_index;
  });
  if (next.size() > 2) next.resize(2);
}

// RunSummary::first_origin_phase_steps.
void FillFirstOriginPhaseSteps(const std::vector<Trace>& traces, RunSummary& s) {
  if (!s.first_origin) return;
  for (const Trace& t : traces) {
    if (t.path == s.first_origin_trace) s.first_origin_phase_steps = t.phase_steps;
  }
}

// RunSummary::first_origin_gradient.
void FillFirstOriginGradient(const std::vector<Trace>& traces, RunSummary& s) {
  ForEachBesideForwardOrigin(traces, s, [&](const FindingRow& first, const FindingRow& f) {
    if (f.kind == "origin" && f.phase == "backward" && f.step == first.step &&
        (f.forward_op == first.op || (!first.top_op.empty() && f.forward_op == first.top_op)) &&
        !Before(f, first) &&
        (!s.first_origin_gradient || Before(f, *s.first_origin_gradient))) {
      s.first_origin_gradient = f;
    }
  });
}

// max |x| relative to fp16's limit: "82%", or "3.2x" / "1.1e+07x" past it.
std::string OfLimit(double max_abs) {
  if (std::isinf(max_abs)) return "inf";
  const double r = max_abs / kFp16Max;
  if (r < 1) return absl::StrFormat("%.0f%%", 100 * r);
  return absl::StrFormat("%.3gx", r);
}

// "aten::bmm (in aten::matmul)".
std::string OpLabel(const FindingRow& f) {
  std::string s = f.op;
  if (!f.top_op.empty() && f.top_op != f.op) {
    absl::StrAppend(&s, " (in ", f.top_op, ")");
  }
  return s;
}

// The magnitude an origin reached: its fp32 recomputation when there is one
// (the fp16 output itself only says "inf").
double ReachedAbs(const FindingRow& f) {
  return f.fp32_max_abs ? *f.fp32_max_abs : f.max_abs;
}

std::string Fit(absl::string_view s, size_t width) {
  if (s.size() <= width) return std::string(s);
  return absl::StrCat(s.substr(0, width - 1), "~");
}

// `text` broken at spaces into lines of at most `width` columns, lines
// after the first starting with `indent` (which counts in the width).
std::string Wrap(absl::string_view text, size_t width, absl::string_view indent) {
  std::string out, line;
  size_t limit = width;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!line.empty() && line.size() + 1 + word.size() > limit) {
      absl::StrAppend(&out, line, "\n", indent);
      line.clear();
      limit = width - indent.size();
    }
    if (!line.empty()) line += ' ';
    absl::StrAppend(&line, word);
  }
  return out + line;
}

// Four characters: the op's max |x| in each quarter of the run, against
// fp16's limit ("_" low, "#" at it, "!" inf/NaN, " " did not run).
std::string Trend(const OpTotals& o) {
  static constexpr char kLevels[] = "_.-=+*#";
  std::string t;
  for (double q : o.quarters) {
    if (std::isinf(q)) {
      t += '!';
    } else if (q <= 0) {
      t += ' ';
    } else {
      const double share = std::min(1.0, q / kFp16Max);
      t += kLevels[static_cast<int>(share * 6)];
    }
  }
  return t;
}

// One character per step (or per bucket of steps on long runs): "!" when
// any op made non-finite values, "s" when the step was skipped, "." else.
std::string StepStrip(const RunSummary& s, size_t width) {
  if (s.steps <= 0) return "(no steps recorded)";
  const int64_t per = (s.steps + static_cast<int64_t>(width) - 1) /
                      static_cast<int64_t>(width);
  std::string strip(static_cast<size_t>((s.steps + per - 1) / per), '.');
  for (int64_t st : s.nonfinite_steps) {
    if (st >= 0 && st < s.steps) strip[static_cast<size_t>(st / per)] = '!';
  }
  std::vector<int64_t> skipped = s.skipped_steps;
  for (const SkipRow& k : s.nanhunt_skips) skipped.push_back(k.step);
  skipped.insert(skipped.end(), s.program_skipped_steps.begin(), s.program_skipped_steps.end());
  skipped.insert(skipped.end(), s.given_up_steps.begin(), s.given_up_steps.end());
  for (int64_t st : skipped) {
    if (st >= 0 && st < s.steps) strip[static_cast<size_t>(st / per)] = 's';
  }
  return per == 1 ? strip : absl::StrCat(strip, " (", per, " steps each)");
}

// "void at::native::vectorized_elementwise_kernel<4, ...>(...)<<<80,1,1>>>"
// from CUPTI's mangled names, each cut to a readable length.
std::string ReadableKernels(const std::string& kernels) {
  std::vector<std::string> parts;
  for (absl::string_view k : absl::StrSplit(kernels, "; ", absl::SkipEmpty())) {
    const size_t grid = k.find("<<<");
    std::string name(k.substr(0, grid));
    int status = 0;
    char* demangled = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
    if (status == 0 && demangled != nullptr) name = demangled;
    free(demangled);
    if (name.size() > 90) name = name.substr(0, 89) + "~";
    parts.push_back(grid == absl::string_view::npos
                        ? name
                        : absl::StrCat(name, k.substr(grid)));
  }
  return absl::StrJoin(parts, "; ");
}

// What an escalation's window caught: its first origin or input, else its
// first warning.
std::optional<FindingRow> FoundInWindow(const std::vector<FindingRow>& findings,
                                        const EscalationRow& e) {
  const FindingRow* warning = nullptr;
  for (const FindingRow& f : findings) {
    if (f.step < e.step || f.step > e.until_step) continue;
    if (BeganHere(f)) return f;
    if (f.kind == "near_max" && warning == nullptr) warning = &f;
  }
  if (warning != nullptr) return *warning;
  return std::nullopt;
}

std::optional<FindingRow> OriginInWindow(const std::vector<FindingRow>& findings,
                                         const EscalationRow& e) {
  for (const FindingRow& f : findings) {
    if (f.step >= e.step && f.step <= e.until_step && f.kind == "origin") return f;
  }
  return std::nullopt;
}

}  // namespace

std::string StepRanges(const std::vector<int64_t>& steps) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < steps.size();) {
    size_t j = i;
    while (j + 1 < steps.size() && steps[j + 1] == steps[j] + 1) ++j;
    parts.push_back(i == j ? absl::StrCat(steps[i])
                           : absl::StrCat(steps[i], "-", steps[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ", ");
}

bool IsFp16Range(absl::string_view dtype) {
  return dtype == "float16" || dtype == "float8_e5m2";
}

std::string FormatAbs(double v) {
  if (std::isinf(v)) return "inf";
  if (v >= 1e6 || (v > 0 && v < 1e-3)) return absl::StrFormat("%.3g", v);
  return absl::StrFormat("%.6g", v);
}

bool FromMask(const FindingRow& f) {
  return absl::StrContains(f.inputs, "put there by a mask");
}

bool FromNanMarker(const FindingRow& f) {
  return absl::StrContains(f.inputs, "NaN put there on purpose");
}

std::string OpWithinTop(const FindingRow& f) {
  return f.top_op.empty() || f.top_op == f.op ? f.op : absl::StrCat(f.op, " in ", f.top_op);
}

std::string BackwardOf(const FindingRow& f) {
  if (f.forward_op.empty()) return "";
  return absl::StrCat(" (backward of ", f.forward_op,
                      SourceIsForwardLine(f) ? absl::StrCat(", called at ", f.source) : "", ")");
}

std::string TimesFp16Max(double v) {
  const double r = v / kFp16Max;
  return r < 100 ? absl::StrFormat("%.2fx", r) : absl::StrFormat("%.3gx", r);
}

bool BeganHere(const FindingRow& f) {
  return f.kind == "origin" || f.kind == "input" || f.kind == "compiled";
}

RunSummary Summarise(const std::vector<Trace>& traces) {
  RunSummary s;
  std::set<std::string> commands, dtypes, settings;
  s.forward_passes = !traces.empty();  // until a trace that trained
  std::map<std::tuple<std::string, std::string, bool>, OpTotals> ops;  // op, phase, mask
  std::map<std::tuple<std::string, std::string, std::string>, UncheckedRow> unchecked;
  std::map<std::string, PhaseTotals> phases;
  std::set<int64_t> bad_steps;
  std::set<int64_t> kept_steps;  // of bad_steps
  std::set<int64_t> program_skips, given_up;
  std::set<int64_t> unfinished;
  for (const Trace& t : traces) {
    s.traces.push_back(t.path);
    for (const auto& p : t.problems) s.problems.push_back(t.path + ": " + p);
    if (auto it = t.meta.find("thinned"); it != t.meta.end()) {
      s.problems.push_back(t.path + ": size cap (NANHUNT_MAX_TRACE_MB) reached, " + it->second);
    }
    if (auto it = t.meta.find("command"); it != t.meta.end()) {
      commands.insert(it->second);
    }
    for (const auto& d : t.dtypes) dtypes.insert(d);
    if (auto it = t.meta.find("config"); it != t.meta.end()) {
      // What the user switched: lines that differ from the defaults.
      const std::string defaults = DescribeConfig(Config{});
      for (absl::string_view line : absl::StrSplit(it->second, '\n', absl::SkipEmpty())) {
        const std::string l(line);
        // Where the trace went, and what `nanhunt run` sets for itself.
        if (absl::StartsWith(l, "NANHUNT_OUT=") ||
            absl::StartsWith(l, "NANHUNT_EXIT_SUMMARY=")) {
          continue;
        }
        if (defaults.find(l + "\n") == std::string::npos &&
            !absl::EndsWith(defaults, "\n" + l)) {
          settings.insert(l);
        }
      }
    }
    if (auto it = t.meta.find("torch_version"); it != t.meta.end()) {
      s.torch_version = it->second;
    }
    for (const FindingRow& f : t.findings) {
      if (f.kind == "origin") ++s.origins;
      if (f.kind == "input" || f.kind == "compiled") ++s.inputs;
      if (f.kind == "propagated") ++s.propagated;
      if (f.kind == "received") ++s.received;
      if (BeganHere(f) && (!s.first_origin || Before(f, *s.first_origin))) {
        s.first_origin = f;
        s.first_origin_trace = t.path;
        auto rank = t.meta.find("rank");
        s.first_origin_rank = rank == t.meta.end() ? "" : rank->second;
      }
      if (f.kind == "received" && (!s.first_received || Before(f, *s.first_received))) {
        s.first_received = f;
      }
      if (f.kind == "propagated" && (!s.first_propagated || Before(f, *s.first_propagated))) {
        s.first_propagated = f;
      }
      if (BeganHere(f) && (!s.first_given_up || Before(f, *s.first_given_up)) &&
          std::find(t.given_up_steps.begin(), t.given_up_steps.end(), f.step) !=
              t.given_up_steps.end()) {
        s.first_given_up = f;
      }
      if (f.kind == "near_max") s.warnings.push_back(f);
    }
    if (auto rank = t.meta.find("rank"); rank != t.meta.end()) {
      const FindingRow* first = nullptr;
      for (const FindingRow& f : t.findings) {
        if ((BeganHere(f) || f.kind == "received") && (!first || Before(f, *first))) {
          first = &f;
        }
      }
      if (first != nullptr) s.ranks.push_back({rank->second, *first});
    }
    for (const OpTotals& o : t.ops) {
      s.fp16_updates |= o.phase == "optimizer" && o.fp16_elements > 0;
      OpTotals& m = ops[{o.op, o.phase, o.mask}];
      m.op = o.op;
      m.phase = o.phase;
      m.mask = o.mask;
      m.calls += o.calls;
      m.elements += o.elements;
      m.nan += o.nan;
      m.posinf += o.posinf;
      m.neginf += o.neginf;
      m.near_max += o.near_max;
      m.underflow += o.underflow;
      m.fp16_overflow += o.fp16_overflow;
      m.fp16_elements += o.fp16_elements;
      m.fp16_underflow += o.fp16_underflow;
      m.max_abs = std::max(m.max_abs, o.max_abs);
      for (int q = 0; q < 4; ++q) m.quarters[q] = std::max(m.quarters[q], o.quarters[q]);
      PhaseTotals& p = phases[o.phase];
      p.phase = o.phase;
      p.calls += o.calls;
      // A mask's ±inf are not the phase's non-finite values.
      if (!o.mask) p.nonfinite_values += o.nonfinite();
      p.near_max += o.near_max;
      p.underflow += o.underflow;
      p.elements += o.elements;
      p.fp16_elements += o.fp16_elements;
      p.fp16_underflow += o.fp16_underflow;
    }
    if (s.loss_scale.empty() && !t.loss_scale.empty()) {
      // Ranks of one run update their scalers alike: one history tells it.
      s.loss_scale = t.loss_scale;
      for (const LossScaleRow& l : t.loss_scale) {
        if (l.skipped) s.skipped_steps.push_back(l.step);
      }
    }
    if (auto it = t.meta.find("fp32_ops"); it != t.meta.end()) {
      for (absl::string_view kv : absl::StrSplit(it->second, ',', absl::SkipEmpty())) {
        const std::pair<std::string, std::string> parts = absl::StrSplit(kv, '=');
        int64_t calls = 0;
        if (!absl::SimpleAtoi(parts.second, &calls)) continue;
        auto known = std::find_if(s.fp32_ops.begin(), s.fp32_ops.end(),
                                  [&](const auto& e) { return e.first == parts.first; });
        if (known == s.fp32_ops.end()) {
          s.fp32_ops.emplace_back(parts.first, calls);
        } else {
          known->second += calls;
        }
      }
    }
    if (auto it = t.meta.find("fp32_learned"); it != t.meta.end()) {
      for (absl::string_view op : absl::StrSplit(it->second, ',', absl::SkipEmpty())) {
        if (std::find(s.fp32_learned.begin(), s.fp32_learned.end(), op) ==
            s.fp32_learned.end()) {
          s.fp32_learned.emplace_back(op);
        }
      }
      if (auto p = t.meta.find("fp32_policy"); p != t.meta.end()) {
        s.fp32_policy = p->second;
      }
    }
    if (auto it = t.meta.find("mask_ops"); it != t.meta.end()) {
      for (absl::string_view op : absl::StrSplit(it->second, ',', absl::SkipEmpty())) {
        if (std::find(s.mask_ops.begin(), s.mask_ops.end(), op) == s.mask_ops.end()) {
          s.mask_ops.emplace_back(op);
        }
      }
    }
    if (auto it = t.meta.find("autocast_switched_to_bf16"); it != t.meta.end()) {
      int64_t n = 0;
      if (absl::SimpleAtoi(it->second, &n)) s.bf16_switches += n;
    }
    int64_t observed = 0;
    double per_op = 0;
    if (auto o = t.meta.find("ops_observed"), u = t.meta.find("host_us_per_op");
        o != t.meta.end() && u != t.meta.end() && absl::SimpleAtoi(o->second, &observed) &&
        absl::SimpleAtod(u->second, &per_op) && observed > 0) {
      // A mean over all traces, each weighted by its ops.
      s.host_us_per_op = (s.host_us_per_op * static_cast<double>(s.ops_observed) +
                          per_op * static_cast<double>(observed)) /
                         static_cast<double>(s.ops_observed + observed);
      s.ops_observed += observed;
    }
    for (auto [key, total] : {std::pair{"device_checks", &s.gpu_checks},
                              std::pair{"device_check_batches", &s.gpu_check_batches},
                              std::pair{"check_ring_waits", &s.ring_waits}}) {
      int64_t n = 0;
      if (auto it = t.meta.find(key); it != t.meta.end() && absl::SimpleAtoi(it->second, &n)) {
        *total += n;
      }
    }
    if (s.nanhunt_skips.empty()) s.nanhunt_skips = t.skips;  // ranks agree
    if (auto it = t.meta.find("op_sampling"); it != t.meta.end()) {
      if (s.op_sampling.empty() || it->second == "torch") s.op_sampling = it->second;
      int64_t n = 0;
      if (auto c = t.meta.find("op_calls_checked");
          c != t.meta.end() && absl::SimpleAtoi(c->second, &n)) {
        s.op_calls_checked += n;
      }
      if (auto c = t.meta.find("iterations_unjudged_in_sample_mode");
          c != t.meta.end() && absl::SimpleAtoi(c->second, &n)) {
        s.iterations_unjudged_in_sample_mode += n;
      }
    }
    if (s.escalations.empty()) {
      for (const EscalationRow& e : t.escalations) {
        s.escalations.push_back(
            {e, FoundInWindow(t.findings, e), OriginInWindow(t.findings, e)});
      }
    }
    for (const UncheckedRow& u : t.unchecked) {
      UncheckedRow& total = unchecked[{u.op, u.phase, u.reason}];
      if (total.outputs == 0) {
        total = u;
        continue;
      }
      total.outputs += u.outputs;
      total.first_step = std::min(total.first_step, u.first_step);
      total.last_step = std::max(total.last_step, u.last_step);
    }
    program_skips.insert(t.program_skipped_steps.begin(), t.program_skipped_steps.end());
    given_up.insert(t.given_up_steps.begin(), t.given_up_steps.end());
    unfinished.insert(t.unfinished_steps.begin(), t.unfinished_steps.end());
    if (s.diverging.empty()) s.diverging = t.diverging;  // of the first trace with any
    // Each rank tells the same.
    for (auto [from, into] : {std::pair{&t.eps_rounded, &s.eps_rounded},
                              std::pair{&t.mask_literals, &s.mask_literals}}) {
      for (const StepEvent& e : *from) {
        const bool known = std::any_of(into->begin(), into->end(),
                                       [&](const StepEvent& k) { return k.detail == e.detail; });
        if (!known) into->push_back(e);
      }
    }
    const auto passes = t.meta.find("forward_passes_as_steps");
    s.forward_passes &= passes != t.meta.end() && passes->second == "1";
    for (const StepRow& st : t.steps) {
      s.steps = std::max(s.steps, st.step + 1);
      if (st.nonfinite_ops == 0) continue;
      bad_steps.insert(st.step);
      const auto gone = [&](const std::vector<int64_t>& steps) {
        return std::find(steps.begin(), steps.end(), st.step) != steps.end();
      };
      if (!gone(t.dropped_steps) && !gone(t.program_skipped_steps) &&
          !gone(t.given_up_steps)) {
        kept_steps.insert(st.step);
      }
    }
  }
  std::sort(s.mask_ops.begin(), s.mask_ops.end());
  for (auto& [key, u] : unchecked) s.unchecked.push_back(std::move(u));
  std::stable_sort(s.unchecked.begin(), s.unchecked.end(),
                   [](const UncheckedRow& a, const UncheckedRow& b) {
                     return a.outputs > b.outputs;
                   });
  for (auto& [key, o] : ops) s.ops.push_back(o);
  // Masks are ±inf on purpose: ranked after every op that computes.
  std::sort(s.ops.begin(), s.ops.end(), [](const OpTotals& a, const OpTotals& b) {
    if (a.mask != b.mask) return !a.mask;
    if (a.max_abs != b.max_abs) return a.max_abs > b.max_abs;
    return a.op < b.op;
  });
  for (const char* name : {"forward", "backward", "optimizer"}) {
    if (auto it = phases.find(name); it != phases.end()) {
      s.phases.push_back(it->second);
    }
  }
  std::sort(s.ranks.begin(), s.ranks.end(), [](const auto& a, const auto& b) {
    return a.rank < b.rank;
  });
  s.commands.assign(commands.begin(), commands.end());
  s.dtypes.assign(dtypes.begin(), dtypes.end());
  s.settings.assign(settings.begin(), settings.end());
  s.nonfinite_steps.assign(bad_steps.begin(), bad_steps.end());
  s.nonfinite_steps_kept.assign(kept_steps.begin(), kept_steps.end());
  s.program_skipped_steps.assign(program_skips.begin(), program_skips.end());
  s.given_up_steps.assign(given_up.begin(), given_up.end());
  s.unfinished_steps.assign(unfinished.begin(), unfinished.end());
  std::sort(s.warnings.begin(), s.warnings.end(), Before);
  FillLaterLines(traces, s);
  FillFirstOriginGradient(traces, s);
  FillFirstOriginPhaseSteps(traces, s);
  FillFirstOriginConsumers(traces, s);
  return s;
}

const char* StepNoun(const RunSummary& s) {
  if (s.forward_passes) return s.steps == 1 ? " forward pass" : " forward passes";
  return s.steps == 1 ? " step" : " steps";
}

std::string RenderText(const RunSummary& s, int width, bool color) {
  const std::string bold = color ? "\x1b[1m" : "", red = color ? "\x1b[31m" : "",
                    yellow = color ? "\x1b[33m" : "", reset = color ? "\x1b[0m" : "";
  const size_t w = static_cast<size_t>(std::max(60, width));
  std::string out;
  absl::StrAppend(&out, bold, "nanhunt", reset, " — ", s.traces.size(),
                  s.traces.size() == 1 ? " trace" : " traces", ", ", s.steps, StepNoun(s),
                  s.forward_passes ? ", no training" : "",
                  s.torch_version.empty() ? "" : ", torch " + s.torch_version,
                  "\n");
  for (const auto& c : s.commands) {
    absl::StrAppend(&out, "  command: ", Fit(c, w - 11), "\n");
  }
  if (!s.dtypes.empty()) {
    absl::StrAppend(&out, "  dtypes:  ", Fit(absl::StrJoin(s.dtypes, ", "), w - 11), "\n");
  }
  absl::StrAppend(&out, "  config:  ",
                  s.settings.empty() ? "defaults (monitoring only, no intervention)"
                                     : Wrap(absl::StrJoin(s.settings, "  "), w - 11,
                                            "           "),
                  "\n");
  if (s.ops_observed > 0) {
    // What monitoring cost the training's host threads, for a production
    // run's budget (GPU checks run on the device besides).
    absl::StrAppend(&out, "  cost:    ",
                    Fit(absl::StrFormat("%.1f us of host time an op in nanhunt's callbacks, "
                                        "%d ops (%.2f s)",
                                        s.host_us_per_op, s.ops_observed,
                                        s.host_us_per_op * s.ops_observed / 1e6),
                        w - 11),
                    "\n");
  }
  if (s.gpu_checks > 0) {
    // The device side: checks enqueued, and how often the ring was full
    // (the op's thread then waited for the oldest result: never dropped).
    absl::StrAppend(
        &out, "  gpu:     ",
        Fit(absl::StrCat(s.gpu_checks, " outputs checked on the device",
                         s.gpu_check_batches > 0
                             ? absl::StrFormat(" in %d held-back batches (%.1f a batch)",
                                               s.gpu_check_batches,
                                               static_cast<double>(s.gpu_checks) /
                                                   static_cast<double>(s.gpu_check_batches))
                             : std::string(),
                         ", result ring full ", s.ring_waits,
                         s.ring_waits == 1 ? " time" : " times"),
            w - 11),
        "\n");
  }

  const Diagnosis diagnosis = Diagnose(s);
  const std::string& tone = diagnosis.kind == "healthy" ? yellow : red;
  absl::StrAppend(&out, "\n", bold, "DIAGNOSIS", reset, "  ",
                  diagnosis.kind == "healthy" && s.warnings.empty() ? "" : tone,
                  // Wrapped, not cut: its end says which step.
                  Wrap(diagnosis.title, w - 11, "           "), reset, "\n");
  for (const auto& e : diagnosis.evidence) {
    absl::StrAppend(&out, "  - ", Wrap(e, w - 4, "    "), "\n");
  }
  if (!diagnosis.fixes.empty()) absl::StrAppend(&out, "  what to try:\n");
  for (size_t i = 0; i < diagnosis.fixes.size(); ++i) {
    absl::StrAppend(&out, "  ", i + 1, ". ", Wrap(diagnosis.fixes[i], w - 5, "     "), "\n");
  }

  absl::StrAppend(&out, "\n", bold, "FIRST NON-FINITE VALUES", reset, "\n");
  if (!s.first_origin) {
    absl::StrAppend(&out, "  none: every checked output was finite\n");
  } else {
    const FindingRow& f = *s.first_origin;
    if (f.kind == "origin") {
      absl::StrAppend(&out, "  ", red, "origin", reset, "  ", bold, OpLabel(f),
                      reset, "  ", f.phase, "  step ", f.step, "\n");
      absl::StrAppend(&out, FromMask(f)        ? "          a mask's -inf (and finite inputs) gave "
                            : FromNanMarker(f) ? "          NaN markers (and finite inputs) gave "
                            : MakesValuesFromNumbers(f.op)
                                ? "          the program's numbers (no tensor's values) gave "
                                : "          finite inputs gave ",
                      f.dtype, " outputs with");
    } else if (f.kind == "compiled") {
      absl::StrAppend(&out, "  ", red, "compiled", reset, "  ", bold, OpLabel(f), reset, "  ",
                      f.phase, "  step ", f.step,
                      "\n          non-finite values came out of a torch.compile region "
                      "(made there, or given to it);\n          this op was the first checked op "
                      "to see them\n"
                      "          region ",
                      Fit(f.compiled_region, w - 17), "\n          outputs:");
    } else {
      absl::StrAppend(&out, "  ", red, "input", reset, "   ", bold, OpLabel(f),
                      reset, "  ", f.phase, "  step ", f.step,
                      s.op_sampling.empty()
                          ? "\n          inf/NaN arrived from outside (data, a checkpoint, "
                            "a constant); this op consumed them first\n"
                          : "\n          no checked op made them (sample mode checks a share "
                            "of ops); this op consumed them first\n",
                      "          outputs:");
    }
    if (f.nan) absl::StrAppend(&out, " nan=", f.nan);
    if (f.posinf) absl::StrAppend(&out, " +inf=", f.posinf);
    if (f.neginf) absl::StrAppend(&out, " -inf=", f.neginf);
    absl::StrAppend(&out, " of ", f.elements, "\n");
    if (f.fp32_max_abs && std::isfinite(*f.fp32_max_abs)) {
      absl::StrAppend(
          &out, "          recomputed in fp32 the outputs reach |x| = ",
          FormatAbs(*f.fp32_max_abs),
          " (", TimesFp16Max(*f.fp32_max_abs), " fp16's max 65504)\n");
    } else if (f.fp32_max_abs) {
      absl::StrAppend(&out, "          recomputed in fp32 the outputs are not finite either",
                      FromMask(f) ? " (a mask's -inf stays -inf)\n" : "\n");
    }
    if (f.kind == "origin" && !f.compiled_region.empty()) {
      absl::StrAppend(&out, "          after ", Fit(f.compiled_region, w - 16),
                      "\n          (on a GPU its inputs were not read: the region may have made "
                      "them)\n");
    }
    if (!f.forward_op.empty()) {
      absl::StrAppend(&out, "          backward of forward op ", f.forward_op,
                      "\n");
    }
    if (!f.source.empty()) {
      // A backward op's line is the one that called its forward op, or the
      // hook's or custom backward's that called it.
      const bool forward_line = SourceIsForwardLine(f);
      absl::StrAppend(&out, forward_line ? "          forward op called at " : "          at ",
                      Fit(f.source, w - (forward_line ? 32 : 13)), "\n");
      // The line called torch code (a distribution, nn.MultiheadAttention)
      // that made the op call.
      if (!f.via.empty()) {
        absl::StrAppend(&out, "          inside ", Fit(f.via, w - 17), "\n");
      }
    } else if (!s.first_origin_later_lines.empty()) {
      absl::StrAppend(&out,
                      f.phase == "backward"
                          ? "          forward op called at (lines of this backward op's findings from step "
                          : "          called at (lines of this op's later findings, from step ",
                      s.first_origin_later_lines_step, " on):\n");
      for (const std::string& line : s.first_origin_later_lines) {
        absl::StrAppend(&out, "            ", Fit(line, w - 12), "\n");
      }
    }
    if (!f.kernels.empty()) {
      absl::StrAppend(&out, "          kernels ",
                      Wrap(ReadableKernels(f.kernels), w - 18, "                  "), "\n");
    }
    if (!f.inputs.empty()) {
      for (absl::string_view in : absl::StrSplit(f.inputs, "; ")) {
        absl::StrAppend(&out, "          input ", Fit(in, w - 16), "\n");
      }
    }
    if (!s.first_origin_rank.empty()) {
      absl::StrAppend(&out, "          on rank ", s.first_origin_rank, "\n");
    }
    absl::StrAppend(&out, "  then: ", s.origins, " origin findings, ",
                    s.inputs, " input findings, ", s.propagated,
                    " propagated (recorded)",
                    s.received > 0 ? absl::StrCat(", ", s.received, " received from other ranks")
                                   : "",
                    " in all\n");
  }

  if (s.ranks.size() > 1 || (!s.ranks.empty() && s.ranks.front().first.kind == "received")) {
    absl::StrAppend(&out, "\n", bold, "RANKS", reset,
                    " (where each rank first saw non-finite values)\n");
    for (const auto& r : s.ranks) {
      const FindingRow& f = r.first;
      const bool began = f.kind != "received" && s.first_origin &&
                         f.step == s.first_origin->step && f.op == s.first_origin->op &&
                         r.rank == s.first_origin_rank;
      absl::StrAppend(
          &out, "  rank ", r.rank, ": ",
          f.kind == "received" ? "received them from another rank (collective), "
                                 "first used by "
                               : absl::StrCat(f.kind, " "),
          OpLabel(f), "  ", f.phase, "  step ", f.step,
          began ? absl::StrCat("  ", red, "<- began here", reset) : "", "\n");
    }
  }

  // Warnings: outputs that really live in fp16 first, as a trend per op
  // ("step 13 26% -> step 16 36% -> ..."); wider formats are only at risk
  // if they were run in fp16, so they come after, one line each.
  // Under a loss scaler, gradients are scaled up to the limit on purpose
  // (it grows its scale until they overflow, then skips the step): said
  // beside them, since their size is the scale's, not the model's.
  const bool scaled_gradients = SkipsOf(s).decided > 0;
  // Grouped by op, phase and dtype; a long op label (flash attention's,
  // inside scaled_dot_product_attention) is what gets shortened to the
  // width, never the phase and dtype after it.
  struct Group {
    std::string label, tail;
    std::vector<const FindingRow*> rows;
    std::string Line(size_t width) const {
      const size_t room = width > tail.size() + 2 ? width - tail.size() - 2 : 1;
      return absl::StrCat(Fit(label, room), "  ", tail);
    }
  };
  std::map<std::string, Group> at_risk, would;
  std::vector<std::string> order;
  for (const FindingRow& f : s.warnings) {
    const std::string tail =
        absl::StrCat(f.phase, " ", f.dtype,
                     scaled_gradients && f.phase == "backward" ? ", scaled by the loss scale" : "");
    const std::string key = absl::StrCat(OpLabel(f), "  ", tail);
    auto& groups = IsFp16Range(f.dtype) ? at_risk : would;
    auto [it, added] = groups.try_emplace(key, Group{OpLabel(f), tail, {}});
    if (added) order.push_back(key);
    it->second.rows.push_back(&f);
  }
  if (!at_risk.empty()) {
    absl::StrAppend(&out, "\n", bold, "WARNINGS BEFORE OVERFLOW", reset,
                    " (fp16 outputs nearing 65504, by step)\n");
    for (const auto& key : order) {
      auto it = at_risk.find(key);
      if (it == at_risk.end()) continue;
      const Group& g = it->second;
      std::vector<std::string> trend;
      for (const FindingRow* f : g.rows) {
        trend.push_back(absl::StrCat("step ", f->step, " ", OfLimit(f->max_abs)));
      }
      absl::StrAppend(&out, "  ", yellow, g.Line(w - 4), reset, "\n    ",
                      Fit(absl::StrJoin(trend, " -> "), w - 6), "\n");
      // Backward rows have their forward op's line only from the steps
      // after the first (the monitor captures it once wanted): the first
      // row that has one.
      const FindingRow* located = nullptr;
      for (const FindingRow* f : g.rows) {
        if (located == nullptr && !f->source.empty()) located = f;
      }
      if (located != nullptr) {
        const bool forward_line = SourceIsForwardLine(*located);
        absl::StrAppend(&out, forward_line ? "    forward op called at " : "    at ",
                        Fit(located->source, w - (forward_line ? 28 : 9)), "\n");
      }
    }
  }
  if (!would.empty()) {
    absl::StrAppend(&out, "\n", bold, "WOULD OVERFLOW IN FP16", reset,
                    " (fp32/bf16 outputs past the near-max threshold; safe "
                    "as they run now)\n");
    for (const auto& key : order) {
      auto it = would.find(key);
      if (it == would.end()) continue;
      const Group& g = it->second;
      const FindingRow* top = g.rows.back();  // each warning is past the last
      const std::string peak = absl::StrCat("up to ", FormatAbs(top->max_abs), " (",
                                            OfLimit(top->max_abs), " of 65504) at step ",
                                            top->step);
      if (key.size() + 2 + peak.size() <= w - 2) {
        absl::StrAppend(&out, "  ", key, "  ", peak, "\n");
      } else {
        absl::StrAppend(&out, "  ", g.Line(w - 4), "\n    ", peak, "\n");
      }
    }
  }

  absl::StrAppend(&out, "\n", bold, "OPS CLOSEST TO FP16'S LIMIT", reset,
                  " (65504; fp32 runs show which ops would overflow in fp16)\n");
  // The rows fit in 100 columns with a 29-column op name; a wider terminal
  // gives long names room (aten::_scaled_dot_product_flash_attention_for_cpu)
  // rather than cutting them.
  constexpr size_t kShownOps = 12, kOpColumn = 29, kRowWidth = 100;
  size_t op_column = kOpColumn;
  for (size_t i = 0; i < s.ops.size() && i < kShownOps; ++i) {
    op_column = std::max(op_column, s.ops[i].op.size());
  }
  op_column = std::min(op_column, kOpColumn + (w > kRowWidth ? w - kRowWidth : 0));
  const int op_w = static_cast<int>(op_column);
  absl::StrAppend(&out, absl::StrFormat("  %-*s %-9s %9s %10s %9s %9s %10s  %s\n",
                                        op_w, "op", "phase", "calls", "max|x|",
                                        "of 65504", "near-max", "non-finite",
                                        "trend"));
  for (size_t i = 0; i < s.ops.size() && i < kShownOps; ++i) {
    const OpTotals& o = s.ops[i];
    absl::StrAppend(&out, absl::StrFormat("  %-*s %-9s %9d %10s %9s %9d %10d  %s\n",
                                          op_w, Fit(o.op, op_column), o.phase, o.calls,
                                          o.mask ? "mask" : FormatAbs(o.max_abs),
                                          o.mask ? "-" : OfLimit(o.max_abs),
                                          o.near_max, o.nonfinite(), Trend(o)));
  }
  absl::StrAppend(&out, "  trend: max|x| per quarter of the run against 65504, "
                        "_ low .. # at the limit, ! inf/NaN\n");
  if (!s.mask_ops.empty()) {
    // Every op named, wrapped under the line when they do not fit beside
    // it: a name cut short ("aten::sc~") is no name. The lead is 52
    // columns (± is one column in two bytes).
    const std::string ops = absl::StrJoin(s.mask_ops, ", ");
    constexpr size_t kLead = 52;
    absl::StrAppend(&out, "  mask: ±inf put there on purpose, never a finding:",
                    ops.size() + kLead <= w ? " " + ops
                                            : "\n    " + Wrap(ops, w - 4, "    "),
                    "\n");
  }

  absl::StrAppend(&out, "\n", bold, "BY PHASE", reset, "\n");
  for (const PhaseTotals& p : s.phases) {
    absl::StrAppend(&out, absl::StrFormat(
                              "  %-9s %10d op calls  %10d non-finite  "
                              "%8d near-max  %10d underflow\n",
                              p.phase, p.calls, p.nonfinite_values, p.near_max,
                              p.underflow));
  }
  if (!s.loss_scale.empty()) {
    const double share = static_cast<double>(s.skipped_steps.size()) /
                         static_cast<double>(s.loss_scale.size());
    absl::StrAppend(&out, "\n", bold, "GRADSCALER", reset, "\n  ",
                    s.skipped_steps.size(), " of ", s.loss_scale.size(),
                    absl::StrFormat(" steps skipped (%.0f%%)", 100 * share),
                    s.skipped_steps.empty() ? "" : ": steps " + Fit(StepRanges(s.skipped_steps), w / 2),
                    "\n  loss scale: ", FormatAbs(s.loss_scale.front().scale),
                    " at step ", s.loss_scale.front().step, " -> ",
                    FormatAbs(s.loss_scale.back().scale), " at step ",
                    s.loss_scale.back().step, "\n");
  }
  if (!s.program_skipped_steps.empty()) {
    absl::StrAppend(&out, "\n", bold, "LOSS SCALING", reset, " (the program's own)\n  ",
                    s.program_skipped_steps.size(), " of ", s.steps,
                    absl::StrFormat(" updates skipped (%.0f%%): steps ",
                                    100.0 * static_cast<double>(s.program_skipped_steps.size()) /
                                        static_cast<double>(std::max<int64_t>(s.steps, 1))),
                    Fit(StepRanges(s.program_skipped_steps), w / 2),
                    "\n  each: non-finite gradients thrown away, then the next batch "
                    "without an optimizer step\n");
  }
  if (!s.given_up_steps.empty()) {
    absl::StrAppend(&out, "\n", bold, "ITERATIONS GIVEN UP", reset,
                    " (by the program, on a non-finite loss)\n  ", s.given_up_steps.size(),
                    " of ", s.steps, " steps: ", Fit(StepRanges(s.given_up_steps), w / 2),
                    "\n  each: the forward pass made inf/NaN, then the next batch began "
                    "without a backward pass: no gradient or update came of it\n");
  }
  if (!s.fp32_ops.empty() || !s.fp32_learned.empty() || s.bf16_switches > 0 ||
      !s.nanhunt_skips.empty()) {
    absl::StrAppend(&out, "\n", bold, "INTERVENTIONS", reset,
                    " (what nanhunt changed in this run)\n");
    if (!s.fp32_ops.empty()) {
      std::vector<std::string> parts;
      for (const auto& [op, calls] : s.fp32_ops) {
        // An op autocast only reaches through another (bmm in matmul) ran
        // in fp32 as part of that one.
        if (calls > 0) parts.push_back(absl::StrCat(op, " x", calls));
      }
      absl::StrAppend(&out, "  ran in fp32: ", Fit(absl::StrJoin(parts, ", "), w - 16), "\n");
    }
    if (!s.fp32_learned.empty()) {
      absl::StrAppend(&out, "  learned by NANHUNT_FP32_OPS=auto: ",
                      absl::StrJoin(s.fp32_learned, ", "), "\n");
      if (!s.fp32_policy.empty()) {
        absl::StrAppend(&out, "    a later run loads them with NANHUNT_POLICY=",
                        s.fp32_policy, "\n");
      }
      absl::StrAppend(&out, "    to fix it in the code: run these ops in fp32 "
                            "(inputs .float(), inside torch.autocast(..., "
                            "enabled=False))\n");
    }
    if (s.bf16_switches > 0) {
      absl::StrAppend(&out, "  fp16 autocast regions ran in bf16: ",
                      s.bf16_switches, " times\n");
    }
    if (!s.nanhunt_skips.empty()) {
      std::vector<int64_t> steps;
      std::map<std::string, int> culprits;
      for (const SkipRow& k : s.nanhunt_skips) {
        steps.push_back(k.step);
        ++culprits[k.first_op.empty()
                       ? "no checked op"
                       : k.forward_op.empty()
                             ? k.first_op
                             : absl::StrCat(k.first_op, " (backward of ", k.forward_op, ")")];
      }
      std::vector<std::string> by;
      for (const auto& [op, n] : culprits) by.push_back(absl::StrCat(op, " x", n));
      absl::StrAppend(&out, "  optimizer steps skipped for non-finite gradients: ",
                      steps.size(), ": steps ", Fit(StepRanges(steps), w / 2),
                      "\n    gradients first non-finite in: ",
                      Fit(absl::StrJoin(by, ", "), w - 36), "\n");
    }
  }
  if (!s.op_sampling.empty()) {
    absl::StrAppend(&out, "\n", bold, "SAMPLE MODE", reset, "  ",
                    s.op_sampling == "torch" ? "op calls sampled by torch"
                                             : "op calls sampled by hash",
                    ", ", s.op_calls_checked, " checked; ", s.escalations.size(),
                    s.escalations.size() == 1 ? " escalation" : " escalations",
                    s.escalations.empty() ? "" : " to every op", "\n");
    constexpr size_t kShown = 8;
    for (size_t i = 0; i < s.escalations.size() && i < kShown; ++i) {
      const RunSummary::Escalation& e = s.escalations[i];
      std::string found = "nothing";
      if (e.found) {
        found = absl::StrCat(e.found->kind == "near_max" ? "warning" : e.found->kind, " ",
                             OpLabel(*e.found), ", ", e.found->phase, ", step ",
                             e.found->step);
      }
      absl::StrAppend(&out, absl::StrFormat("  step %-7d ", e.row.step),
                      Fit(absl::StrCat(e.row.why, "; every op through step ",
                                       e.row.until_step),
                          w - 16),
                      "\n               found: ", Fit(found, w - 23), "\n");
    }
    if (s.escalations.size() > kShown) {
      absl::StrAppend(&out, "  ... ", s.escalations.size() - kShown,
                      " more (nanhunt view --json)\n");
    }
  }
  absl::StrAppend(&out, "\n", bold, "STEPS", reset, "  ", StepStrip(s, w - 9),
                  "\n         . finite   ! non-finite values   s step skipped\n"
                  "  with non-finite values: ",
                  s.nonfinite_steps.empty() ? "none"
                                            : Fit(StepRanges(s.nonfinite_steps), w - 27),
                  "\n");
  if (!s.loss_scale.empty()) {
    absl::StrAppend(&out, "  loss scale: ", FormatAbs(s.loss_scale.front().scale), " -> ",
                    FormatAbs(s.loss_scale.back().scale), "\n");
  }
  if (!s.problems.empty()) {
    absl::StrAppend(&out, "\n", bold, "NOTES", reset, "\n");
    for (const auto& p : s.problems) absl::StrAppend(&out, "  ", p, "\n");
  }
  return out;
}

std::string RenderJson(const RunSummary& s) {
  JsonWriter j;
  j.BeginObject();
  j.Key("traces").BeginArray();
  for (const auto& t : s.traces) j.String(t);
  j.EndArray();
  j.Key("torch_version").String(s.torch_version);
  j.Key("steps").Int(s.steps);
  j.Key("forward_passes").Bool(s.forward_passes);
  const Diagnosis diagnosis = Diagnose(s);
  j.Key("diagnosis").BeginObject();
  j.Key("kind").String(diagnosis.kind);
  j.Key("title").String(diagnosis.title);
  j.Key("op").String(diagnosis.op);
  j.Key("evidence").BeginArray();
  for (const auto& e : diagnosis.evidence) j.String(e);
  j.EndArray();
  j.Key("fixes").BeginArray();
  for (const auto& f : diagnosis.fixes) j.String(f);
  j.EndArray();
  j.EndObject();
  j.Key("first_origin");
  if (!s.first_origin) {
    j.Null();
  } else {
    const FindingRow& f = *s.first_origin;
    j.BeginObject();
    j.Key("kind").String(f.kind);
    j.Key("op").String(f.op);
    j.Key("top_op").String(f.top_op);
    j.Key("phase").String(f.phase);
    j.Key("forward_op").String(f.forward_op);
    j.Key("step").Int(f.step);
    j.Key("call_index").Int(f.call_index);
    j.Key("dtype").String(f.dtype);
    j.Key("elements").Int(f.elements);
    j.Key("nan").Int(f.nan);
    j.Key("posinf").Int(f.posinf);
    j.Key("neginf").Int(f.neginf);
    j.Key("max_abs").Number(ReachedAbs(f));
    j.Key("output_max_abs").Number(f.max_abs);
    j.Key("fp32_max_abs");
    if (f.fp32_max_abs) j.Number(*f.fp32_max_abs); else j.Null();
    j.Key("rank").String(s.first_origin_rank);
    j.Key("source").String(f.source);
    j.Key("via").String(f.via);
    j.Key("later_forward_lines").BeginArray();
    for (const std::string& line : s.first_origin_later_lines) j.String(line);
    j.EndArray();
    j.Key("kernels").String(ReadableKernels(f.kernels));
    j.Key("compiled_region").String(f.compiled_region);
    j.Key("stack").String(f.stack);
    j.Key("inputs").String(f.inputs);
    j.Key("outputs").String(f.outputs);
    j.Key("trace").String(s.first_origin_trace);
    j.EndObject();
  }
  j.Key("counts").BeginObject();
  j.Key("origins").Int(s.origins);
  j.Key("inputs").Int(s.inputs);
  j.Key("propagated").Int(s.propagated);
  j.EndObject();
  j.Key("warnings").BeginArray();
  for (const FindingRow& f : s.warnings) {
    j.BeginObject();
    j.Key("op").String(f.op);
    j.Key("phase").String(f.phase);
    j.Key("dtype").String(f.dtype);
    j.Key("step").Int(f.step);
    j.Key("max_abs").Number(f.max_abs);
    j.Key("source").String(f.source);
    j.EndObject();
  }
  j.EndArray();
  j.Key("ranks").BeginArray();
  for (const auto& r : s.ranks) {
    j.BeginObject();
    j.Key("rank").String(r.rank);
    j.Key("kind").String(r.first.kind);
    j.Key("op").String(r.first.op);
    j.Key("top_op").String(r.first.top_op);
    j.Key("phase").String(r.first.phase);
    j.Key("step").Int(r.first.step);
    j.EndObject();
  }
  j.EndArray();
  j.Key("mask_ops").BeginArray();
  for (const std::string& op : s.mask_ops) j.String(op);
  j.EndArray();
  j.Key("unchecked_ops").BeginArray();
  for (const UncheckedRow& u : s.unchecked) {
    j.BeginObject();
    j.Key("op").String(u.op);
    j.Key("phase").String(u.phase);
    j.Key("reason").String(u.reason);
    j.Key("outputs").Int(u.outputs);
    j.Key("first_step").Int(u.first_step);
    j.Key("last_step").Int(u.last_step);
    j.EndObject();
  }
  j.EndArray();
  j.Key("ops").BeginArray();
  for (const OpTotals& o : s.ops) {
    j.BeginObject();
    j.Key("op").String(o.op);
    j.Key("phase").String(o.phase);
    j.Key("calls").Int(o.calls);
    j.Key("max_abs").Number(o.max_abs);
    j.Key("overflowed").Bool(std::isinf(o.max_abs) && !o.mask);
    j.Key("mask").Bool(o.mask);
    j.Key("near_max").Int(o.near_max);
    j.Key("nonfinite").Int(o.nonfinite());
    j.Key("underflow").Int(o.underflow);
    j.Key("fp16_overflow").Int(o.fp16_overflow);
    j.EndObject();
  }
  j.EndArray();
  j.Key("phases").BeginObject();
  for (const PhaseTotals& p : s.phases) {
    j.Key(p.phase).BeginObject();
    j.Key("calls").Int(p.calls);
    j.Key("nonfinite_values").Int(p.nonfinite_values);
    j.Key("near_max").Int(p.near_max);
    j.Key("underflow").Int(p.underflow);
    j.Key("fp16_elements").Int(p.fp16_elements);
    j.Key("fp16_underflow").Int(p.fp16_underflow);
    j.EndObject();
  }
  j.EndObject();
  j.Key("nonfinite_steps").BeginArray();
  for (int64_t st : s.nonfinite_steps) j.Int(st);
  j.EndArray();
  j.Key("loss_scale").BeginArray();
  for (const LossScaleRow& l : s.loss_scale) {
    j.BeginObject();
    j.Key("step").Int(l.step);
    j.Key("scale").Number(l.scale);
    j.Key("skipped").Bool(l.skipped);
    j.EndObject();
  }
  j.EndArray();
  j.Key("skipped_steps").BeginArray();
  for (int64_t st : s.skipped_steps) j.Int(st);
  j.EndArray();
  j.Key("program_skipped_steps").BeginArray();
  for (int64_t st : s.program_skipped_steps) j.Int(st);
  j.EndArray();
  j.Key("given_up_steps").BeginArray();
  for (int64_t st : s.given_up_steps) j.Int(st);
  j.EndArray();
  j.Key("interventions").BeginObject();
  j.Key("fp32_ops").BeginObject();
  for (const auto& [op, calls] : s.fp32_ops) j.Key(op).Int(calls);
  j.EndObject();
  j.Key("fp32_learned").BeginArray();
  for (const auto& op : s.fp32_learned) j.String(op);
  j.EndArray();
  j.Key("fp32_policy").String(s.fp32_policy);
  j.Key("bf16_switches").Int(s.bf16_switches);
  j.Key("skipped_steps").BeginArray();
  for (const SkipRow& k : s.nanhunt_skips) {
    j.BeginObject();
    j.Key("step").Int(k.step);
    j.Key("first_op").String(k.first_op);
    j.Key("forward_op").String(k.forward_op);
    j.EndObject();
  }
  j.EndArray();
  j.EndObject();
  j.Key("sample_mode");
  if (s.op_sampling.empty()) {
    j.Null();
  } else {
    j.BeginObject();
    j.Key("op_sampling").String(s.op_sampling);
    j.Key("op_calls_checked").Int(s.op_calls_checked);
    j.Key("iterations_unjudged").Int(s.iterations_unjudged_in_sample_mode);
    j.Key("escalations").BeginArray();
    for (const RunSummary::Escalation& e : s.escalations) {
      j.BeginObject();
      j.Key("step").Int(e.row.step);
      j.Key("until_step").Int(e.row.until_step);
      j.Key("why").String(e.row.why);
      j.Key("found");
      if (e.found) {
        j.BeginObject();
        j.Key("kind").String(e.found->kind);
        j.Key("op").String(e.found->op);
        j.Key("phase").String(e.found->phase);
        j.Key("step").Int(e.found->step);
        j.EndObject();
      } else {
        j.Null();
      }
      j.EndObject();
    }
    j.EndArray();
    j.EndObject();
  }
  j.Key("cost").BeginObject();  // nanhunt's own host time
  j.Key("ops_observed").Int(s.ops_observed);
  j.Key("host_us_per_op").Number(s.host_us_per_op);
  j.Key("gpu_checks").Int(s.gpu_checks);
  j.Key("gpu_check_batches").Int(s.gpu_check_batches);
  j.Key("ring_waits").Int(s.ring_waits);
  j.EndObject();
  j.Key("skipped_fraction");
  if (s.loss_scale.empty()) {
    j.Null();
  } else {
    j.Number(static_cast<double>(s.skipped_steps.size()) /
             static_cast<double>(s.loss_scale.size()));
  }
  j.Key("problems").BeginArray();
  for (const auto& p : s.problems) j.String(p);
  j.EndArray();
  j.EndObject();
  return j.str() + "\n";
}

}  // namespace nanhunt
