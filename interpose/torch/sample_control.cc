#include "interpose/torch/sample_control.h"

#include <atomic>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "core/budget.h"
#include "core/sampler.h"
#include "core/self_time.h"
#include "interpose/torch/cuda_library.h"
#include "interpose/torch/observation.h"
#include "interpose/torch/session.h"

namespace nanhunt {

namespace {

std::atomic<int64_t> g_calls_seen{0};
std::atomic<int64_t> g_calls_checked{0};
std::atomic<bool> g_torch_sampled{false};  // torch sampled op calls at some point

// NANHUNT_BUDGET: time spent in checks since the last step, and the step's
// start; the controller is set at start when a budget is configured.
std::atomic<int64_t> g_check_ns{0};
std::atomic<int64_t> g_step_started_ns{0};
std::atomic<BudgetController*> g_budget{nullptr};

// Interventions that act on every op call (fp32 ops, autocast dtype) need
// every op observed.
bool NeedsEveryOp(Session& session) {
  LiveSettings& live = session.live();
  if (live.autocast_bf16.load() || live.fp32_auto.load()) return true;
  absl::MutexLock lock(&live.mu);
  return !live.fp32_ops.empty();
}

}  // namespace

void EscalateSampling(Session& session, const std::string& why, int64_t step) {
  Sampler* sampler = session.sampler();
  if (sampler == nullptr) return;
  if (step < 0) step = session.monitor().step();
  const bool new_window = sampler->Escalate(step);
  ObserveEveryOp(true);  // also when an open window was only extended
  NameKernelsFromNowOn();
  if (!new_window) return;
  const std::string detail = absl::StrCat(
      why, " at step ", step, ": every op checked through step ",
      sampler->escalated_until());
  session.writer().Add(EventRow{static_cast<double>(std::time(nullptr)),
                                "escalated", detail});
  session.writer().Add(EscalationRow{step, sampler->escalated_until(), why,
                                     static_cast<double>(std::time(nullptr))});
  if (!session.config().quiet) fprintf(stderr, "nanhunt: sample mode: %s\n", detail.c_str());
}

void StartBudget(double budget) {
  g_budget.store(new BudgetController(budget));  // leaked, like the session
}

bool BudgetOn() { return g_budget.load(std::memory_order_relaxed) != nullptr; }

void AddCheckTime(int64_t ns) { g_check_ns.fetch_add(ns, std::memory_order_relaxed); }

SampleTotals GetSampleTotals() {
  return SampleTotals{g_calls_seen.load(), g_calls_checked.load(), g_torch_sampled.load()};
}

// A step ended: adjust the share of ops checked to the budget.
void SpendBudget(Session& session) {
  Sampler* sampler = session.sampler();
  BudgetController* budget = g_budget.load(std::memory_order_relaxed);
  if (budget == nullptr || sampler == nullptr) return;
  const int64_t now = SelfTime::NowNs();
  const int64_t started = g_step_started_ns.exchange(now);
  const int64_t spent = g_check_ns.exchange(0);
  if (started == 0) return;
  const double rate = sampler->op_fraction();
  if (auto next = budget->OnStep(now - started, spent, rate)) {
    sampler->set_op_fraction(*next);
    SetSampledShare(*next);
    session.writer().Add(EventRow{
        static_cast<double>(std::time(nullptr)), "sample_rate",
        absl::StrFormat("step %d: checks took %.2f%% of the step at %.4g of op calls; "
                        "now %.4g",
                        session.monitor().step(),
                        100.0 * static_cast<double>(spent) / static_cast<double>(now - started),
                        rate, *next)});
  }
}

// Sample mode, at each step's end: every op observed while escalated, in a
// fully checked step, or for interventions; otherwise torch samples op
// calls, from a seed made of (NANHUNT_SAMPLE_SEED, step) (observers.h).
// Processes without optimizer records (C++ optimizers) never come here and
// keep observing every op, sampled by core/sampler.h's hash.
void UpdateObservation(Session& session) {
  Sampler* sampler = session.sampler();
  if (sampler == nullptr) return;
  const int64_t step = session.monitor().next_step();
  const bool every = sampler->FullStep(step) || NeedsEveryOp(session);
  ObserveEveryOp(every);
  if (every) return;
  g_torch_sampled.store(true);
  ReseedSampling(Mix(static_cast<uint64_t>(session.config().sample_seed) ^
                     Mix(static_cast<uint64_t>(step))));
}

// Sample mode: whether this op call is checked (core/sampler.h). Calls are
// numbered per thread within each step.
bool Sampled(Session& session, const char* name) {
  Sampler* sampler = session.sampler();
  if (sampler == nullptr) return true;
  if (!ObservingEveryOp()) {  // this call reached us because torch sampled it
    g_calls_checked.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  thread_local int64_t t_step = -1, t_call = 0;
  const int64_t step = session.monitor().step();
  if (step != t_step) {
    t_step = step;
    t_call = 0;
  }
  g_calls_seen.fetch_add(1, std::memory_order_relaxed);
  // GradScaler's update ends an iteration the optimizer skipped: always seen.
  if (strcmp(name, kScalerUpdate) == 0) return true;
  if (!sampler->ShouldCheck(step, name, t_call++)) return false;
  g_calls_checked.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool OthersUnchecked(Session& session) {
  const Sampler* sampler = session.sampler();
  return sampler != nullptr && !sampler->FullStep(session.monitor().step());
}

}  // namespace nanhunt
