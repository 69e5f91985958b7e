#include "interpose/torch/compiled_regions.h"

#include <atomic>
#include <cstdint>

#include "absl/strings/match.h"
#include "interpose/torch/forward_ops.h"

namespace nanhunt {
namespace {

std::atomic<uint64_t> g_updates{0};

struct Seen {
  CompiledRegionSeen region;
  uint64_t updates = 0;  // g_updates when it began
};
thread_local Seen t_last;

}  // namespace

bool IsCompiledRegionRecord(absl::string_view record_name) {
  // Dynamo's record around each compiled frame names its compile id (torch
  // 2.3 on); the backward graph runs inside the node of the
  // autograd.Function AOTAutograd made ("CompiledFunction").
  return absl::StartsWith(record_name, "Torch-Compiled Region") ||
         record_name == "CompiledFunctionBackward";
}

void NoteCompiledRegion(absl::string_view name, absl::string_view line) {
  // Interned: a region runs once an iteration or so, from a handful of
  // compiled frames, and its record's name lives only while it runs.
  t_last.region.name = *ForwardOps::InternLine(std::string(name));
  t_last.region.line =
      line.empty() ? absl::string_view() : *ForwardOps::InternLine(std::string(line));
  t_last.updates = g_updates.load(std::memory_order_relaxed);
}

void NoteUpdateEnded() { g_updates.fetch_add(1, std::memory_order_relaxed); }

CompiledRegionSeen CompiledRegionThisIteration() {
  if (t_last.region.name.empty() ||
      t_last.updates != g_updates.load(std::memory_order_relaxed)) {
    return {};
  }
  return t_last.region;
}

}  // namespace nanhunt
