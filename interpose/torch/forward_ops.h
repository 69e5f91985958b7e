// Which forward op created the autograd node a backward record runs.
//
// A backward record carries the forward thread id and sequence number of
// its node; the forward op's record carried the same sequence number when
// it started. Each forward thread gets a ring of the last kSlots sequence
// numbers; lookups that fell out of the ring return null.
#pragma once

#include <cstdint>

namespace nanhunt {

class ForwardOps {
 public:
  // `name` must live for the process (operator schema names do).
  static void Record(uint64_t thread, int64_t seq, const char* name);
  static const char* Lookup(uint64_t thread, int64_t seq);
};

}  // namespace nanhunt
