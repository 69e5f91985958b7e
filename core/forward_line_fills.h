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
// finding's backward op ran made the k-th node of its name since the step
// began (autograd numbers each node on its forward thread; the plugin's
// ring of forward ops names each number's maker: set_named_nodes), and the
// k-th node of that name in a later step is the same call in the program.
// Its line, captured then, fills the finding's row (TraceWriter:
// ForwardLineRow). Counted by name, not by number: ops of other names
// between an update and the next forward pass (a check of the weights with
// grad on, which begins that step) shift the numbers, not the count. A
// program whose forward pass differs between steps (data-dependent
// branches) may call the op a different number of times, which fills a
// wrong line or none. Without set_named_nodes, the k-th node of any name.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
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
};

class ForwardLineFills {
 public:
  // A finding's line, found.
  struct Fill {
    FindingKey key;
    std::string source;
    int64_t from_step = 0;  // the step of the call whose line it is
  };

  // Steps whose first node is remembered, and a want's life in steps.
  static constexpr size_t kRememberedSteps = 64;
  static constexpr int64_t kWantSteps = 20;

  // How many of the nodes `from` to `to` (excluded) made on `thread` an op
  // named `name` made; -1 when not known (numbers no longer remembered).
  using NamedNodes =
      std::function<int64_t(uint64_t thread, int64_t from, int64_t to, absl::string_view name)>;
  void set_named_nodes(NamedNodes named_nodes) {
    absl::MutexLock lock(&mu_);
    named_nodes_ = std::move(named_nodes);
  }

  // Step `step` began on `thread`, the next node to be numbered there
  // being `first_node` (-1: not known, as when it began at a GPU result).
  // Steps renumbered away (micro-batches found to be one step) are
  // forgotten. The calls numbered before it are known by then: the
  // findings whose line they gave.
  std::vector<Fill> OnStepBegan(int64_t step, int64_t first_node, uint64_t thread);
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

  // A forward op `name` of step `step` was called from `line` while node
  // `seq` was the next on `thread`: the findings whose line an earlier
  // such call's is (removed from the wants). Whether a call made that node
  // is known once the thread numbered the next one (an input's cast that
  // needs no node is numbered as the op after it), so each call waits for
  // a later one.
  std::vector<Fill> OnLine(int64_t step, absl::string_view name, int64_t seq, uint64_t thread,
                           absl::string_view line);

 private:
  struct StepStart {
    int64_t step, first_node;
    uint64_t thread;
  };
  struct Wanted {
    uint64_t thread;
    int64_t position, step;
    std::string forward_op;
    std::vector<FindingKey> keys;
  };
  // A call of a wanted op's name, waiting to be known as its node's maker.
  struct Call {
    int64_t step, seq;
    uint64_t thread;
    std::string name, line;
  };
  const StepStart* StartOf(int64_t step) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The calls on `thread` numbered below `below`, matched to the wants.
  void ResolveLocked(uint64_t thread, int64_t below, std::vector<Fill>& fills)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Where node `seq`, made on `thread` by `name` in `step`, is in its step
  // (the count of that name's nodes before it); -1 when not known.
  int64_t PositionLocked(int64_t step, int64_t seq, uint64_t thread, absl::string_view name) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireLocked(int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::deque<StepStart> starts_ ABSL_GUARDED_BY(mu_);
  std::vector<Wanted> wanted_ ABSL_GUARDED_BY(mu_);
  std::deque<Call> calls_ ABSL_GUARDED_BY(mu_);
  NamedNodes named_nodes_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> any_{false};
  std::atomic<int64_t> last_start_{-1};  // starts_.back().step
};

}  // namespace nanhunt
