// The few Python C API functions nanhunt uses, looked up at run time: the
// plugin links no Python, and a C++ LibTorch program has none (ok = false).
// All exist, with these signatures, in CPython 3.9 through 3.13.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace nanhunt {

struct PythonApi {
  int (*IsInitialized)();
  int (*IsFinalizing)();  // _Py_IsFinalizing (<3.13) or Py_IsFinalizing
  int (*GilEnsure)();
  void (*GilRelease)(int);
  void* (*ThisThreadState)();
  void* (*GetFrame)();
  int (*FrameLine)(void*);
  // PyFrame_GetLasti (3.11 on), null before: the instruction a frame is
  // at, which names its line without scanning the line table.
  int (*FrameLasti)(void*);
  void* (*FrameCode)(void*);
  void* (*FrameBack)(void*);
  void* (*GetAttr)(void*, const char*);
  const char* (*Utf8)(void*);
  void (*DecRef)(void*);
  void (*IncRef)(void*);
  void (*ErrClear)();
  // For raising an exception in a Python thread.
  void* (*DictNew)();
  int (*DictSetItemString)(void*, const char*, void*);
  void* (*DictGetItemString)(void*, const char*);  // borrowed
  void* (*UnicodeFromString)(const char*);
  void* (*RunString)(const char*, int, void*, void*);
  unsigned long (*ThreadIdent)();
  unsigned long (*LongAsUnsignedLong)(void*);
  int (*SetAsyncExc)(unsigned long, void*);
  bool ok = false;
};

// Resolved once; `ok` says whether this is a Python process.
const PythonApi& Python();

// Raises, asynchronously, an exception of a FloatingPointError subclass
// named NonFiniteError whose message is `message`, in the Python thread
// running on this OS thread (or the main thread when this one has no
// Python state): Python raises it when the current op returns to Python
// code. Returns false when that is not possible (no Python).
// `thread`, when not 0, is the Python thread (its ident) to raise it in.
bool RaiseInPython(const char* message, unsigned long thread = 0);

// The ident of the Python thread running on this OS thread, or 0 when it
// has none (or this is no Python process). Needs no GIL.
unsigned long PythonThreadHere();

// Runs `code` as a module body with each of `strings` bound as a global str,
// holding the GIL. False when there is no Python or the code raised (the
// exception is cleared: the code reports its own errors).
bool RunPython(const char* code,
               const std::vector<std::pair<const char*, std::string>>& strings);

// As RunPython, then reads the global `result_name`, a str the code set:
// nullopt when there is no Python, the code raised, or it set no str.
std::optional<std::string> EvalPython(
    const char* code, const std::vector<std::pair<const char*, std::string>>& strings,
    const char* result_name);

}  // namespace nanhunt
