// libnanhunt_torch.so: observes every op of the process through a global
// RecordFunction callback and hands the facts to core/'s Monitor.
//
// Loaded by libnanhunt.so once libtorch is in the process; built against
// the torch of the active Python. Nothing here throws into torch: each
// callback catches everything, reports the first internal error once, and
// turns monitoring off for the rest of the process.
#include <ATen/SequenceNumber.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function.h>

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <thread>
#include <unistd.h>
#include <ctime>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "core/op_policy.h"
#include "core/self_time.h"
#include "interpose/torch/compiled_regions.h"
#include "interpose/torch/cuda_library.h"
#include "interpose/torch/device_outputs.h"
#include "interpose/torch/enqueue_checks.h"
#include "interpose/torch/eps_values.h"
#include "interpose/torch/forward_ops.h"
#include "interpose/torch/loaded_state.h"
#include "interpose/torch/loading_names.h"
#include "interpose/torch/model_tensor_names.h"
#include "interpose/torch/fp32_fallback.h"
#include "interpose/torch/nvml_gpus.h"
#include "interpose/torch/observers.h"
#include "interpose/torch/op_check.h"
#include "interpose/torch/plugin_path.h"
#include "interpose/torch/python_api.h"
#include "interpose/torch/sample_control.h"
#include "interpose/torch/snapshot.h"
#include "interpose/torch/source_location.h"
#include "interpose/torch/session.h"
#include "interpose/torch/tls_address.h"
#include "interpose/torch/torch_compat.h"
#include "interpose/torch_detect.h"

namespace nanhunt {
namespace {

constexpr char kOptimizerStep[] = "Optimizer.step#";
// A frame stack deeper than this means ends we never saw (records ended on
// another thread); start over rather than grow.
constexpr size_t kMaxDepth = 512;

enum class FrameKind : uint8_t { kOp, kBackwardNode, kOptimizer, kOther };

struct Frame {
  const at::RecordFunction* fn = nullptr;
  uint64_t id = 0;  // unique per op call (late results name their parent)
  size_t kernel_mark = 0;  // the thread's GPU kernel launches at its start
  int64_t start_cost_ns = 0;  // NANHUNT_BUDGET: what its start callback took
  bool self_timed = false;    // one of the ops core/self_time.h times
  FrameKind kind = FrameKind::kOther;
  const char* name = nullptr;
  const char* forward_op = nullptr;  // backward nodes
  const std::string* forward_line = nullptr;  // backward nodes, when captured
  int64_t forward_seq = -1;  // backward nodes: their node's number
  uint64_t forward_thread = 0;
  bool contains_finding = false;
  bool contains_warning = false;  // a nested op already warned (near-max)
  bool judged = false;  // the monitor judged this op's outputs
  // When judged: none of its outputs held values the check could not read
  // (a GPU's without the GPU path, sparse on a GPU).
  bool outputs_all_read = false;
  // Grad mode when it started: what the ops nested in it are refined by,
  // as autograd.Function runs its forward with grad mode off (so do
  // torch.compile's graphs, and reentrant checkpointing): a forward pass.
  bool grad_at_start = true;
  bool has_nested = false;  // an op ran inside it
  // It casts memory its enclosing op allocated and has not written yet
  // (CastsResultBufferFirst in core/op_policy.h), or runs inside such a
  // cast: garbage, like torch.empty's output.
  bool reads_garbage = false;
  Verdict verdict = Verdict::kClean;  // when judged
  // Nested ops only this op can explain (Deferral in core/monitor.h), with
  // their outputs, looked at again at this op's end.
  struct Deferred {
    Deferral deferral;
    std::vector<at::Tensor> outputs;
  };
  std::vector<Deferred> deferred;
  std::vector<c10::IValue> inputs;   // ops; capacity reused across ops
  std::vector<InputFacts> written_before;  // in-place ops: args before
  uint64_t cache_mark = 0;  // CacheMark() at the op's start
  const OpTraits* traits = nullptr;  // ops: TraitsOf, looked up at the start
  // Autocast was on when the op started (inside an op autocast intercepted,
  // it is excluded, so this must be read at the start of the outer op).
  // Read only while fp32 fallback is in use, the one thing that needs it.
  bool autocast_on = false;
};

// Per-thread state. Frames are kept (with their vectors' capacity) above
// `depth` so that the hot path does not allocate.
struct ThreadState {
  std::vector<Frame> frames;
  size_t depth = 0;
  bool busy = false;  // inside our own end callback work
  int optimizer_depth = 0;
  std::vector<TensorFacts> output_facts;
  std::vector<at::Tensor> output_tensors;
  CompiledRegionSeen compiled_region;  // the last this thread began

  Frame& Push() {
    if (depth >= kMaxDepth) depth = 0;
    if (frames.size() <= depth) frames.resize(depth + 1);
    Frame& f = frames[depth++];
    f.contains_finding = false;
    f.contains_warning = false;
    f.judged = false;
    f.outputs_all_read = false;
    f.has_nested = false;
    f.reads_garbage = false;
    f.deferred.clear();
    f.forward_op = nullptr;
    f.forward_line = nullptr;
    f.forward_seq = -1;
    f.forward_thread = 0;
    return f;
  }
  // Index of the frame of `fn`, searched from the top; -1 if absent.
  int Find(const at::RecordFunction* fn) const {
    for (size_t i = depth; i-- > 0;) {
      if (frames[i].fn == fn) return static_cast<int>(i);
    }
    return -1;
  }
  // Removes frame `i`. Python's record_function ends its USER_SCOPE record
  // inside a later op, so ends are not always last-in first-out.
  void Remove(size_t i) {
    frames[i].inputs.clear();
    frames[i].deferred.clear();  // tensors: not kept alive past the op
    frames[i].fn = nullptr;
    for (size_t j = i; j + 1 < depth; ++j) std::swap(frames[j], frames[j + 1]);
    --depth;
  }
};

thread_local ThreadState t_state;

std::atomic<bool> g_failed{false};
std::atomic<uint64_t> g_next_op_id{1};
std::atomic<bool> g_guard_fired{false};
std::atomic<int64_t> g_autocast_switches{0};
std::string* g_torch_dir = nullptr;  // leaked on purpose

void ReportInternalError(const char* where, const char* what) {
  if (g_failed.exchange(true)) return;
  if (Session* s = Session::Get()) {
    // The trace and the exit line must not read "all finite" after this.
    s->writer().PutMeta("monitoring_stopped",
                        absl::StrCat("internal error in ", where, ": ", what));
  }
  fprintf(stderr,
          "nanhunt: internal error in %s (%s); monitoring is off for the rest "
          "of this process, training goes on.\n",
          where, what);
}

// NANHUNT_ON_NONFINITE=raise|abort: the first origin (or non-finite input)
// stops training, after the trace has it on disk and, with a snapshot
// directory, after the op's arguments are saved.
void StopAtFirstNonFinite(const Frame& frame, const OpTraits& traits,
                          Session& session) {
  LiveSettings& live = session.live();
  // The finding just made (with a reload to raise mid-run, not the first).
  auto first = session.monitor().last_origin();
  if (!first) return;
  std::string snapshot_dir;
  {
    absl::MutexLock lock(&live.mu);
    snapshot_dir = live.snapshot_dir;
  }
  std::string message = absl::StrFormat(
      "non-finite values first %s %s (%s) at step %d%s%s",
      first->kind == "origin" ? "produced by" : "entered through", first->op,
      first->phase, first->step, first->source.empty() ? "" : " at ",
      first->source);
  if (!snapshot_dir.empty()) {
    auto path = SaveSnapshot(snapshot_dir, traits.handle, frame.inputs, *first);
    absl::StrAppend(&message, path.ok() ? "; snapshot: " + *path
                                        : "; no snapshot: " +
                                              std::string(path.status().message()));
  }
  session.writer().Add(EventRow{static_cast<double>(std::time(nullptr)),
                                "stopped", message});
  session.writer().Flush();
  if (live.on_nonfinite.load() == OnNonFinite::kRaise &&
      RaiseInPython(("nanhunt: " + message).c_str())) {
    fprintf(stderr, "nanhunt: raising NonFiniteError: %s\n", message.c_str());
    return;
  }
  fprintf(stderr, "nanhunt: aborting: %s\n", message.c_str());
  session.Finish();
  std::abort();
}

// A checked op's verdict in sample mode: non-finite values, or a jump in
// the op's headroom (the monitor warns when its max |x| grows), escalate.
void EscalateOnVerdict(Session& session, const std::string& op, Verdict verdict) {
  if (IsQuiet(verdict) || session.sampler() == nullptr) {
    return;
  }
  EscalateSampling(session, absl::StrCat(op, verdict == Verdict::kWarned
                                                 ? " came near the limit"
                                                 : " had non-finite values"));
}

// Inf (no NaN), or values near the limit, in gradients a GradScaler
// scales: the overflow it scales them into on purpose, and skips the step
// for (routinely in its first steps, while its scale settles). Not what
// NANHUNT_ON_NONFINITE stops training for, nor what kernel names are
// started for; NaN made of finite gradients (0/0, sqrt of a negative) is.
template <class Outputs>
bool ScalerOverflow(bool scaled_gradients, const Outputs& outputs) {
  if (!scaled_gradients) return false;
  for (const TensorFacts& t : outputs) {
    if (t.counts.nan != 0) return false;
  }
  return true;
}

// Whether NANHUNT_FP32_OPS=auto learns an op from its verdict: fp16 outputs
// and non-finite values, or fp16 outputs that came near the limit; not a
// wider output near it beside fp16 ones that are far from it (flash
// attention's fp32 log-sum-exp), which fp32 would not help.
template <class Outputs>
bool Fp16AtRisk(Verdict verdict, const Outputs& outputs) {
  if (verdict != Verdict::kOrigin && verdict != Verdict::kWarned) return false;
  for (const TensorFacts& t : outputs) {
    if (t.format == Format::kF16 && (verdict == Verdict::kOrigin || t.counts.near_max > 0)) {
      return true;
    }
  }
  return false;
}

// A GPU op's verdict, on the drain thread: the NaN guard stops training
// (no snapshot: the op's inputs are gone by the time its result arrives),
// and NANHUNT_FP32_OPS=auto learns the op, as for host ops.
void OnLateVerdict(const LateOp& op, Verdict verdict) {
  Session* session = Session::Get();
  if (session == nullptr) return;
  // Kernel names, whose CUPTI callback costs on every launch from then on,
  // are for what the user must find: not for the gradients a GradScaler
  // scaled up to fp16's limit, and past it, on purpose (no NaN among them).
  if (!IsQuiet(verdict) && !ScalerOverflow(op.scaled_gradients, op.outputs)) {
    NameKernelsFromNowOn();
  }
  EscalateOnVerdict(*session, op.op, verdict);
  LiveSettings& live = session->live();
  if (Fp16AtRisk(verdict, op.outputs) && !op.scaled_gradients &&
      live.fp32_auto.load(std::memory_order_relaxed)) {
    std::vector<std::string> learned;
    if (LearnFp32Op(c10::OperatorName(op.op, op.overload))) learned.push_back(op.op);
    if (!op.top_op.empty() && LearnFp32Op(c10::OperatorName(op.top_op, ""))) {
      learned.push_back(op.top_op);
    }
    if (!learned.empty()) {
      session->writer().Add(EventRow{
          static_cast<double>(std::time(nullptr)), "fp32_learned",
          absl::StrCat(absl::StrJoin(learned, ", "), " in fp32 from the next call: ",
                       op.op, verdict == Verdict::kOrigin ? " made non-finite values"
                                                          : " came near fp16's limit",
                       " at step ", op.step)});
    }
  }
  if ((verdict != Verdict::kOrigin && verdict != Verdict::kInput) ||
      live.on_nonfinite.load(std::memory_order_relaxed) == OnNonFinite::kContinue ||
      ScalerOverflow(op.scaled_gradients, op.outputs) || g_guard_fired.exchange(true)) {
    return;
  }
  const std::string message = absl::StrFormat(
      "non-finite values first %s %s (%s) at step %d (checked on the GPU; "
      "no snapshot: its inputs are gone by the time the result arrives)",
      verdict == Verdict::kOrigin ? "produced by" : "entered through", op.op,
      PhaseName(op.phase), op.step);
  session->writer().Add(EventRow{static_cast<double>(std::time(nullptr)),
                                 "stopped", message});
  session->writer().Flush();
  if (live.on_nonfinite.load() == OnNonFinite::kRaise && Python().ok) {
    // Raised from a thread of its own, which takes the GIL: this one may
    // hold nanhunt's locks (a full ring's delivery, held checks being
    // enqueued) that a thread holding the GIL waits for. Python raises
    // the exception when its thread next runs Python code either way.
    std::thread([message, thread = PythonThreadHere()] {
      if (RaiseInPython(("nanhunt: " + message).c_str(), thread)) {
        fprintf(stderr, "nanhunt: raising NonFiniteError: %s\n", message.c_str());
        return;
      }
      fprintf(stderr, "nanhunt: aborting: %s\n", message.c_str());
      std::abort();
    }).detach();
    return;
  }
  fprintf(stderr, "nanhunt: aborting: %s\n", message.c_str());
  std::abort();
}

// `grad_enabled`: grad mode as the op (its top-level op) began. torch.optim
// updates with grad mode off; what runs inside its step with grad mode on
// is a closure's forward pass (LBFGS, SAM's second pass re-evaluating the
// loss). `scales_loss`: a GradScaler op (OpTraits), the update's wherever
// it runs.
Phase CurrentPhase(const ThreadState& ts, bool grad_enabled, bool scales_loss = false) {
  if (torch_compat::InBackward()) return Phase::kBackward;
  if ((ts.optimizer_depth > 0 && !grad_enabled) || scales_loss) return Phase::kOptimizer;
  return Phase::kForward;
}

std::string StepGuardScript() {
  const std::string lib = PluginPath();
  return lib.substr(0, lib.rfind('/')) + "/../share/nanhunt/step_guard.py";
}

// step_guard.py, loaded once per process (the GradScaler wrapper loads it
// before the step guard does): prefixed to the code that uses it.
std::string WithStepGuard(const char* code) {
  static constexpr char kLoad[] = R"py(
import sys
def _load_guard():
    guard = sys.modules.get("nanhunt_step_guard")
    if guard is None:
        import importlib.util
        spec = importlib.util.spec_from_file_location("nanhunt_step_guard", SCRIPT)
        guard = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(guard)
        sys.modules["nanhunt_step_guard"] = guard
    return guard
)py";
  return std::string(kLoad) + code;
}

// Registers step_guard.py's optimizer hooks, once, at the first optimizer
// step (torch.optim cannot be imported while torch itself is still being
// imported, when this plugin starts), in every mode: they name each
// optimizer that steps, so that a GAN's two updates are one step; with
// NANHUNT_SKIP_NONFINITE_STEPS they skip, in sample mode they are its
// sentinel. The hooks are registered inside Optimizer.step's record,
// before it reads them. Without skipping or sampling, a failure costs only
// the naming, and says nothing.
void InstallStepGuard() {
  static std::atomic<bool> tried{false};
  if (tried.exchange(true)) return;
  const std::string lib = PluginPath();
  const std::string script = StepGuardScript();
  Session* session = Session::Get();
  const bool sentinel = session->sampler() != nullptr;
  const bool skip = session->live().skip_nonfinite_steps.load(std::memory_order_relaxed);
  const bool says = sentinel || skip;
  static constexpr char kInstall[] = R"py(
try:
    _load_guard().install(LIBRARY, SENTINEL, SKIP)
except Exception as e:
    import sys
    if SAYS == "1":
        print(f"nanhunt: the gradient check cannot work here ({e!r}); no step is "
              "skipped and sample mode has no sentinel", file=sys.stderr)
)py";
  if (!RunPython(WithStepGuard(kInstall).c_str(),
                 {{"SCRIPT", script}, {"LIBRARY", lib},
                  {"SENTINEL", sentinel ? "1" : "0"}, {"SKIP", skip ? "1" : "0"},
                  {"SAYS", says ? "1" : "0"}}) &&
      says) {
    fprintf(stderr,
            "nanhunt: the gradient check needs torch.optim in a Python "
            "process; no step is skipped and sample mode has no sentinel\n");
  }
}

// step_guard.py's wrappers of GradScaler.scale (watch_loss_scale), which
// names the scale's memory before the first loss is multiplied by it, and
// of nn.Module.load_state_dict (watch_loading), which names the tensors a
// load copies into and reads what a module was assigned: set up at the
// first op once torch has finished importing
// (its classes do not exist before; a model is built with ops before it is
// loaded). Until then, tried at most once a millisecond, and given
// up after a thousand tries: a program that embeds Python but never
// imports torch's module would otherwise pay for a try every millisecond.
void InstallPythonWrappers(ThreadState& ts) {
  static std::atomic<bool> done{false};
  static std::atomic<int64_t> last_try{0};
  static std::atomic<int> tries{0};
  if (done.load(std::memory_order_relaxed)) return;
  if (!Python().ok || tries.load(std::memory_order_relaxed) >= 1000) {
    done.store(true);
    return;
  }
  const int64_t now = SelfTime::NowNs();
  if (now - last_try.load(std::memory_order_relaxed) < 1'000'000) return;
  last_try.store(now, std::memory_order_relaxed);
  tries.fetch_add(1, std::memory_order_relaxed);
  const std::string lib = PluginPath();
  static constexpr char kWatch[] = R"py(
import sys
_torch = sys.modules.get("torch")
if _torch is None or getattr(getattr(_torch, "__spec__", None), "_initializing", False):
    raise ImportError("torch is still being imported")
try:
    _load_guard().watch_loss_scale(LIBRARY)
except Exception as e:
    print(f"nanhunt: GradScaler's scaling cannot be told apart ({e!r}); the "
          "scaled loss may be reported as nearing fp16's limit", file=sys.stderr)
try:
    _load_guard().watch_loading(LIBRARY)
except Exception as e:
    print(f"nanhunt: load_state_dict cannot be watched ({e!r}); on a GPU, inf/NaN a "
          "checkpoint copies into a model go without the tensor's name, and those a model "
          "is assigned are blamed on the op that first reads them", file=sys.stderr)
)py";
  ts.busy = true;  // the wrappers' installation is not the model's
  if (RunPython(WithStepGuard(kWatch).c_str(), {{"SCRIPT", StepGuardScript()}, {"LIBRARY", lib}})) {
    done.store(true);
  }
  ts.busy = false;
}

// NANHUNT_FP32_OPS=auto: the op that overflowed or came near the limit runs
// in fp32 from its next call on, with the op autocast reached it through.
void LearnFromFinding(const at::RecordFunction& fn, const Frame* top,
                      Verdict verdict, Session& session) {
  std::vector<std::string> learned;
  if (auto name = fn.operator_name(); name && LearnFp32Op(*name)) {
    learned.push_back(name->name);
  }
  if (top != nullptr && top->autocast_on) {
    if (auto name = top->fn->operator_name(); name && LearnFp32Op(*name)) {
      learned.push_back(name->name);
    }
  }
  if (learned.empty()) return;
  const int64_t step = session.monitor().step();
  const std::string why =
      verdict == Verdict::kOrigin ? "made non-finite values" : "came near fp16's limit";
  session.writer().Add(EventRow{
      static_cast<double>(std::time(nullptr)), "fp32_learned",
      absl::StrCat(absl::StrJoin(learned, ", "), " run", learned.size() > 1 ? "" : "s",
                   " in fp32 from the next call: ", fn.name(), " ", why,
                   " at step ", step)});
  if (!session.config().quiet) {
    fprintf(stderr, "nanhunt: NANHUNT_FP32_OPS=auto: %s now run%s in fp32 (%s %s at step %lld)\n",
            absl::StrJoin(learned, ", ").c_str(), learned.size() > 1 ? "" : "s",
            fn.name(), why.c_str(), static_cast<long long>(step));
  }
  std::vector<std::string> policy = session.config().fp32_ops;
  for (std::string& op : LearnedFp32Ops()) {
    if (std::find(policy.begin(), policy.end(), op) == policy.end()) {
      policy.push_back(std::move(op));
    }
  }
  absl::Status written = WritePolicyFile(
      session.PolicyPath(), policy,
      absl::StrCat("fp32 ops learned by NANHUNT_FP32_OPS=auto (run ",
                   session.writer().path(), ").\nLoad with NANHUNT_POLICY=",
                   session.PolicyPath(), "; one op per line."));
  if (!written.ok()) {
    fprintf(stderr, "nanhunt: cannot write the fp32 policy: %s\n",
            std::string(written.message()).c_str());
  }
}

// GradScaler's update (`_amp_update_scale_(scale, growth_tracker,
// found_inf, ...)`): it ends an iteration whose optimizer step it skipped,
// and its scale goes into the trace. On a GPU the step is settled now, in
// order with the ops (skipped: no optimizer step ran since the last
// update), and the scale and found_inf are read back without a sync.
constexpr char kScalerSkipped[] =
    "GradScaler skipped the optimizer step (gradients not finite)";

void OnScalerUpdate(const std::vector<c10::IValue>& inputs) {
  Session& session = *Session::Get();
  Monitor& monitor = session.monitor();
  const int64_t step = monitor.step();
  if (auto update = ReadScalerUpdate(inputs)) {
    monitor.OnScalerUpdate(update->scale, update->found_inf);
    // A skip ends its iteration here unless step_guard.py reported it.
    if (update->found_inf && monitor.step() != step) {
      EscalateSampling(session, kScalerSkipped, step);
    }
    return;
  }
  if (inputs.size() < 3 || !inputs[0].isTensor() || !inputs[2].isTensor() ||
      !inputs[0].toTensor().is_cuda()) {
    return;
  }
  const StepTracker::ScalerStep s = monitor.OnScalerUpdateStep();
  if (s.advanced) {
    EscalateSampling(session, kScalerSkipped, step);
  }
  ReadValuesOnDevice({inputs[0].toTensor(), inputs[2].toTensor()}, session,
                     [&monitor, row_step = s.step](const std::vector<double>& v) {
                       monitor.RecordLossScale(row_step, v[0], v[1] != 0);
                     });
}

std::vector<const void*> StoragesOf(c10::ArrayRef<c10::IValue> values) {
  std::vector<const void*> storages;
  for (const c10::IValue& v : values) {
    if (v.isTensor() && v.toTensor().defined()) {
      storages.push_back(StorageKey(v.toTensor()));
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) storages.push_back(StorageKey(t));
    }
  }
  return storages;
}

// A tensor of a graph a backward pass already ran (the step's loss or
// logits), read after backward by a metric or a check of the loss
// (`logits.argmax(1)`, `torch.isfinite(loss)`) before the update: no
// forward pass begins there. Before, such an op began a step, and after
// non-finite gradients was "the next iteration, without an update": a
// skip of the program's. Once the update ended the step, one does, as any
// op on a tensor that requires grad (`print(loss.item())`): the next
// batch's preparation is then the next step's.
bool OfBackpropagatedGraph(const at::Tensor& t) {
  if (t.is_leaf() || Session::Get()->monitor().step_ended()) return false;
  const torch::autograd::Node* node = torch::autograd::impl::grad_fn_unsafe(t);
  return node != nullptr &&
         ForwardOps::Backpropagated(node->thread_id(), static_cast<int64_t>(node->sequence_nr()));
}

// Inputs that require grad, all of graphs back-propagated already: what the
// op makes is too (`(logits.float() - y).pow(2)` after backward).
bool OnlyBackpropagatedGradInputs(c10::ArrayRef<const c10::IValue> inputs) {
  bool any = false;
  for (const c10::IValue& v : inputs) {
    if (!v.isTensor() || !v.toTensor().defined() || !v.toTensor().requires_grad()) continue;
    if (!OfBackpropagatedGraph(v.toTensor())) return false;
    any = true;
  }
  return any;
}

// The first input that requires grad (a parameter), or null; before the
// update, not one of a graph back-propagated already.
const at::Tensor* FirstGradInput(c10::ArrayRef<const c10::IValue> inputs) {
  for (const c10::IValue& v : inputs) {
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().requires_grad() &&
        !OfBackpropagatedGraph(v.toTensor())) {
      return &v.toTensor();
    }
  }
  return nullptr;
}

// The first input that is a parameter proper, a leaf that requires grad,
// or null. Its memory stays its own: an activation's goes back to the
// allocator and comes again under the next tensor made, so that (op,
// memory) pairs of activations repeat within one forward pass.
const at::Tensor* FirstLeafGradInput(c10::ArrayRef<const c10::IValue> inputs) {
  for (const c10::IValue& v : inputs) {
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().requires_grad() &&
        v.toTensor().is_leaf()) {
      return &v.toTensor();
    }
  }
  return nullptr;
}

bool AnyRequiresGrad(c10::ArrayRef<const c10::IValue> inputs) {
  return FirstGradInput(inputs) != nullptr;
}

bool AnyRequiresGrad(const std::vector<c10::IValue>& inputs) {
  return AnyRequiresGrad(c10::ArrayRef<const c10::IValue>(inputs.data(), inputs.size()));
}

// Most ops of a step are views and allocations, whose end has nothing to
// do: tested inline, before the call to OpEnded and its long prologue.
std::vector<c10::IValue> WrittenArguments(const char* op, const std::vector<c10::IValue>& inputs,
                                          const OpTraits& traits) {
  std::vector<c10::IValue> written;
  if (AnnotatesOnly(op)) return written;
  for (int i : traits.written_args) {
    if (i >= 0 && static_cast<size_t>(i) < inputs.size()) {
      written.push_back(inputs[static_cast<size_t>(i)]);
    }
  }
  return written;
}

std::vector<c10::IValue> WithWrittenNotReturned(const std::vector<c10::IValue>& returned,
                                                const std::vector<c10::IValue>& inputs,
                                                const OpTraits& traits) {
  std::vector<c10::IValue> outputs = returned;
  for (int i : traits.written_not_returned) {
    if (static_cast<size_t>(i) < inputs.size()) outputs.push_back(inputs[static_cast<size_t>(i)]);
  }
  return outputs;
}

// `returned` but its output at `index`.
std::vector<c10::IValue> WithoutOutput(const std::vector<c10::IValue>& returned, int index) {
  std::vector<c10::IValue> outputs;
  for (size_t i = 0; i < returned.size(); ++i) {
    if (static_cast<int>(i) != index) outputs.push_back(returned[i]);
  }
  return outputs;
}

// Whether `outputs` hold a tensor whose values are another's
// (WithoutOwnMemory).
bool ReturnsWrappers(const std::vector<c10::IValue>& outputs) {
  for (const c10::IValue& v : outputs) {
    if (v.isTensor() && v.toTensor().defined() && WithoutOwnMemory(v.toTensor())) return true;
  }
  return false;
}

// Whether `outputs` hold a tensor of torch.func.grad's, whose backward
// pass returns gradients to the program, not into .grad.
bool ReturnsGradTransformWrappers(const std::vector<c10::IValue>& outputs) {
  for (const c10::IValue& v : outputs) {
    if (v.isTensor() && v.toTensor().defined() &&
        v.toTensor().key_set().has(c10::DispatchKey::FuncTorchGradWrapper)) {
      return true;
    }
  }
  return false;
}

// Whether the op of `frame` is judged by what it returns at its end: an
// operator that computes (not a record named by a string, as an
// autograd.Function's apply or a torch.compile region are, with no outputs;
// not a view, as aten::to is of its _to_copy).
bool JudgesAtItsEnd(const Frame& frame) {
  return frame.traits != nullptr && frame.traits->handle && !frame.traits->view;
}

bool HasWorkAtEnd(const OpTraits& traits) {
  return !(traits.view || traits.uninitialised) || traits.scaler_update || traits.collective;
}

// An eps the op was given (core/op_policy.h's EpsArgument: a Python float,
// which torch wraps into a double tensor, a Scalar, or torch's own
// scalar_tensor: interpose/torch/eps_values.h) that is 0 in its output's
// format: the clamp or the addition keeps nothing off 0.
void NoteEpsRoundedToZero(const Frame& frame, const std::vector<c10::IValue>& outputs,
                          ThreadState& ts, Monitor& monitor) {
  const auto arg = static_cast<size_t>(frame.traits->eps_arg);
  if (arg >= frame.inputs.size() || outputs.empty() || !outputs[0].isTensor()) return;
  const std::optional<double> given = EpsValueOf(frame.inputs[arg], frame.id);
  if (!given) return;
  const double eps = *given;
  const at::Tensor& out = outputs[0].toTensor();
  if (!out.defined()) return;
  const std::optional<Format> format = torch_compat::FormatOf(out.scalar_type());
  if (!format || !RoundsToZero(*format, eps)) return;
  monitor.OnEpsRoundedToZero(frame.name, *format, eps, [&] {
    ts.busy = true;  // reading the Python stack runs no op of the model's
    std::string source = CaptureSourceLocation(*g_torch_dir, /*frames=*/1).source;
    ts.busy = false;
    return source;
  });
}

void OpEnded(const at::RecordFunction& fn, ThreadState& ts, int index) {
  Frame& frame = ts.frames[index];
  const OpTraits& traits = *frame.traits;
  if (traits.scaler_update) {
    // Its first argument is the scale (also when GradScaler.scale was not
    // seen: another scaler class, or the wrapper not installed).
    if (!frame.inputs.empty() && frame.inputs[0].isTensor()) {
      LossScales().Note(StorageKey(frame.inputs[0].toTensor()));
    }
    OnScalerUpdate(frame.inputs);
  }
  // A view computes nothing: its output is memory an earlier op produced.
  // torch.empty's output is garbage by contract.
  Session* session = Session::Get();
  Monitor& monitor = session->monitor();
  if (traits.collective) {
    // What lands in its tensors comes from other ranks.
    monitor.NoteCollective(StoragesOf(frame.inputs));
  }
  if (traits.reads_on_host && ReadsDeviceOnHost(fn, frame.inputs)) NoteHostReadOfDevice();
  if (traits.view || traits.uninitialised) return;
  // An in-place op that returns nothing (_foreach_addcdiv_, _fused_adam_:
  // torch.optim's foreach and fused updates) has its written arguments for
  // outputs: the parameters and state it updated.
  // One that returns tensors and writes others (batch norm's running
  // statistics) has both for outputs.
  // A workspace among its outputs (_ctc_loss's log_alpha) is left out.
  std::vector<c10::IValue> trimmed;
  const std::vector<c10::IValue>& returned = OwnReturns(fn, traits, trimmed);
  const std::vector<c10::IValue> written =
      returned.empty() ? WrittenArguments(frame.name, frame.inputs, traits)
      : traits.workspace_output >= 0 ? WithoutOutput(returned, traits.workspace_output)
      : traits.written_not_returned.empty()
          ? std::vector<c10::IValue>()
          : WithWrittenNotReturned(returned, frame.inputs, traits);
  const std::vector<c10::IValue>& outputs = written.empty() ? returned : written;
  if (traits.makes_scalar_tensor) NoteScalarTensor(frame.inputs, outputs, frame.id);
  if (traits.eps_arg >= 0) NoteEpsRoundedToZero(frame, outputs, ts, monitor);

  const char* top_op = nullptr;
  const char* forward_op = nullptr;
  const std::string* forward_line = nullptr;
  int64_t forward_seq = -1;
  uint64_t forward_thread = 0;
  Frame* parent = nullptr;
  Frame* top = nullptr;
  bool enclosing_op_judges = false;
  for (int i = index - 1; i >= 0; --i) {
    Frame& f = ts.frames[i];
    if (f.kind == FrameKind::kOp) {
      top_op = f.name;
      top = &f;
      if (parent == nullptr) parent = &f;
      enclosing_op_judges |= JudgesAtItsEnd(f);
    } else if (f.kind == FrameKind::kBackwardNode && forward_op == nullptr) {
      forward_op = f.forward_op;
      forward_line = f.forward_line;
      forward_seq = f.forward_seq;
      forward_thread = f.forward_thread;
    }
  }
  // A batch norm's running statistics are the module's buffers, never what
  // the op around it returns: inf/NaN it was given there, that no op made,
  // came with the model (a checkpoint), not from that op's kernel.
  if (traits.updates_running_stats) enclosing_op_judges = false;
  // The copy_ right inside _to_copy or clone, the fill_ inside zero_ or
  // full, write the tensor the enclosing op returns as it is: its check at
  // its end covers that memory and judges it by its inputs
  // (core/op_policy.h). One check a cast instead of two (autocast casts in
  // every layer), one a torch.zeros instead of three: a kernel launch each
  // on a GPU.
  if (traits.writes_whole_tensor && index > 0 && parent == &ts.frames[index - 1] &&
      parent->traits != nullptr && parent->traits->returns_nested_write) {
    return;
  }
  // Only top-level ops decide steps. A nested op ends before its top-level
  // op does: the first layer of a validation pass under no_grad, right
  // after the optimizer step, is told it is a forward pass by its top's
  // parameters (only that case needs it, so only then is it looked at).
  const bool takes_grad_input =
      top == nullptr ? AnyRequiresGrad(frame.inputs)
                     : !top->grad_at_start && AnyRequiresGrad(top->inputs);
  // Outputs on a GPU are checked there, and judged when results arrive.
  // Copies included: whether their source was finite is not known yet.
  DeviceOpCall call;
  call.id = frame.id;
  call.parent_id = parent != nullptr ? parent->id : 0;
  call.name = frame.name;
  call.overload = torch_compat::OverloadName(fn);
  call.top_op = top_op ? top_op : "";
  call.forward_op = forward_op ? forward_op : "";
  if (forward_line != nullptr) call.forward_source = *forward_line;
  call.forward_seq = forward_seq;
  call.forward_thread = forward_thread;
  call.grad_enabled = top != nullptr ? top->grad_at_start : c10::GradMode::is_enabled();
  call.phase = CurrentPhase(ts, call.grad_enabled, traits.scales_loss);
  call.takes_grad_input = takes_grad_input;
  call.top_level = top_op == nullptr;
  call.enclosing_op_judges = enclosing_op_judges;
  const CompiledRegionSeen region = ThisIteration(ts.compiled_region);
  call.compiled_region = region.label;
  call.thread = fn.threadId();
  call.kernel_mark = frame.kernel_mark;
  if (call.top_level) DeliverResultsBeforeIterationVerdict(call, *session);
  if (CheckOnDevice(call, frame.inputs, outputs, traits, *session, *g_torch_dir)) {
    return;
  }
  // Copies and scalar fills make no new values unless they convert a dtype
  // or are given a non-finite scalar, or a mask constant (whose memory the
  // registry must know: torch.full(..., torch.finfo(dtype).min)).
  if (traits.copies_values && SameFloatingDtype(frame.inputs, outputs)) {
    CarryNonFinite(frame.inputs, outputs, traits);
    monitor.NoteCopy(StoragesOf(frame.inputs), StoragesOf(outputs));
    return;
  }
  if (traits.fills_with_scalar && !HasNonFiniteScalar(frame.inputs) &&
      !HasMaskConstantScalar(frame.name, frame.inputs)) {
    ForgetWholeStorages(outputs);
    return;
  }
  if (CopiedFromGpuLater(frame.inputs, traits)) {
    // Its host outputs hold stale values now (a fp16 gradient copied into a
    // fp32 host buffer, as DeepSpeed's offload does): counted, not judged.
    for (const c10::IValue& v : outputs) {
      if (v.isTensor() && v.toTensor().defined() &&
          torch_compat::FormatOf(v.toTensor().scalar_type())) {
        CountUnchecked(OutputOwner{frame.name, call.phase}, UncheckedReason::kArrivesLater,
                       /*on_device=*/false);
      }
    }
    return;
  }
  ts.output_facts.clear();
  ts.output_tensors.clear();
  // Held only while the op is judged: kept past its end, the last output
  // of each thread outlived the user's last reference (its memory, and its
  // Python object for weakrefs), and went at thread exit, where releasing
  // a Python-held tensor takes the GIL.
  absl::Cleanup release_outputs = [&ts] { ts.output_tensors.clear(); };
  // Ops made of nested ops reuse what those found for the same memory
  // (results remembered since this op began); all others scan.
  frame.outputs_all_read =
      CheckOutputs(outputs, OutputOwner{frame.name, call.phase, -1, traits.composite},
                   monitor.limits(),
                   traits.composed_of_nested_ops ? CacheUse::kReuseOrRemember
                                                 : CacheUse::kRemember,
                   frame.cache_mark, ts.output_facts, ts.output_tensors);
  if (ts.output_facts.empty()) {
    // Wrappers hold no values of their own (torch.func's, a tensor
    // subclass's): the ops they redispatch to, nested in this one, are
    // checked. At the top it still moves the step tracker, as a composite
    // op does: torch.func.grad's backward pass is made of such ops alone,
    // and without them no iteration of a torch.func loop ever ended.
    if (call.top_level && ReturnsWrappers(outputs)) {
      if (call.phase == Phase::kBackward && ReturnsGradTransformWrappers(outputs)) {
        monitor.NoteGradientsReturned();
      }
      monitor.NoteLateOp(call.phase, call.grad_enabled, call.takes_grad_input,
                         /*top_level=*/true, [] { return NonFiniteStillHeld(false); },
                         /*result_follows=*/false);
    }
    return;
  }
  if (!traits.written_not_returned.empty()) {
    NameWrittenNotReturned(frame.inputs, traits, ts.output_tensors, ts.output_facts);
  }
  if (traits.fp32_listed && top != nullptr && top->autocast_on) {
    // Listed, but reached inside an op autocast intercepts: switch that one.
    if (auto name = top->fn->operator_name(); name && ExtendFp32Fallback(*name)) {
      session->writer().Add(EventRow{
          static_cast<double>(std::time(nullptr)), "fp32_extended",
          absl::StrCat(top->name, " runs in fp32 from its next call: it encloses ",
                       frame.name, ", which autocast only reaches through it")});
    }
  }
  OpEvent event;
  event.op = frame.name;
  event.top_op = top_op ? top_op : "";
  event.phase = call.phase;
  event.grad_enabled = call.grad_enabled;
  event.takes_grad_input = takes_grad_input;
  event.forward_op = forward_op ? forward_op : "";
  if (forward_line != nullptr) event.forward_source = *forward_line;
  event.forward_seq = forward_seq;
  event.forward_thread = forward_thread;
  event.outputs = ts.output_facts;
  event.contains_finding = frame.contains_finding;
  event.contains_warning = frame.contains_warning;
  event.composite = traits.composite;
  event.thread = fn.threadId();
  event.loss_scaling = TouchesLossScale(frame.inputs, outputs);
  event.scaled_gradients = ScaledGradients(event.phase);
  event.others_unchecked = OthersUnchecked(*session);
  event.enclosing_op_judges = enclosing_op_judges;
  event.compiled_region = region.label;
  TorchOpContext context(frame.inputs, frame.written_before, ts.output_tensors,
                         traits,
                         monitor.limits(), *g_torch_dir);
  // Its input findings are the enclosing op's to make (Monitor::OnOp).
  if (top_op != nullptr && enclosing_op_judges) context.LeaveModelTensorsUnnamed();
  std::optional<Deferral> deferral;
  const Verdict verdict =
      monitor.OnOp(event, context, parent != nullptr ? &deferral : nullptr);
  frame.judged = true;
  frame.verdict = verdict;
  if (verdict == Verdict::kDeferred && deferral) {
    parent->deferred.push_back(Frame::Deferred{std::move(*deferral), ts.output_tensors});
  }
  EscalateOnVerdict(*session, frame.name, verdict);
  if (Fp16AtRisk(verdict, ts.output_facts) &&
      session->live().fp32_auto.load(std::memory_order_relaxed) && !event.scaled_gradients) {
    LearnFromFinding(fn, top, verdict, *session);
  }
  if ((verdict == Verdict::kOrigin || verdict == Verdict::kInput) &&
      session->live().on_nonfinite.load(std::memory_order_relaxed) !=
          OnNonFinite::kContinue &&
      !ScalerOverflow(event.scaled_gradients, ts.output_facts) &&
      !g_guard_fired.exchange(true)) {
    StopAtFirstNonFinite(frame, traits, *session);
  }
  for (size_t i = 0; i < ts.output_tensors.size(); ++i) {
    RememberChecked(ts.output_tensors[i], StorageStateAfter(verdict, ts.output_facts[i].counts));
  }
  if (!traits.collective) monitor.ForgetCollective(StoragesOf(outputs));
  if (parent != nullptr) {
    parent->contains_finding |= verdict == Verdict::kOrigin ||
                                verdict == Verdict::kInput ||
                                frame.contains_finding;
    parent->contains_warning |=
        verdict == Verdict::kWarned || frame.contains_warning;
  }
}

// Whether an op with `traits` and `inputs`, the first inside `parent`,
// casts the result buffer `parent` has not written yet: a cast of a CPU
// tensor that is not the parent's input (a mean's self is cast inside the
// sum that follows, not first).
bool CastsResultBuffer(const Frame& parent, const OpTraits& traits,
                       c10::ArrayRef<const c10::IValue> inputs) {
  if (!traits.casts || parent.traits == nullptr ||
      !parent.traits->casts_result_buffer_first || inputs.empty() || !inputs[0].isTensor() ||
      parent.inputs.empty() || !parent.inputs[0].isTensor()) {
    return false;
  }
  const at::Tensor& cast = inputs[0].toTensor();
  const at::Tensor& self = parent.inputs[0].toTensor();
  return cast.defined() && self.defined() && cast.device().is_cpu() &&
         !cast.is_alias_of(self);
}

// What the op of `frame`, at its end, made of a nested op's values that
// are `nonfinite` still or not (Settled in core/monitor.h).
Settled SettledBy(const Frame& frame, bool nonfinite) {
  if (!nonfinite) return Settled::kOverwritten;
  if (!frame.judged) return Settled::kStands;
  if (frame.verdict == Verdict::kMasked) return Settled::kMask;
  // Finite outputs, every one read: it kept them out itself.
  if (ReturnsFinite(frame.verdict) && frame.outputs_all_read) return Settled::kLeftOut;
  return Settled::kStands;
}

// At the end of the op of frame `index`, the nested ops it was to explain:
// its verdict says whether their non-finite values were a mask it carried;
// values overwritten since (a buffer's garbage, then written) were never
// data. An op deferred in turn, or not judged (aten::to around a
// _to_copy), hands them on.
void SettleDeferred(ThreadState& ts, int index) {
  Frame& frame = ts.frames[index];
  Frame* parent = nullptr;
  for (int i = index - 1; i >= 0 && parent == nullptr; --i) {
    if (ts.frames[i].kind == FrameKind::kOp) parent = &ts.frames[i];
  }
  if (parent != nullptr && (!frame.judged || frame.verdict == Verdict::kDeferred)) {
    for (Frame::Deferred& d : frame.deferred) parent->deferred.push_back(std::move(d));
    frame.deferred.clear();
    return;
  }
  Session& session = *Session::Get();
  Monitor& monitor = session.monitor();
  for (const Frame::Deferred& d : frame.deferred) {
    bool nonfinite = false;
    for (const at::Tensor& t : d.outputs) {
      TensorFacts facts;
      if (CheckTensor(t, monitor.limits(), facts)) nonfinite |= AnyNonFinite(facts.counts);
    }
    const Settled settled = SettledBy(frame, nonfinite);
    monitor.SettleDeferral(d.deferral, settled);
    if (settled == Settled::kOverwritten) {
      for (const at::Tensor& t : d.outputs) RememberChecked(t, StorageState::kFinite);
    }
    if (settled == Settled::kStands) {
      EscalateOnVerdict(session, d.deferral.op, Verdict::kPropagated);
    }
  }
  frame.deferred.clear();
}

// A step may begin (after a backward pass or an optimizer record): a
// top-level forward op on a tensor that requires grad is judged and may
// begin it at its start, so that its nested ops (which end before it, the
// addmm in the first layer's linear) are the new step's too. A GPU
// program's results come in first, as for the verdict at an op's end.
void BeginStepAtTopLevelOp(const at::RecordFunction& fn, ThreadState& ts) {
  for (size_t i = 0; i + 1 < ts.depth; ++i) {
    if (ts.frames[i].kind == FrameKind::kOp) return;
  }
  // Inputs first: until a process trains, every top-level op comes here,
  // and most take no parameter.
  const at::Tensor* parameter = FirstGradInput(fn.inputs());
  if (parameter == nullptr) return;
  DeviceOpCall call;
  call.grad_enabled = c10::GradMode::is_enabled();
  call.phase = CurrentPhase(ts, call.grad_enabled);  // GradScaler's ops take no parameter
  if (call.phase != Phase::kForward) return;
  call.takes_grad_input = true;
  call.top_level = true;
  Session& session = *Session::Get();
  ts.busy = true;  // as at an op's end: what this runs is no op of the model's
  // Sample mode sees some op calls only: no pair can be told to come
  // twice in a pass. An op on activations alone makes no pair.
  const at::Tensor* leaf = FirstLeafGradInput(fn.inputs());
  const void* pair_parameter =
      session.sampler() == nullptr && leaf != nullptr ? StorageKey(*leaf) : nullptr;
  DeliverResultsBeforeIterationVerdict(call, session, fn.name(), pair_parameter);
  session.monitor().OnTopLevelOpStart(
      call.phase, call.grad_enabled, call.takes_grad_input,
      [] { return NonFiniteStillHeld(/*counting_single_values=*/false); }, fn.name(),
      pair_parameter, static_cast<int64_t>(at::sequence_number::peek()), fn.threadId());
  ts.busy = false;
}

// The line a forward op named `name` is called from, for its backward ops'
// findings, while the monitor wants it (Monitor::ForwardLineWanted); null
// otherwise, or when no user frame is found.
const std::string* ForwardLineIfWanted(ThreadState& ts, const char* name) {
  if (!Session::Get()->monitor().ForwardLineWanted(name)) return nullptr;
  ts.busy = true;  // reading the Python stack runs no op of the model's
  // The innermost user frame only: the walk stops there.
  const SourceLocation where = CaptureSourceLocation(*g_torch_dir, /*frames=*/1);
  ts.busy = false;
  return where.source.empty() ? nullptr : ForwardOps::InternLine(where.source);
}

std::unique_ptr<at::ObserverContext> OnStart(const at::RecordFunction& fn) {
  if (!MonitoringActive() || g_failed.load(std::memory_order_relaxed)) {
    return nullptr;
  }
  ThreadState& ts = KeepAddress(t_state);
  if (ts.busy) return nullptr;
  try {
    Frame& f = ts.Push();
    f.fn = &fn;
    f.id = g_next_op_id.fetch_add(1, std::memory_order_relaxed);
    f.name = fn.name();
    switch (fn.scope()) {
      case at::RecordScope::USER_SCOPE:
        if (strncmp(f.name, kOptimizerStep, sizeof(kOptimizerStep) - 1) == 0) {
          f.kind = FrameKind::kOptimizer;
          ++ts.optimizer_depth;
          Session::Get()->monitor().OnOptimizerStepBegin();
          ts.busy = true;  // importing the hooks runs no op of the model
          InstallStepGuard();
          ts.busy = false;
        } else {
          f.kind = FrameKind::kOther;
        }
        break;
      case at::RecordScope::BACKWARD_FUNCTION:
        f.kind = FrameKind::kBackwardNode;
        {
          const ForwardOps::Found forward = ForwardOps::Lookup(fn.forwardThreadId(), fn.seqNr());
          f.forward_op = forward.name;
          f.forward_line = forward.line;
          f.forward_seq = fn.seqNr();
          f.forward_thread = fn.forwardThreadId();
        }
        // No line: the backward runs from loss.backward(), and its
        // findings' source is the forward line when captured.
        if (IsCompiledRegionRecord(f.name)) ts.compiled_region = NoteCompiledRegion(f.name, {});
        ForwardOps::BackwardRan(fn.forwardThreadId(), fn.seqNr());
        if (Session::Get()->monitor().watches_backward_nodes()) {
          Session::Get()->monitor().OnBackwardNode(fn.seqNr(), fn.forwardThreadId());
        }
        break;
      default: {
        InstallPythonWrappers(ts);
        // Between ops only (see fp32_fallback.h): not inside another op.
        if (ts.depth == 1 || ts.frames[ts.depth - 2].kind != FrameKind::kOp) {
          bool top_level = true;
          for (size_t i = 0; i + 1 < ts.depth && top_level; ++i) {
            top_level = ts.frames[i].kind != FrameKind::kOp;
          }
          if (top_level) EnableFp32OnThisThread();
        }
        if (Session::Get()->live().autocast_bf16.load(std::memory_order_relaxed)) {
          // NANHUNT_AUTOCAST_DTYPE=bf16. The user's autocast context puts
          // its own dtype back on exit.
          if (torch_compat::SwitchAutocastFp16ToBf16(at::kCPU) ||
              torch_compat::SwitchAutocastFp16ToBf16(at::kCUDA)) {
            g_autocast_switches.fetch_add(1, std::memory_order_relaxed);
          }
        }
        if (IsBookkeepingRecord(f.name)) {
          f.kind = FrameKind::kOther;
          break;
        }
        // A GPU program that read a value (its loss) in a step that may be
        // given up: its results may say the step made inf/NaN.
        if (Session::Get()->monitor().step_may_begin() ||
            (Session::Get()->monitor().may_give_up_iteration() && DeviceReadSinceIterationBegan())) {
          BeginStepAtTopLevelOp(fn, ts);
        }
        const OpTraits& traits = TraitsOf(fn);
        if (!traits.handle && IsCompiledRegionRecord(f.name)) {
          ts.busy = true;  // reading the Python stack runs no op of the model's
          ts.compiled_region =
              NoteCompiledRegion(f.name, CaptureSourceLocation(*g_torch_dir, /*frames=*/1).source);
          ts.busy = false;
        }
        if (fn.seqNr() >= 0 && c10::GradMode::is_enabled()) {
          // Schema names live for the process; a string-named record's
          // (an autograd.Function's) only while it runs.
          const char* forward_name =
              traits.handle ? f.name : ForwardOps::InternName(f.name);
          const std::string* line = ForwardLineIfWanted(ts, forward_name);
          ForwardOps::Record(fn.threadId(), fn.seqNr(), forward_name, line,
                             OnlyBackpropagatedGradInputs(fn.inputs()));
          // Fills the line of a finding of an earlier step's same call.
          if (line != nullptr) {
            Session::Get()->monitor().OnForwardLine(forward_name, fn.seqNr(), fn.threadId(), *line);
          }
        }
        if (DeviceChecksHeld()) {
          // NANHUNT_GPU_BATCH: checks held back run before this op could
          // change their tensors.
          ts.busy = true;
          EnqueueHeldChecksBefore(fn, traits);
          ts.busy = false;
        }
        if (!Sampled(*Session::Get(), f.name)) {
          f.fn = nullptr;  // not this one: no frame, nothing at its end
          --ts.depth;
          break;
        }
        f.kind = FrameKind::kOp;
        f.grad_at_start = c10::GradMode::is_enabled();
        f.self_timed = SelfTime::TimeThisOne(SelfTime::kOp);
        const bool timed = f.self_timed || BudgetOn();
        const int64_t start_t0 = timed ? SelfTime::NowNs() : 0;
        f.cache_mark = CacheMark();
        f.kernel_mark = DeviceKernelMark();
        f.traits = &traits;
        f.autocast_on = Session::Get()->live().fp32_in_use.load(std::memory_order_relaxed) &&
                        (at::autocast::is_autocast_enabled(at::kCPU) ||
                         at::autocast::is_autocast_enabled(at::kCUDA));
        const auto inputs = OwnArguments(fn, traits);
        // Kept for the op's end, views' too: a view's end needs none, but
        // letting go of them here can make torch's boxed copy the last
        // C++ reference of a Python-held input, whose release then takes
        // the GIL inside the op (torch 2.15's PyObject preservation;
        // bench/op_cost.py's view cost 3,622 instructions more than plain
        // that way, against 2,902 with them kept).
        f.inputs.assign(inputs.begin(), inputs.end());
        f.written_before.clear();
        if (ts.depth >= 2 && ts.frames[ts.depth - 2].kind == FrameKind::kOp) {
          Frame& parent = ts.frames[ts.depth - 2];
          f.reads_garbage = parent.reads_garbage ||
                            (!parent.has_nested && CastsResultBuffer(parent, traits, inputs));
          parent.has_nested = true;
        }
        if (traits.writes && !traits.uninitialised &&
            !traits.fills_with_scalar && !f.reads_garbage) {
          ts.busy = true;
          bool nested = false;
          for (size_t i = 0; i + 1 < ts.depth; ++i) {
            nested |= ts.frames[i].kind == FrameKind::kOp;
          }
          // A copy_ overwrites its destination whole: at the top level its
          // old values are no input, and scanning them (DDP's gradients, a
          // host buffer) is work for nothing. Nested, it defers to the
          // op around it, as any nested in-place op does; not batch
          // norm, whose running statistics are the module's buffers.
          if (nested && !traits.updates_running_stats) {
            f.written_before = UnknownWrittenArgs(traits);
          } else if (!traits.overwrites_written) {
            f.written_before =
                CheckWrittenArgs(inputs, traits, Session::Get()->monitor().limits());
          }
          ts.busy = false;
        }
        f.start_cost_ns = timed ? SelfTime::NowNs() - start_t0 : 0;
      }
    }
  } catch (const std::exception& e) {
    ReportInternalError("op start", e.what());
  } catch (...) {
    ReportInternalError("op start", "unknown exception");
  }
  return nullptr;
}

void OnEnd(const at::RecordFunction& fn, at::ObserverContext*) {
  ThreadState& ts = KeepAddress(t_state);
  if (ts.busy) return;
  const int index = ts.Find(&fn);
  if (index < 0) return;
  if (MonitoringActive() && !g_failed.load(std::memory_order_relaxed)) {
    ts.busy = true;
    try {
      switch (ts.frames[index].kind) {
        case FrameKind::kOptimizer:
          --ts.optimizer_depth;
          NoteUpdateEnded();
          {
            // Whether the step's inf/NaN outlived it is asked only when
            // every op is checked: in sample mode an unsampled op may have
            // carried them into a weight unseen.
            Monitor& monitor = Session::Get()->monitor();
            DeliverResultsBeforeUpdateVerdict(*Session::Get());
            monitor.OnOptimizerStepEnd(Session::Get()->sampler() != nullptr ||
                                       !monitor.StepHasNonFinite() || NonFiniteStillHeld());
          }
          // A step's checks held back for a batch go at its end, not with
          // the next step's first ops: whatever the process does in between
          // (an evaluation, a checkpoint, a stall for data), the step's
          // results, and an origin in it, come in without waiting for it.
          if (DeviceChecksHeld()) EnqueueEverythingHeld();
          SpendBudget(*Session::Get());
          UpdateObservation(*Session::Get());
          break;
        case FrameKind::kOp: {
          const bool self_timed = ts.frames[index].self_timed;
          const bool timed = self_timed || BudgetOn();
          const int64_t t0 = timed ? SelfTime::NowNs() : 0;
          if (HasWorkAtEnd(*ts.frames[index].traits) && !ts.frames[index].reads_garbage) {
            OpEnded(fn, ts, index);
          }
          if (!ts.frames[index].deferred.empty()) SettleDeferred(ts, index);
          const int64_t cost = timed ? SelfTime::NowNs() - t0 + ts.frames[index].start_cost_ns : 0;
          if (BudgetOn()) AddCheckTime(cost);
          if (self_timed) GlobalSelfTime().Add(SelfTime::kOp, cost);
          bool top_level = true;
          for (int i = 0; i < index && top_level; ++i) {
            top_level = ts.frames[i].kind != FrameKind::kOp;
          }
          if (top_level) ForgetDeviceKernels();  // bounded per thread
          break;
        }
        default:
          break;
      }
    } catch (const std::exception& e) {
      ReportInternalError("op end", e.what());
    } catch (...) {
      ReportInternalError("op end", "unknown exception");
    }
    ts.busy = false;
  }
  ts.Remove(static_cast<size_t>(index));
}

}  // namespace
}  // namespace nanhunt

// Called by step_guard.py (through ctypes) around its own gradient checks:
// they are nanhunt's ops, not the model's.
extern "C" __attribute__((visibility("default"))) void nanhunt_quiet(int on) {
  nanhunt::t_state.busy = on != 0;
}

// Read by step_guard.py at each optimizer step: NANHUNT_SKIP_NONFINITE_STEPS
// as it is now (a config reload can switch it either way).
extern "C" __attribute__((visibility("default"))) int nanhunt_skip_enabled() {
  nanhunt::Session* session = nanhunt::Session::Get();
  return session != nullptr && nanhunt::MonitoringActive() &&
         session->live().skip_nonfinite_steps.load(std::memory_order_relaxed);
}

// Called by step_guard.py each step in sample mode: the sentinel.
extern "C" __attribute__((visibility("default"))) void nanhunt_sentinel(int finite) {
  using namespace nanhunt;
  Session* session = Session::Get();
  if (session == nullptr || !MonitoringActive() || finite) return;
  try {
    EscalateSampling(*session, "gradients not finite (sentinel)");
  } catch (...) {
    ReportInternalError("sentinel", "unknown exception");
  }
}

// Called by step_guard.py when it holds back an optimizer update.
extern "C" __attribute__((visibility("default"))) void nanhunt_step_skipped() {
  using namespace nanhunt;
  try {
    Session* session = Session::Get();
    if (session == nullptr || !MonitoringActive()) return;
    const std::string line = session->monitor().OnStepSkipped();
    const int64_t skipped = session->monitor().skipped_steps();
    if (!session->config().quiet && skipped <= 10) {
      fprintf(stderr, "nanhunt: %s%s\n", line.c_str(),
              skipped == 10 ? " (further skips only in the trace)" : "");
    }
  } catch (...) {
    ReportInternalError("step skip", "unknown exception");
  }
}

// Called by step_guard.py's GradScaler.scale wrapper with the memory of
// the scale (its untyped storage's data_ptr) before each loss is scaled.
extern "C" __attribute__((visibility("default"))) void nanhunt_loss_scale(const void* storage) {
  nanhunt::LossScales().Note(storage);
}

namespace {

// A tensor that came in holding inf/NaN without any op writing it, as
// step_guard.py found it: noted under its storage (loaded_state.h).
template <class NameFn>
void NoteLoaded(const char* what, nanhunt::LoadedInto into, const void* storage,
                int64_t elements, int64_t nan, int64_t posinf, int64_t neginf, double max_abs,
                NameFn name) {
  using namespace nanhunt;
  try {
    if (Session::Get() == nullptr || !MonitoringActive()) return;
    LoadedNonFinite facts;
    facts.counts.elements = static_cast<unsigned long long>(elements);
    facts.counts.nan = static_cast<unsigned long long>(nan);
    facts.counts.posinf = static_cast<unsigned long long>(posinf);
    facts.counts.neginf = static_cast<unsigned long long>(neginf);
    facts.max_abs = max_abs;
    facts.name = name();
    facts.into = into;
    NoteLoadedNonFinite(storage, std::move(facts));
  } catch (...) {
    ReportInternalError(what, "unknown exception");
  }
}

}  // namespace

// Called by step_guard.py before an optimizer's first step, for each
// tensor of its state (loaded: torch.optim makes state in step()) that
// holds inf/NaN, with its counts and what to call it when Python cannot
// tell which parameter it belongs to ("Adam state exp_avg_sq of a
// parameter"). See interpose/torch/loaded_state.h.
extern "C" __attribute__((visibility("default"))) void nanhunt_loaded_state(
    const void* storage, int64_t elements, int64_t nan, int64_t posinf, int64_t neginf,
    double max_abs, const char* unnamed) {
  NoteLoaded("loaded optimizer state", nanhunt::LoadedInto::kOptimizer, storage, elements, nan,
             posinf, neginf, max_abs, [&] {
               // The model's name of the parameter, when Python finds the model.
               std::string name = nanhunt::NameModelTensor(storage).value_or("");
               return name.empty() && unnamed != nullptr ? std::string(unnamed) : name;
             });
}

// Called by step_guard.py's load_state_dict wrapper after a module took
// the loaded tensors as its own (assign=True), for each parameter or
// buffer that holds inf/NaN, named as load_state_dict knows it
// ("parameter 2.weight", "buffer bn.running_var"): no op wrote it, and on
// a GPU its first reader would be called the origin.
extern "C" __attribute__((visibility("default"))) void nanhunt_loaded_model_tensor(
    const void* storage, int64_t elements, int64_t nan, int64_t posinf, int64_t neginf,
    double max_abs, const char* name) {
  NoteLoaded("loaded model tensor", nanhunt::LoadedInto::kModel, storage, elements, nan,
             posinf, neginf, max_abs,
             [&] { return std::string(name != nullptr ? name : "parameter"); });
}

// Called by step_guard.py's load_state_dict wrapper, before a module's
// load copies into its CUDA tensors, for each: what the module calls it
// ("parameter 2.weight"), for the copy that brings inf/NaN into it.
// See interpose/torch/loading_names.h.
extern "C" __attribute__((visibility("default"))) void nanhunt_loading_into(
    const void* storage, const char* name) {
  try {
    if (name != nullptr) nanhunt::NoteLoadingInto(storage, name);
  } catch (...) {
    nanhunt::ReportInternalError("load_state_dict names", "unknown exception");
  }
}

// Called by step_guard.py once that load has ended, or failed.
extern "C" __attribute__((visibility("default"))) void nanhunt_loading_done() {
  nanhunt::ForgetLoadingNames();
}

// Called by step_guard.py once the step that read such state has ended.
extern "C" __attribute__((visibility("default"))) void nanhunt_loaded_state_done() {
  nanhunt::ForgetAllLoadedNonFinite();
}

// Called by step_guard.py for an optimizer step it found inside a CUDA
// graph capture, which it leaves alone (see there).
namespace {
std::atomic<int64_t> g_steps_in_capture{0};
}  // namespace
extern "C" __attribute__((visibility("default"))) void nanhunt_step_in_capture() {
  g_steps_in_capture.fetch_add(1, std::memory_order_relaxed);
}

// Called by step_guard.py as optimizer `optimizer` (the Python id of the
// first parameter it updates) steps, inside its record; `replaces_another`:
// at its first step it took over parameters another optimizer updated, or
// every optimizer that stepped before it was gone.
// Another optimizer of the same iteration keeps the step
// (Monitor::OnOptimizerIdentified).
extern "C" __attribute__((visibility("default"))) void nanhunt_optimizer_stepping(
    uint64_t optimizer, int replaces_another) {
  using namespace nanhunt;
  try {
    Session* session = Session::Get();
    if (session == nullptr || !MonitoringActive()) return;
    session->monitor().OnOptimizerIdentified(optimizer, replaces_another != 0);
  } catch (...) {
    ReportInternalError("optimizer step", "unknown exception");
  }
}

// Called by step_guard.py when GradScaler skipped the step of optimizer
// `optimizer` (its gradients were not finite): that update has no record
// to end it. With every op checked, the scale update ends an iteration
// whose only optimizer was skipped, but not one whose other optimizer
// stepped (a GAN's discriminator), whose skipped generator's gradients then
// looked like an iteration the program left without an update; in sample
// mode, while torch samples op calls, the scale update may not be seen.
extern "C" __attribute__((visibility("default"))) void nanhunt_scaler_skipped_step(
    uint64_t optimizer, int replaces_another) {
  using namespace nanhunt;
  try {
    Session* session = Session::Get();
    if (session == nullptr || !MonitoringActive()) return;
    EscalateSampling(*session, kScalerSkipped);
    session->monitor().OnOptimizerIdentified(optimizer, replaces_another != 0);
    session->monitor().OnOptimizerSkipped();
    UpdateObservation(*session);
  } catch (...) {
    ReportInternalError("scaler skip", "unknown exception");
  }
}

// The torch release this plugin was built against: libnanhunt.so starts it
// only in a process that runs the same one.
extern "C" __attribute__((visibility("default"))) const char* nanhunt_torch_built_against() {
  return nanhunt::torch_compat::TorchVersion();
}

// Entry point called by libnanhunt.so right after loading this plugin.
extern "C" __attribute__((visibility("default"))) int nanhunt_torch_start() {
  using namespace nanhunt;
  // Debian's abseil is built with deadlock detection on: every Mutex lock
  // goes through one process-wide lock graph (3-4x the cost of a lock two
  // threads share: the op's thread and the drain thread), and a lock order
  // it suspects aborts the process. Neither belongs in someone's training.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  try {
    auto session = Session::Start(torch_compat::TorchVersion());
    if (!session.ok()) {
      fprintf(stderr, "nanhunt: %s; monitoring is off for this process.\n",
              std::string(session.status().message()).c_str());
      return 1;
    }
    if ((*session)->config().autocast_bf16) {
      const char* visible = getenv("CUDA_VISIBLE_DEVICES");
      absl::Status s = CheckBf16Support(VisibleGpus(
          NvmlGpus(), visible ? std::optional<std::string>(visible) : std::nullopt));
      if (!s.ok()) {
        fprintf(stderr, "nanhunt: %s\n", std::string(s.message()).c_str());
        fflush(stderr);
        _exit(2);
      }
    }
    if (!(*session)->config().fp32_ops.empty() || (*session)->config().fp32_auto) {
      PrepareFp32Fallback();  // between ops: torch is still being loaded
    }
    if (absl::Status s = InstallFp32Fallback((*session)->config().fp32_ops); !s.ok()) {
      // A misspelt op name is as bad as a misspelt setting: stop now.
      fprintf(stderr, "nanhunt: %s\n", std::string(s.message()).c_str());
      fflush(stderr);
      _exit(2);
    }
    (*session)->set_on_reload([](const Config& before, const Config& after) {
      std::vector<std::string> added;
      for (const std::string& p : after.fp32_ops) {
        if (std::find(before.fp32_ops.begin(), before.fp32_ops.end(), p) ==
            before.fp32_ops.end()) {
          added.push_back(p);
        }
      }
      if (absl::Status s = InstallFp32Fallback(added); !s.ok()) {
        fprintf(stderr, "nanhunt: %s (reload)\n", std::string(s.message()).c_str());
      }
    });
    SetLateVerdictHandler(&OnLateVerdict);
    if ((*session)->sampler() != nullptr && (*session)->config().budget > 0) {
      StartBudget((*session)->config().budget);
    }
    (*session)->set_on_finish([](TraceWriter& w) {
      DrainDeviceChecks();  // usually done already, from Python's atexit
      const DeviceTotals device = GetDeviceTotals();
      if (device.enqueued > 0 || !device.unavailable.empty()) {
        w.PutMeta("device_checks", absl::StrCat(device.enqueued));
        w.PutMeta("device_bytes_checked", absl::StrCat(device.bytes));
        w.PutMeta("check_ring_waits", absl::StrCat(device.waits));
        w.PutMeta("outputs_in_graph_capture", absl::StrCat(device.in_capture));
        w.PutMeta("kernel_launches", absl::StrCat(device.kernel_launches));
        if (device.batches > 0) {
          w.PutMeta("device_check_batches", absl::StrCat(device.batches));
        }
        if (device.first_reads > 0) {
          w.PutMeta("inputs_checked_at_first_read", absl::StrCat(device.first_reads));
        }
        if (device.released > 0) {
          w.PutMeta("outputs_released_before_check", absl::StrCat(device.released));
        }
        if (!device.batching_stopped.empty()) {
          w.PutMeta("gpu_batch_stopped", device.batching_stopped);
        }
        if (!device.kernel_names_off.empty()) {
          w.PutMeta("kernel_names_off", device.kernel_names_off);
        }
      }
      if (g_steps_in_capture.load() > 0) {
        w.PutMeta("optimizer_steps_in_graph_capture",
                  absl::StrCat(g_steps_in_capture.load()));
      }
      for (const auto& [key, value] : GlobalSelfTime().MetaRows()) w.PutMeta(key, value);
      const ScanTotals totals = GetScanTotals();
      const std::vector<UncheckedRow> unchecked = UncheckedOps().Rows();
      for (const UncheckedRow& row : unchecked) w.Add(row);
      w.PutMeta("model_tensor_lookups", absl::StrCat(ModelTensorLookups()));
      w.PutMeta("values_scanned", absl::StrCat(totals.scanned));
      w.PutMeta("values_reused", absl::StrCat(totals.reused));
      w.PutMeta("outputs_unchecked", absl::StrCat(totals.unchecked));
      w.PutMeta("autocast_switched_to_bf16", absl::StrCat(g_autocast_switches.load()));
      w.PutMeta("fp32_ops", Fp32FallbackCounts());
      Session* session = Session::Get();
      const std::vector<std::string> masks = session->monitor().mask_ops();
      if (!masks.empty()) w.PutMeta("mask_ops", absl::StrJoin(masks, ","));
      w.PutMeta("skipped_steps", absl::StrCat(session->monitor().skipped_steps()));
      if (const int64_t loaded = LoadedNonFiniteNoted(LoadedInto::kOptimizer); loaded > 0) {
        w.PutMeta("loaded_optimizer_state_nonfinite", absl::StrCat(loaded));
      }
      if (const int64_t loaded = LoadedNonFiniteNoted(LoadedInto::kModel); loaded > 0) {
        w.PutMeta("loaded_model_tensors_nonfinite", absl::StrCat(loaded));
      }
      if (session->monitor().counted_forward_passes()) w.PutMeta("forward_passes_as_steps", "1");
      if (const int64_t unjudged = session->monitor().iterations_unjudged_in_sample_mode();
          unjudged > 0) {
        w.PutMeta("iterations_unjudged_in_sample_mode", absl::StrCat(unjudged));
      }
      if (session->sampler() != nullptr) {
        const SampleTotals sampled = GetSampleTotals();
        // Calls torch left unsampled never reach nanhunt: no count of them.
        if (!sampled.torch_sampled) {
          w.PutMeta("op_calls_seen", absl::StrCat(sampled.calls_seen));
        }
        w.PutMeta("op_sampling", sampled.torch_sampled ? "torch" : "hash");
        w.PutMeta("op_calls_checked", absl::StrCat(sampled.calls_checked));
        w.PutMeta("sample_ops_final", absl::StrCat(session->sampler()->op_fraction()));
      }
      const std::vector<std::string> learned = LearnedFp32Ops();
      if (!learned.empty()) {
        w.PutMeta("fp32_learned", absl::StrJoin(learned, ","));
        w.PutMeta("fp32_policy", session->PolicyPath());
        if (session->config().exit_summary) {
          fprintf(stderr,
                  "nanhunt: fp32 ops learned (NANHUNT_FP32_OPS=auto): %s\n"
                  "nanhunt:   saved in %s; a later run loads them with "
                  "NANHUNT_POLICY=%s\n"
                  "nanhunt:   to fix it in the code: run these ops in fp32 "
                  "(inputs .float(), inside torch.autocast(..., "
                  "enabled=False))\n",
                  absl::StrJoin(learned, ", ").c_str(),
                  session->PolicyPath().c_str(), session->PolicyPath().c_str());
        }
      }
      if (totals.unchecked > 0 && !totals.unchecked_on_device) {
        w.PutMeta("unchecked_reason", HostUncheckedReasons(unchecked));
      }
      if (totals.unchecked_on_device) {
        const std::string why =
            !device.unavailable.empty()          ? device.unavailable
            : device.first_enqueue_error.empty() ? "the GPU check could not be enqueued"
                                                 : "the GPU check could not be enqueued: " +
                                                       device.first_enqueue_error;
        const std::string ops = DescribeUncheckedOps(unchecked, kCountedUnchecked);
        fprintf(stderr,
                "nanhunt: %lld floating-point op outputs lived on a GPU and "
                "were NOT checked (%s)%s%s.\n",
                static_cast<long long>(totals.unchecked), why.c_str(),
                ops.empty() ? "" : ": ", ops.c_str());
        w.PutMeta("unchecked_reason", "outputs on a GPU: " + why);
      }
    });
    // The torch package directory: frames under it are not the user's code.
    std::string lib_dir = TorchLibraryDir();
    g_torch_dir = new std::string(lib_dir.substr(0, lib_dir.rfind('/')));
    InstallObservers(OnStart, OnEnd, (*session)->sampler() != nullptr,
                     (*session)->sampler() != nullptr
                         ? (*session)->sampler()->op_fraction()
                         : 0);
    return 0;
  } catch (const std::exception& e) {
    fprintf(stderr, "nanhunt: cannot start (%s); monitoring is off.\n",
            e.what());
    return 1;
  } catch (...) {
    fprintf(stderr, "nanhunt: cannot start; monitoring is off.\n");
    return 1;
  }
}
