// Op outputs that live on a GPU: checked by libnanhunt_cuda.so on the op's
// own stream (loaded at the first such output), classified when the results
// arrive (core/late_ops.h). No host-device synchronisation per op.
#pragma once

#include <ATen/record_function.h>

#include <functional>
#include <string>
#include <vector>

#include "core/late_ops.h"
#include "core/monitor.h"
#include "interpose/torch/enqueue_checks.h"
#include "interpose/torch/op_check.h"

namespace nanhunt {

class Session;

// One finished op, as the plugin knows it from its frames.
struct DeviceOpCall {
  uint64_t id = 0, parent_id = 0;
  const char* name = "";
  const char* overload = "";
  const char* top_op = "";
  const char* forward_op = "";
  absl::string_view forward_source;  // the forward op's line, when captured
  int64_t forward_seq = -1;          // OpEvent::forward_seq
  uint64_t forward_thread = 0;
  Phase phase = Phase::kForward;
  bool grad_enabled = true, takes_grad_input = false, top_level = false;
  bool enclosing_op_judges = true;  // OpEvent::enclosing_op_judges
  absl::string_view compiled_region;  // OpEvent::compiled_region, interned
  uint64_t thread = 0;
  size_t kernel_mark = 0;  // DeviceKernelMark() at the op's start
};


// True when the op had floating-point outputs on a GPU: they are checked
// there (or counted unchecked with the reason) and the CPU path has nothing
// left to do. False for every op without GPU outputs.
bool CheckOnDevice(const DeviceOpCall& call, const std::vector<c10::IValue>& inputs,
                   const std::vector<c10::IValue>& outputs, const OpTraits& traits,
                   Session& session, const std::string& torch_dir);

// Reads one-element floating-point tensors that live on a GPU without
// making the host wait: each is checked on its stream like an op output,
// and `then` gets their values (in order; NaN and ±inf kept, other values
// as magnitudes) on the drain thread once all have arrived. False, with
// `then` never called, when they cannot be read that way.
bool ReadValuesOnDevice(const std::vector<at::Tensor>& tensors, Session& session,
                        std::function<void(const std::vector<double>&)> then);


// Delivers every result still in flight (waits for the GPU). Called before
// the interpreter exits, while CUDA is still up.
void DrainDeviceChecks();

// Whether op `fn` (with `inputs`) made the host wait for GPU memory: a
// .item() (_local_scalar_dense), a blocking copy into host memory. A
// program's own loss scaler reads its gradients' verdict so before it
// skips an update.
bool ReadsDeviceOnHost(const at::RecordFunction& fn, const std::vector<c10::IValue>& inputs);
void NoteHostReadOfDevice();
// Before top-level op `call` is judged: when it begins an iteration after
// one whose backward pass had no update (Monitor::JudgesIterationWithoutUpdate)
// and the program has read a GPU value since the last op that could, every
// check enqueued so far is delivered (waiting for the GPU): whether the
// program skipped its update is judged by the backward pass's results, and
// the ops after them that freed or zeroed its gradients. An iteration that
// read nothing from the GPU cannot have decided to skip: no wait. So, too,
// when `op` reading `parameter` would give the open step up had it made
// inf/NaN (Monitor::WouldGiveUpIteration): whether it did is in its results.
void DeliverResultsBeforeIterationVerdict(const DeviceOpCall& call, Session& session,
                                          const char* op = "", const void* parameter = nullptr);
// Whether the program read a GPU value since the last top-level forward op
// on a parameter with grad mode on.
bool DeviceReadSinceIterationBegan();
// As an optimizer step ends, once a step that updated had made inf/NaN
// (Monitor::update_made_nonfinite; not in sample mode, nor while the
// thread's stream captures a graph): every check enqueued so far is
// delivered (waiting for the GPU), so that the step's verdict on whether
// its inf/NaN outlived it is given now, by what is alive now.
void DeliverResultsBeforeUpdateVerdict(Session& session);


// For the trace: what was enqueued (EnqueueTotals), ring waits, kernel
// launches seen, and why the GPU path or its kernel names are off (empty
// when on).
struct DeviceTotals : EnqueueTotals {
  int64_t waits = 0, kernel_launches = 0;
  // GPU inputs checked where an op first read them: memory no op nanhunt
  // saw wrote (core/written_memory.h).
  int64_t first_reads = 0;
  std::string unavailable;
  std::string kernel_names_off;
};
DeviceTotals GetDeviceTotals();

}  // namespace nanhunt
