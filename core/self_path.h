// Where this process's executable is (for finding nanhunt's own files next
// to the CLI, and for recording which Python wrote a snapshot).
#pragma once

#include <unistd.h>

#include <string>

namespace nanhunt {

// The executable's absolute path, or "" when /proc is not mounted.
inline std::string SelfExecutable() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// Its folder, or "." when unknown.
inline std::string SelfDir() {
  const std::string exe = SelfExecutable();
  const size_t slash = exe.rfind('/');
  return slash == std::string::npos ? "." : exe.substr(0, slash);
}

}  // namespace nanhunt
