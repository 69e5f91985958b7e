// When held-back GPU checks (NANHUNT_GPU_BATCH) are enqueued: before a
// write, on a stream change (with the new stream made to wait), when full,
// and at the end; always in op order.
#include "core/check_batches.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace nanhunt {
namespace {

using Batches = CheckBatches<std::string>;

void* Stream(int i) { return reinterpret_cast<void*>(static_cast<intptr_t>(i)); }

// Every device's current stream is `s`.
std::function<void*(int)> On(void* s) {
  return [s](int) { return s; };
}

std::vector<std::string> Names(const Batches::Flush& f) { return f.entries; }

TEST(CheckBatchesTest, HoldsOutputsOfSeveralOpsUntilFullThenFlushesThemInOrder) {
  Batches batches(4, 1 << 30);
  const Batches::Key key{0, nullptr};  // the default stream
  EXPECT_TRUE(batches.Add(key, {"mm"}, 100).empty());
  EXPECT_TRUE(batches.BeforeOp(false, On(nullptr)).empty()) << "a reading op changes nothing";
  EXPECT_TRUE(batches.Add(key, {"add", "add2"}, 100).empty());
  auto flushes = batches.Add(key, {"gelu"}, 100);
  ASSERT_EQ(flushes.size(), 1u);
  EXPECT_EQ(Names(flushes[0]), (std::vector<std::string>{"mm", "add", "add2", "gelu"}));
  EXPECT_FALSE(flushes[0].order_after);
  EXPECT_TRUE(batches.empty());
}

TEST(CheckBatchesTest, TooManyBytesHeldFlushesEarly) {
  Batches batches(32, 1000);
  const Batches::Key key{0, Stream(7)};
  EXPECT_TRUE(batches.Add(key, {"small"}, 10).empty());
  auto flushes = batches.Add(key, {"logits"}, 5000);
  ASSERT_EQ(flushes.size(), 1u);
  EXPECT_EQ(Names(flushes[0]), (std::vector<std::string>{"small", "logits"}));
  EXPECT_EQ(flushes[0].key.stream, Stream(7));
}

TEST(CheckBatchesTest, AnOpThatWritesFlushesEveryBatchFirst) {
  Batches batches(32, 1 << 30);
  batches.Add({0, nullptr}, {"a"}, 1);
  batches.Add({1, nullptr}, {"b"}, 1);
  auto flushes = batches.BeforeOp(true, On(nullptr));
  ASSERT_EQ(flushes.size(), 2u);
  EXPECT_EQ(flushes[0].key.device, 0);
  EXPECT_EQ(flushes[1].key.device, 1);
  EXPECT_FALSE(flushes[0].order_after) << "same stream: stream order is enough";
  EXPECT_TRUE(batches.empty());
}

TEST(CheckBatchesTest, AnOpOnAnotherStreamFlushesAndWaitsForTheChecks) {
  Batches batches(32, 1 << 30);
  batches.Add({0, Stream(1)}, {"mm"}, 1);
  auto flushes = batches.BeforeOp(false, On(Stream(2)));
  ASSERT_EQ(flushes.size(), 1u);
  EXPECT_EQ(flushes[0].key.stream, Stream(1)) << "enqueued where the outputs were made";
  EXPECT_TRUE(flushes[0].order_after);
  EXPECT_EQ(flushes[0].waiting_stream, Stream(2));
  // Back to the default stream (null): also a change, also waited for.
  batches.Add({0, Stream(2)}, {"add"}, 1);
  flushes = batches.BeforeOp(false, On(nullptr));
  ASSERT_EQ(flushes.size(), 1u);
  EXPECT_TRUE(flushes[0].order_after);
  EXPECT_EQ(flushes[0].waiting_stream, nullptr);
}

TEST(CheckBatchesTest, OnlyTheDeviceWhoseStreamChangedIsFlushed) {
  Batches batches(32, 1 << 30);
  batches.Add({0, Stream(1)}, {"on0"}, 1);
  batches.Add({1, Stream(5)}, {"on1"}, 1);
  auto flushes = batches.BeforeOp(false, [](int device) { return device == 0 ? Stream(1) : Stream(6); });
  ASSERT_EQ(flushes.size(), 1u);
  EXPECT_EQ(Names(flushes[0]), std::vector<std::string>{"on1"});
  EXPECT_FALSE(batches.empty());
}

TEST(CheckBatchesTest, OutputsOnAnotherStreamOfTheDeviceFlushTheOlderBatchFirst) {
  Batches batches(32, 1 << 30);
  batches.Add({0, Stream(1)}, {"older"}, 1);
  auto flushes = batches.Add({0, Stream(2)}, {"newer"}, 1);
  ASSERT_EQ(flushes.size(), 1u);
  EXPECT_EQ(Names(flushes[0]), std::vector<std::string>{"older"});
  EXPECT_TRUE(flushes[0].order_after);
  EXPECT_EQ(flushes[0].waiting_stream, Stream(2));
  flushes = batches.TakeAll();
  ASSERT_EQ(flushes.size(), 1u);
  EXPECT_EQ(Names(flushes[0]), std::vector<std::string>{"newer"});
  EXPECT_FALSE(flushes[0].order_after);
}

TEST(CheckBatchesTest, OneOpWithMoreOutputsThanABatchIsFlushedWhole) {
  Batches batches(4, 1 << 30);
  std::vector<std::string> many;
  for (int i = 0; i < 10; ++i) many.push_back("p" + std::to_string(i));
  auto flushes = batches.Add({0, nullptr}, many, 10);
  ASSERT_EQ(flushes.size(), 1u);
  EXPECT_EQ(flushes[0].entries.size(), 10u) << "the caller splits it into launches, in order";
  EXPECT_TRUE(batches.TakeAll().empty());
}

}  // namespace
}  // namespace nanhunt
