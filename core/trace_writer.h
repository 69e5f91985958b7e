// Writes one process's trace to a SQLite file from a background thread.
//
// Producers (op callbacks on any thread) only append to an in-memory queue
// under a mutex and never wait on disk. The writer thread commits the queue
// in one transaction every flush interval, in WAL mode: a process killed at
// any point leaves a trace that opens and holds everything up to the last
// commit. The writer thread blocks all signals, so the host's signal
// handling is unchanged.
#pragma once

#include <sqlite3.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/trace_rows.h"

namespace nanhunt {

class TraceWriter {
 public:
  // Creates (or appends to) the SQLite file at `path` and starts the writer
  // thread. The parent directory must exist.
  // `max_bytes` > 0 caps the trace's size (see Thin()).
  static absl::StatusOr<std::unique_ptr<TraceWriter>> Open(
      const std::string& path, std::chrono::milliseconds flush_interval,
      int64_t max_bytes = 0);

  // Stops the thread after a final commit.
  ~TraceWriter();

  // Thread-safe; return at once. After Close() they are ignored.
  void PutMeta(std::string key, std::string value);
  void Add(OpStatsRow row);
  void Add(FindingRow row);
  void Add(StepRow row);
  void Add(EventRow row);
  void Add(LossScaleRow row);
  void Add(SkipRow row);
  void Add(EscalationRow row);
  void Add(UncheckedRow row);
  void Add(StepRenumberRow row);
  void Add(ForwardLineRow row);

  // Commits everything queued so far; returns when it is on disk (or when
  // `timeout` passed). Thread-safe.
  void Flush(std::chrono::milliseconds timeout = std::chrono::seconds(5));

  // Final commit, then the thread ends. Idempotent.
  void Close();

  const std::string& path() const { return path_; }

  // The first error the writer met, if any (it keeps going where it can).
  std::string last_error() const;

 private:
  struct MetaRow {
    std::string key, value;
  };
  using Row = std::variant<MetaRow, OpStatsRow, FindingRow, StepRow, EventRow,
                           LossScaleRow, SkipRow, EscalationRow, UncheckedRow,
                           StepRenumberRow, ForwardLineRow>;

  TraceWriter(std::string path, sqlite3* db,
              std::chrono::milliseconds flush_interval, int64_t max_bytes);
  // The size cap's policy: once the rows in use come near `max_bytes_`,
  // per-step rows (op_stats, steps) of all but the last 200 steps
  // are thinned to one step in `stride_` (doubled each time); findings,
  // loss scale, skips, escalations and events are never dropped. SQLite reuses the freed
  // pages, so the file stops growing. Recorded in meta "thinned".
  void ThinIfNeeded();
  int64_t UsedBytes();
  void Enqueue(Row row);
  void Run();
  void Commit(std::vector<Row>& rows);
  void Write(const Row& row);
  void Renumber(const StepRenumberRow& r);
  void FillForwardLine(const ForwardLineRow& r);

  const std::string path_;
  sqlite3* const db_;
  const std::chrono::milliseconds flush_interval_;
  const int64_t max_bytes_;
  int64_t stride_ = 1;        // per-step rows kept: one step in stride_
  // Prepared once; used by the writer thread only.
  sqlite3_stmt* meta_stmt_ = nullptr;
  sqlite3_stmt* stats_stmt_ = nullptr;
  sqlite3_stmt* finding_stmt_ = nullptr;
  sqlite3_stmt* step_stmt_ = nullptr;
  sqlite3_stmt* event_stmt_ = nullptr;
  sqlite3_stmt* scale_stmt_ = nullptr;
  sqlite3_stmt* skip_stmt_ = nullptr;
  sqlite3_stmt* escalation_stmt_ = nullptr;
  sqlite3_stmt* unchecked_stmt_ = nullptr;

  mutable absl::Mutex mu_;
  std::vector<Row> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t enqueued_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t committed_ ABSL_GUARDED_BY(mu_) = 0;
  bool flush_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::string error_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace nanhunt
