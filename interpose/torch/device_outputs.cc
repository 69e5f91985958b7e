#include "interpose/torch/device_outputs.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/check_batches.h"
#include "core/cpu_check.h"
#include "core/foreign_cuda_code.h"
#include "core/op_policy.h"
#include "core/self_time.h"
#include "cupti/cuda_api.h"
#include "interpose/torch/device_kernel_names.h"
#include "interpose/torch/plugin_path.h"
#include "interpose/torch/python_api.h"
#include "interpose/torch/sample_control.h"
#include "interpose/torch/session.h"
#include "interpose/torch/torch_compat.h"
#include "interpose/torch_detect.h"

namespace nanhunt {
namespace {

struct CudaLibrary {
  decltype(&nanhunt_cuda_start) start = nullptr;
  decltype(&nanhunt_cuda_enqueue) enqueue = nullptr;
  decltype(&nanhunt_cuda_enqueue_many) enqueue_many = nullptr;  // optional
  decltype(&nanhunt_cuda_drain) drain = nullptr;
  decltype(&nanhunt_cuda_waits) waits = nullptr;
  decltype(&nanhunt_kernels_mark) kernels_mark = nullptr;
  decltype(&nanhunt_kernels_since) kernels_since = nullptr;
  decltype(&nanhunt_kernels_forget) kernels_forget = nullptr;
  decltype(&nanhunt_kernel_launches) kernel_launches = nullptr;
  decltype(&nanhunt_cuda_stream_takes_checks) stream_takes_checks = nullptr;  // batching
  decltype(&nanhunt_cuda_order_after) order_after = nullptr;                  // batching
  decltype(&nanhunt_cuda_capture_forbids_legacy_stream) legacy_forbidden = nullptr;
  std::string unavailable;  // why not, when it did not load
  int (*cupti_start)(char*, int) = nullptr;
  // Why CUPTI gives no names, if so; changes once when sample mode starts
  // them late (StartKernelNames).
  absl::Mutex names_mu;
  std::string kernel_names_off ABSL_GUARDED_BY(names_mu);
  std::atomic<bool> names_tried{false};  // StartKernelNames ran
};

// Set once the library is up with CUPTI: read on every op without a lock.
std::atomic<const CudaLibrary*> g_with_kernels{nullptr};

std::atomic<int64_t> g_enqueued{0};
std::atomic<bool> g_names_wanted{false};  // sample mode escalated
std::atomic<int64_t> g_in_capture{0};
LateOps* g_late = nullptr;  // leaked on purpose, like the session
std::function<void(const LateOp&, Verdict)>* g_on_verdict = nullptr;

// Values read back from the device (ReadValuesOnDevice): complete once
// every read has arrived.
struct ValueRead {
  std::function<void(const std::vector<double>&)> then;
  std::vector<Format> formats;
  std::vector<double> values;
  std::atomic<int> pending{0};
};

// What a result is delivered with: the op and which of its outputs, or the
// value read and which of its values.
struct Pending {
  std::shared_ptr<LateOp> op;
  std::shared_ptr<ValueRead> read;
  int index;
};

// One output check to enqueue, and what became of it. Held back for a
// batch (NANHUNT_GPU_BATCH, core/check_batches.h), its tensor keeps the
// caching allocator from reusing the memory before the check has read it.
struct OutputCheck {
  at::Tensor tensor;
  NanhuntDeviceTensor described;
  Pending* pending = nullptr;
  bool enqueued = false;
  bool held = false;  // NANHUNT_GPU_BATCH: enqueued (or counted) later
  std::string error;  // when not
  // Held: the storage (kept even if the tensor is set_ to another) and the
  // memory it owned then, which it may give back without any op.
  c10::Storage storage;
  MemoryRange memory;
};
// Memory a batch keeps alive at most (then it is enqueued): small outputs
// are what batching is for; a large one's check is GPU time anyway.
constexpr int64_t kMaxHeldBytes = int64_t{64} << 20;
absl::Mutex g_held_mu;  // held while a batch is enqueued: rings see batches in order
CheckBatches<OutputCheck>* g_held ABSL_GUARDED_BY(g_held_mu) = nullptr;  // batching on
const CudaLibrary* g_held_lib = nullptr;  // set with g_held
std::atomic<bool> g_batching{false};  // g_held was made: read on every GPU op
std::atomic<bool> g_any_held{false};  // g_held is not empty: read on every op
std::atomic<int64_t> g_batches{0};    // batches enqueued
std::atomic<int64_t> g_released{0};   // held outputs whose memory went first
// NANHUNT_GPU_BATCH=auto: what ends batching, and why it ended (the trace).
ForeignCudaCode* g_foreign ABSL_GUARDED_BY(g_held_mu) = nullptr;
std::string* g_batching_stopped ABSL_GUARDED_BY(g_held_mu) = nullptr;
// Batches taken for enqueuing. Let go of only after g_held_mu is released:
// a held tensor's last reference may be its Python object's, and freeing
// that takes the GIL, which a thread waiting for g_held_mu may hold.
using HeldFlushes = std::vector<CheckBatches<OutputCheck>::Flush>;

// The memory a storage owns now; empty for one without real memory
// (torch.compile's fake tensors while it traces, symbolic sizes).
MemoryRange MemoryOf(const c10::Storage& storage) {
  if (!storage || storage.sym_nbytes().is_heap_allocated()) return {};
  const auto begin = reinterpret_cast<uintptr_t>(storage.unsafeGetStorageImpl()->data_ptr().get());
  return {begin, begin + storage.nbytes()};
}

// A held output whose storage no longer owns the memory it had (FSDP's
// `untyped_storage().resize_(0)`, `set_` on a view of it): its values are
// gone, and a check launched now would read whatever took the memory.
bool MemoryReleased(const OutputCheck& check) { return !(MemoryOf(check.storage) == check.memory); }

double ValueOf(Format format, const CheckCounts& c) {
  if (c.nan != 0) return std::numeric_limits<double>::quiet_NaN();
  if (c.posinf != 0) return std::numeric_limits<double>::infinity();
  if (c.neginf != 0) return -std::numeric_limits<double>::infinity();
  return MaxAbs(format, c);
}

void Deliver(void* context, const CheckCounts* counts) {
  SelfTimer timer(SelfTime::kDelivery);
  std::unique_ptr<Pending> pending(static_cast<Pending*>(context));
  if (!MonitoringActive() || g_late == nullptr) return;
  try {
    if (ValueRead* read = pending->read.get()) {
      read->values[pending->index] = ValueOf(read->formats[pending->index], *counts);
      if (read->pending.fetch_sub(1, std::memory_order_acq_rel) == 1) read->then(read->values);
      return;
    }
    g_late->OnResult(pending->op, pending->index, *counts);
  } catch (...) {
    // The drain thread must survive: a lost classification is better
    // than a dead process. (Nothing in OnResult throws today.)
  }
}

// Subscribes to CUPTI for kernel names, once (said once when it cannot).
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

// Folders whose libraries launch kernels only inside torch's operators (or
// are nanhunt's): torch's package, NVIDIA's libraries beside it, torchvision
// and torchaudio (their kernels are registered operators), the CUDA
// toolkit, and nanhunt's own folder.
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

// Loaded at the first GPU output: libnanhunt_cuda.so next to this plugin.
// Its CUDA runtime is static and finds the driver at run time.
CudaLibrary& Library(Session& session) {
  static CudaLibrary* lib = [&session] {
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
    } else if (l->start(session.config().near_max, &Deliver, error, sizeof(error)) != 0) {
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
    // Every-op mode only: sample mode's few checks would wait for 32 for
    // steps, and its escalation waits for their results.
    if (session.config().gpu_batch > 1 && session.sampler() == nullptr && l->enqueue_many &&
        l->stream_takes_checks && l->order_after && l->legacy_forbidden) {
      absl::MutexLock lock(&g_held_mu);
      g_held = new CheckBatches<OutputCheck>(session.config().gpu_batch, kMaxHeldBytes);
      g_held_lib = l;
      g_batching.store(true, std::memory_order_release);
      if (session.config().gpu_batch_auto) g_foreign = new ForeignCudaCode(TrustedDirs(self));
    }
    g_late = new LateOps(&session.monitor(), &StorageStateOf, &RememberStorage);
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

bool IsCheckableOnDevice(const at::Tensor& t) {
  return t.defined() && t.is_cuda() && t.layout() == at::kStrided &&
         t.has_storage() && torch_compat::FormatOf(t.scalar_type()) &&
         !WithoutOwnMemory(t);
}

template <class Fn>
void ForEachTensorIn(const std::vector<c10::IValue>& values, Fn fn) {
  for (size_t i = 0; i < values.size(); ++i) {
    const c10::IValue& v = values[i];
    if (v.isTensor()) {
      fn(static_cast<int>(i), v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) fn(static_cast<int>(i), t);
    }
  }
}

NanhuntDeviceTensor Describe(const at::Tensor& t, Format format) {
  NanhuntDeviceTensor d{};
  d.format = static_cast<int>(format);
  d.data = t.data_ptr();
  d.count = t.numel();
  bool dense = t.is_non_overlapping_and_dense();
  for (int64_t s : t.strides()) dense = dense && s >= 0;
  d.dense = dense ? 1 : 0;
  d.dims = static_cast<int>(t.dim());
  for (int i = 0; i < d.dims && i < 8; ++i) {
    d.sizes[i] = t.size(i);
    d.strides[i] = t.stride(i);
  }
  return d;
}

// Enqueues the checks of `described` (one tensor, or up to
// NANHUNT_MAX_BATCH dense tensors of one format) on the current stream of
// `device`; each context comes back through Deliver. False, with `error`
// saying why, when they could not be enqueued: the contexts are then still
// the caller's.
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

bool EnqueueOnStream(const CudaLibrary& lib, c10::Device device,
                     const NanhuntDeviceTensor* described, void* const* contexts, int n,
                     std::string* error) {
  SelfTimer timer(SelfTime::kEnqueue);
  void* stream = nullptr;  // also the default stream's handle
  if (!torch_compat::CurrentStreamHandle(device, &stream, error)) return false;
  return EnqueueOn(lib, device.index(), stream, described, contexts, n, error);
}

// An output whose check was not enqueued, and why: counted, never read as
// finite. Its op's thread may have let go already: delivered as nothing
// checked, which completes the op when it was the last.
void CountNotEnqueued(const std::string& error) {
  if (error.find("capturing") != std::string::npos) {
    g_in_capture.fetch_add(1, std::memory_order_relaxed);
  } else {
    CountUnchecked(/*on_device=*/true);
  }
}

// Held outputs taken out because their memory went first: delivered as
// nothing checked, counted unchecked (and why, for the trace).
void DropReleased(OutputCheck& check) {
  g_released.fetch_add(1, std::memory_order_relaxed);
  CountUnchecked(/*on_device=*/true);
  const CheckCounts nothing;
  Deliver(check.pending, &nothing);  // takes it
  check.pending = nullptr;
}

// Enqueues batches held back, in order, each on its own stream, NANHUNT_MAX_BATCH
// checks per call (one launch per dtype), then makes a stream that changed
// wait for them. The caller lets go of `flushes` after g_held_mu.
void EnqueueHeld(const CudaLibrary& lib, HeldFlushes& flushes)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_held_mu) {
  for (auto& flush : flushes) {
    std::vector<OutputCheck>& all = flush.entries;  // let go of by the caller
    std::vector<OutputCheck*> held;                  // whose memory is still theirs
    for (OutputCheck& check : all) {
      if (MemoryReleased(check)) {
        DropReleased(check);
      } else {
        held.push_back(&check);
      }
    }
    // Held on the legacy default stream while the stream this thread moved
    // to captures a graph: if that stream is a blocking one, a launch on
    // the legacy stream would end the capture. Those checks are lost,
    // counted as outputs in capture.
    const bool forbidden = flush.order_after && flush.key.stream == nullptr &&
                           lib.legacy_forbidden(flush.key.device, flush.waiting_stream) != 0;
    for (size_t first = 0; first < held.size(); first += NANHUNT_MAX_BATCH) {
      const size_t n = std::min<size_t>(NANHUNT_MAX_BATCH, held.size() - first);
      std::vector<NanhuntDeviceTensor> described;
      std::vector<void*> contexts;
      for (size_t k = first; k < first + n; ++k) {
        described.push_back(held[k]->described);
        contexts.push_back(held[k]->pending);
      }
      std::string error = "the legacy stream while a blocking stream is capturing";
      bool ok = false;
      if (!forbidden) {
        SelfTimer timer(SelfTime::kEnqueue);
        ok = EnqueueOn(lib, flush.key.device, flush.key.stream, described.data(),
                       contexts.data(), static_cast<int>(n), &error);
      }
      if (ok) {
        g_enqueued.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
        g_batches.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      for (size_t k = first; k < first + n; ++k) {
        CountNotEnqueued(error);
        const CheckCounts nothing;
        Deliver(held[k]->pending, &nothing);  // takes it
      }
    }
    if (flush.order_after && !forbidden) {
      // Refused only while the waiting stream captures a graph, whose work
      // runs at replay, after these checks were enqueued.
      char text[256] = {};
      lib.order_after(flush.key.device, flush.key.stream, flush.waiting_stream, text,
                      sizeof(text));
    }
  }
  // The tensors may go once the caller has released g_held_mu: their memory
  // is reused only by work enqueued after the checks on the same stream
  // (or on one that waits for them).
}

// Enqueues everything held back, in order; returns it for the caller to
// let go of after g_held_mu.
HeldFlushes EnqueueAllHeld() ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_held_mu) {
  if (g_held == nullptr || g_held->empty()) return {};
  HeldFlushes flushes = g_held->TakeAll();
  EnqueueHeld(*g_held_lib, flushes);
  g_any_held.store(false, std::memory_order_release);
  return flushes;
}

// NANHUNT_GPU_BATCH=auto: once code that launches kernels of its own is
// loaded, everything held is enqueued and checks go op by op (said once).
// Returns what the caller lets go of after g_held_mu.
HeldFlushes StopBatchingIfForeignCode() ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_held_mu) {
  if (g_foreign == nullptr || g_batching_stopped != nullptr) return {};
  const std::string& found = g_foreign->Find();
  if (found.empty()) return {};
  g_batching_stopped = new std::string(
      absl::StrCat(found, " launches CUDA kernels of its own: checks op by op from then on"));
  g_batching.store(false, std::memory_order_release);
  if (Session* session = Session::Get(); session != nullptr && !session->config().quiet) {
    fprintf(stderr, "nanhunt: NANHUNT_GPU_BATCH=auto: %s\n", g_batching_stopped->c_str());
  }
  return EnqueueAllHeld();
}

// With NANHUNT_GPU_BATCH: holds the op's checks back when they are all on
// one device and its current stream takes checks now. Otherwise enqueues
// everything held first, so that results keep op order, and returns false:
// the caller enqueues (or counts) them as usual.
bool HoldChecks(const CudaLibrary& lib, std::vector<OutputCheck>& checks) {
  if (!g_batching.load(std::memory_order_acquire) || checks.empty()) return false;
  const c10::Device device = checks.front().tensor.device();
  bool one_device = true;
  for (const OutputCheck& c : checks) one_device = one_device && c.tensor.device() == device;
  void* stream = nullptr;  // also the default stream's handle
  std::string error;
  char text[256] = {};
  const bool holdable = one_device && torch_compat::CurrentStreamHandle(device, &stream, &error) &&
                        lib.stream_takes_checks(device.index(), stream, text, sizeof(text)) == 1;
  HeldFlushes done;  // let go of after the lock
  absl::MutexLock lock(&g_held_mu);
  if (g_held == nullptr) return false;  // drained at exit: op by op again
  // While checks are held, this op's start asked already
  // (EnqueueHeldChecksBefore): asked here for the first check held.
  if (g_held->empty()) StopBatchingIfForeignCode();  // nothing held: nothing to let go of
  if (!g_batching.load(std::memory_order_relaxed)) return false;
  if (!holdable) {
    done = EnqueueAllHeld();
    return false;
  }
  int64_t bytes = 0;
  for (OutputCheck& c : checks) {
    bytes += c.tensor.numel() * static_cast<int64_t>(c.tensor.element_size());
    c.held = true;
    c.storage = c.tensor.storage();
    c.memory = MemoryOf(c.storage);
  }
  done = g_held->Add({device.index(), stream}, checks, bytes);
  EnqueueHeld(lib, done);
  g_any_held.store(!g_held->empty(), std::memory_order_release);
  return true;
}

// Enqueues every check: dense tensors of one device and format together,
// NANHUNT_MAX_BATCH per kernel launch (a foreach op over a model's 150
// parameters costs 5 launches, not 150), the rest one by one.
void EnqueueChecks(const CudaLibrary& lib, std::vector<OutputCheck>& checks) {
  std::vector<bool> done(checks.size(), false);
  for (size_t i = 0; i < checks.size(); ++i) {
    if (done[i]) continue;
    const OutputCheck& first = checks[i];
    std::vector<size_t> batch{i};
    if (lib.enqueue_many != nullptr && first.described.dense) {
      for (size_t j = i + 1; j < checks.size() && batch.size() < NANHUNT_MAX_BATCH; ++j) {
        if (!done[j] && checks[j].described.dense &&
            checks[j].described.format == first.described.format &&
            checks[j].tensor.device() == first.tensor.device()) {
          batch.push_back(j);
        }
      }
    }
    std::vector<NanhuntDeviceTensor> described;
    std::vector<void*> contexts;
    for (size_t k : batch) {
      done[k] = true;
      described.push_back(checks[k].described);
      contexts.push_back(checks[k].pending);
    }
    std::string error;
    const bool ok = EnqueueOnStream(lib, first.tensor.device(), described.data(),
                                    contexts.data(), static_cast<int>(batch.size()), &error);
    for (size_t k : batch) {
      checks[k].enqueued = ok;
      if (!ok) checks[k].error = error;
    }
  }
}

// The memory an op about to start may write: its written and out=
// arguments' storages (a view's write counts for its whole storage), or
// anything when it has no schema to say (except records known to write no
// values: autograd's detach).
OpWrites WritesOf(const at::RecordFunction& fn, const OpTraits& traits) {
  OpWrites writes;
  if (!traits.handle) {
    writes.anything = !WritesNoValues(fn.name());
    return writes;
  }
  if (!traits.writes) return writes;
  const auto inputs = fn.inputs();
  auto add = [&](const at::Tensor& t) {
    if (!t.defined() || !t.has_storage() || WithoutOwnMemory(t)) return;
    writes.ranges.push_back(MemoryOf(t.storage()));
  };
  for (const std::vector<int>* args : {&traits.written_args, &traits.out_args}) {
    for (int i : *args) {
      if (i < 0 || static_cast<size_t>(i) >= inputs.size()) {
        writes.anything = true;  // not where the schema says: assume the worst
        continue;
      }
      const c10::IValue& v = inputs[static_cast<size_t>(i)];
      if (v.isTensor()) {
        add(v.toTensor());
      } else if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorVector()) add(t);
      } else if (v.isList()) {  // Tensor?[]
        for (const c10::IValue& e : v.toListRef()) {
          if (e.isTensor()) add(e.toTensor());
        }
      }
    }
  }
  return writes;
}

}  // namespace

bool CheckOnDevice(const DeviceOpCall& call, const std::vector<c10::IValue>& inputs,
                   const std::vector<c10::IValue>& outputs, const OpTraits& traits,
                   Session& session, const std::string& torch_dir) {
  bool any = false;
  ForEachTensorIn(outputs, [&](int, const at::Tensor& t) {
    any = any || IsCheckableOnDevice(t);
  });
  if (!any) return false;
  // A composite op's outputs are its nested ops' outputs, checked there.
  if (traits.composite) return true;
  CudaLibrary& lib = Library(session);
  if (g_names_wanted.load(std::memory_order_relaxed) &&
      !lib.names_tried.load(std::memory_order_relaxed) && lib.unavailable.empty()) {
    StartKernelNames(lib, session);  // sample mode escalated: from now on
  }
  if (!lib.unavailable.empty()) {
    ForEachTensorIn(outputs, [&](int, const at::Tensor& t) {
      if (IsCheckableOnDevice(t)) CountUnchecked(/*on_device=*/true);
    });
    return true;
  }
  auto op = std::make_shared<LateOp>();
  op->id = call.id;
  op->parent_id = call.parent_id;
  op->op = call.name;
  op->overload = call.overload;
  op->top_op = call.top_op;
  op->forward_op = call.forward_op;
  op->grad_enabled = call.grad_enabled;
  op->takes_grad_input = call.takes_grad_input;
  op->thread = call.thread;
  op->loss_scaling = TouchesLossScale(inputs, outputs);
  op->others_unchecked = OthersUnchecked(session);
  const Monitor::Position position = session.monitor().NoteLateOp(
      call.phase, call.grad_enabled, call.takes_grad_input, call.top_level);
  op->step = position.step;
  op->phase = position.phase;
  const CheckLimits& limits = session.monitor().limits();
  for (size_t i = 0; i < inputs.size(); ++i) {
    // A non-finite scalar argument (masked_fill(mask, -inf), full(inf)):
    // known now, as on the CPU path.
    if (!inputs[i].isDouble() || std::isfinite(inputs[i].toDouble())) continue;
    LateInput in;
    in.arg_index = static_cast<int>(i);
    in.dtype = "scalar";
    in.checked_on_host = true;
    in.counts = CountScalar(inputs[i].toDouble());
    op->inputs.push_back(std::move(in));
  }
  ForEachTensorIn(inputs, [&](int index, const at::Tensor& t) {
    if (!t.defined() || !torch_compat::FormatOf(t.scalar_type())) return;
    LateInput in;
    in.arg_index = index;
    in.dtype = std::string(c10::toString(t.scalar_type()));
    in.sizes.assign(t.sizes().begin(), t.sizes().end());
    if (t.is_cuda()) {
      in.storage = StorageKey(t);
      in.from_collective = session.monitor().IsCollective(in.storage);
    } else {
      // A host tensor fed to a GPU op (a batch being uploaded, a scalar):
      // checked now, as it may change before the result arrives.
      TensorFacts facts;
      if (CheckTensor(t, limits, facts)) {
        in.checked_on_host = true;
        in.counts = facts.counts;
        in.max_abs = MaxAbs(facts.format, facts.counts);
      }
    }
    op->inputs.push_back(std::move(in));
  });
  if (const CudaLibrary* k = g_with_kernels.load(std::memory_order_acquire)) {
    char kernels[1024] = {};
    if (k->kernels_since(call.kernel_mark, kernels, sizeof(kernels)) > 0) {
      op->kernels = kernels;
    }
  }
  if (op->phase == Phase::kForward && g_late->Wanted(op->op)) {
    // Seen near the limit or non-finite before: the line is worth its cost.
    std::vector<InputFacts> none;
    std::vector<at::Tensor> no_outputs;
    TorchOpContext context(inputs, none, no_outputs, traits, limits, torch_dir);
    op->source = context.Source();
    op->stack = context.Stack();
  }
  // Outputs: host ones are checked now; device ones are enqueued. The op
  // is complete once every enqueued result is in (pending counts them).
  std::vector<std::pair<at::Tensor, int>> device_outputs;
  ForEachTensorIn(outputs, [&](int, const at::Tensor& t) {
    const auto format = t.defined() ? torch_compat::FormatOf(t.scalar_type()) : std::nullopt;
    if (!format) return;
    TensorFacts facts;
    absl::InlinedVector<int64_t, 6> sizes;
    if (IsCheckableOnDevice(t)) {
      facts.format = *format;
      sizes.assign(t.sizes().begin(), t.sizes().end());  // shape formatted later
      device_outputs.emplace_back(t, static_cast<int>(op->outputs.size()));
    } else if (!CheckTensor(t, limits, facts)) {
      CountIfUnreadable(t);
      return;
    }
    op->outputs.push_back(std::move(facts));
    op->output_sizes.push_back(std::move(sizes));
    op->output_storages.push_back(IsCheckableOnDevice(t) ? StorageKey(t) : nullptr);
  });
  if (strncmp(call.name, "c10d::", 6) != 0) {
    // Written by this op now: no longer what a collective left there.
    std::vector<const void*> written;
    for (const auto& [t, index] : device_outputs) written.push_back(StorageKey(t));
    session.monitor().ForgetCollective(written);
  }
  op->pending = static_cast<int>(device_outputs.size()) + 1;  // +1: this call
  std::vector<OutputCheck> checks;
  checks.reserve(device_outputs.size());
  for (const auto& [t, index] : device_outputs) {
    OutputCheck check;
    check.tensor = t;
    check.described = Describe(t, op->outputs[index].format);
    check.pending = new Pending{op, nullptr, index};
    checks.push_back(std::move(check));
  }
  if (!HoldChecks(lib, checks)) EnqueueChecks(lib, checks);
  for (OutputCheck& check : checks) {
    if (check.held) continue;  // enqueued with its batch (EnqueueHeld)
    if (check.enqueued) {
      g_enqueued.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    const int index = check.pending->index;
    delete check.pending;
    // Not checked, and said so: never read as finite.
    CountNotEnqueued(check.error);
    // Zero elements: counted as a call, not as values found finite.
    op->outputs[index].counts = CheckCounts{};
    op->pending.fetch_sub(1, std::memory_order_acq_rel);
  }
  g_late->OnResult(op, -1, CheckCounts{});  // let go (see LateOp::pending)
  return true;
}

bool ReadValuesOnDevice(const std::vector<at::Tensor>& tensors, Session& session,
                        std::function<void(const std::vector<double>&)> then) {
  auto read = std::make_shared<ValueRead>();
  std::vector<NanhuntDeviceTensor> described;
  for (const at::Tensor& t : tensors) {
    const auto format = t.defined() ? torch_compat::FormatOf(t.scalar_type()) : std::nullopt;
    if (!format || !IsCheckableOnDevice(t) || t.numel() != 1) return false;
    read->formats.push_back(*format);
    described.push_back(Describe(t, *format));
  }
  const CudaLibrary& lib = Library(session);
  if (!lib.unavailable.empty()) return false;
  HeldFlushes done;  // let go of after the lock
  {
    absl::MutexLock lock(&g_held_mu);
    done = EnqueueAllHeld();  // results in order: the reads come after what is held
  }
  read->then = std::move(then);
  read->values.assign(tensors.size(), 0.0);
  // One more than the reads until all are enqueued: a failed enqueue, or
  // a result that arrives before the last enqueue, must not complete it.
  read->pending.store(static_cast<int>(tensors.size()) + 1);
  for (size_t i = 0; i < tensors.size(); ++i) {
    std::string error;
    auto* pending = new Pending{nullptr, read, static_cast<int>(i)};
    void* context = pending;
    if (!EnqueueOnStream(lib, tensors[i].device(), &described[i], &context, 1, &error)) {
      delete pending;
      return false;  // the reads already enqueued arrive and stay incomplete
    }
  }
  if (read->pending.fetch_sub(1, std::memory_order_acq_rel) == 1) read->then(read->values);
  return true;
}

size_t DeviceKernelMark() {
  const CudaLibrary* k = g_with_kernels.load(std::memory_order_acquire);
  return k != nullptr ? k->kernels_mark() : 0;
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

void DrainDeviceChecks() {
  static std::atomic<bool> drained{false};
  if (g_late == nullptr || drained.exchange(true)) return;
  Session* session = Session::Get();
  if (session == nullptr) return;
  const CudaLibrary& lib = Library(*session);
  if (!lib.unavailable.empty()) return;
  HeldFlushes done;  // let go of after the lock
  {
    absl::MutexLock lock(&g_held_mu);
    done = EnqueueAllHeld();
    delete g_held;  // checks after this point go op by op
    g_held = nullptr;
  }
  lib.drain();
}

bool DeviceChecksHeld() { return g_any_held.load(std::memory_order_acquire); }

void EnqueueHeldChecksBefore(const at::RecordFunction& fn, const OpTraits& traits) {
  HeldFlushes flushes;  // let go of after the lock
  std::vector<OutputCheck> released;
  absl::MutexLock lock(&g_held_mu);
  if (g_held == nullptr || g_held->empty()) return;
  // Foreign code may run before the next op's end (a compiled graph's
  // Triton kernels after its first allocation): checked at op starts too.
  flushes = StopBatchingIfForeignCode();
  if (!flushes.empty()) return;
  // Memory given back since the last op, before this op can take it.
  released = g_held->TakeReleased(&MemoryReleased);
  for (OutputCheck& check : released) DropReleased(check);
  g_any_held.store(!g_held->empty(), std::memory_order_release);
  if (g_held->empty()) return;
  flushes = g_held->BeforeOp(WritesOf(fn, traits), [](int device) -> void* {
    void* stream = nullptr;
    std::string why;
    torch_compat::CurrentStreamHandle(c10::Device(c10::DeviceType::CUDA,
                                                  static_cast<c10::DeviceIndex>(device)),
                                      &stream, &why);
    return stream;
  });
  if (flushes.empty()) return;
  EnqueueHeld(*g_held_lib, flushes);
  g_any_held.store(!g_held->empty(), std::memory_order_release);
}

DeviceTotals GetDeviceTotals() {
  DeviceTotals totals;
  totals.enqueued = g_enqueued.load();
  totals.in_capture = g_in_capture.load();
  totals.batches = g_batches.load();
  totals.released = g_released.load();
  {
    absl::MutexLock lock(&g_held_mu);
    if (g_batching_stopped != nullptr) totals.batching_stopped = *g_batching_stopped;
  }
  if (g_late != nullptr) {
    Session* session = Session::Get();
    if (session != nullptr) {
      CudaLibrary& lib = Library(*session);
      totals.unavailable = lib.unavailable;
      {
        absl::MutexLock lock(&lib.names_mu);
        totals.kernel_names_off = lib.kernel_names_off;
      }
      if (lib.unavailable.empty()) totals.waits = lib.waits();
      if (lib.kernel_launches != nullptr) totals.kernel_launches = lib.kernel_launches();
    }
  }
  return totals;
}

}  // namespace nanhunt

// Registered with Python's atexit at the first GPU output.
extern "C" __attribute__((visibility("default"))) void nanhunt_drain_device_checks() {
  nanhunt::DrainDeviceChecks();
}
