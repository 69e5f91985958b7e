#include "interpose/torch/python_api.h"

#include <dlfcn.h>

#include <functional>

namespace nanhunt {
namespace {

template <class F>
void Resolve(F& fn, const char* name, bool& ok) {
  fn = reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
  ok = ok && fn != nullptr;
}

constexpr int kFileInput = 257;  // Py_file_input

// Defines the exception class with the message baked in, and finds the
// thread to raise it in: Python's own `threading` knows the main thread.
constexpr char kDefineError[] = R"py(
import threading
class NonFiniteError(FloatingPointError):
    """nanhunt stopped training at the first non-finite values."""
    __module__ = "nanhunt"
    def __init__(self, *args):
        super().__init__(MESSAGE)
MAIN_THREAD = threading.main_thread().ident
)py";

}  // namespace

const PythonApi& Python() {
  static const PythonApi api = [] {
    PythonApi a{};
    bool ok = true;
    Resolve(a.IsInitialized, "Py_IsInitialized", ok);
    Resolve(a.GilEnsure, "PyGILState_Ensure", ok);
    Resolve(a.GilRelease, "PyGILState_Release", ok);
    Resolve(a.ThisThreadState, "PyGILState_GetThisThreadState", ok);
    Resolve(a.GetFrame, "PyEval_GetFrame", ok);
    Resolve(a.FrameLine, "PyFrame_GetLineNumber", ok);
    Resolve(a.FrameCode, "PyFrame_GetCode", ok);
    Resolve(a.FrameBack, "PyFrame_GetBack", ok);
    Resolve(a.GetAttr, "PyObject_GetAttrString", ok);
    Resolve(a.Utf8, "PyUnicode_AsUTF8", ok);
    Resolve(a.DecRef, "Py_DecRef", ok);
    Resolve(a.IncRef, "Py_IncRef", ok);
    Resolve(a.ErrClear, "PyErr_Clear", ok);
    Resolve(a.DictNew, "PyDict_New", ok);
    Resolve(a.DictSetItemString, "PyDict_SetItemString", ok);
    Resolve(a.DictGetItemString, "PyDict_GetItemString", ok);
    Resolve(a.UnicodeFromString, "PyUnicode_FromString", ok);
    Resolve(a.RunString, "PyRun_String", ok);
    Resolve(a.ThreadIdent, "PyThread_get_thread_ident", ok);
    Resolve(a.LongAsUnsignedLong, "PyLong_AsUnsignedLong", ok);
    Resolve(a.SetAsyncExc, "PyThreadState_SetAsyncExc", ok);
    bool optional = true;
    Resolve(a.FrameLasti, "PyFrame_GetLasti", optional);
    bool finalizing_ok = true;
    Resolve(a.IsFinalizing, "Py_IsFinalizing", finalizing_ok);
    if (!finalizing_ok) {
      finalizing_ok = true;
      Resolve(a.IsFinalizing, "_Py_IsFinalizing", finalizing_ok);
    }
    a.ok = ok && finalizing_ok;
    return a;
  }();
  return api;
}

unsigned long PythonThreadHere() {
  const PythonApi& py = Python();
  if (!py.ok || !py.IsInitialized() || py.ThisThreadState() == nullptr) return 0;
  return py.ThreadIdent();
}

bool RaiseInPython(const char* message, unsigned long thread) {
  const PythonApi& py = Python();
  if (!py.ok || !py.IsInitialized() || py.IsFinalizing()) return false;
  if (thread == 0 && py.ThisThreadState() != nullptr) thread = py.ThreadIdent();
  const int gil = py.GilEnsure();
  bool raised = false;
  void* globals = py.DictNew();
  void* text = py.UnicodeFromString(message);
  if (globals != nullptr && text != nullptr &&
      py.DictSetItemString(globals, "MESSAGE", text) == 0) {
    void* result = py.RunString(kDefineError, kFileInput, globals, globals);
    if (result != nullptr) {
      py.DecRef(result);
      void* cls = py.DictGetItemString(globals, "NonFiniteError");
      void* main = py.DictGetItemString(globals, "MAIN_THREAD");
      // An autograd worker has no Python frames: the exception goes to the
      // main thread, which is waiting in backward().
      const unsigned long target = thread != 0        ? thread
                                   : main != nullptr ? py.LongAsUnsignedLong(main)
                                                     : py.ThreadIdent();
      raised = cls != nullptr && py.SetAsyncExc(target, cls) == 1;
    }
  }
  if (!raised) py.ErrClear();
  if (text != nullptr) py.DecRef(text);
  if (globals != nullptr) py.DecRef(globals);
  py.GilRelease(gil);
  return raised;
}

namespace {

// Runs `code` with `strings` bound as globals; then `read`, when given,
// reads the globals before they go. All under the GIL.
bool RunWithGlobals(const char* code,
                    const std::vector<std::pair<const char*, std::string>>& strings,
                    const std::function<bool(const PythonApi&, void*)>& read) {
  const PythonApi& py = Python();
  if (!py.ok || !py.IsInitialized() || py.IsFinalizing()) return false;
  const int gil = py.GilEnsure();
  bool ok = false;
  void* globals = py.DictNew();
  if (globals != nullptr) {
    ok = true;
    for (const auto& [name, value] : strings) {
      void* text = py.UnicodeFromString(value.c_str());
      ok = ok && text != nullptr && py.DictSetItemString(globals, name, text) == 0;
      if (text != nullptr) py.DecRef(text);
    }
    void* result = ok ? py.RunString(code, kFileInput, globals, globals) : nullptr;
    ok = result != nullptr;
    if (result != nullptr) py.DecRef(result);
    if (ok && read) ok = read(py, globals);
    py.DecRef(globals);
  }
  if (!ok) py.ErrClear();
  py.GilRelease(gil);
  return ok;
}

}  // namespace

bool RunPython(const char* code,
               const std::vector<std::pair<const char*, std::string>>& strings) {
  return RunWithGlobals(code, strings, nullptr);
}

std::optional<std::string> EvalPython(
    const char* code, const std::vector<std::pair<const char*, std::string>>& strings,
    const char* result_name) {
  std::optional<std::string> value;
  RunWithGlobals(code, strings, [&](const PythonApi& py, void* globals) {
    void* result = py.DictGetItemString(globals, result_name);  // borrowed
    const char* text = result != nullptr ? py.Utf8(result) : nullptr;
    if (text != nullptr) value = text;
    return text != nullptr;
  });
  return value;
}

}  // namespace nanhunt
