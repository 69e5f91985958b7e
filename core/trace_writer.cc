#include "core/trace_writer.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/quiet_thread.h"
#include "core/trace_schema.h"

namespace nanhunt {
namespace {

absl::Status SqliteError(sqlite3* db, absl::string_view what) {
  return absl::InternalError(
      absl::StrCat(what, ": ", db ? sqlite3_errmsg(db) : "out of memory"));
}

void BindText(sqlite3_stmt* s, int i, const std::string& v) {
  sqlite3_bind_text(s, i, v.data(), static_cast<int>(v.size()),
                    SQLITE_TRANSIENT);
}

void BindTime(sqlite3_stmt* s, int i, double t) {
  if (std::isnan(t)) {
    sqlite3_bind_null(s, i);
  } else {
    sqlite3_bind_double(s, i, t);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<TraceWriter>> TraceWriter::Open(
    const std::string& path, std::chrono::milliseconds flush_interval,
    int64_t max_bytes) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                          SQLITE_OPEN_NOMUTEX,
                      nullptr) != SQLITE_OK) {
    absl::Status s = SqliteError(db, absl::StrCat("cannot create trace ", path));
    sqlite3_close(db);
    return s;
  }
  // WAL: a commit is durable against a process crash once written, and
  // readers (nanhunt view on a running job) never block the writer.
  // synchronous=NORMAL: no fsync per commit; only an OS crash can lose the
  // last commits, never the file's integrity.
  const std::string setup = absl::StrCat(
      "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;", kTraceSchema);
  char* err = nullptr;
  if (sqlite3_exec(db, setup.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    absl::Status s = absl::InternalError(
        absl::StrCat("cannot initialise trace ", path, ": ", err ? err : ""));
    sqlite3_free(err);
    sqlite3_close(db);
    return s;
  }
  return std::unique_ptr<TraceWriter>(
      new TraceWriter(path, db, flush_interval, max_bytes));
}

TraceWriter::TraceWriter(std::string path, sqlite3* db,
                         std::chrono::milliseconds flush_interval, int64_t max_bytes)
    : path_(std::move(path)),
      db_(db),
      flush_interval_(flush_interval),
      max_bytes_(max_bytes) {
  sqlite3_prepare_v2(db_, "INSERT OR REPLACE INTO meta VALUES(?,?)", -1,
                     &meta_stmt_, nullptr);
  sqlite3_prepare_v2(db_,
                     "INSERT INTO op_stats VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                     -1, &stats_stmt_, nullptr);
  sqlite3_prepare_v2(
      db_,
      "INSERT INTO findings(kind,step,call_index,op,top_op,phase,forward_op,"
      "dtype,elements,nan,posinf,neginf,near_max,underflow,max_abs,"
      "fp32_max_abs,inputs,outputs,source,stack,thread,time,kernels,compiled_region,via) "
      "VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
      -1, &finding_stmt_, nullptr);
  sqlite3_prepare_v2(db_, "INSERT INTO steps VALUES(?,?,?,?,?,?,?)", -1,
                     &step_stmt_, nullptr);
  sqlite3_prepare_v2(db_, "INSERT INTO events VALUES(?,?,?)", -1,
                     &event_stmt_, nullptr);
  sqlite3_prepare_v2(db_, "INSERT INTO loss_scale VALUES(?,?,?)", -1,
                     &scale_stmt_, nullptr);
  sqlite3_prepare_v2(db_, "INSERT INTO skipped_steps VALUES(?,?,?,?)", -1,
                     &skip_stmt_, nullptr);
  sqlite3_prepare_v2(db_, "INSERT INTO escalations VALUES(?,?,?,?)", -1,
                     &escalation_stmt_, nullptr);
  sqlite3_prepare_v2(db_, "INSERT INTO unchecked_outputs VALUES(?,?,?,?,?,?)", -1,
                     &unchecked_stmt_, nullptr);
  thread_ = StartQuietThread([this] { Run(); });
}

TraceWriter::~TraceWriter() {
  Close();
  for (sqlite3_stmt* s :
       {meta_stmt_, stats_stmt_, finding_stmt_, step_stmt_, event_stmt_,
        scale_stmt_, skip_stmt_, escalation_stmt_, unchecked_stmt_}) {
    sqlite3_finalize(s);
  }
  sqlite3_close(db_);
}

void TraceWriter::Enqueue(Row row) {
  absl::MutexLock lock(&mu_);
  if (closed_) return;
  queue_.push_back(std::move(row));
  ++enqueued_;
}

void TraceWriter::PutMeta(std::string key, std::string value) {
  Enqueue(MetaRow{std::move(key), std::move(value)});
}
void TraceWriter::Add(OpStatsRow row) { Enqueue(std::move(row)); }
void TraceWriter::Add(FindingRow row) { Enqueue(std::move(row)); }
void TraceWriter::Add(StepRow row) { Enqueue(std::move(row)); }
void TraceWriter::Add(EventRow row) { Enqueue(std::move(row)); }
void TraceWriter::Add(LossScaleRow row) { Enqueue(std::move(row)); }
void TraceWriter::Add(SkipRow row) { Enqueue(std::move(row)); }
void TraceWriter::Add(EscalationRow row) { Enqueue(std::move(row)); }
void TraceWriter::Add(UncheckedRow row) { Enqueue(std::move(row)); }
void TraceWriter::Add(StepRenumberRow row) { Enqueue(std::move(row)); }
void TraceWriter::Add(ForwardLineRow row) { Enqueue(std::move(row)); }

void TraceWriter::Flush(std::chrono::milliseconds timeout) {
  absl::MutexLock lock(&mu_);
  if (closed_) return;
  const uint64_t target = enqueued_;
  flush_requested_ = true;
  auto done = [this, target]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return committed_ >= target || closed_;
  };
  mu_.AwaitWithTimeout(absl::Condition(&done),
                       absl::FromChrono(timeout));
}

void TraceWriter::Close() {
  {
    absl::MutexLock lock(&mu_);
    if (closing_) return;
    closing_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

std::string TraceWriter::last_error() const {
  absl::MutexLock lock(&mu_);
  return error_;
}

void TraceWriter::Run() {
  std::vector<Row> batch;
  for (;;) {
    bool last;
    {
      absl::MutexLock lock(&mu_);
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return flush_requested_ || closing_;
      };
      mu_.AwaitWithTimeout(absl::Condition(&wake),
                           absl::FromChrono(flush_interval_));
      flush_requested_ = false;
      last = closing_;
      batch.swap(queue_);
    }
    const size_t n = batch.size();
    if (n > 0) Commit(batch);
    if (n > 0 && max_bytes_ > 0) ThinIfNeeded();
    batch.clear();
    absl::MutexLock lock(&mu_);
    committed_ += n;
    if (last && queue_.empty()) {
      // Fold the write-ahead log into the trace: after a clean exit the
      // trace is one file, which survives being copied on its own.
      sqlite3_wal_checkpoint_v2(db_, nullptr, SQLITE_CHECKPOINT_TRUNCATE,
                                nullptr, nullptr);
      closed_ = true;
      return;
    }
  }
}

namespace {

// Steps whose per-step rows are never thinned: the recent past, where the
// trouble usually is.
constexpr int64_t kRecentSteps = 200;

int64_t Scalar(sqlite3* db, const char* sql) {
  sqlite3_stmt* s = nullptr;
  int64_t v = 0;
  if (sqlite3_prepare_v2(db, sql, -1, &s, nullptr) == SQLITE_OK &&
      sqlite3_step(s) == SQLITE_ROW) {
    v = sqlite3_column_int64(s, 0);
  }
  sqlite3_finalize(s);
  return v;
}

}  // namespace

int64_t TraceWriter::UsedBytes() {
  return (Scalar(db_, "PRAGMA page_count") - Scalar(db_, "PRAGMA freelist_count")) *
         Scalar(db_, "PRAGMA page_size");
}

void TraceWriter::ThinIfNeeded() {
  // Checked after each commit (three cheap pragmas), with room left for
  // the next commit's rows. The WAL (up to ~4 MB before SQLite folds it
  // in) comes on top of the cap.
  if (UsedBytes() < max_bytes_ * 6 / 10) return;
  const int64_t last = Scalar(db_, "SELECT MAX(step) FROM op_stats");
  const int64_t before = last - kRecentSteps;
  if (before <= 0) return;
  if (stride_ < (int64_t{1} << 40)) stride_ *= 2;
  const std::string where = absl::StrCat(" WHERE step < ", before, " AND step % ",
                                         stride_, " != 0");
  sqlite3_exec(db_, "BEGIN", nullptr, nullptr, nullptr);
  sqlite3_exec(db_, absl::StrCat("DELETE FROM op_stats", where).c_str(), nullptr,
               nullptr, nullptr);
  sqlite3_exec(db_, absl::StrCat("DELETE FROM steps", where).c_str(), nullptr,
               nullptr, nullptr);
  const std::string note = absl::StrCat(
      "over ", max_bytes_ / 1000000, " MB: op_stats and steps rows before step ",
      before, " keep one step in ", stride_,
      "; findings, loss scale, skips and events are all kept");
  sqlite3_stmt* s = meta_stmt_;
  BindText(s, 1, "thinned");
  BindText(s, 2, note);
  sqlite3_step(s);
  sqlite3_reset(s);
  sqlite3_clear_bindings(s);
  sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr);
  // Keeping one step in `stride_` leaves pages partly used, and new rows go
  // at the end of their tables: the file kept growing while thinning freed
  // little, and once ended 3.5 KB over a 1 MB cap. VACUUM packs what is
  // kept; it runs only with the file 80 % full after thinning, a handful of
  // times in a run (the stride doubles each time), on the writer's thread.
  if (Scalar(db_, "PRAGMA page_count") * Scalar(db_, "PRAGMA page_size") >
      max_bytes_ * 8 / 10) {
    sqlite3_exec(db_, "VACUUM", nullptr, nullptr, nullptr);
  }
}

void TraceWriter::Commit(std::vector<Row>& rows) {
  sqlite3_exec(db_, "BEGIN", nullptr, nullptr, nullptr);
  for (const Row& row : rows) Write(row);
  if (sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) {
    absl::MutexLock lock(&mu_);
    if (error_.empty()) error_ = SqliteError(db_, "commit").ToString();
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
}

void TraceWriter::Renumber(const StepRenumberRow& r) {
  // Rare (the first iteration of gradient accumulation): plain statements.
  constexpr std::pair<const char*, const char*> kStepColumns[] = {
      {"op_stats", "step"},      {"findings", "step"},      {"steps", "step"},
      {"loss_scale", "step"},    {"skipped_steps", "step"}, {"escalations", "step"},
      {"escalations", "until_step"}};
  for (const auto& [table, column] : kStepColumns) {
    const std::string sql = absl::StrCat("UPDATE ", table, " SET ", column, " = ", r.to,
                                         " WHERE ", column, " BETWEEN ", r.first, " AND ",
                                         r.last);
    if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, nullptr) != SQLITE_OK) {
      absl::MutexLock lock(&mu_);
      if (error_.empty()) error_ = SqliteError(db_, "renumber").ToString();
    }
  }
}

void TraceWriter::FillForwardLine(const ForwardLineRow& r) {
  // Rare (once a backward finding without a line): a statement each.
  sqlite3_stmt* s = nullptr;
  if (sqlite3_prepare_v2(db_,
                         "UPDATE findings SET source = ? WHERE step = ? AND call_index = ? "
                         "AND op = ? AND forward_op = ? AND (source IS NULL OR source = '')",
                         -1, &s, nullptr) == SQLITE_OK) {
    BindText(s, 1, r.source);
    sqlite3_bind_int64(s, 2, r.step);
    sqlite3_bind_int64(s, 3, r.call_index);
    BindText(s, 4, r.op);
    BindText(s, 5, r.forward_op);
    if (sqlite3_step(s) == SQLITE_DONE) {
      sqlite3_finalize(s);
      return;
    }
  }
  sqlite3_finalize(s);
  absl::MutexLock lock(&mu_);
  if (error_.empty()) error_ = SqliteError(db_, "fill a forward line").ToString();
}

void TraceWriter::Write(const Row& row) {
  sqlite3_stmt* s = nullptr;
  if (const auto* r = std::get_if<StepRenumberRow>(&row)) {
    Renumber(*r);
    return;
  }
  if (const auto* r = std::get_if<ForwardLineRow>(&row)) {
    FillForwardLine(*r);
    return;
  }
  if (const auto* m = std::get_if<MetaRow>(&row)) {
    s = meta_stmt_;
    BindText(s, 1, m->key);
    BindText(s, 2, m->value);
  } else if (const auto* r = std::get_if<OpStatsRow>(&row)) {
    s = stats_stmt_;
    sqlite3_bind_int64(s, 1, r->step);
    BindText(s, 2, r->op);
    BindText(s, 3, r->phase);
    BindText(s, 4, r->dtype);
    int i = 5;
    for (int64_t v : {r->calls, r->elements, r->nan, r->posinf, r->neginf,
                      r->near_max, r->underflow, r->fp16_overflow}) {
      sqlite3_bind_int64(s, i++, v);
    }
    sqlite3_bind_double(s, i++, r->max_abs);
    sqlite3_bind_int(s, i, r->mask ? 1 : 0);
  } else if (const auto* f = std::get_if<FindingRow>(&row)) {
    s = finding_stmt_;
    BindText(s, 1, f->kind);
    sqlite3_bind_int64(s, 2, f->step);
    sqlite3_bind_int64(s, 3, f->call_index);
    int i = 4;
    for (const std::string* t :
         {&f->op, &f->top_op, &f->phase, &f->forward_op, &f->dtype}) {
      BindText(s, i++, *t);
    }
    for (int64_t v : {f->elements, f->nan, f->posinf, f->neginf, f->near_max,
                      f->underflow}) {
      sqlite3_bind_int64(s, i++, v);
    }
    sqlite3_bind_double(s, i++, f->max_abs);
    if (f->fp32_max_abs) {
      sqlite3_bind_double(s, i++, *f->fp32_max_abs);
    } else {
      sqlite3_bind_null(s, i++);
    }
    for (const std::string* t : {&f->inputs, &f->outputs, &f->source,
                                 &f->stack}) {
      BindText(s, i++, *t);
    }
    sqlite3_bind_int64(s, i++, f->thread);
    sqlite3_bind_double(s, i++, f->time);
    BindText(s, i++, f->kernels);
    BindText(s, i++, f->compiled_region);
    BindText(s, i, f->via);
  } else if (const auto* st = std::get_if<StepRow>(&row)) {
    s = step_stmt_;
    sqlite3_bind_int64(s, 1, st->step);
    sqlite3_bind_int64(s, 2, st->ops);
    sqlite3_bind_int64(s, 3, st->nonfinite_ops);
    sqlite3_bind_int64(s, 4, st->origins);
    sqlite3_bind_double(s, 5, st->max_abs);
    // NaN times (a row of late GPU results added to a step) are NULL, which
    // the readers' MIN(started) and MAX(ended) pass over.
    BindTime(s, 6, st->started);
    BindTime(s, 7, st->ended);
  } else if (const auto* l = std::get_if<LossScaleRow>(&row)) {
    s = scale_stmt_;
    sqlite3_bind_int64(s, 1, l->step);
    sqlite3_bind_double(s, 2, l->scale);
    sqlite3_bind_int64(s, 3, l->skipped ? 1 : 0);
  } else if (const auto* k = std::get_if<SkipRow>(&row)) {
    s = skip_stmt_;
    sqlite3_bind_int64(s, 1, k->step);
    BindText(s, 2, k->first_op);
    BindText(s, 3, k->forward_op);
    sqlite3_bind_double(s, 4, k->time);
  } else if (const auto* x = std::get_if<EscalationRow>(&row)) {
    s = escalation_stmt_;
    sqlite3_bind_int64(s, 1, x->step);
    sqlite3_bind_int64(s, 2, x->until_step);
    BindText(s, 3, x->why);
    sqlite3_bind_double(s, 4, x->time);
  } else if (const auto* u = std::get_if<UncheckedRow>(&row)) {
    s = unchecked_stmt_;
    BindText(s, 1, u->op);
    BindText(s, 2, u->phase);
    BindText(s, 3, u->reason);
    sqlite3_bind_int64(s, 4, u->outputs);
    sqlite3_bind_int64(s, 5, u->first_step);
    sqlite3_bind_int64(s, 6, u->last_step);
  } else if (const auto* e = std::get_if<EventRow>(&row)) {
    s = event_stmt_;
    sqlite3_bind_double(s, 1, e->time);
    BindText(s, 2, e->kind);
    BindText(s, 3, e->detail);
  }
  if (s == nullptr) return;
  if (sqlite3_step(s) != SQLITE_DONE) {
    absl::MutexLock lock(&mu_);
    if (error_.empty()) error_ = SqliteError(db_, "insert").ToString();
  }
  sqlite3_reset(s);
  sqlite3_clear_bindings(s);
}

}  // namespace nanhunt
