#include "interpose/torch/forward_ops.h"

#include <atomic>
#include <memory>
#include <vector>

#include "absl/container/node_hash_set.h"
#include "absl/synchronization/mutex.h"

namespace nanhunt {
namespace {

constexpr int64_t kSlots = 1 << 16;

struct Slot {
  std::atomic<int64_t> seq{-1};
  std::atomic<const char*> name{nullptr};
  std::atomic<const std::string*> line{nullptr};
  std::atomic<bool> stale{false};
};

struct Ring {
  uint64_t thread;
  std::unique_ptr<Slot[]> slots{new Slot[kSlots]};
  // The highest node number of this thread a backward pass ran.
  std::atomic<int64_t> backpropagated{-1};
};

absl::Mutex g_mu;
// Leaked on purpose (lives for the process); rings are never removed, so a
// pointer to one stays valid without the lock.
auto* g_rings = new std::vector<Ring*>();

Ring* FindRing(uint64_t thread, bool create) {
  absl::MutexLock lock(&g_mu);
  for (Ring* r : *g_rings) {
    if (r->thread == thread) return r;
  }
  if (!create) return nullptr;
  auto* r = new Ring{thread};
  g_rings->push_back(r);
  return r;
}

// `thread`'s ring, made when missing, through the last one this thread
// asked for (a backward thread serves one forward thread at a time).
Ring* CachedRing(uint64_t thread) {
  thread_local Ring* last = nullptr;
  if (last == nullptr || last->thread != thread) last = FindRing(thread, true);
  return last;
}

}  // namespace

void ForwardOps::Record(uint64_t thread, int64_t seq, const char* name,
                        const std::string* line, bool stale) {
  thread_local Ring* mine = nullptr;
  if (mine == nullptr || mine->thread != thread) mine = FindRing(thread, true);
  Slot& s = mine->slots[seq & (kSlots - 1)];
  // Relaxed: a torn record at worst names the wrong op for a backward node
  // racing with its own forward thread, which autograd does not do.
  s.name.store(name, std::memory_order_relaxed);
  s.line.store(line, std::memory_order_relaxed);
  s.stale.store(stale, std::memory_order_relaxed);
  s.seq.store(seq, std::memory_order_release);
}

ForwardOps::Found ForwardOps::Lookup(uint64_t thread, int64_t seq) {
  if (seq < 0) return {};
  Ring* r = FindRing(thread, false);
  if (r == nullptr) return {};
  const Slot& s = r->slots[seq & (kSlots - 1)];
  if (s.seq.load(std::memory_order_acquire) != seq) return {};
  return {s.name.load(std::memory_order_relaxed), s.line.load(std::memory_order_relaxed)};
}

int64_t ForwardOps::CountNamed(uint64_t thread, int64_t from, int64_t to,
                               absl::string_view name) {
  if (from < 0 || to < from || to - from > kSlots) return -1;
  Ring* r = FindRing(thread, false);
  if (r == nullptr) return -1;
  int64_t count = 0;
  for (int64_t seq = from; seq < to; ++seq) {
    const Slot& s = r->slots[seq & (kSlots - 1)];
    // A number no record of nanhunt's took (a node made inside a record it
    // skipped) is no node of that name.
    if (s.seq.load(std::memory_order_acquire) != seq) continue;
    const char* maker = s.name.load(std::memory_order_relaxed);
    count += maker != nullptr && name == maker;
  }
  return count;
}

void ForwardOps::BackwardRan(uint64_t thread, int64_t seq) {
  if (seq < 0) return;  // AccumulateGrad's: made by no forward op
  std::atomic<int64_t>& highest = CachedRing(thread)->backpropagated;
  int64_t now = highest.load(std::memory_order_relaxed);
  while (now < seq && !highest.compare_exchange_weak(now, seq, std::memory_order_relaxed)) {
  }
}

bool ForwardOps::Backpropagated(uint64_t thread, int64_t seq) {
  if (seq < 0) return false;
  Ring* r = CachedRing(thread);
  if (seq <= r->backpropagated.load(std::memory_order_relaxed)) return true;
  const Slot& s = r->slots[seq & (kSlots - 1)];
  return s.seq.load(std::memory_order_acquire) == seq && s.stale.load(std::memory_order_relaxed);
}

const std::string* ForwardOps::InternLine(const std::string& line) {
  static absl::Mutex mu(absl::kConstInit);
  // Leaked on purpose: backward records read the lines until the process ends.
  static auto* lines ABSL_GUARDED_BY(mu) = new absl::node_hash_set<std::string>();
  absl::MutexLock lock(&mu);
  return &*lines->insert(line).first;
}

const char* ForwardOps::InternName(const char* name) {
  return InternLine(name)->c_str();
}

}  // namespace nanhunt
