// Where in the user's code an op was called from, without linking Python:
// the Python C API is looked up at run time (present in python processes,
// absent in C++ LibTorch binaries, where the native stack is used instead).
#pragma once

#include <string>

namespace nanhunt {

struct SourceLocation {
  std::string source;  // "train.py:42 in forward", the innermost user frame
  std::string stack;   // up to 8 user frames, innermost first, one per line
  // The torch code that made the op call for the user's line, where the
  // line alone shows no such op: a distribution's method (a log_prob's log
  // of its scale), "Normal.log_prob (torch/distributions/normal.py:87)", or
  // nn.MultiheadAttention's, "multi_head_attention_forward
  // (torch/nn/functional.py:6480)"; its innermost frame there.
  std::string via;
};

// Frames under `skip_dir` (the torch package) are not the user's code.
// Returns empty fields when no user frame can be found. Safe on any thread:
// a thread without Python state gets the native stack. At most `frames`
// user frames: 1 stops the walk at the innermost (source only).
SourceLocation CaptureSourceLocation(const std::string& skip_dir, int frames = 8);

// For an op of the backward pass: the user's Python code that called it
// from within the pass (a gradient hook, a custom autograd.Function's
// backward), the frames inside autograd's engine call. Empty for the ops of
// autograd's own nodes, which no Python inside the pass called (the line
// that called loss.backward() is not theirs), and in C++ programs.
SourceLocation CaptureBackwardCallSite(const std::string& skip_dir, int frames = 8);

}  // namespace nanhunt
