#include "viewer/report.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "viewer/json_writer.h"

namespace nanhunt {
namespace {

// Generated from report_template.html by viewer/CMakeLists.txt.
constexpr char kTemplate[] =
#include "report_template.inc"
    ;

// How many ops the max |x| chart follows: the closest to fp16's limit.
constexpr size_t kChartedOps = 8;
// At most this many points per line: a run of days has millions of steps;
// longer runs are charted per bucket of steps (max, or sum, per bucket).
constexpr int64_t kMaxPoints = 2000;

// Inside <script>, "</" could end the element early.
std::string ScriptSafe(const std::string& text) {
  return absl::StrReplaceAll(text, {{"</", "<\\/"}});
}

void WriteSeries(const std::vector<Trace>& traces, JsonWriter& j) {
  // The ops (per phase) closest to the limit, those with fp16 outputs
  // first: those are the ones that can overflow as they run. Masks (±inf
  // on purpose) are neither charted nor counted as non-finite.
  std::map<std::pair<std::string, std::string>, std::pair<bool, double>> rank;
  for (const Trace& t : traces) {
    for (const OpStep& o : t.op_steps) {
      if (o.mask) continue;
      auto& r = rank[{o.op, o.phase}];
      r.first |= o.dtype == "float16" || o.dtype == "float8_e5m2";
      r.second = std::max(r.second, o.nonfinite > 0 ? INFINITY : o.max_abs);
    }
  }
  std::vector<std::pair<std::string, std::string>> followed;
  for (const auto& [key, r] : rank) followed.push_back(key);
  std::sort(followed.begin(), followed.end(), [&](const auto& a, const auto& b) {
    return rank[a] > rank[b];
  });
  if (followed.size() > kChartedOps) followed.resize(kChartedOps);
  int64_t last_step = 0;
  for (const Trace& t : traces) {
    for (const OpStep& o : t.op_steps) last_step = std::max(last_step, o.step);
  }
  const int64_t bucket = last_step / kMaxPoints + 1;
  std::map<std::pair<std::string, std::string>, std::map<int64_t, double>> points;
  std::map<int64_t, int64_t> nonfinite;
  std::map<std::string, std::map<int64_t, std::pair<int64_t, int64_t>>> underflow;
  for (const Trace& t : traces) {
    for (const OpStep& o : t.op_steps) {
      const int64_t step = o.step / bucket * bucket;
      const auto key = std::make_pair(o.op, o.phase);
      if (!o.mask && std::find(followed.begin(), followed.end(), key) != followed.end()) {
        double& m = points[key][step];
        m = std::max(m, o.max_abs);
      }
      if (!o.mask && o.nonfinite > 0) nonfinite[step] += o.nonfinite;  // steps with some
      auto& u = underflow[o.phase][step];
      u.first += o.underflow;
      u.second += o.elements;
    }
  }
  j.Key("series").BeginArray();
  for (const auto& key : followed) {
    j.BeginObject();
    j.Key("name").String(absl::StrCat(key.first, " (", key.second, ")"));
    j.Key("points").BeginArray();
    for (const auto& [step, m] : points[key]) {
      j.BeginArray().Int(step).Number(m).EndArray();
    }
    j.EndArray().EndObject();
  }
  j.EndArray();
  j.Key("nonfinite").BeginArray();
  for (const auto& [step, n] : nonfinite) j.BeginArray().Int(step).Int(n).EndArray();
  j.EndArray();
  j.Key("underflow").BeginArray();
  for (const auto& [phase, steps] : underflow) {
    j.BeginObject().Key("phase").String(phase).Key("points").BeginArray();
    for (const auto& [step, u] : steps) {
      j.BeginArray().Int(step).Number(u.second > 0 ? static_cast<double>(u.first) /
                                                         static_cast<double>(u.second)
                                                   : 0.0)
          .EndArray();
    }
    j.EndArray().EndObject();
  }
  j.EndArray();
}

}  // namespace

std::string RenderReport(const RunSummary& summary, const std::vector<Trace>& traces,
                         const std::string& chart_js) {
  // The view's JSON, with the series the charts need added.
  std::string data = RenderJson(summary);
  while (!data.empty() && data.back() != '}') data.pop_back();
  data.pop_back();
  JsonWriter extra;
  extra.BeginObject();
  extra.Key("command").BeginArray();
  for (const auto& c : summary.commands) extra.String(c);
  extra.EndArray();
  WriteSeries(traces, extra);
  extra.EndObject();
  absl::StrAppend(&data, ",", extra.str().substr(1));
  return absl::StrReplaceAll(kTemplate, {{"/*NANHUNT_DATA*/", ScriptSafe(data)},
                                         {"/*CHART_JS*/", ScriptSafe(chart_js)}});
}

absl::StatusOr<std::string> ReadChartJs(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(
        "cannot read Chart.js at ", path,
        "; install Debian's libjs-chart.js (scripts/setup.sh does)"));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace nanhunt
