// `nanhunt report`: one self-contained HTML page (Chart.js inlined from
// Debian's libjs-chart.js, no request leaves it) with the diagnosis, the
// origin, charts over the steps and a sortable op table.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "viewer/summary.h"

namespace nanhunt {

// Where Debian's libjs-chart.js puts the library.
inline constexpr char kChartJsPath[] = "/usr/share/javascript/chart.js/chart.min.js";

// The page for `traces` (read with their series). `chart_js` is the
// library's source, inlined.
std::string RenderReport(const RunSummary& summary, const std::vector<Trace>& traces,
                         const std::string& chart_js);

// Reads Chart.js from `path`; the error names the package to install.
absl::StatusOr<std::string> ReadChartJs(const std::string& path = kChartJsPath);

}  // namespace nanhunt
