#include "interpose/torch/source_location.h"

#include "interpose/torch/python_api.h"

#include <dlfcn.h>
#include <execinfo.h>

#include <vector>

#include "absl/debugging/symbolize.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace nanhunt {
namespace {

constexpr int kMaxFrames = 8;

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

bool IsUserFile(const std::string& file, const std::string& skip_dir) {
  if (file.empty() || file[0] == '<') return false;  // <frozen ...>, <string>
  // nanhunt's own Python (step_guard.py's GradScaler.step wrapper, which
  // runs the unscale): the line that called it is the program's.
  if (absl::StrContains(file, "/share/nanhunt/")) return false;
  return skip_dir.empty() || !absl::StartsWith(file, skip_dir + "/");
}

bool PythonFrames(const std::string& skip_dir, std::vector<std::string>& out) {
  const PythonApi& py = Python();
  if (!py.ok || !py.IsInitialized() || py.IsFinalizing()) return false;
  // Only a thread Python knows has frames; never create a thread state.
  if (py.ThisThreadState() == nullptr) return false;
  const int gil = py.GilEnsure();
  void* frame = py.GetFrame();  // borrowed
  if (frame != nullptr) py.IncRef(frame);
  for (int depth = 0; frame != nullptr && depth < 256 &&
                      static_cast<int>(out.size()) < kMaxFrames;
       ++depth) {
    void* code = py.FrameCode(frame);
    const std::string file = StringAttr(py, code, "co_filename");
    if (IsUserFile(file, skip_dir)) {
      out.push_back(absl::StrCat(file, ":", py.FrameLine(frame), " in ",
                                 StringAttr(py, code, "co_name")));
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

void NativeFrames(std::vector<std::string>& out) {
  void* pcs[64];
  const int n = backtrace(pcs, 64);
  for (int i = 0; i < n && static_cast<int>(out.size()) < kMaxFrames; ++i) {
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

SourceLocation CaptureSourceLocation(const std::string& skip_dir) {
  std::vector<std::string> frames;
  const PythonApi& py = Python();
  const bool python_process = py.ok && py.IsInitialized();
  // In a Python process a native stack shows the interpreter, not the
  // user's code: a thread without Python frames gets no location instead.
  if (!PythonFrames(skip_dir, frames) && !python_process) NativeFrames(frames);
  SourceLocation loc;
  if (!frames.empty()) loc.source = frames.front();
  loc.stack = absl::StrJoin(frames, "\n");
  return loc;
}

}  // namespace nanhunt
