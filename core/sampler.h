// NANHUNT_MODE=sample: which ops are checked, decided the same way in
// every process (two ranks, or a rerun) given the same seed.
//
// An op call is checked when (a) the run is escalated (a sentinel or a
// sampled op saw something) until a step, (b) its step is one of the fully
// checked steps (one in NANHUNT_SAMPLE_STEPS, chosen by hashing the step),
// or (c) a hash of (seed, step, op name, its call number in the step) falls
// under NANHUNT_SAMPLE_OPS. The hash is fixed (splitmix64), not
// per-process, so ranks running the same code sample alike. (c) applies
// where every op is observed; Python training loops between escalations
// let torch sample op calls instead (interpose/torch/observers.h), and
// use this class for (a), (b), the share and escalation.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace nanhunt {

class Sampler {
 public:
  Sampler(double op_fraction, int64_t every_n_steps, uint64_t seed,
          int64_t escalate_steps);

  // Whether to check this op call. `call` counts op calls within the step.
  bool ShouldCheck(int64_t step, absl::string_view op, int64_t call) const;
  // Whether every op of `step` is checked (a full step, or escalated).
  bool FullStep(int64_t step) const;

  // Checks every op from `step` to `step + escalate_steps`. Returns false
  // when already escalated that far (the caller records each new one).
  bool Escalate(int64_t step);

  // NANHUNT_BUDGET: the share of op calls checked, changed while running.
  double op_fraction() const;
  void set_op_fraction(double fraction);
  int64_t escalated_until() const { return escalated_until_.load(); }
  int64_t escalate_steps() const { return escalate_steps_; }

 private:
  std::atomic<uint64_t> threshold_;  // op_fraction scaled to 2^64
  const int64_t every_n_steps_;
  const uint64_t seed_;
  const int64_t escalate_steps_;
  std::atomic<int64_t> escalated_until_{-1};  // last escalated step
};

// splitmix64: a fixed, well-mixed 64-bit hash step.
uint64_t Mix(uint64_t x);
// FNV-1a of an op name.
uint64_t HashName(absl::string_view name);

}  // namespace nanhunt
