#include "interpose/torch/cuda_library.h"

#include <dlfcn.h>

#include <cstdio>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/late_op_pool.h"
#include "core/monitor.h"
#include "core/self_time.h"
#include "interpose/torch/plugin_path.h"
#include "interpose/torch/python_api.h"
#include "interpose/torch/session.h"
#include "interpose/torch_detect.h"

namespace nanhunt {
namespace {

// Set once the library is up with CUPTI: read on every op without a lock.
std::atomic<const CudaLibrary*> g_with_kernels{nullptr};
std::atomic<bool> g_names_wanted{false};  // sample mode escalated
LateOps* g_late = nullptr;  // leaked on purpose, like the session
LateOpPool* g_late_ops_pool = nullptr;  // g_late's ops; leaked with it
std::function<void(const LateOp&, Verdict)>* g_on_verdict = nullptr;
// DrainDeviceChecks is delivering what was still in flight at exit, after
// monitoring stopped for new ops (Session::Finish): those results count.
std::atomic<bool> g_draining_at_exit{false};

double ValueOf(Format format, const CheckCounts& c) {
  if (c.nan != 0) return std::numeric_limits<double>::quiet_NaN();
  if (c.posinf != 0) return std::numeric_limits<double>::infinity();
  if (c.neginf != 0) return -std::numeric_limits<double>::infinity();
  return MaxAbs(format, c);
}

}  // namespace

void DeliverResult(void* context, const CheckCounts* counts) {
  SelfTimer timer(SelfTime::kDelivery);
  auto* target = static_cast<ResultContext*>(context);
  std::unique_ptr<ValueReadContext> value;
  if (target->kind == ResultContext::Kind::kValueRead) {
    value.reset(static_cast<ValueReadContext*>(target));
  }
  if (g_late == nullptr) return;  // nothing is enqueued before it exists
  const bool judged = MonitoringActive() || g_draining_at_exit.load();
  try {
    if (value != nullptr) {
      if (!judged) return;
      ValueRead* read = value->read.get();
      read->values[value->index] = ValueOf(read->formats[value->index], *counts);
      if (read->pending.fetch_sub(1, std::memory_order_acq_rel) == 1) read->then(read->values);
      return;
    }
    if (judged && target->kind == ResultContext::Kind::kLateInput) {
      g_late->OnInputResult(target->op, target->index, *counts);
    } else if (judged) {
      g_late->OnResult(target->op, target->index, *counts);
    } else {
      g_late->LetGo(target->op);
    }
  } catch (...) {
    // The drain thread must survive: a lost classification is better
    // than a dead process. (Nothing in OnResult throws today.)
  }
}

void StartKernelNames(CudaLibrary& l, Session& session) {
  absl::MutexLock lock(&l.names_mu);
  if (l.names_tried.exchange(true)) return;
  char why[256] = {};
  if (session.config().kernel_names == KernelNames::kOff) {
    l.kernel_names_off = "NANHUNT_KERNEL_NAMES=0 (CUPTI left to other tools)";
  } else if (l.cupti_start == nullptr || !l.kernels_mark || !l.kernels_since ||
             !l.kernels_forget || !l.kernel_launches) {
    l.kernel_names_off = "this libnanhunt_cuda.so has no CUPTI support";
  } else if (l.cupti_start(why, sizeof(why)) == 0) {
    l.kernel_names_off = why;
  } else {
    l.kernel_names_off.clear();
  }
  if (!l.kernel_names_off.empty()) {
    // Said once; checks go on without names.
    if (!session.config().quiet && session.config().kernel_names != KernelNames::kOff) {
      fprintf(stderr, "nanhunt: no GPU kernel names: %s\n", l.kernel_names_off.c_str());
    }
  } else {
    g_with_kernels.store(&l);
  }
}

void DeliverWhileDrainingAtExit(bool on) { g_draining_at_exit.store(on); }

bool DrainingAtExit() { return g_draining_at_exit.load(); }

bool KernelNamesWanted() { return g_names_wanted.load(std::memory_order_relaxed); }

LateOps* LateResults() { return g_late; }

LateOp* NewLateOp() { return g_late_ops_pool->Take(); }

std::vector<std::string> TrustedDirs(const std::string& plugin) {
  std::vector<std::string> dirs{"/usr/local/cuda", plugin.substr(0, plugin.rfind('/') + 1)};
  const std::string torch_lib = TorchLibraryDir();
  if (const size_t lib = torch_lib.rfind('/'); lib != std::string::npos) {
    const std::string torch = torch_lib.substr(0, lib);  // .../site-packages/torch
    const std::string packages = torch.substr(0, torch.rfind('/') + 1);
    dirs.push_back(torch + "/");
    for (const char* d : {"nvidia/", "torchvision/", "torchaudio/"}) dirs.push_back(packages + d);
  }
  return dirs;
}

// libnanhunt_cuda.so's CUDA runtime is static and finds the driver at run
// time: loading it needs no driver, starting it does.
CudaLibrary& LoadCudaLibrary(Session& session,
                             std::function<StorageState(const void*)> state_of,
                             LateOps::Remember remember) {
  static CudaLibrary* lib = [&] {
    auto* l = new CudaLibrary;
    const std::string self = PluginPath();
    const std::string path = self.substr(0, self.rfind('/')) + "/libnanhunt_cuda.so";
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      l->unavailable = absl::StrCat("cannot load ", path, ": ", dlerror());
      return l;
    }
    l->start = reinterpret_cast<decltype(l->start)>(dlsym(handle, "nanhunt_cuda_start"));
    l->enqueue = reinterpret_cast<decltype(l->enqueue)>(dlsym(handle, "nanhunt_cuda_enqueue"));
    l->enqueue_many = reinterpret_cast<decltype(l->enqueue_many)>(
        dlsym(handle, "nanhunt_cuda_enqueue_many"));
    l->drain = reinterpret_cast<decltype(l->drain)>(dlsym(handle, "nanhunt_cuda_drain"));
    l->waits = reinterpret_cast<decltype(l->waits)>(dlsym(handle, "nanhunt_cuda_waits"));
    l->stream_takes_checks = reinterpret_cast<decltype(l->stream_takes_checks)>(
        dlsym(handle, "nanhunt_cuda_stream_takes_checks"));
    l->order_after =
        reinterpret_cast<decltype(l->order_after)>(dlsym(handle, "nanhunt_cuda_order_after"));
    l->legacy_forbidden = reinterpret_cast<decltype(l->legacy_forbidden)>(
        dlsym(handle, "nanhunt_cuda_capture_forbids_legacy_stream"));
    char error[256] = {};
    if (!l->start || !l->enqueue || !l->drain || !l->waits) {
      l->unavailable = absl::StrCat(path, " lacks nanhunt_cuda_* symbols");
    } else if (l->start(session.config().near_max, &DeliverResult, error, sizeof(error)) != 0) {
      l->unavailable = error;
    }
    if (!l->unavailable.empty()) return l;
    l->cupti_start = reinterpret_cast<decltype(&nanhunt_cupti_start)>(
        dlsym(handle, "nanhunt_cupti_start"));
    l->kernels_mark = reinterpret_cast<decltype(l->kernels_mark)>(dlsym(handle, "nanhunt_kernels_mark"));
    l->kernels_since = reinterpret_cast<decltype(l->kernels_since)>(dlsym(handle, "nanhunt_kernels_since"));
    l->kernels_forget = reinterpret_cast<decltype(l->kernels_forget)>(dlsym(handle, "nanhunt_kernels_forget"));
    l->kernel_launches = reinterpret_cast<decltype(l->kernel_launches)>(dlsym(handle, "nanhunt_kernel_launches"));
    if (session.config().kernel_names != KernelNames::kFirstWarning || g_names_wanted.load()) {
      StartKernelNames(*l, session);
    } else {
      // CUPTI's callback on every launch costs more than many checks: names
      // start with the first result near the limit or non-finite (or
      // sample mode's first escalation), and the findings after it have them.
      absl::MutexLock lock(&l->names_mu);
      l->kernel_names_off = session.sampler() == nullptr
                                ? "auto: no result came near fp16's limit or non-finite"
                                : "auto: sample mode did not escalate";
    }
    g_late_ops_pool = new LateOpPool();
    g_late = new LateOps(&session.monitor(), std::move(state_of), std::move(remember));
    g_late->set_release([](LateOp* op) { g_late_ops_pool->Give(op); });
    if (g_on_verdict != nullptr) g_late->set_on_verdict(*g_on_verdict);
    // Python tears CUDA down before C's atexit handlers run: drain from
    // Python's own atexit, while results can still be read.
    RunPython(R"py(
import atexit, ctypes
atexit.register(ctypes.CDLL(LIBRARY).nanhunt_drain_device_checks)
)py",
              {{"LIBRARY", self}});
    return l;
  }();
  return *lib;
}

bool EnqueueOn(const CudaLibrary& lib, int device, void* stream,
               const NanhuntDeviceTensor* described, void* const* contexts, int n,
               std::string* error) {
  char text[256] = {};
  const int rc = n == 1 ? lib.enqueue(device, stream, described, contexts[0], text,
                                      sizeof(text))
                        : lib.enqueue_many(device, stream, described, n, contexts,
                                           text, sizeof(text));
  if (rc == 0) return true;
  *error = text;
  return false;
}

size_t DeviceKernelMark() {
  const CudaLibrary* k = g_with_kernels.load(std::memory_order_acquire);
  return k != nullptr ? k->kernels_mark() : 0;
}

std::string DeviceKernelsSince(size_t mark) {
  const CudaLibrary* k = g_with_kernels.load(std::memory_order_acquire);
  if (k == nullptr) return {};
  char kernels[1024] = {};
  return k->kernels_since(mark, kernels, sizeof(kernels)) > 0 ? kernels : "";
}

void ForgetDeviceKernels() {
  if (const CudaLibrary* k = g_with_kernels.load(std::memory_order_acquire)) {
    k->kernels_forget();
  }
}

void NameKernelsFromNowOn() {
  // Started by the next GPU op's thread (CheckOnDevice), not here: this
  // may be the drain thread, inside a delivery.
  g_names_wanted.store(true, std::memory_order_relaxed);
}

void SetLateVerdictHandler(std::function<void(const LateOp&, Verdict)> fn) {
  g_on_verdict = new std::function<void(const LateOp&, Verdict)>(std::move(fn));
}

}  // namespace nanhunt
