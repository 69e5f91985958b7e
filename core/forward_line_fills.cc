#include "core/forward_line_fills.h"

#include <algorithm>
#include <utility>

namespace nanhunt {

void ForwardLineFills::OnStepBegan(int64_t step, int64_t first_node, uint64_t thread) {
  absl::MutexLock lock(&mu_);
  while (!starts_.empty() && starts_.back().step >= step) starts_.pop_back();
  starts_.push_back(StepStart{step, first_node, thread});
  if (starts_.size() > kRememberedSteps) starts_.pop_front();
  last_start_.store(step, std::memory_order_relaxed);
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

void ForwardLineFills::ExpireLocked(int64_t step) {
  wanted_.erase(std::remove_if(wanted_.begin(), wanted_.end(),
                               [&](const Wanted& w) { return step > w.step + kWantSteps; }),
                wanted_.end());
  any_.store(!wanted_.empty(), std::memory_order_relaxed);
}

bool ForwardLineFills::Want(FindingKey key, int64_t forward_seq, uint64_t forward_thread) {
  absl::MutexLock lock(&mu_);
  const StepStart* start = StartOf(key.step);
  // The node must come after the step began on its thread: a node of an
  // earlier step (a value kept across steps) has no offset that repeats.
  if (start == nullptr || start->first_node < 0 || start->thread != forward_thread ||
      forward_seq < start->first_node) {
    return false;
  }
  const int64_t offset = forward_seq - start->first_node;
  for (Wanted& w : wanted_) {
    if (w.thread == forward_thread && w.offset == offset && w.forward_op == key.forward_op) {
      w.step = std::max(w.step, key.step);
      w.keys.push_back(std::move(key));
      return true;
    }
  }
  constexpr size_t kMaxWanted = 256;  // more distinct nodes than a first overflow spreads to
  if (wanted_.size() >= kMaxWanted) return false;
  const int64_t step = key.step;
  std::string forward_op = key.forward_op;
  wanted_.push_back(Wanted{forward_thread, offset, step, std::move(forward_op), {std::move(key)}});
  any_.store(true, std::memory_order_relaxed);
  return true;
}

std::vector<ForwardLineFills::Fill> ForwardLineFills::OnLine(int64_t step, absl::string_view name,
                                                             int64_t seq, uint64_t thread,
                                                             absl::string_view line) {
  std::vector<Fill> fills;
  absl::MutexLock lock(&mu_);
  ExpireLocked(step);
  const StepStart* start = StartOf(step);
  if (start == nullptr || start->first_node < 0 || start->thread != thread ||
      seq < start->first_node) {
    return fills;
  }
  const int64_t offset = seq - start->first_node;
  for (auto it = wanted_.begin(); it != wanted_.end(); ++it) {
    // A later step's call: the wanted step's own nodes' lines are gone.
    if (it->thread != thread || it->offset != offset || it->forward_op != name ||
        step <= it->step) {
      continue;
    }
    for (FindingKey& key : it->keys) fills.push_back(Fill{std::move(key), std::string(line)});
    wanted_.erase(it);
    break;
  }
  any_.store(!wanted_.empty(), std::memory_order_relaxed);
  return fills;
}

}  // namespace nanhunt
