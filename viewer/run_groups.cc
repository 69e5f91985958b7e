#include "viewer/run_groups.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <tuple>

namespace nanhunt {
namespace {

// Union-find over trace indices.
class Groups {
 public:
  explicit Groups(size_t n) : parent_(n) { std::iota(parent_.begin(), parent_.end(), 0); }
  size_t Find(size_t i) {
    while (parent_[i] != i) i = parent_[i] = parent_[parent_[i]];
    return i;
  }
  void Join(size_t a, size_t b) { parent_[Find(a)] = Find(b); }

 private:
  std::vector<size_t> parent_;
};

// Whether `child` is a process `parent` started. A pid is reused once its
// process is gone, so the child must have started while the parent ran
// (start times are whole seconds: a child may share its parent's second).
bool StartedBy(const TraceIdentity& child, const TraceIdentity& parent) {
  return child.ppid != 0 && child.ppid == parent.pid && child.host == parent.host &&
         parent.started != 0 && child.started >= parent.started &&
         (parent.ended == 0 || child.started <= parent.ended);
}

}  // namespace

std::vector<std::string> NewestRun(const std::vector<TraceIdentity>& traces) {
  if (traces.empty()) return {};
  Groups groups(traces.size());
  std::map<std::string, size_t> first_of_id;
  for (size_t i = 0; i < traces.size(); ++i) {
    auto [it, added] = first_of_id.emplace(traces[i].run_id, i);
    if (!added) groups.Join(i, it->second);
  }
  for (size_t c = 0; c < traces.size(); ++c) {
    for (size_t p = 0; p < traces.size(); ++p) {
      if (p != c && StartedBy(traces[c], traces[p])) groups.Join(c, p);
    }
  }
  // A run starts when its first process does.
  std::map<size_t, std::tuple<int64_t, std::string>> start_of;
  for (size_t i = 0; i < traces.size(); ++i) {
    const size_t g = groups.Find(i);
    auto key = std::make_tuple(traces[i].started, traces[i].run_id);
    auto [it, added] = start_of.emplace(g, key);
    if (!added) {
      auto& [started, run_id] = it->second;
      if (traces[i].started != 0 && (started == 0 || traces[i].started < started)) {
        started = traces[i].started;
      }
      run_id = std::max(run_id, traces[i].run_id);
    }
  }
  const auto newest = std::max_element(
      start_of.begin(), start_of.end(),
      [](const auto& a, const auto& b) { return a.second < b.second; });
  std::vector<std::string> files;
  for (size_t i = 0; i < traces.size(); ++i) {
    if (groups.Find(i) == newest->first) files.push_back(traces[i].file);
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace nanhunt
