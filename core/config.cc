#include "core/config.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

extern char** environ;

namespace nanhunt {
namespace {

using Apply = absl::Status (*)(absl::string_view value, Config& config);

struct Setting {
  SettingInfo info;
  Apply apply;
};

absl::Status Invalid(const SettingInfo& s, absl::string_view value) {
  return absl::InvalidArgumentError(absl::StrCat(
      s.name, "='", value, "' is not valid; allowed: ", s.allowed));
}

std::optional<bool> ParseBool(absl::string_view v) {
  const std::string s = absl::AsciiStrToLower(v);
  if (s == "1" || s == "true" || s == "on" || s == "yes") return true;
  if (s == "0" || s == "false" || s == "off" || s == "no") return false;
  return std::nullopt;
}

// An op name or glob: aten::bmm, aten::*softmax*, aten::add.Tensor.
bool IsOpPattern(absl::string_view p) {
  return !p.empty() && std::all_of(p.begin(), p.end(), [](char ch) {
    return absl::ascii_isalnum(ch) || ch == '_' || ch == ':' || ch == '.' ||
           ch == '*' || ch == '?';
  });
}

// Declared below; the appliers look their own SettingInfo up for messages.
const SettingInfo& Info(const char* name);

template <class T>
absl::Status ApplyNumber(const char* name, absl::string_view v, T min, T max,
                         T& out) {
  T parsed{};
  bool ok;
  if constexpr (std::is_floating_point_v<T>) {
    ok = absl::SimpleAtod(v, &parsed) && std::isfinite(parsed);
  } else {
    ok = absl::SimpleAtoi(v, &parsed);
  }
  if (!ok || parsed < min || parsed > max) return Invalid(Info(name), v);
  out = parsed;
  return absl::OkStatus();
}

absl::Status ApplyBool(const char* name, absl::string_view v, bool& out) {
  const auto b = ParseBool(v);
  if (!b) return Invalid(Info(name), v);
  out = *b;
  return absl::OkStatus();
}

absl::Status ApplyNonEmpty(const char* name, absl::string_view v,
                           std::string& out) {
  if (v.empty()) return Invalid(Info(name), v);
  out = std::string(v);
  return absl::OkStatus();
}

const Setting kSettings[] = {
    {{"NANHUNT_MODE", "check", "off, check, sample",
      "off loads nothing at all; check checks the outputs of every op; sample "
      "checks the gradients every step and a deterministic sample of ops "
      "(torch's own sampling, reseeded each step), and every op for a while "
      "after anything is seen (for production runs)"},
     [](absl::string_view v, Config& c) {
       const std::string s = absl::AsciiStrToLower(v);
       if (s == "off") { c.mode = Mode::kOff; return absl::OkStatus(); }
       if (s == "check") { c.mode = Mode::kCheck; return absl::OkStatus(); }
       if (s == "sample") { c.mode = Mode::kSample; return absl::OkStatus(); }
       return Invalid(Info("NANHUNT_MODE"), v);
     }},
    {{"NANHUNT_SAMPLE_OPS", "0.01", "a number in [0, 1]",
      "sample mode: the share of op calls checked (drawn from the seed and "
      "the step, so ranks and reruns sample alike)"},
     [](absl::string_view v, Config& c) {
       return ApplyNumber("NANHUNT_SAMPLE_OPS", v, 0.0, 1.0, c.sample_ops);
     }},
    {{"NANHUNT_SAMPLE_STEPS", "100", "an integer in [0, 1000000]",
      "sample mode: every op of one step in this many is checked (0: none)"},
     [](absl::string_view v, Config& c) {
       return ApplyNumber<int64_t>("NANHUNT_SAMPLE_STEPS", v, 0, 1000000, c.sample_steps);
     }},
    {{"NANHUNT_SAMPLE_SEED", "0", "an integer in [0, 2^62]",
      "sample mode: the seed of the sampling"},
     [](absl::string_view v, Config& c) {
       return ApplyNumber<int64_t>("NANHUNT_SAMPLE_SEED", v, 0, int64_t{1} << 62,
                                   c.sample_seed);
     }},
    {{"NANHUNT_ESCALATE_STEPS", "20", "an integer in [1, 1000000]",
      "sample mode: after non-finite gradients, or a sampled op's finding, "
      "every op is checked for this many steps, to catch the origin the next "
      "time"},
     [](absl::string_view v, Config& c) {
       return ApplyNumber<int64_t>("NANHUNT_ESCALATE_STEPS", v, 1, 1000000,
                                   c.escalate_steps);
     }},
    {{"NANHUNT_BUDGET", "off", "off, or a percentage in [0.01%, 50%] like 1%",
      "sample mode: adjust NANHUNT_SAMPLE_OPS after each step so that "
      "checking ops takes about this share of the step time (full steps and "
      "escalations still check everything)"},
     [](absl::string_view v, Config& c) {
       if (absl::EqualsIgnoreCase(v, "off")) {
         c.budget = 0;
         return absl::OkStatus();
       }
       double percent = 0;
       absl::string_view number = v;
       if (!absl::ConsumeSuffix(&number, "%") || !absl::SimpleAtod(number, &percent) ||
           !(percent >= 0.01 && percent <= 50)) {
         return Invalid(Info("NANHUNT_BUDGET"), v);
       }
       c.budget = percent / 100;
       return absl::OkStatus();
     }},
    {{"NANHUNT_OUT", "nanhunt-out", "a directory path (created if missing)",
      "where each process writes its trace"},
     [](absl::string_view v, Config& c) {
       return ApplyNonEmpty("NANHUNT_OUT", v, c.out_dir);
     }},
    {{"NANHUNT_NEAR_MAX", "16376", "a number in (0, 65504]",
      "magnitude at or above which a finite value counts as near fp16's limit "
      "(default: a quarter of 65504)"},
     [](absl::string_view v, Config& c) {
       return ApplyNumber("NANHUNT_NEAR_MAX", v, 1e-30, 65504.0, c.near_max);
     }},
    {{"NANHUNT_UNDERFLOW_FRACTION", "0.01", "a number in (0, 1]",
      "share of an op's non-zero outputs below fp16's smallest normal "
      "(6.1e-5) that is reported as an underflow finding"},
     [](absl::string_view v, Config& c) {
       return ApplyNumber("NANHUNT_UNDERFLOW_FRACTION", v, 1e-12, 1.0,
                          c.underflow_fraction);
     }},
    {{"NANHUNT_MAX_TRACE_MB", "1024", "an integer in [1, 1048576]",
      "size cap of one trace: past 60% of it, per-step statistics older than "
      "the last 200 steps are thinned (one step in 2, 4, 8...); findings, "
      "loss scale, skips and events are never dropped"},
     [](absl::string_view v, Config& c) {
       return ApplyNumber<int64_t>("NANHUNT_MAX_TRACE_MB", v, 1, 1048576, c.max_trace_mb);
     }},
    {{"NANHUNT_FLUSH_MS", "250", "an integer in [10, 60000]",
      "how often the trace is committed to disk; a crash loses at most "
      "this much"},
     [](absl::string_view v, Config& c) {
       return ApplyNumber("NANHUNT_FLUSH_MS", v, 10, 60000, c.flush_ms);
     }},
    {{"NANHUNT_MAX_FINDINGS_PER_STEP", "50", "an integer in [1, 100000]",
      "propagated findings recorded per step; origins and inputs are always "
      "recorded, counts are always complete"},
     [](absl::string_view v, Config& c) {
       return ApplyNumber("NANHUNT_MAX_FINDINGS_PER_STEP", v, 1, 100000,
                          c.max_findings_per_step);
     }},
    {{"NANHUNT_FOLLOW_CHILDREN", "1", "0 or 1 (also true/false, on/off)",
      "whether programs this process starts are monitored too"},
     [](absl::string_view v, Config& c) {
       return ApplyBool("NANHUNT_FOLLOW_CHILDREN", v, c.follow_children);
     }},
    {{"NANHUNT_KERNEL_NAMES", "auto", "auto, 1 or 0 (also true/false, on/off)",
      "on a GPU, name the kernels each op launched through CUPTI: auto from "
      "the first result near fp16's limit or non-finite (but for the "
      "gradients a GradScaler scales up to it on purpose), or sample mode's "
      "first escalation (CUPTI's callback on every launch costs about 1.5 us); "
      "1 from the first GPU op; CUPTI 13.0 takes one subscriber per process, "
      "so a torch.profiler started after nanhunt subscribed gets no GPU "
      "trace: 0 leaves CUPTI to it"},
     [](absl::string_view v, Config& c) {
       if (absl::EqualsIgnoreCase(v, "auto")) {
         c.kernel_names = KernelNames::kFirstWarning;
         return absl::OkStatus();
       }
       bool on = false;
       if (absl::Status s = ApplyBool("NANHUNT_KERNEL_NAMES", v, on); !s.ok()) return s;
       c.kernel_names = on ? KernelNames::kAlways : KernelNames::kOff;
       return absl::OkStatus();
     }},
    {{"NANHUNT_GPU_BATCH", "1", "an integer in [1, 32], or auto",
      "on a GPU with every op checked (not sample mode), how many op outputs "
      "one batch of checks covers: 1 checks each op's outputs right after "
      "the op; more holds outputs back (alive) "
      "until that many wait, 64 MiB of them, an op writes one of them or "
      "changes stream, then checks them with one launch per dtype: less host "
      "time a check, results a few ops later. Right only when every write to "
      "a GPU tensor goes through torch's operators: not with torch.compile, "
      "apex, or extensions that launch their own kernels. auto: 32 until the "
      "process loads such code (a library outside torch's and NVIDIA's that "
      "links the CUDA runtime or driver, Triton's launchers), then 1"},
     [](absl::string_view v, Config& c) {
       c.gpu_batch_auto = absl::EqualsIgnoreCase(v, "auto");
       if (c.gpu_batch_auto) {
         c.gpu_batch = 32;
         return absl::OkStatus();
       }
       return ApplyNumber("NANHUNT_GPU_BATCH", v, 1, 32, c.gpu_batch);
     }},
    {{"NANHUNT_EXIT_SUMMARY", "1", "0 or 1 (also true/false, on/off)",
      "print a short summary on stderr when the process exits"},
     [](absl::string_view v, Config& c) {
       return ApplyBool("NANHUNT_EXIT_SUMMARY", v, c.exit_summary);
     }},
    {{"NANHUNT_QUIET", "0", "0 or 1 (also true/false, on/off)",
      "no live warnings on stderr (the trace is complete either way)"},
     [](absl::string_view v, Config& c) {
       return ApplyBool("NANHUNT_QUIET", v, c.quiet);
     }},
    {{"NANHUNT_ON_NONFINITE", "continue", "continue, raise, abort",
      "at the first op that turns finite inputs into inf/NaN (or the first "
      "non-finite input): go on; raise a catchable FloatingPointError in "
      "the Python thread (abort in a C++ program); or abort the process"},
     [](absl::string_view v, Config& c) {
       const std::string s = absl::AsciiStrToLower(v);
       if (s == "continue") c.on_nonfinite = OnNonFinite::kContinue;
       else if (s == "raise") c.on_nonfinite = OnNonFinite::kRaise;
       else if (s == "abort") c.on_nonfinite = OnNonFinite::kAbort;
       else return Invalid(Info("NANHUNT_ON_NONFINITE"), v);
       return absl::OkStatus();
     }},
    {{"NANHUNT_AUTOCAST_DTYPE", "keep", "keep, bf16",
      "bf16: autocast regions that ask for fp16 run in bf16 instead (same "
      "range as fp32, no loss scaling needed), on the CPU and on GPUs that "
      "support it"},
     [](absl::string_view v, Config& c) {
       const std::string s = absl::AsciiStrToLower(v);
       if (s == "keep") c.autocast_bf16 = false;
       else if (s == "bf16" || s == "bfloat16") c.autocast_bf16 = true;
       else return Invalid(Info("NANHUNT_AUTOCAST_DTYPE"), v);
       return absl::OkStatus();
     }},
    {{"NANHUNT_FP32_OPS", "(none)",
      "comma-separated op names or globs, e.g. aten::bmm,aten::*softmax*, "
      "and/or auto",
      "these ops run in fp32: under autocast like autocast's own fp32 list "
      "(inputs upcast, outputs fp32, gradients correct); without autocast (a "
      "model made .half()) they compute in fp32 and return the dtype they "
      "would have. auto: an op that overflows or comes near the limit runs "
      "in fp32 from its next call, and the list learned is written to a "
      "policy file (see NANHUNT_POLICY)"},
     [](absl::string_view v, Config& c) {
       c.fp32_ops.clear();
       c.fp32_auto = false;
       for (absl::string_view p : absl::StrSplit(v, ',', absl::SkipWhitespace())) {
         p = absl::StripAsciiWhitespace(p);
         if (absl::EqualsIgnoreCase(p, "auto")) {
           c.fp32_auto = true;
           continue;
         }
         if (!IsOpPattern(p)) return Invalid(Info("NANHUNT_FP32_OPS"), v);
         c.fp32_ops.emplace_back(p);
       }
       if (c.fp32_ops.empty() && !c.fp32_auto) {
         return Invalid(Info("NANHUNT_FP32_OPS"), v);
       }
       return absl::OkStatus();
     }},
    {{"NANHUNT_POLICY", "(none)",
      "path to a policy file written by NANHUNT_FP32_OPS=auto",
      "the ops listed there run in fp32 from the start (with auto, newly "
      "learned ops are added to the same file)"},
     [](absl::string_view v, Config& c) {
       return ApplyNonEmpty("NANHUNT_POLICY", v, c.policy_file);
     }},
    {{"NANHUNT_SKIP_NONFINITE_STEPS", "0", "0 or 1 (also true/false, on/off)",
      "skip the optimizer update of a step whose gradients are not finite, "
      "as GradScaler does (parameters and optimizer state stay as they "
      "were); torch.optim optimizers; a GradScaler in the script keeps "
      "deciding alone"},
     [](absl::string_view v, Config& c) {
       return ApplyBool("NANHUNT_SKIP_NONFINITE_STEPS", v,
                        c.skip_nonfinite_steps);
     }},
    {{"NANHUNT_SNAPSHOT_DIR", "(none)", "a directory path (created, mode 0700)",
      "with raise or abort: first save the offending op's inputs and "
      "arguments there (torch.load reads it; mode 0600: it holds training "
      "data); `nanhunt replay` re-runs it"},
     [](absl::string_view v, Config& c) {
       return ApplyNonEmpty("NANHUNT_SNAPSHOT_DIR", v, c.snapshot_dir);
     }},
    {{"NANHUNT_TORCH_PLUGIN", "(next to libnanhunt.so)",
      "path to a libnanhunt_torch.so",
      "the torch plugin to load; must be built against the torch in use"},
     [](absl::string_view v, Config& c) {
       return ApplyNonEmpty("NANHUNT_TORCH_PLUGIN", v, c.torch_plugin);
     }},
    {{"NANHUNT_RUN_ID", "(one per process)", "letters, digits, '-', '_', '.'",
      "groups the traces of one run; set by `nanhunt run`"},
     [](absl::string_view v, Config& c) {
       const bool ok = !v.empty() && v.size() <= 64 &&
                       std::all_of(v.begin(), v.end(), [](char ch) {
                         return absl::ascii_isalnum(ch) || ch == '-' ||
                                ch == '_' || ch == '.';
                       });
       if (!ok) return Invalid(Info("NANHUNT_RUN_ID"), v);
       c.run_id = std::string(v);
       return absl::OkStatus();
     }},
    {{"NANHUNT_PYTHON", "(.venv, else python3)", "path to a Python with torch",
      "the Python that scripts/build.sh builds the plugin against and that "
      "`nanhunt replay` runs; not read by monitored processes"},
     [](absl::string_view v, Config&) {
       return v.empty() ? Invalid(Info("NANHUNT_PYTHON"), v) : absl::OkStatus();
     }},
    {{"NANHUNT_PROGRESS_MS", "1000", "an integer in [0, 600000]",
      "`nanhunt view`, `report` and `compare` show a progress line on a "
      "terminal when reading traces takes longer than this; not read by "
      "monitored processes"},
     [](absl::string_view v, Config& c) {
       return ApplyNumber("NANHUNT_PROGRESS_MS", v, 0, 600000, c.progress_ms);
     }},
    {{"NANHUNT_CONFIG", "(none)", "path to a readable file",
      "config file of NAME = value lines; the environment wins over it"},
     [](absl::string_view, Config&) { return absl::OkStatus(); }},
};

const SettingInfo& Info(const char* name) {
  for (const auto& s : kSettings) {
    if (absl::string_view(s.info.name) == name) return s.info;
  }
  return kSettings[0].info;  // unreachable: every caller names a setting
}

const Setting* Find(absl::string_view name) {
  for (const auto& s : kSettings) {
    if (absl::EqualsIgnoreCase(s.info.name, name)) return &s;
  }
  return nullptr;
}

std::string KnownNames() {
  std::vector<std::string> names;
  for (const auto& s : kSettings) names.push_back(s.info.name);
  return absl::StrJoin(names, ", ");
}

// A config or policy file line without its `#` comment and blanks.
absl::string_view Content(absl::string_view line) {
  const size_t hash = line.find('#');
  if (hash != absl::string_view::npos) line = line.substr(0, hash);
  return absl::StripAsciiWhitespace(line);
}

// Reads `NAME = value` lines; names are normalised to NANHUNT_NAME.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ReadFile(
    const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NANHUNT_CONFIG='", path,
        "' cannot be read; allowed: path to a readable file"));
  }
  std::vector<std::pair<std::string, std::string>> entries;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const absl::string_view rest = Content(line);
    if (rest.empty()) continue;
    const std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(rest, absl::MaxSplits('=', 1));
    if (rest.find('=') == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ":", number, ": expected NAME = value, got '", rest, "'"));
    }
    std::string name = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(kv.first));
    if (!absl::StartsWith(name, "NANHUNT_")) name = "NANHUNT_" + name;
    if (Find(name) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", number, ": unknown setting '", kv.first,
                       "'; known: ", KnownNames()));
    }
    entries.emplace_back(name,
                         std::string(absl::StripAsciiWhitespace(kv.second)));
  }
  return entries;
}

}  // namespace

absl::Span<const SettingInfo> AllSettings() {
  static const std::vector<SettingInfo>* infos = [] {
    auto* v = new std::vector<SettingInfo>;  // leaked: lives for the process
    for (const auto& s : kSettings) v->push_back(s.info);
    return v;
  }();
  return *infos;
}

absl::StatusOr<Config> LoadConfig(const EnvLookup& env,
                                  const std::vector<std::string>& env_names) {
  for (const auto& name : env_names) {
    if (absl::StartsWith(name, "NANHUNT_") && Find(name) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown setting ", name, "; known: ", KnownNames()));
    }
  }
  Config config;
  if (auto file = env("NANHUNT_CONFIG")) {
    auto entries = ReadFile(*file);
    if (!entries.ok()) return entries.status();
    for (const auto& [name, value] : *entries) {
      absl::Status s = Find(name)->apply(value, config);
      if (!s.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(*file, ": ", s.message()));
      }
    }
    config.config_file = *file;
  }
  for (const auto& s : kSettings) {
    if (auto value = env(s.info.name)) {
      absl::Status st = s.apply(*value, config);
      if (!st.ok()) return st;
    }
  }
  if (!config.policy_file.empty()) {
    // A first auto run may name the file it is about to write.
    const bool may_be_missing =
        config.fp32_auto && access(config.policy_file.c_str(), F_OK) != 0;
    if (!may_be_missing) {
      auto ops = ReadPolicyFile(config.policy_file);
      if (!ops.ok()) return ops.status();
      for (std::string& op : *ops) {
        if (std::find(config.fp32_ops.begin(), config.fp32_ops.end(), op) ==
            config.fp32_ops.end()) {
          config.fp32_ops.push_back(std::move(op));
        }
      }
    }
  }
  return config;
}

absl::StatusOr<std::vector<std::string>> ReadPolicyFile(
    const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NANHUNT_POLICY='", path, "' cannot be read; allowed: ",
        Info("NANHUNT_POLICY").allowed));
  }
  std::vector<std::string> ops;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const absl::string_view rest = Content(line);
    if (rest.empty()) continue;
    if (!IsOpPattern(rest)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "NANHUNT_POLICY: ", path, ":", number, ": '", rest,
          "' is not an op name; allowed: one op name or glob per line, "
          "e.g. aten::bmm"));
    }
    ops.emplace_back(rest);
  }
  return ops;
}

absl::Status WritePolicyFile(const std::string& path,
                             const std::vector<std::string>& ops,
                             const std::string& header) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) {
      return absl::InternalError(absl::StrCat("cannot write ", tmp));
    }
    for (absl::string_view l : absl::StrSplit(header, '\n')) {
      out << "# " << l << "\n";
    }
    for (const std::string& op : ops) out << op << "\n";
    if (!out.flush()) {
      return absl::InternalError(absl::StrCat("cannot write ", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot replace ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<Config> LoadConfigFromProcess() {
  std::vector<std::string> names;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    absl::string_view entry(*e);
    names.emplace_back(entry.substr(0, entry.find('=')));
  }
  return LoadConfig(
      [](const char* name) -> std::optional<std::string> {
        const char* v = getenv(name);
        if (v == nullptr) return std::nullopt;
        return std::string(v);
      },
      names);
}

std::string DescribeConfig(const Config& c) {
  return absl::StrCat(
      "NANHUNT_MODE=",
      c.mode == Mode::kOff ? "off" : c.mode == Mode::kCheck ? "check" : "sample",
      c.mode == Mode::kSample
          ? absl::StrCat("\nNANHUNT_SAMPLE_OPS=", c.sample_ops,
                         "\nNANHUNT_SAMPLE_STEPS=", c.sample_steps,
                         "\nNANHUNT_SAMPLE_SEED=", c.sample_seed,
                         "\nNANHUNT_ESCALATE_STEPS=", c.escalate_steps,
                         c.budget > 0 ? absl::StrCat("\nNANHUNT_BUDGET=", c.budget * 100, "%")
                                      : "")
          : "",
      "\nNANHUNT_OUT=", c.out_dir, "\nNANHUNT_NEAR_MAX=", c.near_max,
      "\nNANHUNT_UNDERFLOW_FRACTION=", c.underflow_fraction,
      "\nNANHUNT_FLUSH_MS=", c.flush_ms,
      "\nNANHUNT_MAX_TRACE_MB=", c.max_trace_mb,
      "\nNANHUNT_MAX_FINDINGS_PER_STEP=", c.max_findings_per_step,
      "\nNANHUNT_FOLLOW_CHILDREN=", c.follow_children ? 1 : 0,
      "\nNANHUNT_KERNEL_NAMES=",
      c.kernel_names == KernelNames::kFirstWarning ? "auto"
      : c.kernel_names == KernelNames::kAlways     ? "1"
                                                   : "0",
      c.gpu_batch_auto  ? "\nNANHUNT_GPU_BATCH=auto"
      : c.gpu_batch > 1 ? absl::StrCat("\nNANHUNT_GPU_BATCH=", c.gpu_batch)
                        : "",
      "\nNANHUNT_EXIT_SUMMARY=", c.exit_summary ? 1 : 0,
      "\nNANHUNT_QUIET=", c.quiet ? 1 : 0,
      "\nNANHUNT_ON_NONFINITE=",
      c.on_nonfinite == OnNonFinite::kContinue ? "continue"
      : c.on_nonfinite == OnNonFinite::kRaise  ? "raise"
                                               : "abort",
      c.snapshot_dir.empty() ? "" : "\nNANHUNT_SNAPSHOT_DIR=", c.snapshot_dir,
      c.autocast_bf16 ? "\nNANHUNT_AUTOCAST_DTYPE=bf16" : "",
      c.fp32_ops.empty() && !c.fp32_auto ? "" : "\nNANHUNT_FP32_OPS=",
      absl::StrJoin(c.fp32_ops, ","),
      c.fp32_auto ? (c.fp32_ops.empty() ? "auto" : ",auto") : "",
      c.policy_file.empty() ? "" : "\nNANHUNT_POLICY=", c.policy_file,
      c.skip_nonfinite_steps ? "\nNANHUNT_SKIP_NONFINITE_STEPS=1" : "",
      c.config_file.empty() ? "" : "\nNANHUNT_CONFIG=", c.config_file);
}

}  // namespace nanhunt
