// Which forward op created the autograd node a backward record runs.
//
// A backward record carries the forward thread id and sequence number of
// its node; the forward op's record carried the same sequence number when
// it started. Each forward thread gets a ring of the last kSlots sequence
// numbers; lookups that fell out of the ring find nothing.
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace nanhunt {

class ForwardOps {
 public:
  struct Found {
    const char* name = nullptr;
    // The line it was called from, when captured (Monitor::ForwardLineWanted).
    const std::string* line = nullptr;
  };
  // `name` and `line` (or null) must live for the process: operator schema
  // names do, and lines come from InternLine.
  // `stale`: the op computes only of tensors of graphs back-propagated
  // already (a metric of the step's logits after backward): its node is
  // as if back-propagated (Backpropagated).
  static void Record(uint64_t thread, int64_t seq, const char* name,
                     const std::string* line = nullptr, bool stale = false);
  static Found Lookup(uint64_t thread, int64_t seq);
  // How many of the nodes `from` to `to` (excluded) an op named `name`
  // made on `thread` (ForwardLineFills::NamedNodes); -1 when the ring no
  // longer holds them all.
  static int64_t CountNamed(uint64_t thread, int64_t from, int64_t to, absl::string_view name);
  // A backward pass ran node `seq` of `thread`. A thread numbers its nodes
  // in order, and a backward pass runs a graph from its last node (the
  // loss) down: nodes numbered up to the highest it ran belong to graphs
  // back-propagated already, as do stale ones made since (Backpropagated).
  static void BackwardRan(uint64_t thread, int64_t seq);
  static bool Backpropagated(uint64_t thread, int64_t seq);
  // `line` kept for the process, once per distinct line.
  static const std::string* InternLine(const std::string& line);
  // A record named by a string rather than an operator schema (a Python
  // autograd.Function's apply, torch.compile's CompiledFunction) owns its
  // name only while it runs: its backward looks the name up later.
  static const char* InternName(const char* name);
};

}  // namespace nanhunt
