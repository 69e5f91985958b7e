// `nanhunt compare A B`: two runs of the same script (fp32 and fp16, or
// before and after a fix) side by side per op — the A/B protocol an expert
// runs by hand to see where the low-precision run leaves the rails.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "viewer/summary.h"

namespace nanhunt {

// The first op of a run whose low-precision (fp16, fp8 e5m2) outputs left
// fp16's range: max |x| past 65504, or inf/NaN.
struct OutOfRange {
  std::string op, top_op, phase, dtype;
  int64_t step = 0;
  double max_abs = 0;        // in this run (inf when non-finite)
  std::optional<double> other_max_abs;  // the same op and step in the other run
  std::string other_dtype;
};

struct Comparison {
  std::string run_a, run_b;  // commands
  std::optional<OutOfRange> first_a, first_b;
  struct Row {
    std::string op, phase;
    double a_max_abs = 0, b_max_abs = 0;
    int64_t a_nonfinite = 0, b_nonfinite = 0;
    bool in_a = false, in_b = false;
  };
  std::vector<Row> rows;  // by max |x| in B, highest first
  std::optional<int64_t> first_nonfinite_a, first_nonfinite_b;  // steps
};

// `a` and `b`: traces read with their series.
Comparison Compare(const std::vector<Trace>& a, const std::vector<Trace>& b);

std::string RenderComparisonText(const Comparison& c, int width);
std::string RenderComparisonJson(const Comparison& c);

}  // namespace nanhunt
