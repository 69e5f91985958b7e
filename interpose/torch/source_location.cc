#include "interpose/torch/source_location.h"

#include "interpose/torch/python_api.h"

#include <dlfcn.h>
#include <execinfo.h>

#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/debugging/symbolize.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"

namespace nanhunt {
namespace {

std::string StringAttr(const PythonApi& py, void* obj, const char* name) {
  void* attr = py.GetAttr(obj, name);
  if (attr == nullptr) {
    py.ErrClear();
    return "?";
  }
  const char* s = py.Utf8(attr);
  std::string out = s ? s : "?";
  if (s == nullptr) py.ErrClear();
  py.DecRef(attr);
  return out;
}

// torch's Python code whose ops the user's line does not show: a
// distribution's methods (Normal.log_prob's log of its scale), and
// nn.MultiheadAttention's, which turns a boolean key_padding_mask into -inf
// and takes the softmax. `in_torch` is the file within the package
// ("distributions/normal.py").
bool IsViaCode(absl::string_view in_torch, absl::string_view qualified_name) {
  if (absl::StartsWith(in_torch, "distributions/")) return true;
  return (in_torch == "nn/functional.py" && qualified_name == "multi_head_attention_forward") ||
         (in_torch == "nn/modules/activation.py" &&
          qualified_name == "MultiheadAttention.forward");
}

bool IsUserFile(const std::string& file, const std::string& skip_dir) {
  if (file.empty() || file[0] == '<') return false;  // <frozen ...>, <string>
  // nanhunt's own Python (step_guard.py's GradScaler.step wrapper, which
  // runs the unscale): the line that called it is the program's.
  if (absl::StrContains(file, "/share/nanhunt/")) return false;
  return skip_dir.empty() || !absl::StartsWith(file, skip_dir + "/");
}

// What a code object says of itself (its file, its name, whether it is the
// user's), read once: a line is captured for every call of a wanted op,
// and the attribute reads and string matches of each frame were most of
// its cost (26,369 instructions a capture, bench/line_capture_cost.py,
// callgrind). The cache keeps a reference to each code object it holds, so
// that no other code object can be made at a freed one's address. Used
// with the GIL held.
class CodeFacts {
 public:
  struct Facts {
    std::string file, name;
    bool user = false;
    // torch code worth naming beside the user's line (IsViaCode):
    // "Normal.log_prob (torch/distributions/normal.py:" (the line
    // follows), empty elsewhere.
    std::string via;
    // torch's call into autograd's engine (torch.autograd.backward and
    // grad run it): frames inside it run within the backward pass.
    bool engine_call = false;
    // Line by instruction offset: PyFrame_GetLineNumber scans the line
    // table from the code's start (8,400 instructions a capture at a loop
    // near the end of a module, 70% of what was left).
    absl::flat_hash_map<int, int> lines;
  };

  // `code`'s facts, from the cache or read now into `scratch` (a full
  // cache, or another `skip_dir` than the cache's).
  Facts& Of(const PythonApi& py, void* code, const std::string& skip_dir, Facts& scratch) {
    absl::MutexLock lock(&mu_);
    if (skip_dir != skip_dir_) {
      if (!by_code_.empty()) return Read(py, code, skip_dir, scratch);
      skip_dir_ = skip_dir;
    }
    if (auto it = by_code_.find(code); it != by_code_.end()) return it->second;
    if (by_code_.size() >= kMaxCodes) return Read(py, code, skip_dir, scratch);
    py.IncRef(code);  // for good: its address keys it
    return Read(py, code, skip_dir, by_code_[code]);
  }

  // The line `frame`, running the code of `facts`, is at.
  int LineOf(const PythonApi& py, Facts& facts, void* frame) {
    const int lasti = py.FrameLasti != nullptr ? py.FrameLasti(frame) : -1;
    if (lasti < 0) return py.FrameLine(frame);
    absl::MutexLock lock(&mu_);
    if (auto it = facts.lines.find(lasti); it != facts.lines.end()) return it->second;
    const int line = py.FrameLine(frame);
    facts.lines.emplace(lasti, line);  // at most one a call site in the code
    return line;
  }

 private:
  static constexpr size_t kMaxCodes = 4096;

  static Facts& Read(const PythonApi& py, void* code, const std::string& skip_dir,
                     Facts& into) {
    into.file = StringAttr(py, code, "co_filename");
    into.name = StringAttr(py, code, "co_name");
    into.user = IsUserFile(into.file, skip_dir);
    into.via.clear();
    if (!into.user && !skip_dir.empty() && absl::StartsWith(into.file, skip_dir + "/")) {
      const std::string in_torch = into.file.substr(skip_dir.size() + 1);
      // co_qualname (Python 3.11) names the class too: "Normal.log_prob".
      std::string qualified = StringAttr(py, code, "co_qualname");
      if (qualified == "?") qualified = into.name;
      if (IsViaCode(in_torch, qualified)) {
        into.via = absl::StrCat(qualified, " (torch/", in_torch, ":");
      }
    }
    // torch/autograd/graph.py's _engine_run_backward in recent torch; in
    // older ones torch.autograd.backward and grad call the engine themselves.
    into.engine_call =
        !into.user && (into.name == "_engine_run_backward" ||
                       (absl::EndsWith(into.file, "/autograd/__init__.py") &&
                        (into.name == "backward" || into.name == "grad")));
    into.lines.clear();
    return into;
  }

  absl::Mutex mu_;
  std::string skip_dir_ ABSL_GUARDED_BY(mu_);
  // Nodes: a reference handed out stays valid as others are added.
  absl::node_hash_map<void*, Facts> by_code_ ABSL_GUARDED_BY(mu_);
};

// The user frames of this thread's Python stack, innermost first; with
// `within_backward`, only those inside the innermost call into autograd's
// engine. `via`, when not null, gets the innermost frame of IsViaCode's
// below the first user frame. False when this thread has no Python
// state.
bool PythonFrames(const std::string& skip_dir, int max_frames, bool within_backward,
                  std::vector<std::string>& out, std::string* via = nullptr) {
  static CodeFacts* const codes = new CodeFacts();  // leaked on purpose: holds references
  const PythonApi& py = Python();
  if (!py.ok || !py.IsInitialized() || py.IsFinalizing()) return false;
  // Only a thread Python knows has frames; never create a thread state.
  if (py.ThisThreadState() == nullptr) return false;
  const int gil = py.GilEnsure();
  void* frame = py.GetFrame();  // borrowed
  if (frame != nullptr) py.IncRef(frame);
  CodeFacts::Facts scratch;
  for (int depth = 0; frame != nullptr && depth < 256 &&
                      static_cast<int>(out.size()) < max_frames;
       ++depth) {
    void* code = py.FrameCode(frame);
    CodeFacts::Facts& facts = codes->Of(py, code, skip_dir, scratch);
    if (within_backward && facts.engine_call) {
      py.DecRef(code);
      break;
    }
    if (via != nullptr && via->empty() && out.empty() && !facts.via.empty()) {
      *via = absl::StrCat(facts.via, codes->LineOf(py, facts, frame), ")");
    }
    if (facts.user) {
      out.push_back(absl::StrCat(facts.file, ":", codes->LineOf(py, facts, frame), " in ",
                                 facts.name));
    }
    py.DecRef(code);
    void* back = py.FrameBack(frame);
    py.DecRef(frame);
    frame = back;
  }
  if (frame != nullptr) py.DecRef(frame);
  py.GilRelease(gil);
  return true;
}

// Shared objects of torch, nanhunt and the C/C++ runtime: frames in them
// are not the user's code.
bool IsRuntimeLibrary(absl::string_view path) {
  const size_t slash = path.rfind('/');
  const absl::string_view base =
      slash == absl::string_view::npos ? path : path.substr(slash + 1);
  if (!absl::StrContains(base, ".so")) return false;  // the program itself
  for (absl::string_view lib :
       {"libtorch", "libc10", "libnanhunt", "libc.so", "libstdc++",
        "libpython", "libgomp", "ld-linux", "libgcc_s"}) {
    if (absl::StartsWith(base, lib)) return true;
  }
  return false;
}

void NativeFrames(int max_frames, std::vector<std::string>& out) {
  void* pcs[64];
  const int n = backtrace(pcs, 64);
  for (int i = 0; i < n && static_cast<int>(out.size()) < max_frames; ++i) {
    Dl_info info;
    if (dladdr(pcs[i], &info) == 0 || info.dli_fname == nullptr) continue;
    if (IsRuntimeLibrary(info.dli_fname)) continue;
    char symbol[512];
    // pcs[i] is a return address; step back into the call instruction.
    void* pc = static_cast<char*>(pcs[i]) - 1;
    const std::string module = info.dli_fname;
    const std::string base = module.substr(module.rfind('/') + 1);
    if (absl::Symbolize(pc, symbol, sizeof(symbol))) {
      out.push_back(absl::StrCat(symbol, " (", base, ")"));
    } else {
      out.push_back(absl::StrCat(base, "+0x",
                                 absl::Hex(static_cast<char*>(pc) -
                                           static_cast<char*>(info.dli_fbase))));
    }
  }
}

}  // namespace

SourceLocation CaptureSourceLocation(const std::string& skip_dir, int frames) {
  const PythonApi& py = Python();
  const bool python_process = py.ok && py.IsInitialized();
  // In a Python process a native stack shows the interpreter, not the
  // user's code: a thread without Python frames gets no location instead.
  std::vector<std::string> found;
  SourceLocation loc;
  if (!PythonFrames(skip_dir, frames, /*within_backward=*/false, found, &loc.via) &&
      !python_process) {
    NativeFrames(frames, found);
  }
  if (!found.empty()) loc.source = found.front();
  loc.stack = absl::StrJoin(found, "\n");
  return loc;
}

SourceLocation CaptureBackwardCallSite(const std::string& skip_dir, int frames) {
  std::vector<std::string> found;
  PythonFrames(skip_dir, frames, /*within_backward=*/true, found);
  SourceLocation loc;
  if (!found.empty()) loc.source = found.front();
  loc.stack = absl::StrJoin(found, "\n");
  return loc;
}

}  // namespace nanhunt
