// Runs the fallbacks of interpose/torch/torch_compat.h with the torch it is
// built against, where that torch also has what they stand in for, so
// that the branches older torch releases take are run, not only compiled
// (scripts/torch_headers_check.py):
//
// - overload names: every op's OverloadNameByOperatorName (torch before
//   2.7) against RecordFunction::overload_name(), on two threads, ops of
//   several overloads and a scope named by a string; the interned answer
//   must also keep its address.
// - the stream handle: StreamHandleByCudaStream (torch before 2.11) finds
//   libc10_cuda's CUDAStream::stream() and calls it; without a driver it
//   throws, which must come back as an error that names it; on a GPU its
//   handles must be torch's own (getStreamNativeHandle).
//
// Prints what it found; exits 1 when an overload name or a handle differs.
#include <dlfcn.h>
#include <torch/torch.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "interpose/torch/torch_compat.h"

namespace {

std::atomic<int> g_compared{0};
std::atomic<int> g_differ{0};
std::atomic<int> g_moved{0};  // asked twice, interned at another address
std::mutex g_seen_mu;
std::set<std::string> g_seen;  // the overloads compared, non-empty ones

std::unique_ptr<at::ObserverContext> Compare(const at::RecordFunction& fn) {
#if NANHUNT_TORCH_AT_LEAST(2, 7)
  const char* fallback = nanhunt::torch_compat::OverloadNameByOperatorName(fn);
  if (std::strcmp(fallback, fn.overload_name()) != 0) {
    if (g_differ.fetch_add(1) < 5) {
      std::printf("differs: %s: '%s' against '%s'\n", fn.name(), fallback, fn.overload_name());
    }
  }
  if (nanhunt::torch_compat::OverloadNameByOperatorName(fn) != fallback) g_moved.fetch_add(1);
  g_compared.fetch_add(1);
  if (*fallback != '\0') {
    std::lock_guard<std::mutex> lock(g_seen_mu);
    g_seen.insert(fallback);
  }
#endif
  return nullptr;
}

void Ops() {
  for (int i = 0; i < 50; ++i) {
    RECORD_USER_SCOPE("a scope named by a string");
    at::Tensor a = torch::ones({4, 4});
    at::Tensor b = a + a;                 // add.Tensor
    at::Tensor c = torch::add(b, 2.0);    // add.Scalar... or add.Tensor, as torch wraps it
    at::Tensor d = torch::mm(c, a).sum(/*dim=*/0);  // mm, sum.dim_IntList
    at::Tensor e = d.sum();               // sum
    b.add_(1);                            // add_.Tensor
    torch::sum_out(d, c, {1});            // sum.IntList_out
    (void)e.item<float>();
  }
}

// On a GPU, with a torch that has getStreamNativeHandle (2.11): the
// fallback's handle against torch's own, for the default stream and pool
// streams of both priorities (scripts/gpu-check.sh runs this). Nothing to
// compare without a GPU.
bool StreamHandlesAgree(bool cuda_torch) {
#if NANHUNT_TORCH_AT_LEAST(2, 11)
  if (!cuda_torch || !c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) return true;
  const c10::impl::DeviceGuardImplInterface* impl =
      c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  if (impl->deviceCount() == 0) return true;
  const c10::Device cuda0(c10::DeviceType::CUDA, 0);
  int compared = 0, differ = 0;
  for (const c10::Stream& s : {impl->getDefaultStream(cuda0), impl->getStreamFromGlobalPool(cuda0),
                               impl->getStreamFromGlobalPool(cuda0, /*isHighPriority=*/true)}) {
    void* fallback = nullptr;
    std::string why;
    const bool found = nanhunt::torch_compat::StreamHandleByCudaStream(s, &fallback, &why);
    ++compared;
    if (!found || fallback != impl->getStreamNativeHandle(s)) {
      ++differ;
      std::printf("stream %lld: %p against %p %s\n", static_cast<long long>(s.id()), fallback,
                  impl->getStreamNativeHandle(s), why.c_str());
    }
  }
  std::printf("stream handles on cuda:0: %d compared, %d differ\n", compared, differ);
  return differ == 0;
#else
  return true;
#endif
}

}  // namespace

int main() {
  at::addGlobalCallback(at::RecordFunctionCallback(Compare)
                            .scopes({at::RecordScope::FUNCTION, at::RecordScope::USER_SCOPE}));
  std::thread other(Ops);
  Ops();
  other.join();
  at::clearCallbacks();
  std::string seen;
  for (const std::string& o : g_seen) seen += " " + o;
  std::printf("overload names: %d compared, %d differ, %d moved; overloads:%s\n",
              g_compared.load(), g_differ.load(), g_moved.load(), seen.c_str());

  // As Python does: torch's CUDA library loaded locally, its symbols out of
  // the global scope (a CPU-only torch has none: nothing to call then).
  const bool cuda_torch = dlopen("libc10_cuda.so", RTLD_NOW | RTLD_LOCAL) != nullptr;
  std::printf("libc10_cuda.so: %s\n", cuda_torch ? "loaded" : "none");
  void* handle = nullptr;
  std::string why;
  const c10::Stream default_stream(c10::Stream::DEFAULT, c10::Device(c10::DeviceType::CUDA, 0));
  if (nanhunt::torch_compat::StreamHandleByCudaStream(default_stream, &handle, &why)) {
    std::printf("stream handle: %p\n", handle);
  } else {
    std::printf("stream handle: none: %s\n", why.substr(0, why.find('\n')).c_str());
  }
  const bool streams_agree = StreamHandlesAgree(cuda_torch);
  return g_differ.load() == 0 && g_moved.load() == 0 && streams_agree ? 0 : 1;
}
