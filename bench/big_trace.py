"""Makes a large trace from a real one, for timing the viewer: the op_stats
rows of TRACE are repeated with later step numbers (and their steps rows
with them) until the trace holds ROWS op_stats rows, as a run of many
thousand steps would. Usage: big_trace.py TRACE OUT ROWS"""
import shutil
import sqlite3
import sys

source, target, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
shutil.copyfile(source, target)
db = sqlite3.connect(target)
db.execute("PRAGMA journal_mode=OFF")
(have,) = db.execute("SELECT COUNT(*) FROM op_stats").fetchone()
while have < rows:  # doubling: a few statements even for millions of rows
    (steps,) = db.execute("SELECT MAX(step) + 1 FROM op_stats").fetchone()
    db.execute("INSERT INTO op_stats SELECT step + ?, op, phase, dtype, calls, elements, nan,"
               " posinf, neginf, near_max, underflow, fp16_overflow, max_abs, mask FROM op_stats"
               " ORDER BY rowid LIMIT ?", (steps, rows - have))
    db.execute("INSERT INTO steps SELECT step + ?, ops, nonfinite_ops, origins, max_abs,"
               " started, ended FROM steps WHERE step < ?", (steps, steps))
    (have,) = db.execute("SELECT COUNT(*) FROM op_stats").fetchone()
(offset,) = db.execute("SELECT MAX(step) + 1 FROM op_stats").fetchone()
db.execute("DELETE FROM steps WHERE step >= ?", (offset,))
db.commit()
print(f"{target}: {have} op_stats rows, {offset} steps")
