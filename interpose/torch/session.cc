#include "interpose/torch/session.h"

#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iterator>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "core/quiet_thread.h"
#include "core/trace_schema.h"
#include "interpose/torch/forward_ops.h"

namespace nanhunt {
namespace {

std::atomic<Session*> g_session{nullptr};
std::atomic<bool> g_active{false};
std::atomic<bool> g_finished{false};

// Whether the process that started this one is monitored too (it has
// nanhunt's library mapped): under a plain LD_PRELOAD a helper the training
// starts (torch.compile's probe of a fresh kernel, an evaluation script)
// is monitored as well, and its "nothing seen" must not sit under the
// training's own finding as if it were the run's verdict.
bool ParentIsMonitored() {
  std::ifstream maps(absl::StrCat("/proc/", getppid(), "/maps"));
  std::string line;
  while (std::getline(maps, line)) {
    if (absl::StrContains(line, "/libnanhunt")) return true;
  }
  return false;
}

absl::Status MakeDirs(const std::string& path) {
  std::string partial;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || (path[i] == '/' && i > 0)) {
      partial = path.substr(0, i);
      if (mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
        return absl::InvalidArgumentError(absl::StrCat(
            "NANHUNT_OUT='", path, "': cannot create ", partial, ": ",
            strerror(errno)));
      }
    }
  }
  return absl::OkStatus();
}

std::string ReadCmdline() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(in)),
                  std::istreambuf_iterator<char>());
  while (!raw.empty() && raw.back() == '\0') raw.pop_back();
  return absl::StrReplaceAll(raw, {{std::string(1, '\0'), " "}});
}

std::string Hostname() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

std::string DefaultRunId() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", &tm);
  return absl::StrCat(buf, "-", getpid());
}

void OnTerminate(int sig);
void OnReloadSignal(int);

// A forked child (a DataLoader worker) is not traced, and must not keep our
// signal handlers: they write to pipes the parent reads, so a SIGTERM sent
// to a worker would end the parent.
void OnForkChild() {
  g_active.store(false);
  struct sigaction current {};
  if (sigaction(SIGTERM, nullptr, &current) == 0 && current.sa_handler == OnTerminate) {
    signal(SIGTERM, SIG_DFL);
  }
  if (sigaction(SIGUSR1, nullptr, &current) == 0 &&
      current.sa_handler == OnReloadSignal) {
    signal(SIGUSR1, SIG_DFL);
  }
}

void AtExit() {
  if (Session* s = g_session.load()) s->Finish();
}

// SIGTERM with the default action would kill the process between two
// commits. When (and only when) the host left SIGTERM at its default, a
// handler takes it: it only raises a flag, which a watcher thread turns into
// a final commit and then the default action, so the process still dies of
// SIGTERM, with its trace complete.
int g_term_pipe[2] = {-1, -1};

void OnTerminate(int sig) {
  const unsigned char byte = static_cast<unsigned char>(sig);
  ssize_t ignored = write(g_term_pipe[1], &byte, 1);  // async-signal-safe
  (void)ignored;
}

void WatchForTermination() {
  unsigned char sig = 0;
  while (read(g_term_pipe[0], &sig, 1) != 1) {
    if (errno != EINTR) return;
  }
  if (Session* s = g_session.load()) s->Finish();
  signal(sig, SIG_DFL);
  kill(getpid(), sig);
}

// Config file edits apply within a second; SIGUSR1 (when the host left it
// at its default, which would kill the process) applies them at once.
int g_reload_pipe[2] = {-1, -1};

void OnReloadSignal(int) {
  const unsigned char byte = 1;
  ssize_t ignored = write(g_reload_pipe[1], &byte, 1);
  (void)ignored;
}

int64_t ModifiedNs(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

void WatchConfigFile(Session* session) {
  if (pipe2(g_reload_pipe, O_CLOEXEC) != 0) return;
  struct sigaction current {};
  if (sigaction(SIGUSR1, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    struct sigaction action {};
    action.sa_handler = OnReloadSignal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &action, nullptr);
  }
  const std::string path = session->config().config_file;
  StartQuietThread([session, path] {
    int64_t seen = ModifiedNs(path);
    for (;;) {
      pollfd p{g_reload_pipe[0], POLLIN, 0};
      const int ready = poll(&p, 1, 1000);
      if (!MonitoringActive() && g_finished.load()) return;
      if (ready > 0) {
        unsigned char byte;
        ssize_t ignored = read(g_reload_pipe[0], &byte, 1);
        (void)ignored;
        seen = ModifiedNs(path);
        session->Reload("SIGUSR1");
        continue;
      }
      const int64_t now = ModifiedNs(path);
      if (now != seen) {
        seen = now;
        session->Reload("config file changed");
      }
    }
  }).detach();
}

void InstallTerminationFlush() {
  struct sigaction current {};
  if (sigaction(SIGTERM, nullptr, &current) != 0 ||
      current.sa_handler != SIG_DFL) {
    return;  // the host handles SIGTERM itself; leave it alone
  }
  if (pipe2(g_term_pipe, O_CLOEXEC) != 0) return;
  struct sigaction action {};
  action.sa_handler = OnTerminate;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  StartQuietThread(WatchForTermination).detach();
}

}  // namespace

bool MonitoringActive() {
  return g_active.load(std::memory_order_relaxed);
}

Session* Session::Get() { return g_session.load(std::memory_order_acquire); }

void LiveSettings::Set(const Config& config) {
  on_nonfinite = config.on_nonfinite;
  autocast_bf16 = config.autocast_bf16;
  fp32_auto = config.fp32_auto;
  fp32_in_use = config.fp32_auto || !config.fp32_ops.empty();
  skip_nonfinite_steps = config.skip_nonfinite_steps;
  absl::MutexLock lock(&mu);
  snapshot_dir = config.snapshot_dir;
  fp32_ops = config.fp32_ops;
}

Session::Session(Config config, std::unique_ptr<TraceWriter> writer)
    : config_(std::move(config)), writer_(std::move(writer)) {
  live_.Set(config_);
  absl::MutexLock lock(&reload_mu_);
  current_ = config_;
  monitor_ = std::make_unique<Monitor>(config_, writer_.get());
  if (config_.mode == Mode::kSample) {
    sampler_ = std::make_unique<Sampler>(config_.sample_ops, config_.sample_steps,
                                         static_cast<uint64_t>(config_.sample_seed),
                                         config_.escalate_steps);
  }
  monitor_->set_named_nodes(&ForwardOps::CountNamed);
  if (!config_.quiet) {
    monitor_->set_notify([](const std::string& line) {
      fprintf(stderr, "nanhunt: %s\n", line.c_str());
    });
  }
}

absl::StatusOr<Session*> Session::Start(const std::string& torch_version) {
  auto config = LoadConfigFromProcess();
  if (!config.ok()) return config.status();
  if (absl::Status s = MakeDirs(config->out_dir); !s.ok()) return s;
  // One file per process: "nanhunt-<run id>-<pid>.sqlite", where a run id
  // given by `nanhunt run` groups the processes of one run (the default run
  // id already ends in the pid).
  const std::string run_id =
      config->run_id.empty() ? DefaultRunId() : config->run_id;
  const std::string path = absl::StrCat(
      config->out_dir, "/nanhunt-", run_id,
      config->run_id.empty() ? "" : absl::StrCat("-", getpid()), ".sqlite");
  auto writer = TraceWriter::Open(path, std::chrono::milliseconds(config->flush_ms),
                                 config->max_trace_mb * 1000000);
  if (!writer.ok()) return writer.status();
  TraceWriter& w = **writer;
  w.PutMeta("schema_version", absl::StrCat(kTraceSchemaVersion));
  w.PutMeta("run_id", run_id);
  w.PutMeta("command", ReadCmdline());
  w.PutMeta("pid", absl::StrCat(getpid()));
  w.PutMeta("ppid", absl::StrCat(getppid()));
  w.PutMeta("host", Hostname());
  w.PutMeta("torch_version", torch_version);
  w.PutMeta("config", DescribeConfig(*config));
  w.PutMeta("near_max", absl::StrCat(config->near_max));
  w.PutMeta("started", absl::StrCat(std::time(nullptr)));
  for (const char* var : {"RANK", "LOCAL_RANK", "WORLD_SIZE"}) {
    if (const char* v = getenv(var)) w.PutMeta(absl::AsciiStrToLower(var), v);
  }
  w.Flush();  // the metadata is on disk before the first op

  auto* session = new Session(*std::move(config), *std::move(writer));
  g_session.store(session, std::memory_order_release);
  pthread_atfork(nullptr, nullptr, OnForkChild);
  atexit(AtExit);
  InstallTerminationFlush();
  if (!session->config().config_file.empty()) WatchConfigFile(session);
  g_active.store(true);
  return session;
}

void Session::Reload(const char* why) {
  auto loaded = LoadConfigFromProcess();
  const double now = static_cast<double>(std::time(nullptr));
  if (!loaded.ok()) {
    const std::string msg = absl::StrCat(
        "config reload (", why, ") rejected, previous settings kept: ",
        loaded.status().message());
    fprintf(stderr, "nanhunt: %s\n", msg.c_str());
    writer_->Add(EventRow{now, "config_rejected", msg});
    return;
  }
  absl::MutexLock lock(&reload_mu_);
  const Config before = current_;
  const Config& after = *loaded;
  std::vector<std::string> applied, ignored;
  if (after.on_nonfinite != before.on_nonfinite) applied.push_back("NANHUNT_ON_NONFINITE");
  if (after.autocast_bf16 != before.autocast_bf16) applied.push_back("NANHUNT_AUTOCAST_DTYPE");
  if (after.snapshot_dir != before.snapshot_dir) applied.push_back("NANHUNT_SNAPSHOT_DIR");
  if (after.fp32_ops != before.fp32_ops || after.fp32_auto != before.fp32_auto) {
    applied.push_back("NANHUNT_FP32_OPS");
  }
  if (after.skip_nonfinite_steps != before.skip_nonfinite_steps) {
    applied.push_back("NANHUNT_SKIP_NONFINITE_STEPS");
  }
  if (after.policy_file != before.policy_file) ignored.push_back("NANHUNT_POLICY");
  if (after.near_max != before.near_max) ignored.push_back("NANHUNT_NEAR_MAX");
  if (after.out_dir != before.out_dir) ignored.push_back("NANHUNT_OUT");
  if (after.mode != before.mode) ignored.push_back("NANHUNT_MODE");
  if (applied.empty() && ignored.empty()) return;
  live_.Set(after);
  live_.generation.fetch_add(1);
  if (on_reload_) on_reload_(before, after);
  current_ = after;
  std::string detail = absl::StrCat("(", why, ") applied: ",
                                    applied.empty() ? "nothing" : absl::StrJoin(applied, ", "));
  if (!ignored.empty()) {
    absl::StrAppend(&detail, "; needs a restart: ", absl::StrJoin(ignored, ", "));
  }
  writer_->Add(EventRow{now, "config_reloaded", detail});
  if (!config_.quiet) fprintf(stderr, "nanhunt: config reloaded %s\n", detail.c_str());
}

std::string Session::PolicyPath() const {
  if (!config_.policy_file.empty()) return config_.policy_file;
  std::string path = writer_->path();
  if (absl::EndsWith(path, ".sqlite")) path.resize(path.size() - 7);
  return path + ".fp32-policy";
}

void Session::Finish() {
  if (g_finished.exchange(true)) return;
  g_active.store(false);
  // First the plugin's last words (it drains GPU results still in flight
  // into the monitor), then the open step's statistics.
  if (on_finish_) on_finish_(*writer_);
  monitor_->FlushStep();
  writer_->PutMeta("ended", absl::StrCat(std::time(nullptr)));
  writer_->PutMeta("findings", absl::StrCat(monitor_->findings()));
  writer_->Close();
  if (!config_.exit_summary) return;
  // A monitored parent speaks for the run; this process only when it found
  // something (`nanhunt view` on the folder shows both traces as one run).
  if (monitor_->findings() == 0 && ParentIsMonitored()) return;
  std::string line = absl::StrCat("nanhunt: trace ", writer_->path());
  if (auto origin = monitor_->first_origin()) {
    absl::StrAppendFormat(
        &line, "\nnanhunt: first non-finite: %s %s (%s) at step %d%s%s",
        origin->kind == "origin" ? "origin" : "input of", origin->op,
        origin->phase, origin->step, origin->source.empty() ? "" : " — ",
        origin->source);
  } else {
    absl::StrAppend(&line, "\nnanhunt: no non-finite values seen in what was checked");
  }
  if (const int64_t skips = monitor_->program_skips(); skips > 0) {
    // The origin above is then often in gradients the program threw away.
    absl::StrAppend(&line, "\nnanhunt: the program skipped ", skips, " update",
                    skips == 1 ? "" : "s",
                    " after non-finite gradients (a loss scaler of its own), without an "
                    "optimizer step");
  }
  if (const int64_t given_up = monitor_->iterations_given_up(); given_up > 0) {
    // Their steps are the program's iterations, not its updates.
    absl::StrAppend(&line, "\nnanhunt: the program gave up ", given_up, " iteration",
                    given_up == 1 ? "" : "s",
                    " on a non-finite loss, before the backward pass (each a step of its own)");
  }
  if (const int64_t unjudged = monitor_->iterations_unjudged_in_sample_mode();
      unjudged > 0 && monitor_->first_origin()) {
    // The origin above may then be in gradients the program threw away.
    absl::StrAppend(&line, "\nnanhunt: sample mode: ", unjudged, " iteration",
                    unjudged == 1 ? "" : "s",
                    " made non-finite gradients and began the next batch without an "
                    "optimizer step; if the program scales its loss itself (not GradScaler), "
                    "NANHUNT_MODE=check follows its skips");
  }
  absl::StrAppend(&line, "\nnanhunt: details: nanhunt view ",
                  config_.out_dir);
  fprintf(stderr, "%s\n", line.c_str());
}

}  // namespace nanhunt
