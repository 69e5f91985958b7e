"""A GradScaler user's loss-scale history and skipped steps, recorded
without any switch, equal what the script itself printed."""
import sqlite3

from conftest import PYTHON, SCRIPTS, preload_run, view_json


def test_scale_history_and_skipped_steps_match_the_scripts_own_log(out):
    r = preload_run([PYTHON, SCRIPTS / "gradscaler_training.py"], out)
    assert r.returncode == 0, r.stderr
    printed = []
    for line in r.stdout.splitlines():
        _, step, _, scale, _, skipped = line.split()
        printed.append((int(step), float(scale), int(skipped)))
    # The first step overflows on its own: 2**16 is too large a start.
    assert [p[2] for p in printed] == [1, 0, 1, 0, 0, 1, 0, 0]
    [trace] = out.glob("*.sqlite")
    recorded = sqlite3.connect(trace).execute(
        "SELECT step, scale, skipped FROM loss_scale ORDER BY rowid").fetchall()
    assert recorded == printed
    report = view_json(out)
    assert report["skipped_steps"] == [0, 2, 5]
    assert report["steps"] == 8
