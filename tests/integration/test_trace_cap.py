"""A 10,000-step run in sample mode keeps its trace under the configured
cap: old per-step statistics are thinned, findings and the recent steps
are kept, and the trace says so."""
import sqlite3

from conftest import NANHUNT, PYTHON, SCRIPTS, preload_run, run, view_json


def test_ten_thousand_steps_stay_under_a_one_megabyte_cap(out):
    r = preload_run([PYTHON, SCRIPTS / "long_small_training.py"], out, timeout=900,
                    NANHUNT_MODE="sample", NANHUNT_SAMPLE_STEPS="2", NANHUNT_MAX_TRACE_MB="1")
    assert r.returncode == 0, r.stderr
    [trace] = out.glob("*.sqlite")
    assert trace.stat().st_size < 1_000_000, trace.stat().st_size
    db = sqlite3.connect(trace)
    (thinned,) = db.execute("SELECT value FROM meta WHERE key = 'thinned'").fetchone()
    assert "keep one step in" in thinned
    # Sample mode writes a step's row when it checked something: one step in
    # two is checked in full here, so the recent, unthinned past keeps at
    # least half its steps; the thinned past far fewer.
    (last,) = db.execute("SELECT MAX(step) FROM steps").fetchone()
    assert last >= 9990
    (recent,) = db.execute("SELECT COUNT(*) FROM steps WHERE step > ?", (last - 200,)).fetchone()
    (early,) = db.execute("SELECT COUNT(*) FROM steps WHERE step < 200").fetchone()
    assert recent >= 100 and early < recent / 2, (recent, early)
    report = view_json(out)
    assert report["steps"] >= 9990
    assert any("size cap (NANHUNT_MAX_TRACE_MB) reached" in p for p in report["problems"])
