// libempty_op_callbacks.so: torch's per-op RecordFunction cost with nothing
// of nanhunt in it. Loaded into a process that already imported torch
// (bench/with_empty_op_callbacks.py), it adds one global callback asking
// for what nanhunt's does (inputs and outputs boxed, the same scopes:
// interpose/torch/observers.cc) and doing nothing with them. What a step
// costs with it, against plain, is the part of every-op checking that torch
// charges whoever observes every op; nanhunt's callbacks and checks are the
// rest (bench/gpt2_bench.py, mode "empty-callbacks").
#include <ATen/record_function.h>

#include <atomic>
#include <cstdint>

namespace {

// How many records the callback saw: proof that it ran, and the op count
// the figures are per. One relaxed increment against the boxing of every
// op's inputs and outputs that asking for them costs.
std::atomic<uint64_t> g_calls{0};

std::unique_ptr<at::ObserverContext> Start(const at::RecordFunction&) {
  g_calls.fetch_add(1, std::memory_order_relaxed);
  return nullptr;
}

void End(const at::RecordFunction&, at::ObserverContext*) {}

// Added when the library loads; never removed (the process ends with it).
const at::CallbackHandle kHandle = at::addGlobalCallback(
    at::RecordFunctionCallback(Start, End)
        .needsInputs(true)
        .needsOutputs(true)
        .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                 at::RecordScope::USER_SCOPE}));

}  // namespace

extern "C" __attribute__((visibility("default"))) uint64_t empty_op_callbacks_calls() {
  return g_calls.load(std::memory_order_relaxed);
}
