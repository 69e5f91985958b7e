#include "interpose/torch/compiled_regions.h"

#include <atomic>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "interpose/torch/forward_ops.h"

namespace nanhunt {
namespace {

std::atomic<uint64_t> g_updates{0};

}  // namespace

bool IsCompiledRegionRecord(absl::string_view record_name) {
  // Dynamo's record around each compiled frame names its compile id (torch
  // 2.3 on); the backward graph runs inside the node of the
  // autograd.Function AOTAutograd made ("CompiledFunction").
  return absl::StartsWith(record_name, "Torch-Compiled Region") ||
         record_name == "CompiledFunctionBackward";
}

CompiledRegionSeen NoteCompiledRegion(absl::string_view name, absl::string_view line) {
  // Interned: a region runs once an iteration or so, from a handful of
  // compiled frames, and its record's name lives only while it runs.
  CompiledRegionSeen seen;
  seen.label = *ForwardOps::InternLine(
      line.empty() ? std::string(name) : absl::StrCat(name, ", called at ", line));
  seen.updates = g_updates.load(std::memory_order_relaxed);
  return seen;
}

void NoteUpdateEnded() { g_updates.fetch_add(1, std::memory_order_relaxed); }

CompiledRegionSeen SinceLastUpdate(const CompiledRegionSeen& last) {
  if (last.updates != g_updates.load(std::memory_order_relaxed)) return {};
  return last;
}

}  // namespace nanhunt
