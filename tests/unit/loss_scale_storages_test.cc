// The registry of GradScaler's scale memory that marks loss-scaling ops.
#include "core/loss_scale_storages.h"

#include "gtest/gtest.h"

namespace nanhunt {
namespace {

TEST(LossScaleStoragesTest, KnowsWhatWasNotedAndNothingElse) {
  LossScaleStorages scales;
  int a = 0, b = 0;
  EXPECT_TRUE(scales.empty());
  EXPECT_FALSE(scales.Contains(&a));
  scales.Note(&a);
  scales.Note(&a);  // every step notes it again
  scales.Note(nullptr);
  EXPECT_FALSE(scales.empty());
  EXPECT_TRUE(scales.Contains(&a));
  EXPECT_FALSE(scales.Contains(&b));
  EXPECT_FALSE(scales.Contains(nullptr));
}

TEST(LossScaleStoragesTest, PastItsSlotsTheOldestMakesRoom) {
  LossScaleStorages scales;
  int storages[LossScaleStorages::kSlots + 1];
  for (int& s : storages) scales.Note(&s);
  EXPECT_FALSE(scales.Contains(&storages[0]));
  for (int i = 1; i <= LossScaleStorages::kSlots; ++i) {
    EXPECT_TRUE(scales.Contains(&storages[i])) << i;
  }
}

}  // namespace
}  // namespace nanhunt
