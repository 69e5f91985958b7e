#include "core/forward_line_fills.h"

#include <algorithm>
#include <utility>

namespace nanhunt {

std::vector<ForwardLineFills::Fill> ForwardLineFills::OnStepBegan(int64_t step,
                                                                  int64_t first_node,
                                                                  uint64_t thread) {
  std::vector<Fill> fills;
  absl::MutexLock lock(&mu_);
  if (first_node >= 0) ResolveLocked(thread, first_node, fills);
  while (!starts_.empty() && starts_.back().step >= step) starts_.pop_back();
  starts_.push_back(StepStart{step, first_node, thread});
  if (starts_.size() > kRememberedSteps) starts_.pop_front();
  last_start_.store(step, std::memory_order_relaxed);
  any_.store(!wanted_.empty(), std::memory_order_relaxed);
  return fills;
}

void ForwardLineFills::OnTrainingOp(int64_t step, int64_t first_node, uint64_t thread) {
  // Every forward op of a pass before the first step ends: one load, no lock.
  if (last_start_.load(std::memory_order_relaxed) >= step) return;
  absl::MutexLock lock(&mu_);
  if (!starts_.empty() && starts_.back().step >= step) return;
  starts_.push_back(StepStart{step, first_node, thread});
  if (starts_.size() > kRememberedSteps) starts_.pop_front();
  last_start_.store(step, std::memory_order_relaxed);
}

const ForwardLineFills::StepStart* ForwardLineFills::StartOf(int64_t step) const {
  for (auto it = starts_.rbegin(); it != starts_.rend(); ++it) {
    if (it->step == step) return &*it;
    if (it->step < step) break;
  }
  return nullptr;
}

int64_t ForwardLineFills::PositionLocked(int64_t step, int64_t seq, uint64_t thread,
                                         absl::string_view name) const {
  const StepStart* start = StartOf(step);
  // The node must come after the step began on its thread: a node of an
  // earlier step (a value kept across steps) has no place that repeats.
  if (start == nullptr || start->first_node < 0 || start->thread != thread ||
      seq < start->first_node) {
    return -1;
  }
  return named_nodes_ ? named_nodes_(thread, start->first_node, seq, name)
                      : seq - start->first_node;
}

void ForwardLineFills::ExpireLocked(int64_t step) {
  wanted_.erase(std::remove_if(wanted_.begin(), wanted_.end(),
                               [&](const Wanted& w) { return step > w.step + kWantSteps; }),
                wanted_.end());
  any_.store(!wanted_.empty(), std::memory_order_relaxed);
}

bool ForwardLineFills::Want(FindingKey key, int64_t forward_seq, uint64_t forward_thread) {
  absl::MutexLock lock(&mu_);
  const int64_t position = PositionLocked(key.step, forward_seq, forward_thread, key.forward_op);
  if (position < 0) return false;
  for (Wanted& w : wanted_) {
    if (w.thread == forward_thread && w.position == position && w.forward_op == key.forward_op) {
      w.step = std::max(w.step, key.step);
      w.keys.push_back(std::move(key));
      return true;
    }
  }
  constexpr size_t kMaxWanted = 256;  // more distinct nodes than a first overflow spreads to
  if (wanted_.size() >= kMaxWanted) return false;
  const int64_t step = key.step;
  std::string forward_op = key.forward_op;
  wanted_.push_back(
      Wanted{forward_thread, position, step, std::move(forward_op), {std::move(key)}});
  any_.store(true, std::memory_order_relaxed);
  return true;
}

std::vector<ForwardLineFills::Fill> ForwardLineFills::OnLine(int64_t step, absl::string_view name,
                                                             int64_t seq, uint64_t thread,
                                                             absl::string_view line) {
  std::vector<Fill> fills;
  absl::MutexLock lock(&mu_);
  ExpireLocked(step);
  // The calls before this one have made their nodes: theirs are known now.
  ResolveLocked(thread, seq, fills);
  const bool waits = std::any_of(wanted_.begin(), wanted_.end(), [&](const Wanted& w) {
    return w.thread == thread && w.forward_op == name && step > w.step;
  });
  if (waits) {
    constexpr size_t kMaxCalls = 256;
    if (calls_.size() >= kMaxCalls) calls_.pop_front();
    calls_.push_back(Call{step, seq, thread, std::string(name), std::string(line)});
    // Without a ring to ask, a node is its number's first call.
    if (!named_nodes_) ResolveLocked(thread, seq + 1, fills);
  }
  any_.store(!wanted_.empty(), std::memory_order_relaxed);
  return fills;
}

void ForwardLineFills::ResolveLocked(uint64_t thread, int64_t below, std::vector<Fill>& fills) {
  for (auto call = calls_.begin(); call != calls_.end();) {
    if (call->thread != thread || call->seq >= below) {
      ++call;
      continue;
    }
    // A call that made no node of its own (autocast's cast of an input
    // that requires no grad) shares its number with the op that made it.
    const bool made_it =
        !named_nodes_ || named_nodes_(thread, call->seq, call->seq + 1, call->name) == 1;
    const int64_t position =
        made_it ? PositionLocked(call->step, call->seq, thread, call->name) : -1;
    for (auto it = wanted_.begin(); position >= 0 && it != wanted_.end(); ++it) {
      // A later step's call: the wanted step's own nodes' lines are gone.
      if (it->thread != thread || it->position != position || it->forward_op != call->name ||
          call->step <= it->step) {
        continue;
      }
      for (FindingKey& key : it->keys) {
        fills.push_back(Fill{std::move(key), call->line, call->step});
      }
      wanted_.erase(it);
      break;
    }
    call = calls_.erase(call);
  }
}

}  // namespace nanhunt
