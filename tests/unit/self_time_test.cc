#include "core/self_time.h"

#include <map>
#include <thread>

#include "gtest/gtest.h"

namespace nanhunt {
namespace {

std::map<std::string, std::string> Rows(const SelfTime& t) {
  std::map<std::string, std::string> rows;
  for (const auto& [key, value] : t.MetaRows()) rows[key] = value;
  return rows;
}

TEST(SelfTimeTest, EachThreadTimesOneEventInEveryKEvery) {
  // The kEvery-th event of each kind on a thread is timed, then one in
  // kEvery (never a thread's first, which pays one-time set-up); kinds count
  // apart. A fresh thread starts its own count.
  std::thread([] {
    EXPECT_FALSE(SelfTime::TimeThisOne(SelfTime::kOp));
    int timed = 0;
    for (uint64_t i = 1; i < 3 * SelfTime::kEvery; ++i) {
      timed += SelfTime::TimeThisOne(SelfTime::kOp) ? 1 : 0;
    }
    EXPECT_EQ(timed, 3);
    EXPECT_FALSE(SelfTime::TimeThisOne(SelfTime::kEnqueue));
  }).join();
}

TEST(SelfTimeTest, MetaScalesTimedEventsBackUp) {
  SelfTime t;
  EXPECT_TRUE(Rows(t).empty());  // nothing timed: nothing claimed
  t.Add(SelfTime::kOp, 2000);
  t.Add(SelfTime::kOp, 4000);
  auto rows = Rows(t);
  EXPECT_EQ(rows["host_us_per_op"], "3.00");
  EXPECT_EQ(rows["ops_observed"], std::to_string(2 * SelfTime::kEvery));
  EXPECT_EQ(rows.count("host_us_per_enqueue"), 0u);
  EXPECT_EQ(rows.count("host_us_per_gpu_op"), 0u);
  EXPECT_EQ(rows.count("delivery_seconds"), 0u);
  t.Add(SelfTime::kEnqueue, 6500);
  t.Add(SelfTime::kGpuOp, 9000);
  t.Add(SelfTime::kDelivery, 1000000);  // 1 ms, standing for kEvery of them
  rows = Rows(t);
  EXPECT_EQ(rows["host_us_per_enqueue"], "6.50");
  EXPECT_EQ(rows["host_us_per_gpu_op"], "9.00");
  EXPECT_EQ(rows["delivery_seconds"], "0.064");
}

TEST(SelfTimeTest, TimerAddsToTheGlobalTotalsWhenItsTurnComes) {
  std::thread([] {
    const int64_t before = GlobalSelfTime().Get(SelfTime::kDelivery).timed;
    for (uint64_t i = 1; i < SelfTime::kEvery; ++i) {
      SelfTimer timer(SelfTime::kDelivery);
    }
    EXPECT_EQ(GlobalSelfTime().Get(SelfTime::kDelivery).timed, before);
    { SelfTimer timer(SelfTime::kDelivery); }  // the kEvery-th: timed
    EXPECT_EQ(GlobalSelfTime().Get(SelfTime::kDelivery).timed, before + 1);
  }).join();
}

}  // namespace
}  // namespace nanhunt
