#include "core/sampler.h"

#include <cmath>

namespace nanhunt {

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t HashName(absl::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

namespace {

uint64_t Threshold(double fraction) {
  if (fraction >= 1) return UINT64_MAX;
  if (fraction <= 0) return 0;
  return static_cast<uint64_t>(std::ldexp(fraction, 64));
}

}  // namespace

Sampler::Sampler(double op_fraction, int64_t every_n_steps, uint64_t seed,
                 int64_t escalate_steps)
    : threshold_(Threshold(op_fraction)),
      every_n_steps_(every_n_steps),
      seed_(seed),
      escalate_steps_(escalate_steps) {}

bool Sampler::FullStep(int64_t step) const {
  if (step <= escalated_until_.load(std::memory_order_relaxed)) return true;
  return every_n_steps_ > 0 &&
         Mix(seed_ ^ Mix(static_cast<uint64_t>(step))) %
                 static_cast<uint64_t>(every_n_steps_) ==
             0;
}

bool Sampler::ShouldCheck(int64_t step, absl::string_view op, int64_t call) const {
  if (FullStep(step)) return true;
  const uint64_t threshold = threshold_.load(std::memory_order_relaxed);
  if (threshold == 0) return false;
  const uint64_t h = Mix(seed_ ^ Mix(static_cast<uint64_t>(step) ^
                                     Mix(HashName(op) ^ static_cast<uint64_t>(call))));
  return h < threshold;
}

double Sampler::op_fraction() const {
  return std::ldexp(static_cast<double>(threshold_.load()), -64);
}

void Sampler::set_op_fraction(double fraction) { threshold_.store(Threshold(fraction)); }

bool Sampler::Escalate(int64_t step) {
  const int64_t until = step + escalate_steps_;
  int64_t current = escalated_until_.load();
  while (current < until) {
    if (escalated_until_.compare_exchange_weak(current, until)) return current < step;
  }
  return false;
}

}  // namespace nanhunt
