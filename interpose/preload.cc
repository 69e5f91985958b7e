// libnanhunt.so: the library LD_PRELOAD injects into every process.
//
// It links neither torch nor CUDA. At load it validates the configuration
// (a long run monitored with a misspelt setting is worse than no run: the
// process stops with a message), then waits for libtorch: a C++ LibTorch
// binary has it from the start, Python imports it much later through
// dlopen, which this library interposes. Once libtorch is in the process,
// the torch plugin built against it (libnanhunt_torch.so) is loaded and
// does the monitoring. A process that never loads torch runs untouched:
// no thread, no file, no output.
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/config.h"
#include "core/torch_release.h"
#include "interpose/preload_env.h"
#include "interpose/torch_detect.h"

namespace {

enum class State : int { kWaiting, kLoading, kDone };

std::atomic<State> g_state{State::kDone};  // kWaiting once configured
bool g_fork_child = false;
nanhunt::Config* g_config = nullptr;  // leaked on purpose: lives for the process

using DlopenFn = void* (*)(const char*, int);

DlopenFn RealDlopen() {
  static DlopenFn real = reinterpret_cast<DlopenFn>(dlsym(RTLD_NEXT, "dlopen"));
  return real;
}

std::string PluginPath() {
  if (!g_config->torch_plugin.empty()) return g_config->torch_plugin;
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&PluginPath), &info) == 0 ||
      info.dli_fname == nullptr) {
    return "libnanhunt_torch.so";
  }
  std::string self = info.dli_fname;
  const size_t slash = self.rfind('/');
  return (slash == std::string::npos ? std::string(".")
                                     : self.substr(0, slash)) +
         "/libnanhunt_torch.so";
}

// Why the plugin at `path` must not start in this process: built against
// another torch release than the one loaded (its inline code would read
// this torch's objects with the other's layout). "" when it may start,
// also when this torch's version cannot be read beside its libraries.
std::string OtherTorch(void* plugin, const std::string& path) {
  auto built_against =
      reinterpret_cast<const char* (*)()>(dlsym(plugin, "nanhunt_torch_built_against"));
  if (built_against == nullptr) return "";
  const std::string built = built_against();
  const std::string dir = nanhunt::TorchLibraryDir();
  const std::string running = nanhunt::TorchReleaseBeside(dir);
  if (running.empty() || nanhunt::SameTorchRelease(built, running)) return "";
  return std::string("the torch plugin ") + path + " was built against torch " + built +
         ", but this process runs torch " + running + " (" + dir +
         "). Rebuild nanhunt against this torch: NANHUNT_PYTHON=/path/to/its/python "
         "scripts/build.sh";
}

// Loads the torch plugin once libtorch is present. Safe to call from any
// thread, any number of times; only the first call that sees libtorch acts.
void MaybeLoadTorchPlugin() {
  if (g_state.load(std::memory_order_acquire) != State::kWaiting) return;
  if (g_fork_child || !nanhunt::TorchIsLoaded()) return;
  State expected = State::kWaiting;
  if (!g_state.compare_exchange_strong(expected, State::kLoading)) return;
  const std::string path = PluginPath();
  void* plugin = RealDlopen()(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (plugin == nullptr) {
    fprintf(stderr,
            "nanhunt: cannot load the torch plugin (%s); monitoring is off "
            "for this process. Rebuild nanhunt against this torch.\n",
            dlerror());
  } else if (const std::string other = OtherTorch(plugin, path); !other.empty()) {
    fprintf(stderr, "nanhunt: %s; monitoring is off for this process.\n", other.c_str());
  } else if (auto start = reinterpret_cast<int (*)()>(
                 dlsym(plugin, "nanhunt_torch_start"))) {
    start();  // reports its own errors; never throws
  } else {
    fprintf(stderr, "nanhunt: %s has no entry point; monitoring is off.\n",
            path.c_str());
  }
  g_state.store(State::kDone, std::memory_order_release);
}

void OnForkChild() {
  // heaptrack's rule: the child of a fork is not traced (DataLoader workers
  // share the parent's trace file handle and thread-less state).
  g_fork_child = true;
}

__attribute__((constructor)) void NanhuntPreloadInit() {
  const char* mode = getenv("NANHUNT_MODE");
  if (mode != nullptr && strcasecmp(mode, "off") == 0) return;
  auto config = nanhunt::LoadConfigFromProcess();
  if (!config.ok()) {
    fprintf(stderr, "nanhunt: %s\n", std::string(config.status().message()).c_str());
    fflush(stderr);
    _exit(2);
  }
  if (config->mode == nanhunt::Mode::kOff) return;
  g_config = new nanhunt::Config(*config);
  if (!g_config->follow_children) nanhunt::RemoveSelfFromPreload();
  pthread_atfork(nullptr, nullptr, OnForkChild);
  g_state.store(State::kWaiting, std::memory_order_release);
  // A LibTorch binary: libtorch is already mapped. dlopen of the plugin
  // initialises libtorch first if its constructors have not run yet.
  MaybeLoadTorchPlugin();
}

}  // namespace

// The dlopen interposer. glibc resolves a bare library name against the
// *caller's* RPATH, and it takes the caller from its return address, so for
// names without a '/' this wrapper must be a tail call: the jump keeps the
// real caller's return address and libraries that rely on their own RPATH
// (torch loading nvrtc or cuDNN) still find them. Paths need no search:
// those (Python's extension modules, torch's own libraries) are opened here
// and followed by the libtorch check.
extern "C" __attribute__((visibility("default"))) void* dlopen(const char* file,
                                                              int mode) {
  if (file == nullptr || strchr(file, '/') == nullptr ||
      g_state.load(std::memory_order_relaxed) != State::kWaiting) {
    return RealDlopen()(file, mode);
  }
  void* handle = RealDlopen()(file, mode);
  MaybeLoadTorchPlugin();
  return handle;
}
