// Sampling: deterministic across processes, close to the asked share,
// full steps one in N, and escalation checking everything for K steps.
#include "core/sampler.h"

#include "gtest/gtest.h"

namespace nanhunt {
namespace {

TEST(SamplerTest, TheSameSeedSamplesTheSameOpsAndTheShareIsAsAsked) {
  Sampler a(0.01, 0, 7, 20), b(0.01, 0, 7, 20), other(0.01, 0, 8, 20);
  int checked = 0, differ = 0;
  for (int64_t step = 0; step < 100; ++step) {
    for (int64_t call = 0; call < 1000; ++call) {
      const bool x = a.ShouldCheck(step, "aten::bmm", call);
      EXPECT_EQ(x, b.ShouldCheck(step, "aten::bmm", call));
      checked += x;
      differ += x != other.ShouldCheck(step, "aten::bmm", call);
    }
  }
  EXPECT_NEAR(checked / 100000.0, 0.01, 0.002);
  EXPECT_GT(differ, 0) << "another seed samples other ops";
  // Fixed values: the hash may not change between builds or machines.
  EXPECT_EQ(Mix(0), 0xe220a8397b1dcdafull);
  EXPECT_EQ(HashName("aten::bmm"), HashName("aten::bmm"));
}

TEST(SamplerTest, OneStepInNIsCheckedInFull) {
  Sampler s(0, 10, 1, 20);
  int full = 0;
  for (int64_t step = 0; step < 10000; ++step) {
    const bool f = s.FullStep(step);
    full += f;
    EXPECT_EQ(f, s.ShouldCheck(step, "aten::add", 3));
  }
  EXPECT_NEAR(full / 10000.0, 0.1, 0.02);
}

TEST(SamplerTest, EscalationChecksEveryOpForTheNextKSteps) {
  Sampler s(0, 0, 1, 20);
  EXPECT_FALSE(s.ShouldCheck(5, "aten::mm", 0));
  EXPECT_TRUE(s.Escalate(5));
  // Seen again while escalated: not a new escalation, but it lasts longer.
  EXPECT_FALSE(s.Escalate(6));
  for (int64_t step = 5; step <= 26; ++step) EXPECT_TRUE(s.ShouldCheck(step, "aten::mm", 0));
  EXPECT_FALSE(s.ShouldCheck(27, "aten::mm", 0));
  EXPECT_TRUE(s.Escalate(30));
  EXPECT_EQ(s.escalated_until(), 50);
}

}  // namespace
}  // namespace nanhunt

#include "core/budget.h"

namespace nanhunt {
namespace {

TEST(BudgetTest, TheRateSettlesWhereChecksCostTheBudget) {
  // A model of a run: checking every op costs 40% of a 100 ms step.
  BudgetController budget(0.01);
  double rate = 1.0;
  for (int step = 0; step < 60; ++step) {
    const int64_t step_ns = 100'000'000;
    const auto check_ns = static_cast<int64_t>(0.4 * rate * step_ns);
    if (auto next = budget.OnStep(step_ns, check_ns, rate)) rate = *next;
  }
  EXPECT_NEAR(0.4 * rate, 0.01, 0.004) << "checks take about 1% of the step";
}

TEST(BudgetTest, NothingMeasuredMeansRoomToCheckMore) {
  BudgetController budget(0.05);
  auto next = budget.OnStep(1'000'000, 0, 0.01);
  ASSERT_TRUE(next.has_value());
  EXPECT_GT(*next, 0.01);
  // Already at 90% of the budget: left alone.
  EXPECT_FALSE(BudgetController(0.05).OnStep(1'000'000, 45'000, 0.5).has_value());
}

}  // namespace
}  // namespace nanhunt
