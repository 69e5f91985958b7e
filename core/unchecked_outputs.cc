#include "core/unchecked_outputs.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace nanhunt {

absl::string_view UncheckedReasonName(UncheckedReason reason) {
  switch (reason) {
    case UncheckedReason::kGraphCapture: return "graph_capture";
    case UncheckedReason::kNotEnqueued: return "not_enqueued";
    case UncheckedReason::kReleased: return "released_before_check";
    case UncheckedReason::kGpuPathOff: return "gpu_path_off";
    case UncheckedReason::kUnreadable: return "unreadable";
    case UncheckedReason::kArrivesLater: return "copied_from_gpu_async";
  }
  return "unreadable";
}

void UncheckedOutputs::Add(absl::string_view op, Phase phase, UncheckedReason reason,
                           int64_t step, int64_t n) {
  if (n <= 0) return;
  absl::MutexLock lock(&mu_);
  Key key{std::string(op), phase, reason};
  auto it = counts_.find(key);
  if (it == counts_.end()) {
    if (counts_.size() >= kMaxKeys) key.op = "(other ops)";
    it = counts_.try_emplace(std::move(key), Counts{0, step, step}).first;
  }
  Counts& c = it->second;
  c.outputs += n;
  c.first_step = std::min(c.first_step, step);
  c.last_step = std::max(c.last_step, step);
}

std::vector<UncheckedRow> UncheckedOutputs::Rows() const {
  std::vector<UncheckedRow> rows;
  {
    absl::MutexLock lock(&mu_);
    rows.reserve(counts_.size());
    for (const auto& [key, c] : counts_) {
      rows.push_back(UncheckedRow{key.op, std::string(PhaseName(key.phase)),
                                  std::string(UncheckedReasonName(key.reason)), c.outputs,
                                  c.first_step, c.last_step});
    }
  }
  std::sort(rows.begin(), rows.end(), [](const UncheckedRow& a, const UncheckedRow& b) {
    if (a.outputs != b.outputs) return a.outputs > b.outputs;
    if (a.op != b.op) return a.op < b.op;
    if (a.phase != b.phase) return a.phase < b.phase;
    return a.reason < b.reason;
  });
  return rows;
}

std::string DescribeUncheckedOps(const std::vector<UncheckedRow>& rows,
                                 absl::Span<const UncheckedReason> reasons,
                                 size_t max_ops) {
  // The same op in one phase for several reasons is one entry.
  std::vector<std::pair<std::string, int64_t>> ops;
  absl::flat_hash_map<std::string, size_t> index;  // into ops
  for (const UncheckedRow& r : rows) {
    if (std::none_of(reasons.begin(), reasons.end(), [&](UncheckedReason reason) {
          return r.reason == UncheckedReasonName(reason);
        })) {
      continue;
    }
    std::string name = absl::StrCat(r.op, " (", r.phase, ")");
    auto [it, added] = index.try_emplace(name, ops.size());
    if (added) {
      ops.emplace_back(std::move(name), r.outputs);
    } else {
      ops[it->second].second += r.outputs;
    }
  }
  std::stable_sort(ops.begin(), ops.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string out;
  for (size_t i = 0; i < ops.size() && i < max_ops; ++i) {
    absl::StrAppend(&out, i == 0 ? "" : ", ", ops[i].first, " ", ops[i].second);
  }
  if (ops.size() > max_ops) {
    const size_t more = ops.size() - max_ops;
    absl::StrAppend(&out, " and ", more, " other op", more == 1 ? "" : "s");
  }
  return out;
}

std::string HostUncheckedReasons(const std::vector<UncheckedRow>& rows) {
  bool unreadable = false, later = false;
  for (const UncheckedRow& row : rows) {
    unreadable |= row.reason == UncheckedReasonName(UncheckedReason::kUnreadable);
    later |= row.reason == UncheckedReasonName(UncheckedReason::kArrivesLater);
  }
  std::vector<std::string> why;
  if (unreadable || !later) {
    why.push_back("tensors the check does not read: mkldnn, other devices', sparse ones on a GPU");
  }
  if (later) why.push_back("copies from a GPU with non_blocking=True, whose values land after the op");
  return absl::StrJoin(why, "; ");
}

}  // namespace nanhunt
