// NANHUNT_BUDGET: keeps the time nanhunt spends checking ops within a share
// of the step time, by adjusting sample mode's share of checked op calls
// after each step. What the checks cost is measured where nanhunt works
// (its callbacks); torch's own cost of calling a callback is not included.
#pragma once

#include <cstdint>
#include <optional>

namespace nanhunt {

class BudgetController {
 public:
  // `budget`: the share of step time allowed, e.g. 0.01.
  explicit BudgetController(double budget) : budget_(budget) {}

  // A step took `step_ns`, `check_ns` of it in checks, at op share `rate`.
  // Returns the share to use from now on when it should change (by more
  // than a fifth), else nullopt. The cost is taken as proportional to the
  // share, smoothed over a few steps.
  std::optional<double> OnStep(int64_t step_ns, int64_t check_ns, double rate);

 private:
  const double budget_;
  double smoothed_ = -1;  // checks' share of the step, smoothed
};

}  // namespace nanhunt
