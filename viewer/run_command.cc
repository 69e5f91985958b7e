#include "viewer/run_command.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/self_path.h"
#include "viewer/summary.h"

namespace nanhunt {
namespace {

pid_t g_child = -1;

// Signals sent to nanhunt itself (kill, a job scheduler) go on to the
// child. Signals from the terminal (Ctrl-C) already reach the whole
// foreground process group, the child included: forwarding those would
// deliver them twice.
void Forward(int sig, siginfo_t* info, void*) {
  if (g_child <= 0) return;
  if (info != nullptr && info->si_code == SI_KERNEL) return;
  kill(g_child, sig);
}

std::string NewRunId() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", &tm);
  return absl::StrCat(buf, "-r", getpid());
}

}  // namespace

int RunCommand(const RunOptions& options) {
  if (options.command.empty()) {
    fprintf(stderr, "nanhunt run: no command given (nanhunt run -- CMD ...)\n");
    return 2;
  }
  if (!options.out_dir.empty()) setenv("NANHUNT_OUT", options.out_dir.c_str(), 1);
  // The same check the preload library makes, before anything starts.
  auto config = LoadConfigFromProcess();
  if (!config.ok()) {
    fprintf(stderr, "nanhunt: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  const std::string lib = SelfDir() + "/../lib/libnanhunt.so";
  if (access(lib.c_str(), R_OK) != 0) {
    fprintf(stderr, "nanhunt run: %s not found (is the build complete?)\n",
            lib.c_str());
    return 2;
  }
  const char* old_preload = getenv("LD_PRELOAD");
  const std::string preload =
      old_preload && *old_preload ? lib + ":" + old_preload : lib;
  const std::string run_id = NewRunId();
  setenv("LD_PRELOAD", preload.c_str(), 1);
  setenv("NANHUNT_RUN_ID", run_id.c_str(), 1);
  setenv("NANHUNT_EXIT_SUMMARY", "0", 1);  // nanhunt run prints its own

  struct sigaction action {};
  action.sa_sigaction = Forward;
  action.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&action.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) {
    sigaction(sig, &action, nullptr);
  }
  g_child = fork();
  if (g_child < 0) {
    fprintf(stderr, "nanhunt run: fork failed: %s\n", strerror(errno));
    return 2;
  }
  if (g_child == 0) {
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) {
      signal(sig, SIG_DFL);
    }
    std::vector<char*> argv;
    for (const auto& a : options.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    fprintf(stderr, "nanhunt run: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  int status = 0;
  while (waitpid(g_child, &status, 0) < 0 && errno == EINTR) {
  }
  const int code = WIFEXITED(status)     ? WEXITSTATUS(status)
                   : WIFSIGNALED(status) ? 128 + WTERMSIG(status)
                                         : 1;
  // The run's traces: every process that loaded torch wrote one.
  const std::string out = config->out_dir;
  std::vector<Trace> traces;
  if (auto files = FindTraceFiles({out}, /*all_runs=*/true); files.ok()) {
    for (const auto& f : *files) {
      if (f.find(run_id) == std::string::npos) continue;
      if (auto t = ReadTrace(f); t.ok()) traces.push_back(*std::move(t));
    }
  }
  if (traces.empty()) {
    // Or the plugin did not start: it was built against another torch, or
    // could not load (the preload library said why, above).
    fprintf(stderr,
            "nanhunt: no trace written (the command never loaded torch, or nanhunt "
            "did not start in it: see above)\n");
  } else {
    const std::string text =
        RenderText(Summarise(traces), 100, isatty(STDERR_FILENO) != 0);
    fprintf(stderr, "\n%s\nnanhunt: traces in %s (nanhunt view %s)\n",
            text.c_str(), out.c_str(), out.c_str());
  }
  return code;
}

}  // namespace nanhunt
