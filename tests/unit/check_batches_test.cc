// When held-back GPU checks (NANHUNT_GPU_BATCH) are enqueued: before a
// write to memory a held check reads (or an op that may write anything),
// on a stream change (with the new stream made to wait), when full, and at
// the end; always in op order. Checks whose storage gave its memory back
// are taken out, never enqueued.
#include "core/check_batches.h"

#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace nanhunt {
namespace {

// An output held back: its op's name and its storage's memory.
struct Held {
  std::string name;
  MemoryRange memory;
  Held(const char* n) : name(n), memory(At(next_address++)) {}  // NOLINT: names read best
  Held(std::string n, MemoryRange m) : name(std::move(n)), memory(m) {}
  // A storage of 0x100 bytes at i * 0x1000.
  static MemoryRange At(uintptr_t i) { return {i * 0x1000, i * 0x1000 + 0x100}; }
  static inline uintptr_t next_address = 0x1000;  // far from the tests' own ranges
};
using Batches = CheckBatches<Held>;

void* Stream(int i) { return reinterpret_cast<void*>(static_cast<intptr_t>(i)); }

const OpWrites kReadsOnly;
const OpWrites kMayWriteAnything{true, {}};
OpWrites Writing(MemoryRange r) { return OpWrites{false, {r}}; }

// Every device's current stream is `s`.
std::function<void*(int)> On(void* s) {
  return [s](int) { return s; };
}

std::vector<std::string> Names(const std::vector<Held>& entries) {
  std::vector<std::string> names;
  for (const Held& e : entries) names.push_back(e.name);
  return names;
}
std::vector<std::string> Names(const Batches::Flush& f) { return Names(f.entries); }

TEST(CheckBatchesTest, HoldsOutputsOfSeveralOpsUntilFullThenFlushesThemInOrder) {
  Batches batches(4, 1 << 30);
  const Batches::Key key{0, nullptr};  // the default stream
  EXPECT_TRUE(batches.Add(key, {"mm"}, 100).empty());
  EXPECT_TRUE(batches.BeforeOp(kReadsOnly, On(nullptr)).empty()) << "a reading op changes nothing";
  EXPECT_TRUE(batches.Add(key, {"add", "add2"}, 100).empty());
  auto flushes = batches.Add(key, {"gelu"}, 100);
  ASSERT_EQ(flushes.size(), 1u);
  EXPECT_EQ(Names(flushes[0]), (std::vector<std::string>{"mm", "add", "add2", "gelu"}));
  EXPECT_FALSE(flushes[0].order_after);
  EXPECT_TRUE(batches.empty());
}

// A batch's vector is large (max_checks entries): the next batch fills the
// one an enqueued batch gave back instead of allocating its own.
TEST(CheckBatchesTest, ABatchFillsTheVectorAnEarlierBatchGaveBack) {
  Batches batches(2, 1 << 30);
  const Batches::Key key{0, nullptr};
  auto first = batches.Add(key, {"mm", "add"}, 100);
  ASSERT_EQ(first.size(), 1u);
  const Held* recycled = first[0].entries.data();
  first[0].entries.clear();  // the caller lets its tensors go first
  batches.Recycle(std::move(first[0].entries));
  EXPECT_TRUE(batches.Add(key, {"gelu"}, 100).empty());
  auto second = batches.Add(key, {"mul"}, 100);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(Names(second[0]), (std::vector<std::string>{"gelu", "mul"}));
  EXPECT_EQ(second[0].entries.data(), recycled);
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

TEST(CheckBatchesTest, AnOpThatWritesHeldMemoryFlushesEveryBatchFirst) {
  Batches batches(32, 1 << 30);
  const MemoryRange a{0x10000, 0x10400};
  batches.Add({0, nullptr}, {Held("a", a)}, 1);
  batches.Add({1, nullptr}, {"b"}, 1);
  // add_ on a view of a's storage: its storage is a's.
  auto flushes = batches.BeforeOp(Writing({0x10000, 0x10400}), On(nullptr));
  ASSERT_EQ(flushes.size(), 2u);
  EXPECT_EQ(flushes[0].key.device, 0);
  EXPECT_EQ(flushes[1].key.device, 1);
  EXPECT_FALSE(flushes[0].order_after) << "same stream: stream order is enough";
  EXPECT_TRUE(batches.empty());
}

TEST(CheckBatchesTest, AWriteThatOverlapsHeldMemoryOnlyInPartFlushes) {
  Batches batches(32, 1 << 30);
  batches.Add({0, nullptr}, {Held("a", {0x10000, 0x10400})}, 1);
  EXPECT_TRUE(batches.BeforeOp(Writing({0x10400, 0x10800}), On(nullptr)).empty())
      << "memory just past the held storage";
  EXPECT_TRUE(batches.BeforeOp(Writing({0xfc00, 0x10000}), On(nullptr)).empty())
      << "memory just before it";
  EXPECT_EQ(batches.BeforeOp(Writing({0x10300, 0x10500}), On(nullptr)).size(), 1u);
}

TEST(CheckBatchesTest, WritesToMemoryNobodyHoldsFlushNothing) {
  // Autocast's casts copy into a new tensor (_to_copy's copy_) in every
  // layer; flushing there kept batches at two checks.
  Batches batches(32, 1 << 30);
  batches.Add({0, nullptr}, {"layer_norm"}, 1);
  OpWrites copy_into_new = Writing({0x900000, 0x900100});
  copy_into_new.ranges.push_back({0x0, 0x0});  // an empty storage
  EXPECT_TRUE(batches.BeforeOp(copy_into_new, On(nullptr)).empty());
  batches.Add({0, nullptr}, {"copy_"}, 1);
  auto flushes = batches.TakeAll();
  ASSERT_EQ(flushes.size(), 1u);
  EXPECT_EQ(Names(flushes[0]), (std::vector<std::string>{"layer_norm", "copy_"}));
}

TEST(CheckBatchesTest, AnOpThatMayWriteAnythingFlushesEverything) {
  Batches batches(32, 1 << 30);
  batches.Add({0, nullptr}, {"a"}, 1);
  batches.Add({1, Stream(3)}, {"b"}, 1);
  auto flushes = batches.BeforeOp(kMayWriteAnything,
                                  [](int device) { return device == 0 ? nullptr : Stream(3); });
  ASSERT_EQ(flushes.size(), 2u);
  EXPECT_FALSE(flushes[1].order_after) << "no stream changed";
  EXPECT_TRUE(batches.empty());
}

TEST(CheckBatchesTest, ChecksWhoseMemoryWasReleasedAreTakenOutInOrder) {
  Batches batches(32, 1 << 30);
  batches.Add({0, nullptr}, {"kept1", "freed1"}, 1);
  batches.Add({0, nullptr}, {"kept2", "freed2"}, 1);
  batches.Add({1, nullptr}, {"freed3"}, 1);
  auto released = batches.TakeReleased(
      [](const Held& e) { return e.name.rfind("freed", 0) == 0; });
  EXPECT_EQ(Names(released), (std::vector<std::string>{"freed1", "freed2", "freed3"}));
  auto flushes = batches.TakeAll();
  ASSERT_EQ(flushes.size(), 1u) << "device 1's batch was emptied and is gone";
  EXPECT_EQ(Names(flushes[0]), (std::vector<std::string>{"kept1", "kept2"}));
}

TEST(CheckBatchesTest, AnOpOnAnotherStreamFlushesAndWaitsForTheChecks) {
  Batches batches(32, 1 << 30);
  batches.Add({0, Stream(1)}, {"mm"}, 1);
  auto flushes = batches.BeforeOp(kReadsOnly, On(Stream(2)));
  ASSERT_EQ(flushes.size(), 1u);
  EXPECT_EQ(flushes[0].key.stream, Stream(1)) << "enqueued where the outputs were made";
  EXPECT_TRUE(flushes[0].order_after);
  EXPECT_EQ(flushes[0].waiting_stream, Stream(2));
  // Back to the default stream (null): also a change, also waited for.
  batches.Add({0, Stream(2)}, {"add"}, 1);
  flushes = batches.BeforeOp(kReadsOnly, On(nullptr));
  ASSERT_EQ(flushes.size(), 1u);
  EXPECT_TRUE(flushes[0].order_after);
  EXPECT_EQ(flushes[0].waiting_stream, nullptr);
}

TEST(CheckBatchesTest, OnlyTheDeviceWhoseStreamChangedIsFlushed) {
  Batches batches(32, 1 << 30);
  batches.Add({0, Stream(1)}, {"on0"}, 1);
  batches.Add({1, Stream(5)}, {"on1"}, 1);
  auto flushes = batches.BeforeOp(kReadsOnly, [](int device) { return device == 0 ? Stream(1) : Stream(6); });
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
  std::vector<Held> many;
  for (int i = 0; i < 10; ++i) many.emplace_back("p" + std::to_string(i), Held::At(100 + i));
  auto flushes = batches.Add({0, nullptr}, many, 10);
  ASSERT_EQ(flushes.size(), 1u);
  EXPECT_EQ(flushes[0].entries.size(), 10u) << "the caller splits it into launches, in order";
  EXPECT_TRUE(batches.TakeAll().empty());
}

}  // namespace
}  // namespace nanhunt
