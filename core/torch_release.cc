#include "core/torch_release.h"

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace nanhunt {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// "2.15.0+cu132" from a line `__version__ = '2.15.0+cu132'`.
std::string VersionAssigned(absl::string_view python) {
  for (absl::string_view line : absl::StrSplit(python, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (!absl::ConsumePrefix(&line, "__version__")) continue;
    line = absl::StripLeadingAsciiWhitespace(line);
    if (!absl::ConsumePrefix(&line, "=")) continue;
    line = absl::StripAsciiWhitespace(line);
    if (line.size() < 2 || (line.front() != '\'' && line.front() != '"') ||
        line.back() != line.front()) {
      continue;
    }
    return std::string(line.substr(1, line.size() - 2));
  }
  return "";
}

bool MajorMinor(absl::string_view version, int* major, int* minor) {
  std::vector<absl::string_view> parts = absl::StrSplit(version, absl::MaxSplits('.', 2));
  if (parts.size() < 2) return false;
  // "15" of "2.15", "2.15.0", "2.15+cpu"
  const absl::string_view minor_part = parts[1].substr(0, parts[1].find_first_not_of("0123456789"));
  return absl::SimpleAtoi(parts[0], major) && absl::SimpleAtoi(minor_part, minor);
}

}  // namespace

std::string TorchReleaseBeside(absl::string_view lib_dir) {
  if (lib_dir.empty()) return "";
  const std::string root = absl::StrCat(lib_dir, "/..");
  if (std::string v = VersionAssigned(ReadFile(root + "/version.py")); !v.empty()) return v;
  return std::string(absl::StripAsciiWhitespace(ReadFile(root + "/build-version")));
}

bool SameTorchRelease(absl::string_view a, absl::string_view b) {
  int a_major = 0, a_minor = 0, b_major = 0, b_minor = 0;
  return MajorMinor(a, &a_major, &a_minor) && MajorMinor(b, &b_major, &b_minor) &&
         a_major == b_major && a_minor == b_minor;
}

}  // namespace nanhunt
