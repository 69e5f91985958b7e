// When the monitor says live that a training is diverging: the updates'
// largest |x| grown a hundredfold, tenfold within three steps.
#include "core/divergence_watch.h"

#include <optional>
#include <vector>

#include "gtest/gtest.h"

namespace nanhunt {
namespace {

// Feeds steps 0, 1, ... their values; the steps that warned.
std::vector<int64_t> WarnedSteps(DivergenceWatch& watch, const std::vector<double>& values) {
  std::vector<int64_t> warned;
  for (size_t i = 0; i < values.size(); ++i) {
    if (watch.OnUpdate(static_cast<int64_t>(i), values[i])) warned.push_back(i);
  }
  return warned;
}

TEST(DivergenceWatch, ALearningRateTooHighWarnsWhereItPassesBothBarsThenPerHundredfold) {
  // SGD at lr=0.5 on a regression MLP (tests/integration/scripts/
  // diverging_learning_rate.py): its weights, step by step.
  DivergenceWatch w;
  EXPECT_FALSE(w.OnUpdate(0, 0.82));
  EXPECT_FALSE(w.OnUpdate(1, 1.41));
  EXPECT_FALSE(w.OnUpdate(2, 19.47));  // 24x: not yet a hundredfold
  const std::optional<DivergenceWatch::Growth> g = w.OnUpdate(3, 4782.83);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->Describe(), "the updates grew from max|x| 0.82 at step 0 to 4782.83 at step 3");
  EXPECT_TRUE(w.OnUpdate(4, 9.05e11));  // a hundredfold past the last warning
  EXPECT_FALSE(w.OnUpdate(5, 1e13));    // not
}

TEST(DivergenceWatch, AdamsStepCounterAndAHealthyDriftNeverWarn) {
  std::vector<double> counter, drift;
  for (int i = 1; i <= 2000; ++i) {
    counter.push_back(i);  // Adam's step count: 2000x, by one a step
    drift.push_back(1.0 + 0.05 * ((i * 7919) % 13) / 13.0);
  }
  DivergenceWatch a, b;
  EXPECT_TRUE(WarnedSteps(a, counter).empty());
  EXPECT_TRUE(WarnedSteps(b, drift).empty());
}

TEST(DivergenceWatch, AFastGrowthFromTheStartNeedsThreeStepsBehindIt) {
  // Tenfold each step from step 0: the first step with a value three
  // steps back is 3.
  DivergenceWatch w;
  EXPECT_EQ(WarnedSteps(w, {1, 10, 100, 1000, 1e4}), std::vector<int64_t>({3}));
}

TEST(DivergenceWatch, AStepSeenAgainRaisesItsValueAndOldStepsAreIgnored) {
  // A GPU result that came after its step's row: the step's larger value.
  DivergenceWatch w;
  EXPECT_EQ(WarnedSteps(w, {1, 1, 1, 50}), std::vector<int64_t>{});
  EXPECT_TRUE(w.OnUpdate(3, 500));
  EXPECT_FALSE(w.OnUpdate(0, 1e9));  // long gone
  EXPECT_FALSE(w.OnUpdate(4, 0));    // nothing written
}

}  // namespace
}  // namespace nanhunt
