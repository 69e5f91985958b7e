#include "core/op_policy.h"

#include <fnmatch.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace nanhunt {

bool OutputsAreUninitialised(absl::string_view op) {
  for (absl::string_view prefix :
       {"aten::empty", "aten::new_empty", "aten::_empty", "aten::resize_"}) {
    if (absl::StartsWith(op, prefix)) return true;
  }
  return false;
}

bool PassesInputThrough(absl::string_view op) {
  for (absl::string_view name :
       {"aten::_unsafe_view", "aten::lift_fresh", "aten::_reshape_alias",
        "aten::alias", "aten::detach", "aten::lift"}) {
    if (op == name) return true;
  }
  return false;
}

bool CopiesValues(absl::string_view op) {
  static constexpr absl::string_view kOps[] = {
      "aten::copy_",          "aten::clone",          "aten::contiguous",
      "aten::_to_copy",       "aten::to",             "aten::cat",
      "aten::stack",          "aten::index_select",   "aten::gather",
      "aten::select_backward", "aten::slice_backward", "aten::embedding",
      "aten::repeat",         "aten::flip",           "aten::roll",
      "aten::narrow_copy",    "aten::expand_copy",    "aten::permute_copy",
      "aten::_reshape_copy",  "aten::constant_pad_nd", "aten::index"};
  for (absl::string_view name : kOps) {
    if (op == name) return true;
  }
  return false;
}

bool FillsWithScalar(absl::string_view op) {
  static constexpr absl::string_view kOps[] = {
      "aten::zero_",     "aten::zeros",     "aten::zeros_like", "aten::new_zeros",
      "aten::ones",      "aten::ones_like", "aten::new_ones",   "aten::fill_",
      "aten::full",      "aten::full_like", "aten::new_full",   "aten::scalar_tensor"};
  for (absl::string_view name : kOps) {
    if (op == name) return true;
  }
  return false;
}

bool MatchesOpPattern(absl::string_view op, absl::string_view overload,
                      const std::vector<std::string>& patterns) {
  const std::string name(op);
  const std::string full =
      overload.empty() ? name : absl::StrCat(name, ".", overload);
  for (const std::string& p : patterns) {
    const bool with_overload = p.find('.') != std::string::npos;
    if (fnmatch(p.c_str(), (with_overload ? full : name).c_str(), 0) == 0) {
      return true;
    }
  }
  return false;
}

bool IsBookkeepingRecord(absl::string_view name) {
  return absl::StartsWith(name, "autograd::") ||
         absl::StartsWith(name, "profiler::");
}

}  // namespace nanhunt
