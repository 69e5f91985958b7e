// The line of the forward op behind a backward op's first finding.
//
// A backward op runs after its forward op's Python frame is gone, and
// capturing a line at every forward op is too dear (a walk of the Python
// stack under the GIL), so a backward finding's first occurrence has no
// line: the monitor only starts capturing its forward op's lines then
// (Monitor::ForwardLineWanted). Without a fill, a run that dies at its
// first backward overflow never names the line.
//
// A training step repeats its forward pass: the forward op whose node the
// finding's backward op ran was the node created `offset` sequence numbers
// after the step began (autograd numbers each node on its forward thread),
// and the node created at the same offset of a later step, by an op of the
// same name, is the same call in the program. Its line, captured then,
// fills the finding's row (TraceWriter: ForwardLineRow). A program whose
// forward pass differs between steps (data-dependent branches) shifts the
// offsets: the name must match, or nothing is filled.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace nanhunt {

// A finding row, as trace_writer finds it again.
struct FindingKey {
  int64_t step = 0, call_index = 0;
  std::string op, forward_op;
  bool origin = false;  // an origin or input finding (not a warning)
};

class ForwardLineFills {
 public:
  // Steps whose first node is remembered, and a want's life in steps.
  static constexpr size_t kRememberedSteps = 64;
  static constexpr int64_t kWantSteps = 20;

  // Step `step` began on `thread`, the next node to be numbered there
  // being `first_node` (-1: not known, as when it began at a GPU result).
  // Steps renumbered away (micro-batches found to be one step) are
  // forgotten.
  void OnStepBegan(int64_t step, int64_t first_node, uint64_t thread);
  // A forward op on parameters, with grad, started in `step`: its start,
  // when no step began there (the first step, which begins with the
  // process).
  void OnTrainingOp(int64_t step, int64_t first_node, uint64_t thread);

  // `key`'s finding, in step key.step, came from a backward op of the node
  // `forward_seq` made on `forward_thread`; its forward op's line was not
  // captured. False when that node is not in a step whose start is known.
  bool Want(FindingKey key, int64_t forward_seq, uint64_t forward_thread);

  // Whether any want is open: one load, asked after every captured line.
  bool any() const { return any_.load(std::memory_order_relaxed); }

  struct Fill {
    FindingKey key;
    std::string source;
  };
  // A forward op `name` of step `step` made node `seq` on `thread`, called
  // from `line`: the findings whose line that is (removed from the wants).
  std::vector<Fill> OnLine(int64_t step, absl::string_view name, int64_t seq, uint64_t thread,
                           absl::string_view line);

 private:
  struct StepStart {
    int64_t step, first_node;
    uint64_t thread;
  };
  struct Wanted {
    uint64_t thread;
    int64_t offset, step;
    std::string forward_op;
    std::vector<FindingKey> keys;
  };
  const StepStart* StartOf(int64_t step) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void ExpireLocked(int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::deque<StepStart> starts_ ABSL_GUARDED_BY(mu_);
  std::vector<Wanted> wanted_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> any_{false};
  std::atomic<int64_t> last_start_{-1};  // starts_.back().step
};

}  // namespace nanhunt
