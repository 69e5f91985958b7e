// Whether a training is diverging, from the largest |x| each step's update
// wrote (the optimizer's outputs: the weights and its state). A learning
// rate too high for the gradients makes each update larger than the last,
// by orders of magnitude within a few steps, until some value passes the
// format's range; a healthy run's weights drift by percents, and Adam's
// step counter, an optimizer output too, grows by one a step. The monitor
// warns live when the bars below are passed, before the NaN; the viewer
// applies the same bars to a trace (viewer/diagnosis_growth.h).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>

namespace nanhunt {

// Diverging: the latest update's max |x| is at least kDivergedGrowth times
// the smallest of the steps before, and kRecentGrowth times the largest of
// those kRecentSteps steps or more before it.
inline constexpr double kDivergedGrowth = 100;
inline constexpr double kRecentGrowth = 10;
inline constexpr int64_t kRecentSteps = 3;

// Whether an update's max |x| `now` passes both bars, given the smallest of
// the steps before it and the largest of those kRecentSteps or more before
// it (0 when there is none: no verdict yet). The watch and the viewer's
// reading of a trace both ask this.
inline bool PassesDivergenceBars(double now, double smallest_before,
                                 double largest_before_recent) {
  return largest_before_recent > 0 && now >= kDivergedGrowth * smallest_before &&
         now >= kRecentGrowth * largest_before_recent;
}

class DivergenceWatch {
 public:
  struct Growth {
    int64_t from_step = 0;  // the smallest update's step
    double from = 0;
    int64_t step = 0;  // the step that passed the bars
    double now = 0;
    // "the updates grew from max|x| 0.82 at step 0 to 4782.83 at step 3".
    std::string Describe() const;
  };

  // The largest finite |x| step `step`'s update wrote (steps in order; a
  // step seen again, a GPU result that came after its step's row, raises
  // its value). The growth when it passes the bars, the first time and
  // again each time it grows kDivergedGrowth times more; nullopt otherwise.
  std::optional<Growth> OnUpdate(int64_t step, double max_abs);

 private:
  std::optional<std::pair<int64_t, double>> smallest_;
  // The last kRecentSteps steps' values; older ones fold into
  // before_recent_.
  std::deque<std::pair<int64_t, double>> recent_;
  double before_recent_ = 0;
  double warned_at_ = 0;  // the value of the last growth returned
};

}  // namespace nanhunt
