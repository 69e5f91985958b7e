// The torch.compile regions each thread ran, for OpEvent::compiled_region.
//
// A compiled region runs its fused kernels without dispatching an op per
// operation: nanhunt sees its record ("Torch-Compiled Region: 0/0", around
// the compiled forward; "CompiledFunctionBackward", the node running the
// compiled backward) and the ops it still dispatches (extern matmuls), not
// what the fused kernels write. Non-finite values no checked op made, seen
// after a region ran in the same iteration, came out of it.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace nanhunt {

// Whether a record (not an operator) is a compiled region, or the backward
// node that runs a compiled backward graph.
bool IsCompiledRegionRecord(absl::string_view record_name);

// This thread began region `name`; `line` is where it was called from, or
// empty. Both copied.
void NoteCompiledRegion(absl::string_view name, absl::string_view line);

// An optimizer step ended: the next iteration's data comes in before any
// region of it has run. Step numbers would not do: a model compiled whole
// begins its step inside the region, at the first op that reads a weight.
void NoteUpdateEnded();

// The last region this thread began since the last optimizer step ended
// (empty name when none); its strings live for the process.
struct CompiledRegionSeen {
  absl::string_view name, line;
};
CompiledRegionSeen CompiledRegionThisIteration();

}  // namespace nanhunt
