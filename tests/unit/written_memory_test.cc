// GPU memory nanhunt knows the values of (core/written_memory.h): known by
// address and owning storage, the storage's weak reference made once and
// given back when another storage takes the address or the sweep finds the
// storage gone.
#include "core/written_memory.h"

#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace nanhunt {
namespace {

// Storages standing in for torch's: alive while in g_alive; a weak
// reference is counted in g_weak until released.
std::set<void*> g_alive;
std::multiset<void*> g_weak;

bool Alive(void* impl) { return g_alive.count(impl) > 0; }

using Memory = WrittenMemory::Memory;

WeakStorage WeakOf(void* impl) {
  g_weak.insert(impl);
  return WeakStorage(impl, [](void* p) { g_weak.erase(g_weak.find(p)); });
}

// One read's answer, and one write, as the plugin asks for an op's.
bool Known(const WrittenMemory& written, const void* key, const void* identity) {
  bool known[1] = {false};
  const Memory read{key, identity};
  written.Known(absl::MakeConstSpan(&read, 1), absl::MakeSpan(known));
  return known[0];
}

void Note(WrittenMemory& written, const void* key, void* identity, int* made = nullptr) {
  const Memory write{key, identity};
  written.NoteKnown(absl::MakeConstSpan(&write, 1), [&](size_t) {
    if (made != nullptr) ++*made;
    return WeakOf(identity);
  });
}

class WrittenMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_alive.clear();
    g_weak.clear();
  }
  int memory_[4] = {};
  int storages_[4] = {};
  void* Storage(int i) {
    g_alive.insert(&storages_[i]);
    return &storages_[i];
  }
};

TEST_F(WrittenMemoryTest, MemoryIsKnownOnlyAsOwnedByTheStorageNoted) {
  WrittenMemory written(Alive);
  void* first = Storage(0);
  void* next = Storage(1);
  EXPECT_FALSE(Known(written, &memory_[0], first));
  Note(written, &memory_[0], first);
  EXPECT_TRUE(Known(written, &memory_[0], first));
  EXPECT_FALSE(Known(written, &memory_[1], first));
  // The same address handed to another storage (the caching allocator's
  // reuse): what that storage holds was never noted.
  EXPECT_FALSE(Known(written, &memory_[0], next));
  Note(written, &memory_[0], next);
  EXPECT_TRUE(Known(written, &memory_[0], next));
  EXPECT_FALSE(Known(written, &memory_[0], first));
  // The first storage's reference went with its entry.
  EXPECT_EQ(g_weak.count(first), 0u);
  EXPECT_EQ(g_weak.count(next), 1u);
}

TEST_F(WrittenMemoryTest, AStorageWrittenAgainMakesNoNewReference) {
  WrittenMemory written(Alive);
  void* weight = Storage(0);
  int made = 0;
  for (int step = 0; step < 5; ++step) {  // an in-place update every step
    Note(written, &memory_[0], weight, &made);
  }
  EXPECT_EQ(made, 1);
  EXPECT_EQ(g_weak.count(weight), 1u);
}

TEST_F(WrittenMemoryTest, AnOpsReadsAreAnsweredAndItsWritesNotedEachInTurn) {
  WrittenMemory written(Alive);
  void* weight = Storage(0);
  void* batch = Storage(1);
  void* out = Storage(2);
  Note(written, &memory_[0], weight);
  const Memory reads[] = {{&memory_[1], batch}, {&memory_[0], weight}};
  bool known[2] = {true, false};
  written.NoteKnown({}, [&](size_t) { return WeakOf(weight); });  // nothing to note
  written.Known(reads, absl::MakeSpan(known));
  EXPECT_FALSE(known[0]);
  EXPECT_TRUE(known[1]);
  // The batch, checked at this read, and the output: each its own storage's.
  const Memory writes[] = {{&memory_[1], batch}, {&memory_[2], out}};
  void* storages[] = {batch, out};
  written.NoteKnown(writes, [&](size_t i) { return WeakOf(storages[i]); });
  EXPECT_TRUE(Known(written, &memory_[1], batch));
  EXPECT_TRUE(Known(written, &memory_[2], out));
  EXPECT_EQ(g_weak.size(), 3u);
}

TEST_F(WrittenMemoryTest, NothingIsNotedWithoutAnAddressOrAStorage) {
  WrittenMemory written(Alive);
  void* s = Storage(0);
  Note(written, nullptr, s);
  Note(written, &memory_[0], nullptr);
  EXPECT_EQ(written.size(), 0u);
  EXPECT_TRUE(g_weak.empty());
}

TEST_F(WrittenMemoryTest, EntriesOfStoragesThatAreGoneAreSweptAsTheTableGrows) {
  WrittenMemory written(Alive);
  // One address an output, as activations are: each storage freed before
  // the next is made.
  std::vector<int> addresses(WrittenMemory::kFirstSweep);
  std::vector<int> dead(WrittenMemory::kFirstSweep);
  for (size_t i = 0; i + 1 < addresses.size(); ++i) {
    Note(written, &addresses[i], &dead[i]);
  }
  EXPECT_EQ(written.size(), WrittenMemory::kFirstSweep - 1);
  // The weight is alive; the activations' storages are gone.
  void* weight = Storage(0);
  Note(written, &addresses.back(), weight);
  EXPECT_EQ(written.size(), 1u);
  EXPECT_TRUE(Known(written, &addresses.back(), weight));
  EXPECT_EQ(g_weak.size(), 1u);  // the swept entries gave their references back
}

TEST_F(WrittenMemoryTest, LiveStoragesOutlastTheSweep) {
  WrittenMemory written(Alive);
  std::vector<int> addresses(WrittenMemory::kFirstSweep);
  std::vector<int> storages(WrittenMemory::kFirstSweep);
  for (size_t i = 0; i < addresses.size(); ++i) {
    g_alive.insert(&storages[i]);
    Note(written, &addresses[i], &storages[i]);
  }
  // All alive: the sweep kept them, and waits for twice as many.
  EXPECT_EQ(written.size(), WrittenMemory::kFirstSweep);
  for (size_t i = 0; i < addresses.size(); ++i) {
    EXPECT_TRUE(Known(written, &addresses[i], &storages[i]));
  }
}

}  // namespace
}  // namespace nanhunt
