// NANHUNT_GPU_BATCH: op outputs on a GPU held back and checked together,
// one kernel launch per format for the outputs of several ops, instead of
// one launch after every op. The launch is most of a check's host cost
// (4.13 of 6.26 us on an H200), and with every op checked that host work,
// not the GPU, sets the pace of a GPT-2 step.
//
// A held-back check is right as long as its tensor keeps the values its op
// left until the check runs. The caller keeps every held tensor alive (its
// memory cannot be reused while its storage owns it), and a batch is
// enqueued on its tensors' stream before anything that could change them:
//   - an op that writes memory a held check reads (in-place, out=,
//     collectives, fills, all judged by storage: a view's write counts for
//     its whole storage), or that may write anything (no schema): every
//     batch. Writes elsewhere flush nothing: autocast's casts copy into new
//     tensors (_to_copy's copy_) in every layer, and flushing at every
//     write made batches of 2.6 checks in a tiny GPT-2 step's ops, against ~27
//     with this rule (bench/batch_replay.py, design.md);
//   - an op whose thread's current stream on a batch's device is another
//     one: that batch, and that stream is made to wait for it on the
//     device, so that a write there (after the program synchronised the two
//     streams, which nanhunt does not see) cannot overtake the check;
//   - `max_checks` outputs or `max_bytes` held (the memory kept alive);
//   - reads of values (GradScaler's scale), the end of the process: TakeAll.
// A storage can also give its memory back without any op (FSDP frees
// parameters with `untyped_storage().resize_(0)`): the caller takes such
// checks out (TakeReleased) and counts them as unchecked, never launched
// over memory that may hold something else by then.
// Writes that bypass torch's operators (torch.compile's Triton kernels,
// apex, extensions that launch their own kernels) are not seen: with those,
// keep NANHUNT_GPU_BATCH=1, which holds nothing back.
//
// Results stay in op order: a device holds one batch at a time (a stream
// change flushes the older one first), and a batch is enqueued in order.
// Not thread-safe: the caller serialises, and enqueues the flushes it is
// given in order before letting go, so that rings see them in that order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace nanhunt {

// Memory a held check reads, or an op writes: [begin, end) of a storage.
struct MemoryRange {
  uintptr_t begin = 0, end = 0;
  bool Overlaps(const MemoryRange& o) const { return begin < o.end && o.begin < end; }
  bool operator==(const MemoryRange& o) const { return begin == o.begin && end == o.end; }
};

// What an op about to start may write.
struct OpWrites {
  bool anything = false;            // unknown (no schema): every held check's memory
  std::vector<MemoryRange> ranges;  // the storages of the arguments it writes
};

// `Entry` has a `MemoryRange memory`: its storage's memory when it was held.
template <class Entry>
class CheckBatches {
 public:
  struct Key {
    int device = 0;
    void* stream = nullptr;  // null is a real stream: the default one
  };
  // Entries to enqueue now, in order, on `key.stream`; then, when
  // `order_after`, make `waiting_stream` wait for them.
  struct Flush {
    Key key;
    std::vector<Entry> entries;
    bool order_after = false;
    void* waiting_stream = nullptr;
  };

  CheckBatches(int max_checks, int64_t max_bytes)
      : max_checks_(max_checks), max_bytes_(max_bytes) {}

  bool empty() const { return batches_.empty(); }

  // Before an op starts: what it may write, and
  // `current_stream(device)`, the thread's current stream there (void*).
  // Templates, not std::function: asked at every op start while checks are
  // held, with an indirect call per held entry otherwise.
  template <class CurrentStream>
  std::vector<Flush> BeforeOp(const OpWrites& writes, CurrentStream&& current_stream) {
    const bool overwrites = writes.anything || HoldsAnyOf(writes.ranges);
    std::vector<Flush> flushes;
    for (size_t i = 0; i < batches_.size();) {
      void* now = current_stream(batches_[i].key.device);
      const bool moved = now != batches_[i].key.stream;
      if (!overwrites && !moved) {
        ++i;
        continue;
      }
      flushes.push_back(Take(i, moved, now));
    }
    return flushes;
  }

  // After an op: holds its outputs on `key` (`bytes` their size). Returns
  // what to enqueue now: a batch of the same device on another stream
  // first (older), then this one if it is full.
  std::vector<Flush> Add(Key key, std::vector<Entry> entries, int64_t bytes) {
    std::vector<Flush> flushes;
    for (size_t i = 0; i < batches_.size();) {
      if (batches_[i].key.device == key.device && batches_[i].key.stream != key.stream) {
        flushes.push_back(Take(i, /*order_after=*/true, key.stream));
      } else {
        ++i;
      }
    }
    Batch* batch = nullptr;
    for (Batch& b : batches_) {
      if (b.key.device == key.device) batch = &b;
    }
    if (batch == nullptr) {
      batches_.push_back(Batch{key, {}, 0});
      batch = &batches_.back();
      // Filled to max_checks_ one op at a time: moved once each, not on
      // every doubling, into a vector of an earlier batch when there is one.
      if (!spare_.empty()) {
        batch->entries = std::move(spare_.back());
        spare_.pop_back();
      }
      batch->entries.reserve(static_cast<size_t>(max_checks_));
    }
    for (Entry& e : entries) batch->entries.push_back(std::move(e));
    batch->bytes += bytes;
    if (static_cast<int64_t>(batch->entries.size()) >= max_checks_ ||
        batch->bytes >= max_bytes_) {
      flushes.push_back(Take(static_cast<size_t>(batch - batches_.data()), false, nullptr));
    }
    return flushes;
  }

  // Entries whose memory their storage gave back (`released`), taken out
  // in order. Their batches' byte counts stay as they were: a batch that
  // lost entries is enqueued a little early, never late. `released(entry)`
  // returns bool.
  template <class Released>
  std::vector<Entry> TakeReleased(Released&& released) {
    std::vector<Entry> taken;
    // Asked at every op start: look until one is, move nothing when none is.
    bool any = false;
    for (const Batch& b : batches_) {
      for (const Entry& e : b.entries) {
        if (released(e)) {
          any = true;
          break;
        }
      }
      if (any) break;
    }
    if (!any) return taken;
    for (size_t i = 0; i < batches_.size();) {
      std::vector<Entry>& entries = batches_[i].entries;
      std::vector<Entry> kept;
      for (Entry& e : entries) (released(e) ? taken : kept).push_back(std::move(e));
      entries = std::move(kept);
      if (entries.empty()) {
        batches_.erase(batches_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    return taken;
  }

  // A flushed batch's `entries`, emptied by the caller, back for a later
  // batch: no allocation of max_checks_ entries a batch.
  void Recycle(std::vector<Entry> entries) {
    entries.clear();
    if (spare_.size() < kSpares) spare_.push_back(std::move(entries));
  }

  // Everything held, in order, without waits.
  std::vector<Flush> TakeAll() {
    std::vector<Flush> flushes;
    while (!batches_.empty()) flushes.push_back(Take(0, false, nullptr));
    return flushes;
  }

 private:
  struct Batch {
    Key key;
    std::vector<Entry> entries;
    int64_t bytes = 0;
  };

  bool HoldsAnyOf(const std::vector<MemoryRange>& ranges) const {
    for (const MemoryRange& r : ranges) {
      for (const Batch& b : batches_) {
        for (const Entry& e : b.entries) {
          if (e.memory.Overlaps(r)) return true;
        }
      }
    }
    return false;
  }

  Flush Take(size_t i, bool order_after, void* waiting_stream) {
    Flush f{batches_[i].key, std::move(batches_[i].entries), order_after, waiting_stream};
    batches_.erase(batches_.begin() + static_cast<std::ptrdiff_t>(i));
    return f;
  }

  static constexpr size_t kSpares = 4;  // a batch a device, and one spare
  const int max_checks_;
  const int64_t max_bytes_;
  std::vector<Batch> batches_;  // one per device at most
  std::vector<std::vector<Entry>> spare_;  // emptied, capacity kept (Recycle)
};

}  // namespace nanhunt
