// Op outputs that no check read, by op, phase and reason, so that the trace
// names the ops and says why (a count alone cannot tell a user which part
// of the model went unwatched): outputs captured into a CUDA graph, GPU
// checks that could not be enqueued, held-back checks whose memory went
// first, tensors the check cannot read (sparse). Only the paths that
// leave an output unchecked call Add: a checked op never pays for it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "absl/synchronization/mutex.h"
#include "core/phase.h"
#include "core/trace_rows.h"

namespace nanhunt {

enum class UncheckedReason : uint8_t {
  kGraphCapture,  // captured into a CUDA graph: garbage until replay
  kNotEnqueued,   // the GPU check could not be enqueued
  kReleased,      // held back for a batch, its memory went first
  kGpuPathOff,    // libnanhunt_cuda.so did not load
  kUnreadable,    // mkldnn, other devices', sparse on a GPU: not read
  kArrivesLater,  // copied from a GPU with non_blocking=True: not there at the op's end
};

// The trace's name of a reason: "graph_capture", "not_enqueued",
// "released_before_check", "gpu_path_off", "unreadable",
// "copied_from_gpu_async".
absl::string_view UncheckedReasonName(UncheckedReason reason);

class UncheckedOutputs {
 public:
  // Distinct (op, phase, reason) kept at most; outputs of more are counted
  // under the op "(other ops)", so a pathological program cannot grow this.
  static constexpr size_t kMaxKeys = 4096;

  // `n` outputs of `op` went unchecked for `reason` at `step`. Thread-safe.
  void Add(absl::string_view op, Phase phase, UncheckedReason reason, int64_t step,
           int64_t n = 1);

  // One row per (op, phase, reason), most outputs first (then by op).
  std::vector<UncheckedRow> Rows() const;

 private:
  struct Key {
    std::string op;
    Phase phase;
    UncheckedReason reason;
    template <typename H>
    friend H AbslHashValue(H h, const Key& k) {
      return H::combine(std::move(h), k.op, k.phase, k.reason);
    }
    bool operator==(const Key& o) const {
      return op == o.op && phase == o.phase && reason == o.reason;
    }
  };
  struct Counts {
    int64_t outputs = 0, first_step = 0, last_step = 0;
  };
  mutable absl::Mutex mu_;
  absl::flat_hash_map<Key, Counts> counts_ ABSL_GUARDED_BY(mu_);
};

// The reasons counted in the trace's `outputs_unchecked` (all but graph
// capture, which `outputs_in_graph_capture` counts).
inline constexpr UncheckedReason kCountedUnchecked[] = {
    UncheckedReason::kNotEnqueued, UncheckedReason::kReleased, UncheckedReason::kGpuPathOff,
    UncheckedReason::kUnreadable, UncheckedReason::kArrivesLater};

// Why host outputs went unchecked, for the trace's `unchecked_reason`: the
// host's reasons among `rows` (unreadable tensors when none is named).
std::string HostUncheckedReasons(const std::vector<UncheckedRow>& rows);

// "aten::mm (forward) 96, aten::add_ (optimizer) 48 and 3 other ops": the
// ops of `rows` for any of `reasons`, most outputs first, at most `max_ops`
// named. Empty when no row has one of them.
std::string DescribeUncheckedOps(const std::vector<UncheckedRow>& rows,
                                 absl::Span<const UncheckedReason> reasons,
                                 size_t max_ops = 3);

}  // namespace nanhunt
