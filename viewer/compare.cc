#include "viewer/compare.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/check_limits.h"
#include "viewer/json_writer.h"
#include "viewer/summary.h"

namespace nanhunt {
namespace {

bool LowPrecision(const std::string& dtype) {
  return dtype == "float16" || dtype == "float8_e5m2";
}

bool LeftRange(const OpStep& o) {
  // A mask's ±inf were put there on purpose, not past the range.
  return !o.mask && LowPrecision(o.dtype) && (o.nonfinite > 0 || o.max_abs >= kFp16Max);
}

std::optional<int64_t> FirstNonFinite(const std::vector<Trace>& traces) {
  std::optional<int64_t> first;
  for (const Trace& t : traces) {
    for (const StepRow& s : t.steps) {
      if (s.nonfinite_ops > 0 && (!first || s.step < *first)) first = s.step;
    }
  }
  return first;
}

// The first (step) low-precision output past the range; within that step,
// the run's own origin when it is one of them (it has the call order),
// else the largest.
std::optional<OutOfRange> FirstOutOfRange(const std::vector<Trace>& traces) {
  const OpStep* best = nullptr;
  for (const Trace& t : traces) {
    for (const OpStep& o : t.op_steps) {
      if (!LeftRange(o)) continue;
      const double m = o.nonfinite > 0 ? INFINITY : o.max_abs;
      const double best_m = best == nullptr ? 0
                            : best->nonfinite > 0 ? INFINITY
                                                  : best->max_abs;
      if (best == nullptr || o.step < best->step ||
          (o.step == best->step && m > best_m)) {
        best = &o;
      }
    }
  }
  if (best == nullptr) return std::nullopt;
  OutOfRange r;
  r.op = best->op;
  r.phase = best->phase;
  r.dtype = best->dtype;
  r.step = best->step;
  r.max_abs = best->nonfinite > 0 ? INFINITY : best->max_abs;
  for (const Trace& t : traces) {
    for (const FindingRow& f : t.findings) {
      if (BeganHere(f) && f.step == r.step &&
          LowPrecision(f.dtype)) {
        r.op = f.op;
        r.top_op = f.top_op == f.op ? "" : f.top_op;
        r.phase = f.phase;
        return r;
      }
    }
  }
  return r;
}

// Max |x| of `op` (any phase given) at `step` in `traces`.
void Lookup(const std::vector<Trace>& traces, const OutOfRange& r,
            std::optional<double>& max_abs, std::string& dtype) {
  for (const Trace& t : traces) {
    for (const OpStep& o : t.op_steps) {
      if (o.mask || o.step != r.step || o.phase != r.phase ||
          (o.op != r.op && o.op != r.top_op)) {
        continue;
      }
      if (o.op != r.op && max_abs) continue;  // prefer the op itself
      const double m = o.nonfinite > 0 ? INFINITY : o.max_abs;
      max_abs = std::max(max_abs.value_or(0), m);
      dtype = o.dtype;
    }
  }
}

std::string Command(const std::vector<Trace>& traces) {
  for (const Trace& t : traces) {
    if (auto it = t.meta.find("command"); it != t.meta.end()) return it->second;
  }
  return "(unknown command)";
}

std::string Label(const OutOfRange& r) {
  return r.top_op.empty() ? r.op : absl::StrCat(r.op, " (in ", r.top_op, ")");
}

}  // namespace

Comparison Compare(const std::vector<Trace>& a, const std::vector<Trace>& b) {
  Comparison c;
  c.run_a = Command(a);
  c.run_b = Command(b);
  c.first_a = FirstOutOfRange(a);
  c.first_b = FirstOutOfRange(b);
  if (c.first_a) Lookup(b, *c.first_a, c.first_a->other_max_abs, c.first_a->other_dtype);
  if (c.first_b) Lookup(a, *c.first_b, c.first_b->other_max_abs, c.first_b->other_dtype);
  c.first_nonfinite_a = FirstNonFinite(a);
  c.first_nonfinite_b = FirstNonFinite(b);
  std::map<std::pair<std::string, std::string>, Comparison::Row> rows;
  for (const auto* side : {&a, &b}) {
    const bool is_a = side == &a;
    for (const Trace& t : *side) {
      for (const OpTotals& o : t.ops) {
        if (o.mask) continue;  // ±inf on purpose: no range compared
        Comparison::Row& r = rows[{o.op, o.phase}];
        r.op = o.op;
        r.phase = o.phase;
        (is_a ? r.in_a : r.in_b) = true;
        double& m = is_a ? r.a_max_abs : r.b_max_abs;
        m = std::max(m, o.max_abs);
        (is_a ? r.a_nonfinite : r.b_nonfinite) += o.nonfinite();
      }
    }
  }
  for (auto& [key, row] : rows) c.rows.push_back(row);
  std::sort(c.rows.begin(), c.rows.end(), [](const auto& x, const auto& y) {
    if (x.b_max_abs != y.b_max_abs) return x.b_max_abs > y.b_max_abs;
    return x.op < y.op;
  });
  return c;
}

std::string RenderComparisonText(const Comparison& c, int width) {
  const size_t w = static_cast<size_t>(std::max(70, width));
  auto fit = [](const std::string& s, size_t n) {
    return s.size() <= n ? s : s.substr(0, n - 1) + "~";
  };
  std::string out = absl::StrCat("nanhunt compare\n  A: ", fit(c.run_a, w - 5),
                                 "\n  B: ", fit(c.run_b, w - 5), "\n\n");
  absl::StrAppend(&out, "FIRST OP WHOSE FP16 VALUES LEAVE FP16'S RANGE (65504)\n");
  for (const auto& [name, first] : {std::make_pair("A", &c.first_a),
                                    std::make_pair("B", &c.first_b)}) {
    if (!*first) {
      absl::StrAppend(&out, "  ", name, ": none (every fp16 output stayed within 65504)\n");
      continue;
    }
    const OutOfRange& r = **first;
    absl::StrAppend(&out, "  ", name, ": ", Label(r), "  ", r.phase, "  step ",
                    r.step, "  max|x| ", FormatAbs(r.max_abs), " (", r.dtype, ")\n");
    if (r.other_max_abs) {
      absl::StrAppend(&out, "     the other run, same op and step: max|x| ",
                      FormatAbs(*r.other_max_abs), " (", r.other_dtype, ")",
                      std::isfinite(*r.other_max_abs) && *r.other_max_abs >= kFp16Max
                          ? absl::StrCat(": ", TimesFp16Max(*r.other_max_abs),
                                         " fp16's limit, so fp16 cannot hold it")
                          : "",
                      "\n");
    }
  }
  auto step = [](const std::optional<int64_t>& s) {
    return s ? absl::StrCat("step ", *s) : std::string("never");
  };
  absl::StrAppend(&out, "\nFIRST STEP WITH NON-FINITE VALUES\n  A: ",
                  step(c.first_nonfinite_a), "\n  B: ", step(c.first_nonfinite_b),
                  "\n\nOPS SIDE BY SIDE (max |x| over the run; by B, highest first)\n");
  absl::StrAppend(&out, absl::StrFormat("  %-32s %-9s %10s %10s %8s %9s %9s\n", "op",
                                        "phase", "A max|x|", "B max|x|", "B/A",
                                        "A non-fin", "B non-fin"));
  for (size_t i = 0; i < c.rows.size() && i < 20; ++i) {
    const auto& r = c.rows[i];
    std::string ratio = "-";
    if (r.in_a && r.in_b && r.a_max_abs > 0 && std::isfinite(r.a_max_abs)) {
      ratio = std::isinf(r.b_max_abs) ? "inf"
                                      : absl::StrFormat("%.3g", r.b_max_abs / r.a_max_abs);
    }
    absl::StrAppend(&out, absl::StrFormat("  %-32s %-9s %10s %10s %8s %9d %9d\n",
                                          fit(r.op, 32), r.phase,
                                          r.in_a ? FormatAbs(r.a_max_abs) : "-",
                                          r.in_b ? FormatAbs(r.b_max_abs) : "-", ratio,
                                          r.a_nonfinite, r.b_nonfinite));
  }
  return out;
}

std::string RenderComparisonJson(const Comparison& c) {
  JsonWriter j;
  j.BeginObject();
  j.Key("a").String(c.run_a);
  j.Key("b").String(c.run_b);
  for (const auto& [name, first] : {std::make_pair("first_out_of_range_a", &c.first_a),
                                    std::make_pair("first_out_of_range_b", &c.first_b)}) {
    j.Key(name);
    if (!*first) {
      j.Null();
      continue;
    }
    const OutOfRange& r = **first;
    j.BeginObject();
    j.Key("op").String(r.op);
    j.Key("top_op").String(r.top_op);
    j.Key("phase").String(r.phase);
    j.Key("dtype").String(r.dtype);
    j.Key("step").Int(r.step);
    j.Key("max_abs").Number(r.max_abs);
    j.Key("other_max_abs");
    if (r.other_max_abs) j.Number(*r.other_max_abs); else j.Null();
    j.Key("other_dtype").String(r.other_dtype);
    j.EndObject();
  }
  for (const auto& [name, s] : {std::make_pair("first_nonfinite_step_a", &c.first_nonfinite_a),
                                std::make_pair("first_nonfinite_step_b", &c.first_nonfinite_b)}) {
    j.Key(name);
    if (*s) j.Int(**s); else j.Null();
  }
  j.Key("ops").BeginArray();
  for (const auto& r : c.rows) {
    j.BeginObject();
    j.Key("op").String(r.op);
    j.Key("phase").String(r.phase);
    j.Key("a_max_abs");
    if (r.in_a) j.Number(r.a_max_abs); else j.Null();
    j.Key("b_max_abs");
    if (r.in_b) j.Number(r.b_max_abs); else j.Null();
    j.Key("a_nonfinite").Int(r.a_nonfinite);
    j.Key("b_nonfinite").Int(r.b_nonfinite);
    j.EndObject();
  }
  j.EndArray();
  j.EndObject();
  return j.str() + "\n";
}

}  // namespace nanhunt
