#include "viewer/trace_reader.h"

#include <dirent.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/op_policy.h"
#include "core/trace_schema.h"
#include "core/unchecked_outputs.h"
#include "viewer/run_groups.h"

namespace nanhunt {
namespace {

std::string Text(sqlite3_stmt* s, int col) {
  const unsigned char* t = sqlite3_column_text(s, col);
  return t ? reinterpret_cast<const char*>(t) : "";
}

// Runs `sql`, calling `row` per result row; on failure notes the problem
// and keeps what was read before the failure.
void Query(sqlite3* db, const char* table, const char* sql,
           const std::function<void(sqlite3_stmt*)>& row,
           std::vector<std::string>& problems) {
  sqlite3_stmt* s = nullptr;
  if (sqlite3_prepare_v2(db, sql, -1, &s, nullptr) != SQLITE_OK) {
    problems.push_back(
        absl::StrCat("table ", table, " unreadable: ", sqlite3_errmsg(db)));
    sqlite3_finalize(s);
    return;
  }
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) row(s);
  if (rc != SQLITE_DONE) {
    problems.push_back(absl::StrCat("table ", table, " read only in part: ",
                                    sqlite3_errmsg(db)));
  }
  sqlite3_finalize(s);
}

FindingRow ReadFinding(sqlite3_stmt* s) {
  FindingRow f;
  int i = 0;
  f.kind = Text(s, i++);
  f.step = sqlite3_column_int64(s, i++);
  f.call_index = sqlite3_column_int64(s, i++);
  f.op = Text(s, i++);
  f.top_op = Text(s, i++);
  f.phase = Text(s, i++);
  f.forward_op = Text(s, i++);
  f.dtype = Text(s, i++);
  for (int64_t* v : {&f.elements, &f.nan, &f.posinf, &f.neginf, &f.near_max,
                     &f.underflow}) {
    *v = sqlite3_column_int64(s, i++);
  }
  f.max_abs = sqlite3_column_double(s, i++);
  if (sqlite3_column_type(s, i) != SQLITE_NULL) {
    f.fp32_max_abs = sqlite3_column_double(s, i);
  }
  ++i;
  f.inputs = Text(s, i++);
  f.outputs = Text(s, i++);
  f.source = Text(s, i++);
  f.stack = Text(s, i++);
  f.thread = sqlite3_column_int64(s, i++);
  f.time = sqlite3_column_double(s, i++);
  if (sqlite3_column_count(s) > i) f.kernels = Text(s, i++);  // schema 4
  if (sqlite3_column_count(s) > i) f.compiled_region = Text(s, i++);  // schema 8
  if (sqlite3_column_count(s) > i) f.via = Text(s, i++);              // schema 9
  return f;
}

bool IsDirectory(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Whether the trace has `table` (older schemas lack the newer tables).
bool HasTable(sqlite3* db, const std::string& table, std::vector<std::string>& problems) {
  bool found = false;
  const std::string sql =
      absl::StrCat("SELECT 1 FROM sqlite_master WHERE name = '", table, "'");
  Query(db, "sqlite_master", sql.c_str(), [&](sqlite3_stmt*) { found = true; },
        problems);
  return found;
}

// The events rows of `kind` whose detail is "step N: ...", in order: N and
// what follows ": ".
std::vector<StepEvent> EventsOfKind(sqlite3* db, absl::string_view kind,
                                    std::vector<std::string>& problems) {
  std::vector<StepEvent> events;
  const std::string sql =
      absl::StrCat("SELECT detail FROM events WHERE kind = '", kind, "' ORDER BY rowid");
  Query(db, "events", sql.c_str(),
        [&](sqlite3_stmt* s) {
          const std::string detail = Text(s, 0);
          const absl::string_view rest = absl::StripPrefix(detail, "step ");
          const size_t colon = rest.find(':');
          int64_t step = 0;
          if (colon != absl::string_view::npos && absl::SimpleAtoi(rest.substr(0, colon), &step)) {
            events.push_back({step, std::string(absl::StripLeadingAsciiWhitespace(
                                        rest.substr(colon + 1)))});
          }
        },
        problems);
  return events;
}

// The steps of the events rows of `kind`.
std::vector<int64_t> StepsOfEvents(sqlite3* db, absl::string_view kind,
                                   std::vector<std::string>& problems) {
  std::vector<int64_t> steps;
  for (const StepEvent& e : EventsOfKind(db, kind, problems)) steps.push_back(e.step);
  return steps;
}

// Whether `table` has `column` (traces of older schemas lack newer ones).
// A trace before schema 7 merged an op's mask calls with its others: its
// rows count as masks, as the viewer read them then, when the op is in
// meta mask_ops and made ±inf but no NaN (totals), in a step where no op
// made real inf/NaN (steps).
void InferMasks(Trace& t) {
  auto it = t.meta.find("mask_ops");
  if (it == t.meta.end()) return;
  const std::vector<std::string> ops = absl::StrSplit(it->second, ',', absl::SkipEmpty());
  auto listed = [&](const std::string& op) {
    return std::find(ops.begin(), ops.end(), op) != ops.end();
  };
  for (OpTotals& o : t.ops) o.mask = o.nan == 0 && o.nonfinite() > 0 && listed(o.op);
  std::set<int64_t> bad_steps;
  for (const StepRow& st : t.steps) {
    if (st.nonfinite_ops > 0) bad_steps.insert(st.step);
  }
  for (OpStep& o : t.op_steps) {
    o.mask = o.nonfinite > 0 && !bad_steps.count(o.step) && listed(o.op);
  }
}

bool HasColumn(sqlite3* db, const char* table, const char* column) {
  sqlite3_stmt* s = nullptr;
  const std::string sql = absl::StrCat("SELECT ", column, " FROM ", table, " LIMIT 0");
  const bool ok = sqlite3_prepare_v2(db, sql.c_str(), -1, &s, nullptr) == SQLITE_OK;
  sqlite3_finalize(s);
  return ok;
}

// "nanhunt: reading <file>... 2.4 s" on a terminal, for reads that take
// longer than a moment; SQLite calls Tick as it works. Cleared when done.
class ProgressLine {
 public:
  ProgressLine(sqlite3* db, const std::string& path, int after_ms)
      : db_(db), path_(path), after_(std::chrono::milliseconds(after_ms)) {
    if (after_ms >= 0 && isatty(STDERR_FILENO)) {
      sqlite3_progress_handler(db_, 200000, &Tick, this);
    }
  }
  ~ProgressLine() {
    sqlite3_progress_handler(db_, 0, nullptr, nullptr);
    if (shown_) fputs("\r\x1b[K", stderr);
  }

 private:
  static int Tick(void* self) {
    auto* p = static_cast<ProgressLine*>(self);
    const auto elapsed = std::chrono::steady_clock::now() - p->start_;
    // Redrawn at most five times a second.
    if (elapsed >= p->after_ && elapsed - p->drawn_ >= std::chrono::milliseconds(200)) {
      fprintf(stderr, "\rnanhunt: reading %s... %.1f s", p->path_.c_str(),
              std::chrono::duration<double>(elapsed).count());
      p->shown_ = true;
      p->drawn_ = std::chrono::duration_cast<std::chrono::steady_clock::duration>(elapsed);
    }
    return 0;  // never interrupts
  }

  sqlite3* const db_;
  const std::string path_;
  const std::chrono::milliseconds after_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  bool shown_ = false;
  std::chrono::steady_clock::duration drawn_ = std::chrono::hours(-1);
};

// "nanhunt-<run id>-<pid>.sqlite" -> "<run id>".
std::string RunIdOf(const std::string& file) {
  std::string base = file.substr(file.rfind('/') + 1);
  if (!absl::StartsWith(base, "nanhunt-")) return base;
  base = base.substr(8);
  const size_t dash = base.rfind('-');
  return dash == std::string::npos ? base : base.substr(0, dash);
}

absl::StatusOr<sqlite3*> OpenTrace(const std::string& path) {
  sqlite3* db = nullptr;
  // Read-write without create: a trace left by a killed process has a WAL
  // file that must be replayed. Falls back to read-only for read-only media.
  int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr);
  if (rc != SQLITE_OK) {
    sqlite3_close(db);
    db = nullptr;
    rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr);
  }
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot open as a trace: ", msg));
  }
  sqlite3_busy_timeout(db, 2000);  // a live writer commits in milliseconds
  // A trace cut short (disk full, copied mid-write) has a header that
  // promises more pages than the file holds, which SQLite otherwise refuses
  // as corrupt. With writable_schema it reads up to the cut instead. The
  // viewer never writes, so the pragma's other effect does not matter.
  sqlite3_exec(db, "PRAGMA writable_schema=ON", nullptr, nullptr, nullptr);
  return db;
}

// What the trace's meta says of its process; the name stands in for what
// cannot be read.
TraceIdentity ReadIdentity(const std::string& path) {
  TraceIdentity id;
  id.file = path;
  std::map<std::string, std::string> meta;
  if (auto db = OpenTrace(path); db.ok()) {
    std::vector<std::string> problems;
    Query(*db, "meta",
          "SELECT key, value FROM meta WHERE key IN "
          "('run_id', 'host', 'pid', 'ppid', 'started', 'ended')",
          [&](sqlite3_stmt* s) { meta[Text(s, 0)] = Text(s, 1); }, problems);
    sqlite3_close(*db);
  }
  auto number = [&](const char* key) {
    int64_t v = 0;
    auto it = meta.find(key);
    return it != meta.end() && absl::SimpleAtoi(it->second, &v) ? v : 0;
  };
  id.run_id = meta.count("run_id") ? meta["run_id"] : RunIdOf(path);
  id.host = meta["host"];
  id.pid = number("pid");
  id.ppid = number("ppid");
  id.started = number("started");
  id.ended = number("ended");
  return id;
}

// A note for a count in the meta that is not zero: "<count><what><then>",
// with the ops whose outputs it counts for `reasons` (schema 6) between:
// "<count><what> (<ops>)<then>".
void NoteCount(Trace& t, const char* key, absl::string_view what, absl::string_view then = "",
               absl::Span<const UncheckedReason> reasons = {}) {
  auto it = t.meta.find(key);
  if (it == t.meta.end() || it->second == "0") return;
  const std::string ops = DescribeUncheckedOps(t.unchecked, reasons);
  t.problems.push_back(
      absl::StrCat(it->second, what, ops.empty() ? "" : " (" + ops + ")", then));
}

// Trace::phase_steps, read after the findings. GradScaler's scale, an
// optimizer output that doubles as it grows, is no value of the model.
void ReadPhaseSteps(sqlite3* db, const std::string& mask_column, Trace& t) {
  std::optional<int64_t> origin_step;
  for (const FindingRow& f : t.findings) {
    if (f.kind == "origin" && (!origin_step || f.step < *origin_step)) origin_step = f.step;
  }
  if (!origin_step) return;
  const std::string sql = absl::StrCat(
      "SELECT step, phase, MAX(CASE WHEN nan + posinf + neginf = 0 THEN max_abs ELSE 0 END),"
      " SUM(nan + posinf + neginf) FROM op_stats WHERE step <= ", *origin_step, " AND ",
      mask_column, " = 0 AND op != '", kScalerUpdate, "' GROUP BY step, phase ORDER BY step");
  Query(db, "op_stats", sql.c_str(),
        [&](sqlite3_stmt* s) {
          PhaseStep p;
          p.step = sqlite3_column_int64(s, 0);
          p.phase = Text(s, 1);
          p.max_abs = sqlite3_column_double(s, 2);
          p.nonfinite = sqlite3_column_int64(s, 3);
          t.phase_steps.push_back(std::move(p));
        },
        t.problems);
}

}  // namespace

absl::StatusOr<Trace> ReadTrace(const std::string& path, bool with_series,
                                int progress_ms) {
  auto opened = OpenTrace(path);
  if (!opened.ok()) return opened.status();
  sqlite3* db = *opened;
  Trace t;
  std::optional<ProgressLine> progress;
  progress.emplace(db, path, progress_ms);
  t.path = path;
  Query(db, "meta", "SELECT key, value FROM meta",
        [&](sqlite3_stmt* s) { t.meta[Text(s, 0)] = Text(s, 1); }, t.problems);
  const bool has_kernels = HasColumn(db, "findings", "kernels");
  const bool has_regions = has_kernels && HasColumn(db, "findings", "compiled_region");
  const bool has_via = has_regions && HasColumn(db, "findings", "via");
  const std::string findings_sql = absl::StrCat(
      "SELECT kind,step,call_index,op,top_op,phase,forward_op,dtype,"
      "elements,nan,posinf,neginf,near_max,underflow,max_abs,fp32_max_abs,"
      "inputs,outputs,source,stack,thread,time",
      has_kernels ? ",kernels" : "", has_regions ? ",compiled_region" : "",
      has_via ? ",via" : "",
      " FROM findings ORDER BY id");
  Query(db, "findings", findings_sql.c_str(),
        [&](sqlite3_stmt* s) { t.findings.push_back(ReadFinding(s)); },
        t.problems);
  // Schema 7 keeps an op's mask calls in rows of their own; before, they
  // were merged with its other calls (InferMasks).
  const bool has_mask_rows = HasColumn(db, "op_stats", "mask");
  const std::string mask_column = has_mask_rows ? "mask" : "0";
  const std::string by_mask = has_mask_rows ? ", mask" : "";  // GROUP BY 0 names a column
  const std::string totals_sql = absl::StrCat(
      "SELECT op, phase, SUM(calls), SUM(elements), SUM(nan), SUM(posinf),"
      " SUM(neginf), SUM(near_max), SUM(underflow), SUM(fp16_overflow),"
      " SUM(CASE WHEN dtype IN ('float16', 'float8_e5m2') THEN elements ELSE 0 END),"
      " SUM(CASE WHEN dtype IN ('float16', 'float8_e5m2') THEN underflow ELSE 0 END),"
      " MAX(max_abs), ", mask_column, " FROM op_stats GROUP BY op, phase", by_mask);
  Query(db, "op_stats", totals_sql.c_str(),
        [&](sqlite3_stmt* s) {
          OpTotals o;
          o.op = Text(s, 0);
          o.phase = Text(s, 1);
          int i = 2;
          for (int64_t* v : {&o.calls, &o.elements, &o.nan, &o.posinf,
                             &o.neginf, &o.near_max, &o.underflow,
                             &o.fp16_overflow, &o.fp16_elements, &o.fp16_underflow}) {
            *v = sqlite3_column_int64(s, i++);
          }
          o.max_abs = sqlite3_column_double(s, i++);
          o.mask = sqlite3_column_int(s, i) != 0;
          t.ops.push_back(std::move(o));
        },
        t.problems);
  int64_t last_step = 0;
  Query(db, "op_stats", "SELECT MAX(step), group_concat(DISTINCT dtype) FROM op_stats",
        [&](sqlite3_stmt* s) {
          last_step = sqlite3_column_int64(s, 0);
          for (absl::string_view d : absl::StrSplit(Text(s, 1), ',', absl::SkipEmpty())) {
            t.dtypes.emplace_back(d);
          }
        },
        t.problems);
  {
    // The trend: max |x| per quarter of the steps, non-finite as +inf.
    const std::string sql = absl::StrCat(
        "SELECT op, phase, MIN(3, step * 4 / ", last_step + 1, "), "
        "MAX(CASE WHEN nan + posinf + neginf > 0 THEN 9e999 ELSE max_abs END), ",
        mask_column, " FROM op_stats GROUP BY 1, 2, 3", by_mask);
    std::map<std::tuple<std::string, std::string, bool>, OpTotals*> by_key;
    for (OpTotals& o : t.ops) by_key[{o.op, o.phase, o.mask}] = &o;
    Query(db, "op_stats", sql.c_str(),
          [&](sqlite3_stmt* s) {
            auto it = by_key.find({Text(s, 0), Text(s, 1), sqlite3_column_int(s, 4) != 0});
            const int q = sqlite3_column_int(s, 2);
            if (it != by_key.end() && q >= 0 && q < 4) {
              it->second->quarters[q] = sqlite3_column_double(s, 3);
            }
          },
          t.problems);
  }
  if (with_series) {
    const std::string sql = absl::StrCat(
        "SELECT step, op, phase, dtype, MAX(max_abs),"
        " SUM(nan + posinf + neginf), SUM(underflow), SUM(elements), ", mask_column,
        " FROM op_stats GROUP BY step, op, phase, dtype", by_mask, " ORDER BY step");
    Query(db, "op_stats", sql.c_str(),
          [&](sqlite3_stmt* s) {
            OpStep o;
            o.step = sqlite3_column_int64(s, 0);
            o.op = Text(s, 1);
            o.phase = Text(s, 2);
            o.dtype = Text(s, 3);
            o.max_abs = sqlite3_column_double(s, 4);
            o.nonfinite = sqlite3_column_int64(s, 5);
            o.underflow = sqlite3_column_int64(s, 6);
            o.elements = sqlite3_column_int64(s, 7);
            o.mask = sqlite3_column_int(s, 8) != 0;
            t.op_steps.push_back(std::move(o));
          },
          t.problems);
  }
  ReadPhaseSteps(db, mask_column, t);
  Query(db, "steps",
        "SELECT step, SUM(ops), SUM(nonfinite_ops), SUM(origins), "
        "MAX(max_abs), MIN(started), MAX(ended) FROM steps GROUP BY step "
        "ORDER BY step",
        [&](sqlite3_stmt* s) {
          StepRow r;
          r.step = sqlite3_column_int64(s, 0);
          r.ops = sqlite3_column_int64(s, 1);
          r.nonfinite_ops = sqlite3_column_int64(s, 2);
          r.origins = sqlite3_column_int64(s, 3);
          r.max_abs = sqlite3_column_double(s, 4);
          r.started = sqlite3_column_double(s, 5);
          r.ended = sqlite3_column_double(s, 6);
          t.steps.push_back(r);
        },
        t.problems);
  if (!has_mask_rows) InferMasks(t);
  t.dropped_steps = StepsOfEvents(db, kNonFiniteDropped, t.problems);
  t.program_skipped_steps = StepsOfEvents(db, kProgramSkippedUpdate, t.problems);
  t.given_up_steps = StepsOfEvents(db, kGaveUpIteration, t.problems);
  t.unfinished_steps = StepsOfEvents(db, kUnfinishedStep, t.problems);
  t.diverging = EventsOfKind(db, kDiverging, t.problems);
  t.eps_rounded = EventsOfKind(db, kEpsRoundedToZero, t.problems);
  t.mask_literals = EventsOfKind(db, kMaskLiteralPastRange, t.problems);
  if (HasTable(db, "loss_scale", t.problems)) {  // schema 2 and later
    Query(db, "loss_scale",
          "SELECT step, scale, skipped FROM loss_scale ORDER BY rowid",
          [&](sqlite3_stmt* s) {
            t.loss_scale.push_back(LossScaleRow{sqlite3_column_int64(s, 0),
                                                sqlite3_column_double(s, 1),
                                                sqlite3_column_int64(s, 2) != 0});
          },
          t.problems);
  }
  if (HasTable(db, "skipped_steps", t.problems)) {  // schema 3 and later
    Query(db, "skipped_steps",
          "SELECT step, first_op, forward_op, time FROM skipped_steps ORDER BY rowid",
          [&](sqlite3_stmt* s) {
            SkipRow r;
            r.step = sqlite3_column_int64(s, 0);
            r.first_op = Text(s, 1);
            r.forward_op = Text(s, 2);
            r.time = sqlite3_column_double(s, 3);
            t.skips.push_back(std::move(r));
          },
          t.problems);
  }
  if (HasTable(db, "escalations", t.problems)) {  // schema 5 and later
    Query(db, "escalations",
          "SELECT step, until_step, why, time FROM escalations ORDER BY rowid",
          [&](sqlite3_stmt* s) {
            EscalationRow r;
            r.step = sqlite3_column_int64(s, 0);
            r.until_step = sqlite3_column_int64(s, 1);
            r.why = Text(s, 2);
            r.time = sqlite3_column_double(s, 3);
            t.escalations.push_back(std::move(r));
          },
          t.problems);
  }
  if (HasTable(db, "unchecked_outputs", t.problems)) {  // schema 6 and later
    Query(db, "unchecked_outputs",
          "SELECT op, phase, reason, outputs, first_step, last_step FROM unchecked_outputs "
          "ORDER BY outputs DESC, op",
          [&](sqlite3_stmt* s) {
            t.unchecked.push_back(UncheckedRow{Text(s, 0), Text(s, 1), Text(s, 2),
                                               sqlite3_column_int64(s, 3),
                                               sqlite3_column_int64(s, 4),
                                               sqlite3_column_int64(s, 5)});
          },
          t.problems);
  }
  progress.reset();
  sqlite3_close(db);
  if (t.meta.empty() && !t.problems.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": not a readable nanhunt trace (", t.problems.front(), ")"));
  }
  if (auto it = t.meta.find("monitoring_stopped"); it != t.meta.end()) {
    t.problems.push_back(absl::StrCat(
        "monitoring stopped early (", it->second.substr(0, 200),
        "): nothing after that point was checked"));
  }
  if (auto it = t.meta.find("outputs_unchecked");
      it != t.meta.end() && it->second != "0") {
    auto reason = t.meta.find("unchecked_reason");
    const std::string ops = DescribeUncheckedOps(t.unchecked, kCountedUnchecked);
    t.problems.push_back(absl::StrCat(
        it->second, " floating-point op outputs were not checked",
        reason != t.meta.end() ? " (" + reason->second + ")" : std::string(),
        ops.empty() ? ": " : ": " + ops + "; ",
        "\"all finite\" covers only what was checked"));
  }
  // CUDA graphs: what was captured was never checked, and a replay runs
  // no op through torch's dispatcher, so nothing of it is seen again.
  static constexpr UncheckedReason kCaptured[] = {UncheckedReason::kGraphCapture};
  NoteCount(t, "outputs_in_graph_capture",
            " op outputs were captured into CUDA graphs",
            ": not checked when captured nor when the graphs replay; to check those "
            "ops, run them once uncaptured (torch.compile without "
            "mode=\"reduce-overhead\", or eagerly)",
            kCaptured);
  NoteCount(t, "optimizer_steps_in_graph_capture",
            " optimizer steps ran inside a CUDA graph capture: their "
            "gradients were not checked and no such step can be skipped (a check "
            "would read the gradients on the host and end the capture)");
  // NANHUNT_GPU_BATCH: outputs whose memory went before their late check,
  // and why batching stopped (auto), which stderr said once, mid-run.
  static constexpr UncheckedReason kReleased[] = {UncheckedReason::kReleased};
  NoteCount(t, "outputs_released_before_check",
            " GPU op outputs held back for a batch gave their memory back "
            "before their check ran",
            " (a storage freed without an op, as FSDP frees parameters): not checked; "
            "NANHUNT_GPU_BATCH=1 checks each right after its op",
            kReleased);
  if (auto it = t.meta.find("gpu_batch_stopped"); it != t.meta.end()) {
    t.problems.push_back(absl::StrCat("NANHUNT_GPU_BATCH=auto stopped batching: ", it->second));
  }
  if (t.meta.count("ended") == 0) {
    t.problems.push_back(
        "the process did not finish cleanly (killed, crashed, or still "
        "running): the trace holds what was committed before that");
  }
  return t;
}

absl::StatusOr<std::vector<std::string>> FindTraceFiles(
    const std::vector<std::string>& paths, bool all_runs) {
  std::vector<std::string> files;
  for (const std::string& p : paths) {
    if (!IsDirectory(p)) {
      struct stat st {};
      if (stat(p.c_str(), &st) != 0) {
        return absl::NotFoundError(absl::StrCat(p, ": no such file or folder"));
      }
      files.push_back(p);
      continue;
    }
    std::vector<std::string> in_dir;
    if (DIR* d = opendir(p.c_str())) {
      while (dirent* e = readdir(d)) {
        const std::string name = e->d_name;
        if (absl::EndsWith(name, ".sqlite")) in_dir.push_back(p + "/" + name);
      }
      closedir(d);
    }
    if (in_dir.empty()) {
      return absl::NotFoundError(
          absl::StrCat(p, ": no nanhunt traces (*.sqlite) in this folder"));
    }
    std::sort(in_dir.begin(), in_dir.end());
    if (!all_runs) {
      std::vector<TraceIdentity> ids;
      for (const auto& f : in_dir) ids.push_back(ReadIdentity(f));
      in_dir = NewestRun(ids);
    }
    files.insert(files.end(), in_dir.begin(), in_dir.end());
  }
  return files;
}

}  // namespace nanhunt
