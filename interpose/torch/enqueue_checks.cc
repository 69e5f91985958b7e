#include "interpose/torch/enqueue_checks.h"

#include <algorithm>
#include <atomic>
#include <cstdio>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/check_limits.h"
#include "core/foreign_cuda_code.h"
#include "core/op_policy.h"
#include "core/self_time.h"
#include "interpose/torch/plugin_path.h"
#include "interpose/torch/session.h"
#include "interpose/torch/torch_compat.h"

namespace nanhunt {
namespace {

std::atomic<int64_t> g_enqueued{0};    // checks enqueued
std::atomic<int64_t> g_bytes{0};       // what they read: the GPU's share of their cost
std::atomic<int64_t> g_in_capture{0};  // outputs left unchecked in graph capture

// Why the first GPU check that could not be enqueued was not (a capture
// aside): said once when it happens, and in the exit summary and trace.
// Innermost lock: held only to copy the text.
absl::Mutex g_error_mu;
std::string* g_first_error ABSL_GUARDED_BY(g_error_mu) = nullptr;

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
// Batches taken for enqueuing, let go of when this goes, which must be
// after g_held_mu is released: a held tensor's last reference may be its
// Python object's, and freeing that takes the GIL, which a thread waiting
// for g_held_mu may hold. Their emptied vectors then go back to g_held for
// the next batches: a batch's vector is about 8 KB, and glibc's malloc
// consolidates its fast bins at a request or a free that large (callgrind:
// 1,300 instructions an op in bench/gpu_op_cost.py's batches).
class HeldFlushes {
 public:
  using Flush = CheckBatches<OutputCheck>::Flush;
  HeldFlushes() = default;
  HeldFlushes(std::vector<Flush> taken) : taken_(std::move(taken)) {}  // NOLINT: CheckBatches' results
  HeldFlushes(HeldFlushes&&) = default;
  // Adds: what this held already is let go of with the rest, never here.
  HeldFlushes& operator=(HeldFlushes&& other) {
    for (Flush& f : other.taken_) taken_.push_back(std::move(f));
    other.taken_.clear();
    return *this;
  }
  ~HeldFlushes() {
    if (taken_.empty()) return;  // also when made and dropped under g_held_mu
    for (Flush& f : taken_) f.entries.clear();  // the tensors, without the lock
    absl::MutexLock lock(&g_held_mu);
    if (g_held == nullptr) return;
    for (Flush& f : taken_) g_held->Recycle(std::move(f.entries));
  }
  bool empty() const { return taken_.empty(); }
  std::vector<Flush>::iterator begin() { return taken_.begin(); }
  std::vector<Flush>::iterator end() { return taken_.end(); }

 private:
  std::vector<Flush> taken_;
};

// Checks enqueued (all of `described`) and the bytes they read, for the trace.
void CountEnqueued(const NanhuntDeviceTensor* described, int n) {
  int64_t bytes = 0;
  for (int i = 0; i < n; ++i) {
    bytes += described[i].count *
             static_cast<int64_t>(FormatWidth(static_cast<Format>(described[i].format)));
  }
  g_enqueued.fetch_add(n, std::memory_order_relaxed);
  g_bytes.fetch_add(bytes, std::memory_order_relaxed);
}

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

// Held outputs taken out because their memory went first: delivered as
// nothing checked, counted unchecked (and why, for the trace).
void DropReleased(OutputCheck& check) {
  g_released.fetch_add(1, std::memory_order_relaxed);
  if (check.result->kind == ResultContext::Kind::kLateOutput) {
    CountUnchecked(OwnerOf(*check.result->op), UncheckedReason::kReleased, /*on_device=*/true);
  }
  const CheckCounts nothing;
  DeliverResult(AsContext(check.result), &nothing);  // takes it
  check.result = nullptr;
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
        contexts.push_back(AsContext(held[k]->result));
      }
      std::string error = "the legacy stream while a blocking stream is capturing";
      bool ok = false;
      if (!forbidden) {
        SelfTimer timer(SelfTime::kEnqueue);
        ok = EnqueueOn(lib, flush.key.device, flush.key.stream, described.data(),
                       contexts.data(), static_cast<int>(n), &error);
      }
      if (ok) {
        CountEnqueued(described.data(), static_cast<int>(n));
        g_batches.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      for (size_t k = first; k < first + n; ++k) {
        if (held[k]->result->kind == ResultContext::Kind::kLateOutput) {
          CountNotEnqueued(OwnerOf(*held[k]->result->op), error);
        }
        const CheckCounts nothing;
        DeliverResult(AsContext(held[k]->result), &nothing);  // takes it
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
    c.storage = c.tensor.storage();
    c.memory = MemoryOf(c.storage);
  }
  // Held, all of them: the caller has nothing left to do with `checks`.
  done = g_held->Add({device.index(), stream}, std::move(checks), bytes);
  checks.clear();
  EnqueueHeld(lib, done);
  g_any_held.store(!g_held->empty(), std::memory_order_release);
  return true;
}

// Enqueues every check: dense tensors of one device and format together,
// NANHUNT_MAX_BATCH per kernel launch (a foreach op over a model's 150
// parameters costs 5 launches, not 150), the rest one by one.
void EnqueueNow(const CudaLibrary& lib, std::vector<OutputCheck>& checks) {
  // Most ops have one output: nothing here should cost an allocation.
  absl::InlinedVector<bool, 8> done(checks.size(), false);
  for (size_t i = 0; i < checks.size(); ++i) {
    if (done[i]) continue;
    const OutputCheck& first = checks[i];
    absl::InlinedVector<size_t, 8> batch{i};
    if (lib.enqueue_many != nullptr && first.described.dense) {
      for (size_t j = i + 1; j < checks.size() && batch.size() < NANHUNT_MAX_BATCH; ++j) {
        if (!done[j] && checks[j].described.dense &&
            checks[j].described.format == first.described.format &&
            checks[j].tensor.device() == first.tensor.device()) {
          batch.push_back(j);
        }
      }
    }
    absl::InlinedVector<NanhuntDeviceTensor, 2> described;
    absl::InlinedVector<void*, 8> contexts;
    for (size_t k : batch) {
      done[k] = true;
      described.push_back(checks[k].described);
      contexts.push_back(AsContext(checks[k].result));
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
  const auto inputs = OwnArguments(fn, traits);
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

bool EnqueueOnStream(const CudaLibrary& lib, c10::Device device,
                     const NanhuntDeviceTensor* described, void* const* contexts, int n,
                     std::string* error) {
  SelfTimer timer(SelfTime::kEnqueue);
  void* stream = nullptr;  // also the default stream's handle
  if (!torch_compat::CurrentStreamHandle(device, &stream, error)) return false;
  return EnqueueOn(lib, device.index(), stream, described, contexts, n, error);
}

void CountNotEnqueued(const OutputOwner& owner, const std::string& error) {
  const bool captured = error.find("capturing") != std::string::npos;
  if (captured) g_in_capture.fetch_add(1, std::memory_order_relaxed);
  if (!captured) {
    bool first = false;
    {
      absl::MutexLock lock(&g_error_mu);
      if (g_first_error == nullptr) {
        g_first_error = new std::string(error.empty() ? "no reason given" : error);
        first = true;
      }
    }
    const Session* session = Session::Get();
    if (first && session != nullptr && !session->config().quiet) {
      fprintf(stderr,
              "nanhunt: a GPU check could not be enqueued (%s): its output, and any "
              "other's that cannot be, is counted unchecked and named in the trace\n",
              error.c_str());
    }
  }
  CountUnchecked(owner,
                 captured ? UncheckedReason::kGraphCapture : UncheckedReason::kNotEnqueued,
                 /*on_device=*/true);
}

void EnqueueOrHold(const CudaLibrary& lib, std::vector<OutputCheck>& checks) {
  if (!HoldChecks(lib, checks)) EnqueueNow(lib, checks);
  for (const OutputCheck& check : checks) {
    if (check.enqueued) CountEnqueued(&check.described, 1);
  }
}

// Every-op mode only: sample mode's few checks would wait for 32 for
// steps, and its escalation waits for their results.
void StartHoldingChecks(Session& session, const CudaLibrary& lib) {
  if (session.config().gpu_batch <= 1 || session.sampler() != nullptr || !lib.enqueue_many ||
      !lib.stream_takes_checks || !lib.order_after || !lib.legacy_forbidden) {
    return;
  }
  absl::MutexLock lock(&g_held_mu);
  g_held = new CheckBatches<OutputCheck>(session.config().gpu_batch, kMaxHeldBytes);
  g_held_lib = &lib;
  g_batching.store(true, std::memory_order_release);
  if (session.config().gpu_batch_auto) g_foreign = new ForeignCudaCode(TrustedDirs(PluginPath()));
}

void EnqueueEverythingHeld() {
  HeldFlushes done;  // let go of after the lock
  absl::MutexLock lock(&g_held_mu);
  done = EnqueueAllHeld();
}

void StopHoldingChecks() {
  HeldFlushes done;  // let go of after the lock
  absl::MutexLock lock(&g_held_mu);
  done = EnqueueAllHeld();
  delete g_held;  // checks after this point go op by op
  g_held = nullptr;
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
  released = g_held->TakeReleased([](const OutputCheck& c) { return MemoryReleased(c); });
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

EnqueueTotals GetEnqueueTotals() {
  EnqueueTotals totals;
  totals.enqueued = g_enqueued.load();
  totals.bytes = g_bytes.load();
  totals.in_capture = g_in_capture.load();
  totals.batches = g_batches.load();
  totals.released = g_released.load();
  {
    absl::MutexLock lock(&g_error_mu);
    if (g_first_error != nullptr) totals.first_enqueue_error = *g_first_error;
  }
  absl::MutexLock lock(&g_held_mu);
  if (g_batching_stopped != nullptr) totals.batching_stopped = *g_batching_stopped;
  return totals;
}

}  // namespace nanhunt
