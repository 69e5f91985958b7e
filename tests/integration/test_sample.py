"""NANHUNT_MODE=sample: 1% of op calls checked, the gradients every step.
An overflow that recurs every five steps is missed or not the first time,
but the sentinel escalates to every-op checking, and the next occurrence is
caught at its origin op, with its line."""
import sqlite3

from conftest import PYTHON, SCRIPTS, preload_run, view_json

SCRIPT = SCRIPTS / "recurring_overflow.py"
SAMPLE = dict(NANHUNT_MODE="sample", NANHUNT_SAMPLE_OPS="0.01", NANHUNT_SAMPLE_STEPS="0",
              NANHUNT_ESCALATE_STEPS="20", NANHUNT_SKIP_NONFINITE_STEPS="1")


def test_a_recurring_overflow_is_localised_within_the_escalation_window(out):
    r = preload_run([PYTHON, SCRIPT], out, **SAMPLE)
    assert r.returncode == 0, r.stderr
    [trace] = out.glob("*.sqlite")
    db = sqlite3.connect(trace)
    (escalation,) = db.execute(
        "SELECT detail FROM events WHERE kind = 'escalated' ORDER BY time").fetchone()
    assert escalation.startswith("gradients not finite (sentinel) at step 5"), escalation
    first = view_json(out)["first_origin"]
    assert first["kind"] == "origin" and first["op"] == "aten::addmm", first
    assert 5 <= first["step"] <= 25, first  # the next burst, inside the window
    assert "recurring_overflow.py:18" in first["source"]
    # Before the first burst, a sample; once escalated, everything.
    (before,) = db.execute("SELECT SUM(calls) FROM op_stats WHERE step < 5").fetchone()
    (after,) = db.execute("SELECT SUM(calls) FROM op_stats WHERE step = 6").fetchone()
    assert (before or 0) * 10 < after, (before, after)
    seen, checked = (int(db.execute("SELECT value FROM meta WHERE key = ?", (k,)).fetchone()[0])
                     for k in ("op_calls_seen", "op_calls_checked"))
    assert 0 < checked < seen


def test_sampling_is_the_same_in_two_runs(tmp_path):
    counts = []
    for i in range(2):
        out = tmp_path / f"run{i}"
        r = preload_run([PYTHON, SCRIPT], out, **SAMPLE)
        assert r.returncode == 0, r.stderr
        [trace] = out.glob("*.sqlite")
        counts.append(sqlite3.connect(trace).execute(
            "SELECT step, op, phase, calls FROM op_stats ORDER BY 1, 2, 3").fetchall())
    assert counts[0] == counts[1]


def test_a_budget_lowers_the_share_of_ops_checked(out):
    # Checking every op of this small model costs far more than 1% of its
    # step: the budget must bring the share down, and say so in the trace.
    r = preload_run([PYTHON, SCRIPTS / "long_small_training.py"], out, timeout=900,
                    NANHUNT_MODE="sample", NANHUNT_SAMPLE_OPS="1", NANHUNT_SAMPLE_STEPS="0",
                    NANHUNT_BUDGET="1%")
    assert r.returncode == 0, r.stderr
    [trace] = out.glob("*.sqlite")
    db = sqlite3.connect(trace)
    changes = [d for (d,) in db.execute("SELECT detail FROM events WHERE kind = 'sample_rate'")]
    assert changes and "checks took" in changes[0], changes[:3]
    (final,) = db.execute("SELECT value FROM meta WHERE key = 'sample_ops_final'").fetchone()
    assert float(final) < 0.5, final
