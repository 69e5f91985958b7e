// nanhunt: the command line. `run` starts a monitored command; `view`
// summarises traces.
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/self_path.h"
#include "viewer/compare.h"
#include "viewer/report.h"
#include "viewer/run_command.h"
#include "viewer/summary.h"

namespace {

constexpr char kUsage[] =
    "usage:\n"
    "  nanhunt run [--out DIR] -- CMD [ARGS...]   run CMD monitored\n"
    "  nanhunt view [--json] [--all-runs] TRACE_OR_DIR...\n"
    "                                         summarise traces (a folder: its\n"
    "                                         newest run, or all with --all-runs)\n"
    "  nanhunt report [-o FILE] [--chart-js PATH] TRACE_OR_DIR...\n"
    "                                         a self-contained HTML report\n"
    "                                         (default nanhunt-report.html;\n"
    "                                         Chart.js from libjs-chart.js)\n"
    "  nanhunt compare [--json] A B           two runs (traces or folders) side\n"
    "                                         by side per op\n"
    "  nanhunt replay SNAPSHOT                re-run a NaN guard snapshot's op in\n"
    "                                         fp16, bf16 and fp32\n"
    "  nanhunt settings [--markdown]          list the NANHUNT_* settings\n";

int TerminalWidth() {
  winsize ws{};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) {
    return ws.ws_col;
  }
  return 100;
}

// Reads the traces `paths` name (files, or folders' newest run); errors
// go to stderr under `command`'s name. Empty when none could be read.
std::vector<nanhunt::Trace> LoadTraces(const char* command,
                                       std::vector<std::string> paths,
                                       bool all_runs, bool with_series) {
  if (paths.empty()) paths.push_back("nanhunt-out");
  std::vector<nanhunt::Trace> traces;
  int progress_ms = nanhunt::Config{}.progress_ms;
  if (auto config = nanhunt::LoadConfigFromProcess(); config.ok()) {
    progress_ms = config->progress_ms;
  } else {
    fprintf(stderr, "nanhunt %s: %s (going on with the defaults)\n", command,
            std::string(config.status().message()).c_str());
  }
  auto files = nanhunt::FindTraceFiles(paths, all_runs);
  if (!files.ok()) {
    fprintf(stderr, "nanhunt %s: %s\n", command,
            std::string(files.status().message()).c_str());
    return traces;
  }
  for (const auto& f : *files) {
    auto t = nanhunt::ReadTrace(f, with_series, progress_ms);
    if (!t.ok()) {
      fprintf(stderr, "nanhunt %s: %s\n", command,
              std::string(t.status().message()).c_str());
      continue;
    }
    traces.push_back(*std::move(t));
  }
  return traces;
}

int View(const std::vector<std::string>& args) {
  bool json = false, all_runs = false;
  std::vector<std::string> paths;
  for (const auto& a : args) {
    if (a == "--json") {
      json = true;
    } else if (a == "--all-runs") {
      all_runs = true;
    } else if (!a.empty() && a[0] == '-') {
      fprintf(stderr, "nanhunt view: unknown option '%s'\n%s", a.c_str(), kUsage);
      return 2;
    } else {
      paths.push_back(a);
    }
  }
  const auto traces = LoadTraces("view", paths, all_runs, false);
  if (traces.empty()) return 1;
  const nanhunt::RunSummary summary = nanhunt::Summarise(traces);
  const std::string out =
      json ? nanhunt::RenderJson(summary)
           : nanhunt::RenderText(summary, TerminalWidth(),
                                 isatty(STDOUT_FILENO) != 0);
  fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

int Report(const std::vector<std::string>& args) {
  std::string output = "nanhunt-report.html";
  std::string chart_js_path = nanhunt::kChartJsPath;
  bool all_runs = false;
  std::vector<std::string> paths;
  for (size_t i = 0; i < args.size(); ++i) {
    if ((args[i] == "-o" || args[i] == "--output") && i + 1 < args.size()) {
      output = args[++i];
    } else if (args[i] == "--chart-js" && i + 1 < args.size()) {
      chart_js_path = args[++i];
    } else if (args[i] == "--all-runs") {
      all_runs = true;
    } else if (!args[i].empty() && args[i][0] == '-') {
      fprintf(stderr, "nanhunt report: unknown option '%s'\n%s", args[i].c_str(), kUsage);
      return 2;
    } else {
      paths.push_back(args[i]);
    }
  }
  auto chart_js = nanhunt::ReadChartJs(chart_js_path);
  if (!chart_js.ok()) {
    fprintf(stderr, "nanhunt report: %s\n", std::string(chart_js.status().message()).c_str());
    return 1;
  }
  const auto traces = LoadTraces("report", paths, all_runs, true);
  if (traces.empty()) return 1;
  const std::string html =
      nanhunt::RenderReport(nanhunt::Summarise(traces), traces, *chart_js);
  FILE* f = fopen(output.c_str(), "w");
  if (f == nullptr || fwrite(html.data(), 1, html.size(), f) != html.size() ||
      fclose(f) != 0) {
    fprintf(stderr, "nanhunt report: cannot write %s: %s\n", output.c_str(),
            strerror(errno));
    return 1;
  }
  fprintf(stderr, "nanhunt report: wrote %s (open it in a browser; it works offline)\n",
          output.c_str());
  return 0;
}

int Compare(const std::vector<std::string>& args) {
  bool json = false;
  std::vector<std::string> runs;
  for (const auto& a : args) {
    if (a == "--json") {
      json = true;
    } else if (!a.empty() && a[0] == '-') {
      fprintf(stderr, "nanhunt compare: unknown option '%s'\n%s", a.c_str(), kUsage);
      return 2;
    } else {
      runs.push_back(a);
    }
  }
  if (runs.size() != 2) {
    fprintf(stderr, "usage: nanhunt compare [--json] A B  (each a trace or a folder)\n");
    return 2;
  }
  const auto a = LoadTraces("compare", {runs[0]}, false, true);
  const auto b = LoadTraces("compare", {runs[1]}, false, true);
  if (a.empty() || b.empty()) return 1;
  const nanhunt::Comparison c = nanhunt::Compare(a, b);
  const std::string out = json ? nanhunt::RenderComparisonJson(c)
                               : nanhunt::RenderComparisonText(c, TerminalWidth());
  fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

// The settings table; with --markdown, the README's table (a test keeps
// the README equal to it).
int Settings(const std::vector<std::string>& args) {
  const bool markdown = !args.empty() && args[0] == "--markdown";
  if (markdown) {
    printf("| setting | default | allowed | meaning |\n|---|---|---|---|\n");
  }
  for (const auto& s : nanhunt::AllSettings()) {
    if (markdown) {
      printf("| `%s` | %s | %s | %s |\n", s.name, s.fallback, s.allowed,
             s.meaning);
    } else {
      printf("%-30s default %s\n    %s\n    allowed: %s\n", s.name,
             s.fallback, s.meaning, s.allowed);
    }
  }
  return 0;
}

// Replaying needs torch: the Python named by NANHUNT_PYTHON, else the
// project's .venv next to this build, else python3 on the PATH.
int Replay(const std::vector<std::string>& args) {
  if (args.size() != 1) {
    fprintf(stderr, "usage: nanhunt replay SNAPSHOT\n");
    return 2;
  }
  const std::string dir = nanhunt::SelfDir();
  std::string python = "python3";
  if (const char* p = getenv("NANHUNT_PYTHON")) {
    python = p;
  } else if (access((dir + "/../../.venv/bin/python").c_str(), X_OK) == 0) {
    python = dir + "/../../.venv/bin/python";
  }
  const std::string script = dir + "/../share/nanhunt/replay.py";
  std::vector<char*> argv = {const_cast<char*>(python.c_str()),
                             const_cast<char*>(script.c_str()),
                             const_cast<char*>(args[0].c_str()), nullptr};
  execvp(argv[0], argv.data());
  fprintf(stderr, "nanhunt replay: cannot run %s: %s\n", python.c_str(),
          strerror(errno));
  return 2;
}

int Run(const std::vector<std::string>& args) {
  nanhunt::RunOptions options;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    if (args[i] == "--") {
      ++i;
      break;
    }
    if (args[i] == "--out" && i + 1 < args.size()) {
      options.out_dir = args[++i];
    } else if (args[i][0] == '-') {
      fprintf(stderr, "nanhunt run: unknown option '%s'\n%s", args[i].c_str(), kUsage);
      return 2;
    } else {
      break;  // the command itself, without a "--"
    }
  }
  options.command.assign(args.begin() + static_cast<long>(i), args.end());
  return nanhunt::RunCommand(options);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fputs(kUsage, stderr);
    return 2;
  }
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "run") return Run(args);
  if (command == "view") return View(args);
  if (command == "settings") return Settings(args);
  if (command == "replay") return Replay(args);
  if (command == "report") return Report(args);
  if (command == "compare") return Compare(args);
  if (command == "-h" || command == "--help" || command == "help") {
    fputs(kUsage, stdout);
    return 0;
  }
  fprintf(stderr, "nanhunt: unknown command '%s'\n%s", command.c_str(), kUsage);
  return 2;
}
