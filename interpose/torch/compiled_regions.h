// The torch.compile regions each thread ran, for OpEvent::compiled_region.
//
// A compiled region runs its fused kernels without dispatching an op per
// operation: nanhunt sees its record ("Torch-Compiled Region: 0/0", around
// the compiled forward; "CompiledFunctionBackward", the node running the
// compiled backward) and the ops it still dispatches (extern matmuls), not
// what the fused kernels write. Non-finite values no checked op made, seen
// after a region ran in the same iteration, came out of it.
#pragma once

#include <cstdint>

#include "absl/strings/string_view.h"

namespace nanhunt {

// Whether a record (not an operator) is a compiled region, or the backward
// node that runs a compiled backward graph.
bool IsCompiledRegionRecord(absl::string_view record_name);

// The last region a thread began: its record's name and the line it was
// called from ("Torch-Compiled Region: 0/0, called at train.py:11 in
// <module>"), living for the process. Kept in the plugin's per-thread
// state, which every op reads already.
struct CompiledRegionSeen {
  absl::string_view label;
  uint64_t updates = 0;  // optimizer steps ended before it began
};

// A region named `name`, called from `line` (or empty), begins now.
CompiledRegionSeen NoteCompiledRegion(absl::string_view name, absl::string_view line);

// An optimizer step ended: the next iteration's data comes in before any
// region of it has run. Step numbers would not do: a model compiled whole
// begins its step inside the region, at the first op that reads a weight.
void NoteUpdateEnded();

// `last` if it began since the last optimizer step ended, else no region.
// Inline for the common case, a program that compiles nothing: one test.
CompiledRegionSeen SinceLastUpdate(const CompiledRegionSeen& last);
inline CompiledRegionSeen ThisIteration(const CompiledRegionSeen& last) {
  return last.label.empty() ? CompiledRegionSeen() : SinceLastUpdate(last);
}

}  // namespace nanhunt
